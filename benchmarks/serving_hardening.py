"""Serving hardening, measured: the server of this checkout vs an older one, same model, same requests, one run.

Issue #25 added work to every request (reading its deadlines, watching for a client that leaves, the request guard).
This script measures what that costs where it matters: throughput under load, and the server's CPU time per request
(which other jobs on a shared machine barely move). It starts `distrinews.serve` from this checkout ("new") and from
another checkout of the repository ("old", e.g. a git worktree of the commit before), both with micro-batching,
serving the same checkpoint, and sends the same AG News texts from N concurrent clients in alternating rounds (new,
old, old, new, ...) so that background load on a shared machine hits both alike. The load generator, the texts and the
statistics are those of the serving benchmark (notebook 07: `distrinews.harness`, notebook 18). It writes
benchmarks/results/serving_hardening_c<clients>.json with the ratios new/old.

    git worktree add /tmp/serve-old a7d3b3a
    python benchmarks/serving_hardening.py --old-checkout /tmp/serve-old --checkpoint runs/cpu/checkpoint
"""

import argparse
import contextlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the servers load a local checkpoint: no hub call

from distrinews.harness import http_json, load_test, load_texts, server_process, summarize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def commit(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def cpu_seconds(pid: int) -> float:
    "User + system CPU time of process `pid` so far (Linux /proc): unlike throughput, barely moved by other jobs."
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-checkout", required=True, help="another checkout of the repository, e.g. a git worktree")
    p.add_argument("--checkpoint", default=str(ROOT / "runs" / "cpu" / "checkpoint"), help="the checkpoint both serve")
    p.add_argument("--requests", type=int, default=2048, help="measured requests per server")
    p.add_argument("--rounds", type=int, default=8, help="the requests are sent in this many rounds, alternating")
    p.add_argument("--warmup", type=int, default=256, help="unmeasured requests per server first")
    p.add_argument("--max-words", type=int, default=10, help="the first N words of each AG News test item (0: all)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads in each server")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--out", help="default: benchmarks/results/serving_hardening_c<concurrency>.json")
    args = p.parse_args(argv)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"serving_hardening_c{args.concurrency:02d}.json")
    checkouts = {"new": ROOT, "old": Path(args.old_checkout).resolve()}
    flags = ["--threads", str(args.threads), "--dtype", args.dtype, "--device", "cpu", "--log-level", "warning"]
    flags += ["--queue-limit", str(max(256, 4 * args.concurrency))]
    flags += ["--checkpoint", str(Path(args.checkpoint).resolve())]
    texts = load_texts(args.requests, args.max_words)
    warmup = load_texts(args.warmup, args.max_words, start=args.requests)
    load_before = os.getloadavg()[0]
    pooled = {name: ([], {}, 0.0) for name in checkouts}
    per_round = {name: [] for name in checkouts}
    with contextlib.ExitStack() as stack:
        urls, pids, cpu = {}, {}, {name: 0.0 for name in checkouts}
        for name, checkout in checkouts.items():  # each server imports distrinews from its own checkout
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            server = stack.enter_context(server_process(*flags, env=env, cwd=checkout))
            urls[name], pids[name] = server.url, server.process.pid
        health = {name: http_json(url + "/health") for name, url in urls.items()}
        for name, (status, h) in health.items():
            if status != 200:
                raise RuntimeError(f"the {name} server has no model: {h.get('error')}")
        versions = {name: h["model_version"] for name, (_, h) in health.items()}
        for url in urls.values():
            load_test(url, warmup, args.concurrency)
        rounds = [texts[i :: args.rounds] for i in range(args.rounds)]
        for i, chunk in enumerate(rounds):
            for name in list(checkouts) if i % 2 == 0 else list(checkouts)[::-1]:
                used = cpu_seconds(pids[name])
                lat, st, wall = load_test(urls[name], chunk, args.concurrency)
                cpu[name] += cpu_seconds(pids[name]) - used
                all_lat, all_st, all_wall = pooled[name]
                for k, v in st.items():
                    all_st[k] = all_st.get(k, 0) + v
                pooled[name] = (all_lat + lat, all_st, all_wall + wall)
                per_round[name].append(round(st.get(200, 0) / wall, 1))
        after = {name: http_json(url + "/health")[1] for name, url in urls.items()}
    runs = {}
    for name in checkouts:
        runs[name] = dict(
            summarize(*pooled[name]),
            throughput_per_round=per_round[name],
            commit=commit(checkouts[name]),
            dtype=after[name]["dtype"],
            model=f"{after[name]['model_name']} {versions[name]}",
            largest_batch=after[name]["batching"]["largest_batch"],
            server_cpu_ms_per_request=round(1000 * cpu[name] / args.requests, 3),
        )
        print(
            f"{name}: {runs[name]['throughput_rps']:8.1f} req/s  p50 {runs[name]['p50_ms']:7.1f} ms  "
            f"p99 {runs[name]['p99_ms']:7.1f} ms  server CPU {runs[name]['server_cpu_ms_per_request']:.2f} ms/request  "
            f"per round {per_round[name]}  statuses {runs[name]['statuses']}"
        )
    ratio = runs["new"]["throughput_rps"] / runs["old"]["throughput_rps"]
    round_ratios = [round(a / b, 3) for a, b in zip(per_round["new"], per_round["old"])]
    cpu_ratio = runs["new"]["server_cpu_ms_per_request"] / runs["old"]["server_cpu_ms_per_request"]
    import torch

    # no machine's absolute path in a committed JSON: the checkpoint inside the clone by its path there, else its name
    in_clone = lambda p: os.path.relpath(p, ROOT) if Path(p).resolve().is_relative_to(ROOT) else Path(p).name  # noqa: E731
    report = dict(
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; 1-min load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other jobs share the machine)",
        compared=f"this checkout ({runs['new']['commit']} + working tree) vs {runs['old']['commit']}, both batching",
        settings=dict(
            vars(args), old_checkout=f"a checkout of {runs['old']['commit']}", checkpoint=in_clone(args.checkpoint)
        ),
        same_model=versions["new"] == versions["old"],
        runs=runs,
        throughput_new_over_old=round(ratio, 3),
        throughput_new_over_old_per_round=round_ratios,
        throughput_new_over_old_median_round=sorted(round_ratios)[len(round_ratios) // 2],
        server_cpu_per_request_new_over_old=round(cpu_ratio, 3),
        p99_new_over_old=round(runs["new"]["p99_ms"] / runs["old"]["p99_ms"], 3),
        targets={"throughput >= 0.95x of the old server's": ratio >= 0.95},
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"throughput new/old {ratio:.3f} (per round {round_ratios}); server CPU per request new/old {cpu_ratio:.3f}")
    print(f"-> {out}")
    return report


if __name__ == "__main__":
    main()
