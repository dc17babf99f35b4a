"""Does the `cpu` profile cost what the settings it replaced cost? Both train side by side, in one process, on the same batches.

A tuned profile must not buy its accuracy with more training work. This builds a trainer for today's `cpu` profile and
one for `--previous` (the settings it replaced), checks that both see the same rows in the same batches, then times
`--steps` optimizer steps of each, alternating in rounds of `--round` steps (A B, B A, ...) so that a slow patch of the
machine hits both sides alike. The first round of each is a warm-up and is not counted. Written to
benchmarks/results/profile_cost.json.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 DISTRINEWS_DATA_DIR=../shared/data/ag_news .venv/bin/python benchmarks/profile_cost.py
"""
import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--previous", type=json.loads, default={"pooling": "cls"}, metavar="JSON",
                   help="the settings the profile replaced, on top of today's `cpu` profile")
    p.add_argument("--steps", type=int, default=60, help="timed optimizer steps per side")
    p.add_argument("--round", type=int, default=10, help="steps per side before switching")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "profile_cost.json")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch
    from distrinews.model import get_config
    from distrinews.train import make_trainer

    with tempfile.TemporaryDirectory() as tmp:
        configs = {"previous": get_config("cpu", **args.previous, output_dir=f"{tmp}/previous"),
                   "cpu": get_config("cpu", output_dir=f"{tmp}/cpu")}
        trainers = {name: make_trainer(cfg, progress=False, log=lambda *a: None) for name, cfg in configs.items()}
        # the same work on both sides: same rows, same batches in the same order, same number of optimizer steps
        batches = {name: [list(b) for b in t.train_dl.batch_sampler] for name, t in trainers.items()}
        if batches["previous"] != batches["cpu"]:
            sys.exit("profile_cost.py: the two settings batch the training rows differently; their step times would not compare.")
        totals = {name: dict(seconds=0.0, samples=0, steps=0) for name in trainers}
        names = list(trainers)
        for r in range(args.steps // args.round + 1):
            for name in (names if r % 2 == 0 else names[::-1]):
                trainer = trainers[name]
                metrics = trainer.train_epoch(stop_at_step=trainer.step + args.round)
                if r == 0: continue                                   # warm-up round: allocator, caches, first batches
                totals[name]["seconds"] += metrics["train_seconds"]
                totals[name]["samples"] += metrics["train_samples"]
                totals[name]["steps"] += args.round
        if totals["previous"]["samples"] != totals["cpu"]["samples"]:
            sys.exit(f"profile_cost.py: the sides trained different numbers of rows: {totals}")
    for t in totals.values(): t["samples_per_s"] = round(t["samples"] / t["seconds"], 2)
    result = dict(previous=args.previous, cpu={k: getattr(configs["cpu"], k) for k in args.previous},
                  rows_per_epoch=sum(map(len, batches["cpu"])), steps_per_epoch=len(batches["cpu"]), timed=totals,
                  time_ratio_cpu_over_previous=round(totals["cpu"]["seconds"] / totals["previous"]["seconds"], 3),
                  machine=f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
                  date=time.strftime("%Y-%m-%d"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{totals['cpu']['steps']} steps each, {totals['cpu']['samples']} rows each: previous {totals['previous']['seconds']:.1f} s, "
          f"cpu {totals['cpu']['seconds']:.1f} s, ratio {result['time_ratio_cpu_over_previous']:.3f} -> {args.out}")
    return result


if __name__ == "__main__":
    main()
