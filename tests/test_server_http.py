"""The real server: `python -m distrinews.serve` (the code behind `distrinews-serve`) under uvicorn on a free loopback
port, called over HTTP and over raw sockets. One server serves the whole module (with deadlines short enough for a
test to wait for); the last test stops it with SIGTERM under load (run alone, a test that comes after it gets a new
one). Also: a schemathesis run against its /openapi.json that must find no 5xx, the model file changed under the
running server, slow and silent clients, and 1,000 connections holding partial bodies."""

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import safetensors.torch
from conftest import http_json, started_server

from distrinews.ddp import free_port
from distrinews.inference import PROBE_TEXTS
from distrinews.model import LABELS, OFFLINE_ENCODER, build_classifier

pytestmark = pytest.mark.slow

MAX_BODY, MAX_BODIES = 1_048_576, 64
HEADER_TIMEOUT, BODY_TIMEOUT, KEEP_ALIVE = 1.0, 2.0, 1.0
SERVER_ARGS = (
    "--threads",
    "1",
    "--dtype",
    "fp32",
    "--device",
    "cpu",
    "--max-text-chars",
    "300",
    "--max-batch-size",
    "8",
    "--log-level",
    "info",
    "--max-pending-bytes",
    str(MAX_BODIES * MAX_BODY),
    "--header-timeout-s",
    str(HEADER_TIMEOUT),
    "--body-timeout-s",
    str(BODY_TIMEOUT),
    "--keep-alive-s",
    str(KEEP_ALIVE),
    "--shutdown-timeout-s",
    "2",
    "--batch-wait-ms",
    "50",
)
SERVER_ENV = {"DISTRINEWS_MAX_BODY_BYTES": str(MAX_BODY), "DISTRINEWS_QUEUE_LIMIT": "64"}


@pytest.fixture(scope="module")
def served(checkpoint, tmp_path_factory) -> Path:
    "The module server's own copy of the demo checkpoint: a test changes its files under the running server."
    return shutil.copytree(checkpoint, tmp_path_factory.mktemp("served") / "checkpoint")


@pytest.fixture(scope="module")
def servers(served):
    "The module's server, and a way to start another once a test has stopped it."
    with contextlib.ExitStack() as stack:
        start = lambda: stack.enter_context(started_server(served, *SERVER_ARGS, env=SERVER_ENV))
        yield dict(current=start(), start=start)


@pytest.fixture
def server(servers):
    if servers["current"].process.poll() is not None:  # stopped by the SIGTERM test
        servers["current"] = servers["start"]()
    return servers["current"]


@pytest.fixture
def url(server):
    return server.url


def _address(url: str) -> tuple[str, int]:
    host, port = url.split("//")[1].split(":")
    return host, int(port)


def _raw(url: str, data: bytes, timeout: float = 10) -> bytes:
    "Send `data` on a fresh connection; everything the server answers until it closes the connection."
    with socket.create_connection(_address(url), timeout=timeout) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_health_and_predict_over_http(url):
    h = httpx.get(url + "/health").json()
    assert (h["model_loaded"], h["device"], h["labels"]) == (True, "cpu", LABELS)
    assert (h["limits"]["max_body_bytes"], h["limits"]["max_pending_bytes"]) == (MAX_BODY, MAX_BODIES * MAX_BODY)
    r = httpx.post(url + "/predict", json={"text": "Central bank raises interest rates"})
    assert r.status_code == 200 and r.json()["label"] in LABELS
    assert r.headers["x-content-type-options"] == "nosniff"
    r = httpx.post(url + "/predict/batch", json={"texts": ["Mars rover lands", "Striker scores twice", "Oil climbs"]})
    assert r.status_code == 200 and len(r.json()["predictions"]) == 3
    assert httpx.get(url + "/").headers["content-type"].startswith("text/html")
    assert httpx.get(url + "/openapi.json").json()["info"]["title"] == "DistriNews API"
    r = httpx.head(url + "/health")
    assert (r.status_code, r.content) == (200, b"")
    r = httpx.get(url + "/health/", headers={"host": "evil.example"})
    assert r.status_code == 404 and "location" not in r.headers  # no redirect built from the Host header


