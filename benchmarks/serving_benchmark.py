"""Serving benchmark: dynamic micro-batching on vs off, same model, same requests, one run.

Starts `distrinews.serve` twice on a free loopback port (once with micro-batching, once with `--no-batching`, where
the same worker takes one request at a time), sends the same AG News texts from N concurrent clients, and writes
throughput and p50/p99 latency to a JSON file (notebook 07 writes benchmarks/results/serving_c<clients>.json).
The servers are started by `distrinews.harness.server_process` (notebook 18), and the texts are AG News test items
read the way the course reads them.

    python benchmarks/serving_benchmark.py                          # untrained demo checkpoint, 32 clients
    python benchmarks/serving_benchmark.py --checkpoint runs/cpu/checkpoint --requests 2000
    python benchmarks/serving_benchmark.py --scrape-metrics-s 1     # and a third server, its /metrics read every second
"""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the servers load a local checkpoint: no hub call

from cli import run  # benchmarks/cli.py: one flag per parameter of the function

from distrinews.benchmarks import serving_benchmark  # the measuring code (notebook 07 exports it)

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    main_job = here.parent / "runs" / "cpu" / "checkpoint"  # the model `make main` trains, where it exists
    checkpoint = str(main_job) if (main_job / "config.json").exists() else ""
    run(serving_benchmark, checkpoint=checkpoint, out=str(here / "results"))  # a folder: serving_c<clients>.json in it
