"""Serving benchmark: dynamic micro-batching on vs off, same model, same requests, one run.

Starts `distrinews.serve` twice on a free loopback port (once with micro-batching, once with `--no-batching`, where
the same worker takes one request at a time), sends the same AG News texts from N concurrent clients, and writes
throughput and p50/p99 latency to a JSON file (notebook 07 writes benchmarks/results/serving_c<clients>.json).
The servers are started by the helper the tests use (tests/conftest.py), and the AG News CSVs are read with the
library's reader (`distrinews.data.read_agnews_csv`).

    python benchmarks/serving_benchmark.py                          # untrained demo checkpoint, 32 clients
    python benchmarks/serving_benchmark.py --checkpoint runs/cpu/checkpoint --requests 2000
"""

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
from conftest import fit_head, running_server  # noqa: E402   the tests' server launcher and linear probe

from distrinews.data import find_data_dir, read_agnews_csv  # noqa: E402


def agnews_dir() -> Path | None:
    "The local AG News folder ($DISTRINEWS_DATA_DIR, else ../shared/data/ag_news beside the repository), if any."
    folder = find_data_dir() or ROOT.parent / "shared" / "data" / "ag_news"
    return folder if (folder / "test.csv").is_file() and (folder / "train.csv").is_file() else None


def load_texts(n: int, max_words: int = 10, start: int = 0) -> list[str]:
    """`n` AG News test items read with the library's reader, from row `start` on, each cut to its first `max_words`
    words (0: whole). An item starts with its title, so 10 words is about a headline. Synthetic texts without data."""
    folder = agnews_dir()
    if folder is not None:
        texts, _ = read_agnews_csv(folder / "test.csv")
        cut = (lambda t: " ".join(t.split()[:max_words])) if max_words else (lambda t: t)
        return [cut(texts[(start + i) % len(texts)]) for i in range(n)]
    topics = ["oil prices and the markets", "the cup final", "a new smartphone chip", "peace talks in the region"]
    return [f"Story {i}: a report about {topics[i % 4]} with a few more words of context" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Connection:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams. The load generator shares the machine's CPUs with the
    server, so it should cost as little as possible per request (httpx costs ~10x more)."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.reader, self.writer = host, port, None, None

    async def post_json(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        return status, await self.reader.readexactly(length)

    def close(self):
        if self.writer is not None:
            self.writer.close()


async def load_test(url: str, texts: list[str], concurrency: int) -> tuple[list[float], dict, float]:
    "Send every text to /predict from `concurrency` clients (each waits for its answer before its next request)."
    host, port = url.split("//")[1].split(":")
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    latencies, statuses, next_index = [], {}, 0

    async def client():
        nonlocal next_index
        conn = Connection(host, int(port))
        try:
            while next_index < len(bodies):
                body = bodies[next_index]
                next_index += 1
                t0 = time.perf_counter()
                status, _ = await conn.post_json("/predict", body)
                latencies.append(time.perf_counter() - t0)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, statuses, time.perf_counter() - start


def summarize(latencies: list[float], statuses: dict, wall: float) -> dict:
    ms = lambda q: round(1000 * percentile(latencies, q), 2)
    ok = statuses.get(200, 0)
    return dict(
        requests=len(latencies),
        ok=ok,
        statuses={str(k): v for k, v in sorted(statuses.items())},
        wall_s=round(wall, 3),
        throughput_rps=round(ok / wall, 2),
        p50_ms=ms(0.5),
        p90_ms=ms(0.9),
        p99_ms=ms(0.99),
        max_ms=round(1000 * max(latencies), 2),
        mean_ms=round(1000 * statistics.mean(latencies), 2),
    )


def server_flags(batching: bool, args) -> list[str]:
    flags = [
        "--threads",
        str(args.threads),
        "--dtype",
        args.dtype,
        "--device",
        "cpu",
        "--log-level",
        "warning",
        "--queue-limit",
        str(max(256, 4 * args.concurrency)),
    ]
    return flags + (
        ["--batch-max-size", str(args.batch_max_size), "--batch-wait-ms", str(args.batch_wait_ms)]
        if batching
        else ["--no-batching"]
    )


def benchmark(checkpoint, texts, warmup, args) -> dict:
    """Both servers run side by side (an idle one costs nothing); the measured requests go to them in alternating rounds,
    so a change in background load on a shared machine hits both modes alike."""
    modes = {"on": True, "off": False}
    with contextlib.ExitStack() as stack:
        urls = {
            name: stack.enter_context(running_server(checkpoint, *server_flags(b, args))) for name, b in modes.items()
        }
        for url in urls.values():
            asyncio.run(load_test(url, warmup, args.concurrency))
        health = {name: httpx.get(url + "/health") for name, url in urls.items()}
        for name, h in health.items():
            if h.status_code != 200:
                raise RuntimeError(f"the batching={name} server has no model: {h.json()['error']}")
        before = {name: h.json() for name, h in health.items()}
        pooled = {name: ([], {}, 0.0) for name in modes}
        rounds = [texts[i :: args.rounds] for i in range(args.rounds)]
        per_round = {name: [] for name in modes}
        for i, chunk in enumerate(rounds):
            for name in list(modes) if i % 2 == 0 else list(modes)[::-1]:
                lat, st, wall = asyncio.run(load_test(urls[name], chunk, args.concurrency))
                all_lat, all_st, all_wall = pooled[name]
                all_lat += lat
                for k, v in st.items():
                    all_st[k] = all_st.get(k, 0) + v
                pooled[name] = (all_lat, all_st, all_wall + wall)
                per_round[name].append(round(st.get(200, 0) / wall, 1))
        after = {name: httpx.get(url + "/health").json() for name, url in urls.items()}
    runs = {}
    for name in modes:
        r = summarize(*pooled[name])
        b0, b1 = before[name]["batching"], after[name]["batching"]
        passes = b1["batches"] - b0["batches"]
        r.update(
            throughput_per_round=per_round[name],
            forward_passes=passes,
            mean_batch=round((b1["items"] - b0["items"]) / max(1, passes), 2),
            largest_batch=b1["largest_batch"],
            dtype=after[name]["dtype"],
            model=f"{after[name]['model_name']} {after[name]['model_version']}",
        )
        runs[name] = r
    return runs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint", help="checkpoint folder (default: runs/cpu/checkpoint if it exists, else an untrained demo)"
    )
    p.add_argument(
        "--fit-head",
        type=int,
        default=1,
        help="without --checkpoint: fit the demo model's head on 1024 "
        "AG News items first (a linear probe, ~10 s), so it predicts like a trained model (0: leave it untrained)",
    )
    p.add_argument("--requests", type=int, default=2048, help="measured requests per mode")
    p.add_argument("--rounds", type=int, default=4, help="the requests are sent in this many rounds, alternating modes")
    p.add_argument("--warmup", type=int, default=256, help="unmeasured requests per server first")
    p.add_argument(
        "--max-words",
        type=int,
        default=10,
        help="clients send the first N words of each AG News test "
        "item: 10 is about its headline, what the demo page gets (0: the whole item)",
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads in the server")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--batch-max-size", type=int, default=32)
    p.add_argument("--batch-wait-ms", type=float, default=5)
    p.add_argument("--out", help="the JSON file to write (default: benchmarks/results/serving_c<concurrency>.json)")
    args = p.parse_args(argv)
    args.out = args.out or str(ROOT / "benchmarks" / "results" / f"serving_c{args.concurrency:02d}.json")

    checkpoint = args.checkpoint
    if checkpoint is None and (ROOT / "runs" / "cpu" / "checkpoint" / "config.json").exists():
        checkpoint = ROOT / "runs" / "cpu" / "checkpoint"
    if checkpoint is None:
        from distrinews.inference import make_demo_checkpoint

        checkpoint = make_demo_checkpoint(Path(tempfile.mkdtemp(prefix="distrinews-bench-")) / "demo")
        if args.fit_head and agnews_dir() is not None:  # a linear probe on 1024 training items, so it predicts like a
            checkpoint = fit_head(checkpoint, checkpoint.parent / "probe", n=1024)  # trained model (bf16 check!)
    texts = load_texts(args.requests, args.max_words)
    warmup = load_texts(args.warmup, args.max_words, start=args.requests)
    print(f"{args.requests} requests from {args.concurrency} concurrent clients, checkpoint {checkpoint}")

    load_before = os.getloadavg()[0]
    runs = benchmark(checkpoint, texts, warmup, args)
    for name, r in runs.items():
        print(
            f"batching {name:>3}: {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:8.1f} ms  p90 {r['p90_ms']:8.1f} ms"
            f"  p99 {r['p99_ms']:8.1f} ms  max {r['max_ms']:8.1f} ms  per round {r['throughput_per_round']}"
            f"  mean batch {r['mean_batch']:5.1f}  statuses {r['statuses']}"
        )
    speedup = runs["on"]["throughput_rps"] / runs["off"]["throughput_rps"]
    p99_ratio = runs["on"]["p99_ms"] / runs["off"]["p99_ms"]
    import torch

    report = dict(
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; 1-min load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other jobs share the machine)",
        settings=dict(vars(args), checkpoint=str(checkpoint)),
        runs=runs,
        speedup=round(speedup, 2),
        p99_on_over_off=round(p99_ratio, 3),
        targets={"throughput >= 4x": speedup >= 4, "p99 with batching <= without": p99_ratio <= 1},
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"speed-up {speedup:.2f}x, p99 on/off {p99_ratio:.2f}  ->  {out}")
    return report


if __name__ == "__main__":
    main()