def test_bad_input_over_http(url):
    assert httpx.post(url + "/predict", json={"text": "   "}).status_code == 422
    r = httpx.post(url + "/predict", json={"text": "x" * 301})
    assert r.status_code == 422 and "at most 300 characters" in r.text
    r = httpx.post(url + "/predict", content=b'{"text": "caf\xe9"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["detail"]
    r = httpx.post(url + "/predict", content=b'{"text": "a"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "not 'text/plain'" in r.json()["detail"]
    r = httpx.delete(url + "/predict")
    assert (r.status_code, r.json()["detail"]) == (405, "DELETE is not allowed on /predict: use POST")
    r = httpx.get(url + "/nope")
    assert (r.status_code, r.json()["detail"]) == (
        404,
        "no such path; this API has /, /health, /predict, /predict/batch (see /docs)",
    )


def test_body_limit_over_http(url):
    big = json.dumps({"text": "y" * (MAX_BODY + 10)}).encode()
    r = httpx.post(url + "/predict", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and f"larger than the limit of {MAX_BODY} bytes" in r.json()["detail"]  # announced
    assert r.headers["x-content-type-options"] == "nosniff"
    chunks = iter([b'{"text": "', b"z" * (MAX_BODY + 10), b'"}'])  # no Content-Length: chunked transfer encoding
    r = httpx.post(url + "/predict", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and f"larger than the limit of {MAX_BODY} bytes" in r.json()["detail"]
    assert httpx.get(url + "/health").json()["model_loaded"]  # and the server is fine afterwards


def test_bad_framing_is_refused(url):
    "httpx would fix these itself: raw requests. A wrong Content-Length (uvicorn), and Content-Length with chunked."
    answer = _raw(
        url, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    smuggle = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 13\r\n"
        b'Transfer-Encoding: chunked\r\n\r\nd\r\n{"text": "a"}\r\n0\r\n\r\n'
    )
    answer = _raw(url, smuggle)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b"Content-Length and Transfer-Encoding together" in answer and b"connection: close" in answer.lower()


def test_concurrent_clients_get_their_own_answers_in_shared_batches(url):
    texts = [
        f"Headline number {i} about {topic}" for i, topic in enumerate(["oil", "tennis", "chips", "elections"] * 4)
    ]
    before = httpx.get(url + "/health").json()["batching"]
    with httpx.Client() as c, concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda t: c.post(url + "/predict", json={"text": t}, timeout=60), texts))
    assert all(a.status_code == 200 for a in answers)
    after = httpx.get(url + "/health").json()["batching"]
    assert after["items"] - before["items"] == 16
    assert after["batches"] - before["batches"] < 16  # 16 clients within a 50 ms window: fewer forward passes
    expected = httpx.post(url + "/predict/batch", json={"texts": texts[:8]}).json()["predictions"]
    assert [a.json()["label"] for a in answers[:8]] == [e["label"] for e in expected]


def test_the_model_file_changing_under_the_server_changes_nothing(server, served):
    "Another model written over model.safetensors, then the file truncated: same answers, same version, still up."
    weights, saved = served / "model.safetensors", (served / "model.safetensors").read_bytes()
    ask = lambda: httpx.post(server.url + "/predict/batch", json={"texts": PROBE_TEXTS[:8]}, timeout=60)
    before, version = ask().json(), httpx.get(server.url + "/health").json()["model_version"]
    try:
        safetensors.torch.save_file(build_classifier(OFFLINE_ENCODER, seed=1).state_dict(), weights)
        assert ask().json() == before
        weights.write_bytes(saved[:1000])  # truncated in place: a memory-mapped model would die with SIGBUS
        r = ask()
        assert (r.status_code, r.json()) == (200, before)
        assert httpx.get(server.url + "/health").json()["model_version"] == version
        assert server.process.poll() is None
    finally:
        weights.write_bytes(saved)


def _closed_after(url: str, send_first: bytes, trickle: bytes = b"", every: float = 0.25) -> tuple[float, bytes]:
    "Connect, send `send_first`, then `trickle` every `every` s until the server closes: (seconds, what it answered)."
    with socket.create_connection(_address(url), timeout=15) as s:
        s.sendall(send_first)
        started, answer = time.monotonic(), b""
        s.settimeout(every)
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                if trickle:
                    try:
                        s.sendall(trickle)
                    except OSError:
                        break
                if time.monotonic() - started > 15:
                    raise AssertionError("the connection was never closed") from None
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
        return time.monotonic() - started, answer


def test_slow_and_silent_clients_are_closed_within_their_timeouts(url):
    "Slowloris headers, a slow body, a silent connection and an idle keep-alive one, side by side."
    cases = {
        "silent": (b"", b""),
        "slow headers": (b"GET /health HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n"),
        "slow body": (
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
            b" ",
        ),
        "idle keep-alive": (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b""),
    }
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        done = {name: pool.submit(_closed_after, url, *case) for name, case in cases.items()}
        results = {name: f.result() for name, f in done.items()}
    slack = 4.0  # a busy 2-core machine; a timeout not enforced shows as 15 s (_closed_after gives up)
    for name in ("silent", "slow headers"):
        seconds, answer = results[name]
        assert HEADER_TIMEOUT - 0.1 < seconds < HEADER_TIMEOUT + slack, (name, seconds)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), (name, answer[:100])
        assert f"headers did not arrive within {HEADER_TIMEOUT:g} s".encode() in answer, answer  # the limit, in JSON
    seconds, answer = results["slow body"]
    assert BODY_TIMEOUT - 0.1 < seconds < BODY_TIMEOUT + slack, seconds
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout") and b"did not arrive in time" in answer, answer[:200]
    seconds, answer = results["idle keep-alive"]
    assert answer.startswith(b"HTTP/1.1 200") and KEEP_ALIVE - 0.1 < seconds < KEEP_ALIVE + slack, seconds
    assert httpx.get(url + "/health").status_code == 200


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc")
def test_memory_stays_bounded_under_1000_connections_with_partial_bodies(server):
    """1,000 connections each announce a body of MAX_BODY (1 MiB), send as much of it as the socket takes, and wait. The
    bodies in progress may hold MAX_BODIES * MAX_BODY bytes (64 MiB here, 100 MiB with the defaults), counted as they
    arrive: once they hold that much, the others are refused with 503, so the memory that pending requests hold is
    at most that plus uvicorn's read buffer (64 KiB) per open connection, whatever the clients do. Without the bound
    it is up to 1 GiB."""
    pid, n = server.process.pid, 1000
    before, peak, stop = _rss_mib(pid), [0.0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_mib(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    head = (
        f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {MAX_BODY}\r\n\r\n"
    ).encode()
    body, socks, statuses = b'{"text": "' + b"x" * (MAX_BODY - 20), [], collections.Counter()
    try:
        for _ in range(n):
            s = socket.create_connection(_address(server.url), timeout=10)
            s.setblocking(False)
            try:
                s.send(head + body)  # as much as the socket takes now
            except OSError:
                pass
            socks.append(s)
        time.sleep(1.0)  # < BODY_TIMEOUT: the connections that got to the app still hold their partial bodies
        for s in socks:
            try:
                statuses[s.recv(12)[9:12].decode() or "open"] += 1
            except BlockingIOError:
                statuses["open"] += 1
            except OSError:
                statuses["reset"] += 1
    finally:
        for s in socks:
            s.close()
        stop.set()
        sampler.join()
    grown = peak[0] - before
    print(f"resident memory {before:.0f} MiB -> peak {peak[0]:.0f} MiB (+{grown:.0f}); {dict(statuses)}")
    # some refused by the bound as their bytes arrived (how many within 1 s depends on how fast the server reads them:
    # the others wait, inside the bound, or meet their body deadline)
    assert statuses["503"] > 0
    # the bodies (each held twice at most while it is parsed), the read buffers, a chunk of each body that the bound
    # refuses as it arrives (64 KiB), and the server's own churn
    bound = (2 * MAX_BODIES * MAX_BODY + 2 * n * 65536) / 2**20 + 48
    assert grown < bound, f"resident memory grew by {grown:.0f} MiB, more than {bound:.0f}"
    deadline = time.monotonic() + 10
    while httpx.get(server.url + "/health").status_code != 200:  # and it serves again once they are gone
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert httpx.post(server.url + "/predict", json={"text": "still here"}).status_code == 200


def test_clients_that_announce_bodies_and_send_nothing_lock_no_one_out(url):
    """More clients than MAX_BODIES announce a body of MAX_BODY (by Content-Length or chunked) and send none of it. The
    memory bound counts the bytes that have arrived, so they hold nothing: a normal request is answered at once, not
    refused with 503 until their body deadline passes (as when announced sizes were reserved)."""
    head = "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{}\r\n\r\n"
    bodies = [f"Content-Length: {MAX_BODY}", "Transfer-Encoding: chunked"]
    socks = [socket.create_connection(_address(url), timeout=10) for _ in range(MAX_BODIES + 8)]
    try:
        for i, s in enumerate(socks):
            s.sendall(head.format(bodies[i % 2]).encode())
        time.sleep(0.3)  # < BODY_TIMEOUT: every one of them is in, waiting for its body
        r = httpx.post(url + "/predict", json={"text": "answered while they wait"})
        assert r.status_code == 200, r.text
    finally:
        for s in socks:
            s.close()


def test_headers_over_the_limit_are_refused(url):
    "Issue 35, fault 6: the documented 16 KiB limit on the request line and headers holds, however the bytes arrive."
    ask = lambda size: _raw(url, f"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * size}\r\n\r\n".encode())
    assert ask(15 * 1024).startswith(b"HTTP/1.1 200")
    answer = ask(17 * 1024)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b"take 17436 bytes; the limit is 16384 bytes" in answer and b"connection: close" in answer.lower()
    answer = ask(100 * 1024)  # 431 when it arrives at once; split over reads, h11 stops it at 16 KiB: uvicorn's 400
    assert answer.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400 Bad Request")), answer[:200]
    assert answer.startswith(b"HTTP/1.1 431") or b"or a head over 16384 bytes" in answer, answer  # h11's: the limit
    assert httpx.get(url + "/health").status_code == 200


async def _slow_clients(url: str, n: int, stop: threading.Event, closed: collections.Counter):
    "`n` clients sending a request's headers a byte every 0.2 s, each connecting again as soon as it is closed."
    host, port = _address(url)

    async def client():
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            try:
                while not stop.is_set():
                    try:
                        answer = await asyncio.wait_for(reader.read(100), 0.2)
                    except TimeoutError:
                        writer.write(b"a")
                        continue
                    closed[answer[9:12].decode() or "closed"] += 1
                    break
            except OSError:
                closed["reset"] += 1
            writer.close()

    await asyncio.gather(*(client() for _ in range(n)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc")
def test_slow_clients_that_reconnect_leave_room_for_real_requests(server):
    """Issue 35, fault 5: 128 slow clients (twice the 64 connections that used to be all the server took), each closed
    (408) after HEADER_TIMEOUT and connecting again at once, for 8 s; meanwhile a normal client posts one text after
    the other, each on a new connection. Its requests are answered (at least 95 % with 200, p90 within 5 s on a busy
    2-core machine: of its 20-40 requests, p99 is the slowest one), the slow clients are closed over and over, and the
    server's memory stays bounded."""
    stop, closed, n = threading.Event(), collections.Counter(), 128
    before = _rss_mib(server.process.pid)
    slow = threading.Thread(target=asyncio.run, args=(_slow_clients(server.url, n, stop, closed),))
    slow.start()
    statuses, seconds = collections.Counter(), []
    try:
        time.sleep(1.5)  # every slow client has connected
        end = time.monotonic() + 8
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                r = httpx.post(server.url + "/predict", json={"text": "Oil prices climb"}, timeout=10)
                statuses[r.status_code] += 1
            except httpx.TransportError as e:
                statuses[type(e).__name__] += 1
            seconds.append(time.monotonic() - started)
    finally:
        stop.set()
        slow.join(30)
    after = _rss_mib(server.process.pid)
    seconds.sort()
    p90, p99 = (seconds[min(len(seconds) - 1, int(q * len(seconds)))] for q in (0.9, 0.99))
    ok = statuses[200] / sum(statuses.values())
    print(
        f"normal client {dict(statuses)}: {ok:.1%} answered 200, p50 {seconds[len(seconds) // 2] * 1000:.0f} ms, "
        f"p90 {p90 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; slow clients closed {dict(closed)}; "
        f"RSS {before:.0f} -> {after:.0f} MiB"
    )
    assert sum(statuses.values()) >= 5 and ok >= 0.95, statuses  # before: 503 for all but 0-2 %
    assert p90 < 5, p90  # (seconds; p99 0.25-0.5 s alone on 2 busy cores, 2.6 s beside other test runs)
    assert closed["408"] >= n, closed  # the slow clients were really there, closed and back again
    assert after - before < 64, (before, after)


def test_every_request_is_logged_with_its_status(server):
    "The access log has every answer, refusals included, and the 408 of a client too slow to get one."
    marker = f"/health?mark={time.monotonic()}"
    httpx.get(server.url + marker)
    httpx.post(server.url + "/predict", json={"text": ""})
    httpx.post(server.url + "/predict", content=b"{}", headers={"content-type": "text/plain"})
    httpx.post(server.url + "/predict", content=b"x" * (MAX_BODY + 1), headers={"content-type": "application/json"})
    _closed_after(server.url, b"")  # silent: 408 after HEADER_TIMEOUT
    time.sleep(0.2)
    log = server.log()
    new = log[log.index(marker) :]
    for line in ('"POST /predict HTTP/1.1" 422', '"POST /predict HTTP/1.1" 415', '"POST /predict HTTP/1.1" 413'):
        assert line in new, line
    assert "408 Request Timeout: the request's headers did not arrive within 1 s" in new
    assert "Traceback" not in log and "Exception in ASGI application" not in log


def test_bad_settings_and_a_checkpoint_it_cannot_serve_stop_with_one_line(tmp_path, checkpoint, capsys):
    # the command's `main`, in this process (every server these tests start runs `python -m distrinews.serve`)
    from distrinews.serve import main

    with pytest.raises(SystemExit) as e:
        main(["--batch-wait-ms", "-5"])
    assert e.value.code == 2 and "batch_wait_ms" in capsys.readouterr().err
    bad = shutil.copytree(checkpoint, tmp_path / "llama")
    (bad / "config.json").write_text(
        json.dumps({**json.loads((bad / "config.json").read_text()), "model_type": "llama"})
    )
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(bad), "--device", "cpu", "--port", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and len(err.splitlines()) == 1, err[-2000:]
    assert "distrinews-serve: error:" in err and "LlamaForSequenceClassification" in err


def test_a_port_taken_before_the_server_binds_it_gets_the_server_started_on_another(checkpoint, monkeypatch):
    # the harness picks a free port; the server tries it before its model loads and binds it after: another program
    # can take it in between. Here the first port it is given is taken (a socket that listens and never answers), and
    # the server says so at once, before loading anything.
    from distrinews import harness

    with socket.create_server(("127.0.0.1", 0)) as taken:
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(harness, "free_port", lambda host: next(ports, None) or free_port(host))
        with started_server(checkpoint, "--threads", "1", "--device", "cpu") as server:
            status, health = http_json(server.url + "/health")
            assert status == 200 and health["model_loaded"], health
            assert server.url != f"http://127.0.0.1:{taken.getsockname()[1]}"
            assert server.log().lower().count("address already in use") == 1, server.log()[-2000:]
            assert server.log().startswith("distrinews-serve: error: --host, --port: Address already in use")


@pytest.mark.parametrize("then, says", [("sleep 0.3; exit 2", "exited with code 2"), ("", "exited with code 1")])
def test_a_server_that_fails_after_a_taken_port_stops_the_wait_at_once(tmp_path, then, says):
    # a stand-in interpreter: its first run finds the port taken; the next fails otherwise (a bad flag), or finds its
    # port taken as well, as every run after it does: three runs in all, then the wait stops with what they printed
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\nif [ -e "$0.ran" ]; then {then or ":"}; fi\ntouch "$0.ran"\n'
        'echo "[Errno 98] error while attempting to bind: address already in use"; exit 1\n'
    )
    fake.chmod(0o755)
    from distrinews.harness import server_process

    started = time.monotonic()
    with pytest.raises(RuntimeError, match=says) as e:
        server_process(python=fake, timeout=20).__enter__()
    assert time.monotonic() - started < 10  # not the 20 s timeout
    assert str(e.value).count("address already in use") == (1 if then else 3), str(e.value)


@pytest.mark.skipif(
    shutil.which("distrinews-serve") is None
    and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "distrinews-serve")),
    reason="console script distrinews-serve not installed (pip install -e .)",
)
def test_console_script_help_lists_every_setting():
    exe = shutil.which("distrinews-serve") or os.path.join(os.path.dirname(sys.executable), "distrinews-serve")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "distrinews-serve" in out.stdout and "--checkpoint" in out.stdout
    assert "--no-batching" in out.stdout and "--header-timeout-s" in out.stdout and "--max-pending-bytes" in out.stdout
    assert "--batch-wait-ms" in out.stdout and "DISTRINEWS_BATCH_WAIT_MS" in out.stdout  # made from ServeSettings


def test_openapi_fuzzing_finds_no_server_errors(url):
    "schemathesis generates valid and invalid requests for every operation in /openapi.json; none may get a 5xx."
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import response_schema_conformance

    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} == {
        "GET /",
        "GET /health",
        "POST /predict",
        "POST /predict/batch",
    }
    seen = []
    for op in operations:
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if op.method.upper() == "POST" else [])
        for mode in modes:  # (a GET without parameters has no invalid form)

            @settings(
                max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def check(case):
                response = case.call(base_url=url, timeout=60)
                seen.append(response.status_code)
                assert response.status_code < 500, (
                    f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
                )
                case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

            check()
    print(sorted(collections.Counter(seen).items()))
    assert len(seen) > 50 and {200, 422} <= set(seen)


def _scrape(url: str) -> dict:
    "/metrics read back with prometheus_client's parser: {(sample name, labels), ...: value}."
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = text_string_to_metric_families(r.text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def _growth(before: dict, after: dict, name: str, *labels: str) -> collections.Counter:
    "How much sample `name` grew from one scrape to the next, by the values of `labels` (those that grew)."
    by = lambda samples: {tuple(dict(k[1])[x] for x in labels): v for k, v in samples.items() if k[0] == name}
    grown = collections.Counter(by(after))
    grown.subtract(by(before))
    return +grown


def test_metrics_count_every_answer_after_a_known_load(served):
    """Issue 37: a server of its own (a queue of 8 texts) under a known load: good requests, bad ones refused at every
    layer (uvicorn's 400, the guard's 413, 415 and 431, FastAPI's 422, a 404), a burst that gets 503s, a silent
    client and a slow body (408s). /metrics counts each answer the clients saw, by route and status, exactly; the
    latency histograms count the requests, the batch-size and inference histograms the forward passes /health counts."""
    with started_server(served, *SERVER_ARGS, "--queue-limit", "8", env=SERVER_ENV) as server:
        url, seen = server.url, collections.Counter()

        def call(method: str, path: str, **kwargs) -> int:
            status = httpx.request(method, url + path, timeout=60, **kwargs).status_code
            seen[(path if path in ("/health", "/predict", "/predict/batch") else "other", str(status))] += 1
            return status

        before = _scrape(url)
        for i in range(5):
            assert call("POST", "/predict", json={"text": f"Oil prices climb, day {i}"}) == 200
        assert call("POST", "/predict/batch", json={"texts": ["Mars rover lands", "Striker scores twice"]}) == 200
        as_json = {"content-type": "application/json"}
        assert call("POST", "/predict", content=b'{"text": ', headers=as_json) == 422  # invalid JSON
        assert call("POST", "/predict", json={"text": "   "}) == 422
        assert call("POST", "/predict", content=b'{"text": "a"}', headers={"content-type": "text/plain"}) == 415
        assert call("POST", "/predict", content=b"x" * (MAX_BODY + 1), headers=as_json) == 413
        assert call("GET", "/health", headers={"x-big": "a" * 17 * 1024}) == 431
        assert call("GET", "/nope") == 404
        bad_length = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"  # h11 cannot parse it
        answer = _raw(url, bad_length)  # answered by the protocol (`HeaderDeadline`), not uvicorn's plain text
        assert answer.startswith(b"HTTP/1.1 400") and b'{"detail":"not a valid HTTP/1.1 request' in answer, answer
        seen[("other", "400")] += 1
        barrier = threading.Barrier(24)

        def burst(i):
            barrier.wait()
            return call("POST", "/predict/batch", json={"texts": [f"burst {i} text {j}" for j in range(8)]})

        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            burst_statuses = collections.Counter(pool.map(burst, range(24)))
        assert burst_statuses[503] > 0 and set(burst_statuses) <= {200, 503}, burst_statuses
        slow_body = (
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            silent, slow = pool.map(lambda first: _closed_after(url, first)[1], [b"", slow_body])
        assert silent.startswith(b"HTTP/1.1 408") and slow.startswith(b"HTTP/1.1 408"), (silent[:50], slow[:50])
        seen[("other", "408")] += 1  # the silent client: its headers never came, its route is unknown
        seen[("/predict", "408")] += 1
        health = httpx.get(url + "/health").json()
        seen[("/health", "200")] += 1
        after = _scrape(url)

    seen[("/metrics", "200")] += 1  # the scrape before the load
    print(f"burst {dict(burst_statuses)}; answers {dict(seen)}")
    assert _growth(before, after, "distrinews_requests_total", "route", "status") == seen
    by_route = collections.Counter()
    for (route, _), n in seen.items():
        by_route[(route,)] += n
    by_route[("other",)] -= 2  # the silent client's 408 and uvicorn's 400 never reached the app: no latency
    assert _growth(before, after, "distrinews_request_seconds_count", "route") == by_route
    batches, items = health["batching"]["batches"], health["batching"]["items"]
    assert batches >= 1 + 5 and items == 5 + 2 + 8 * burst_statuses[200], health["batching"]
    assert after[("distrinews_batch_size_count", ())] == batches and after[("distrinews_batch_size_sum", ())] == items
    assert after[("distrinews_inference_seconds_count", ())] == batches
    assert after[("distrinews_queue_depth", ())] == 0
    info = {dict(k[1])["version"]: v for k, v in after.items() if k[0] == "distrinews_model_info"}
    assert info == {health["model_version"]: 1.0}, info


async def _hammer(url: str, clients: int, statuses: collections.Counter):
    "`clients` keep-alive clients posting one text after the other until the server's port is closed."
    host, port = _address(url)
    body = json.dumps({"text": "Oil prices climb as stocks slide on Wall Street"}).encode()
    request = (
        f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def client():
        reader = writer = None
        while True:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:"))[15:])
                await reader.readexactly(length)
                statuses[status] += 1
                if b"connection: close" in head.lower():
                    writer.close()
                    writer = None
            except ConnectionRefusedError:  # the port is closed: the server has stopped accepting
                statuses["refused"] += 1
                return
            except (ConnectionError, asyncio.IncompleteReadError):  # closed after an answer: connect again
                statuses["closed"] += 1
                writer = None

    await asyncio.gather(*(client() for _ in range(clients)))


def test_sigterm_under_load_answers_every_request_without_a_500(server):
    """32 clients in a loop; SIGTERM; every request gets 200 or 503 (or finds the port closed); a clean exit. It stops
    the module's server: the last test of the module."""
    statuses = collections.Counter()

    async def scenario():
        load = asyncio.ensure_future(_hammer(server.url, 32, statuses))
        for _ in range(300):  # until the load is on (a busy machine answers its first requests late)
            if statuses[200] > 10:
                break
            await asyncio.sleep(0.1)
        before = dict(statuses)
        server.process.send_signal(signal.SIGTERM)  # what `docker stop` and Kubernetes do
        await asyncio.wait_for(load, 30)
        return before

    before = asyncio.run(scenario())
    code, log = server.process.wait(30), server.log()
    print(f"before SIGTERM {before}; in all {dict(statuses)}; exit code {code}")
    assert before.get(200, 0) > 10 and statuses["refused"] == 32  # each client ends when it finds the port closed
    assert set(statuses) <= {200, 503, "refused", "closed"}, statuses
    assert code in (0, -signal.SIGTERM)  # uvicorn ends by re-raising the signal it handled
    assert "Application shutdown complete" in log and "Exception in ASGI application" not in log, log[-3000:]
    assert "Traceback" not in log
