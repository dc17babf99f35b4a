"""Run the benchmark notebook (nbs/07_benchmarks.ipynb) with papermill over a matrix of parameters, keep each executed
notebook in benchmarks/runs/, then render benchmarks/README.md and the PNG charts from benchmarks/results/*.json.

    # the real thing, ~30 min on 2 cores
    HF_HUB_OFFLINE=1 DISTRINEWS_DATA_DIR=../shared/data/ag_news .venv/bin/python benchmarks/run.py
    .venv/bin/python benchmarks/run.py --smoke --out /tmp/bench    # tiny parameters, ~2 min
    .venv/bin/python benchmarks/run.py --only serving              # one row of the matrix
    .venv/bin/python benchmarks/run.py --dry-run                   # check the rows against the notebook, run nothing
    # a run of your own: a row with some of 07's parameters changed (a value is read as JSON, else as a string)
    .venv/bin/python benchmarks/run.py --only training -p measure ddp -p averaging '["allreduce", "fp16"]' --out /tmp/b
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import papermill as pm
import report  # benchmarks/report.py, beside this script

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE.parent / "nbs" / "07_benchmarks.ipynb"

# one executed notebook per row; measurements that compete for the CPU run in separate rows, one after the other
MATRIX = {
    "training": dict(measure="trainer,ddp", world_sizes=[1, 2], threads_per_rank=1, steps=20, trainer_samples=1024),
    # the same scaling run with 4 micro-batches per all-reduce (no_sync): what accumulation does to DDP's overhead
    # (5 steps x 4 micro-batches x 2 ranks x 32: the same 1,280 rows as the plain run)
    "ddp-accumulation": dict(measure="ddp", world_sizes=[1, 2], threads_per_rank=1, grad_accum=4, steps=5),
    "accuracy": dict(profile="cpu", measure="accuracy"),
    # serves runs/cpu/checkpoint (the main job's model) when it exists, else a demo model
    "serving": dict(measure="serving", serving_clients=[1, 8, 32], serving_requests=1024),
    # what reading /metrics every second costs a server under load (a third server, the same as batching on)
    "serving-scrape": dict(measure="serving", serving_clients=[8], serving_requests=8192, serving_scrape_s=1.0),
    "gpu": dict(measure="gpu"),
}
SMOKE = {
    "smoke": dict(
        profile="smoke",
        measure="trainer,ddp,accuracy,serving,gpu",
        world_sizes=[1, 2],
        steps=2,
        warmup=1,
        ddp_warmup=0,
        batch_size=8,
        trainer_samples=32,
        serving_clients=[4],
        serving_requests=16,
    ),
}


def parameter(pair: list[str]) -> tuple:
    "`-p NAME VALUE`: the value as JSON (a number, a list, true), else as the string it is."
    name, value = pair
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def check_parameters(matrix: dict, notebook: Path = NOTEBOOK):
    "Stop before measuring anything if a row sets a parameter the notebook's `parameters` cell does not declare."
    declared = set(pm.inspect_notebook(str(notebook)))
    for name, params in matrix.items():
        unknown = sorted(set(params) - declared)
        if unknown:
            sys.exit(f"row {name!r} sets {unknown}, which {notebook.name} does not declare (it has {sorted(declared)})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny parameters, output into --out (default: a temp folder)")
    p.add_argument("--only", nargs="+", help=f"rows of the matrix to run: {sorted(MATRIX)}")
    p.add_argument("--out", help="folder for results/, runs/ and the report (default: benchmarks/ itself)")
    p.add_argument(
        "--dry-run", action="store_true", help="check the rows against the notebook, print them, run nothing"
    )
    p.add_argument(
        "-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
        help="change one of 07's parameters in every row run (VALUE as JSON, else a string)",
    )  # fmt: skip
    a = p.parse_args(argv)
    matrix = SMOKE if a.smoke else {k: v for k, v in MATRIX.items() if not a.only or k in a.only}
    if a.only and not matrix:
        p.error(f"--only: choose from {sorted(MATRIX)}")
    matrix = {name: dict(params, **dict(map(parameter, a.parameter))) for name, params in matrix.items()}
    check_parameters(matrix)
    if os.environ.get("DISTRINEWS_DATA_DIR"):  # from where this was started: the notebook runs in nbs/
        os.environ["DISTRINEWS_DATA_DIR"] = str(Path(os.environ["DISTRINEWS_DATA_DIR"]).expanduser().resolve())
    if a.dry_run:
        print(json.dumps(matrix, indent=1))
        return None
    out = Path(a.out or (tempfile.mkdtemp(prefix="distrinews-bench-") if a.smoke else HERE)).resolve()
    results, runs = out / "results", out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    for name, params in matrix.items():
        print(f"== {name}: {params}", flush=True)
        executed = runs / f"07_benchmarks-{name}.ipynb"
        pm.execute_notebook(
            NOTEBOOK,
            executed,
            parameters=dict(params, out_dir=str(results)),
            cwd=NOTEBOOK.parent,
            progress_bar=False,
            log_output=False,
        )
        # one way to make an executed notebook fit to commit, shared with `make course`
        subprocess.run([sys.executable, str(HERE.parent / "tools" / "course.py"), "--tidy", str(executed)], check=True)
    report.render(results, out)
    print(f"report: {out / 'README.md'}")
    return out


if __name__ == "__main__":
    main()
