"""The real server: `python -m distrinews.serve` (the code behind `distrinews-serve`) under uvicorn on a free loopback
port, called over HTTP; and a schemathesis run against its /openapi.json that must find no 5xx."""

import collections
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys

import httpx
import pytest
from conftest import running_server

from distrinews.model import LABELS

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
    "warning",
)
SERVER_ENV = {"DISTRINEWS_MAX_BODY_BYTES": "16384", "DISTRINEWS_QUEUE_LIMIT": "64"}


@pytest.fixture(scope="module")
def url(checkpoint):
    with running_server(checkpoint, *SERVER_ARGS, "--batch-wait-ms", "50", env=SERVER_ENV) as base:
        yield base


def test_health_and_predict_over_http(url):
    h = httpx.get(url + "/health").json()
    assert (h["model_loaded"], h["device"], h["labels"], h["limits"]["max_body_bytes"]) == (True, "cpu", LABELS, 16384)
    r = httpx.post(url + "/predict", json={"text": "Central bank raises interest rates"})
    assert r.status_code == 200 and r.json()["label"] in LABELS
    r = httpx.post(url + "/predict/batch", json={"texts": ["Mars rover lands", "Striker scores twice", "Oil climbs"]})
    assert r.status_code == 200 and len(r.json()["predictions"]) == 3
    assert httpx.get(url + "/").headers["content-type"].startswith("text/html")
    assert httpx.get(url + "/openapi.json").json()["info"]["title"] == "DistriNews API"


def test_bad_input_over_http(url):
    assert httpx.post(url + "/predict", json={"text": "   "}).status_code == 422
    r = httpx.post(url + "/predict", json={"text": "x" * 301})
    assert r.status_code == 422 and "at most 300 characters" in r.text
    r = httpx.post(url + "/predict", content=b'{"text": "caf\xe9"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["detail"]
    assert httpx.delete(url + "/predict").status_code == 405 and httpx.get(url + "/nope").status_code == 404


def test_body_limit_over_http(url):
    big = json.dumps({"text": "y" * 100_000}).encode()
    r = httpx.post(url + "/predict", content=big, headers={"content-type": "application/json"})
    assert (r.status_code, r.text) == (413, "Content Too Large")  # announced: refused before the body is read
    chunks = iter([b'{"text": "', b"z" * 20_000, b'"}'])  # no Content-Length: chunked transfer encoding
    r = httpx.post(url + "/predict", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than the limit of 16384 bytes" in r.json()["detail"]
    assert httpx.get(url + "/health").json()["model_loaded"]  # and the server is fine afterwards


def test_bad_content_length_is_refused_by_the_http_server(url):
    "httpx would fix a wrong Content-Length itself: a raw request. uvicorn refuses it before the app sees it."
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n{}"
        )
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


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


def test_server_with_a_broken_checkpoint_stays_up(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with running_server(tmp_path, *SERVER_ARGS) as base:
        r = httpx.get(base + "/health")
        assert r.status_code == 503  # not ready, and the body says why
        h = r.json()
        assert h["model_loaded"] is False and "has no model.safetensors" in h["error"]
        r = httpx.post(base + "/predict", json={"text": "hello"})
        assert r.status_code == 503 and "model not loaded" in r.json()["detail"]


def test_cli_help_and_bad_settings():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "distrinews.serve", "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "--checkpoint" in out.stdout and "--no-batching" in out.stdout
    assert "--batch-wait-ms" in out.stdout and "DISTRINEWS_BATCH_WAIT_MS" in out.stdout  # made from ServeSettings
    out = subprocess.run(
        [sys.executable, "-m", "distrinews.serve", "--batch-wait-ms", "-5"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2 and "batch_wait_ms" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(
    shutil.which("distrinews-serve") is None
    and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "distrinews-serve")),
    reason="console script distrinews-serve not installed (pip install -e .)",
)
def test_console_script_exists():
    exe = shutil.which("distrinews-serve") or os.path.join(os.path.dirname(sys.executable), "distrinews-serve")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "distrinews-serve" in out.stdout


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
