"""The real hyper-parameter search for the `cpu` profile, written to benchmarks/results/tuning_cpu.json.

The `cpu` profile's model (`sentence-transformers/all-MiniLM-L6-v2`) and data (the 10,429 training rows), of which
`--validation-size` rows (1,000 by default) are held out, stratified, to choose on: the test split is never used. Each
trial trains at most `--max-epochs` epochs (3: the profile's budget), reports its validation accuracy after every epoch,
and the median rule prunes the poor ones (see nbs/11_scale_out.ipynb).

    # one machine, one GPU: a SQLite file (a journal file works too: --storage journal:runs/tuning_cpu.log)
    python benchmarks/tune_cpu_profile.py --trials 24 --storage sqlite:///runs/tuning_cpu.db --device cuda
    # several machines or GPUs: the same line on each (CUDA_VISIBLE_DEVICES=k) against one PostgreSQL server, with
    # --no-write on all but one; then run once more with --trials 0 to write the JSON of the whole study
    python benchmarks/tune_cpu_profile.py --trials 12 --storage postgresql+psycopg://optuna:PW@db:5432/optuna --no-write

Needs torch, transformers, datasets and optuna (no Ray, no PostgreSQL driver unless the storage is PostgreSQL).
Running it again with the same storage and study adds trials to the study and rewrites the JSON with all of them.
"""

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def study_json(study) -> dict:
    "Every trial of `study` (state, settings, validation accuracy per epoch), the best one and the study's notes."
    trials = [
        dict(
            number=t.number,
            state=t.state.name,
            params=t.params,
            value=t.value,
            val_accuracy=[t.intermediate_values[k] for k in sorted(t.intermediate_values)],
            seconds=t.duration.total_seconds() if t.duration else None,
            retry_of=t.system_attrs.get("failed_trial"),  # a copy of a trial whose worker died
            recorded=t.user_attrs.get("recorded"),  # a trial added by hand says how
        )
        for t in study.get_trials(deepcopy=False)
    ]
    best = max((t for t in trials if t["state"] == "COMPLETE"), key=lambda t: t["value"], default=None)
    states = dict(sorted(Counter(t["state"] for t in trials).items()))
    return dict(study=study.study_name, trials=trials, best=best, states=states, notes=dict(study.user_attrs))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--storage",
        default=f"sqlite:///{ROOT / 'runs' / 'tuning_cpu.db'}",
        help="postgresql+psycopg://..., sqlite:///FILE.db or journal:FILE.log",
    )
    p.add_argument("--study", default="cpu-minilm")
    p.add_argument("--trials", type=int, default=24, help="trials this process runs (0: only write the JSON)")
    p.add_argument("--validation-size", type=int, default=1000)
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--startup-trials", type=int, default=4, help="finished trials before the pruner stops any")
    p.add_argument(
        "--warmup-epochs",
        type=int,
        default=1,
        help="epochs every trial runs before it may be pruned (1: judged from epoch 2 on; slow starters can win)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--sampler-seed", type=int, help="the sampler's seed (give each process its own)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tuning_cpu.json")
    p.add_argument("--no-write", action="store_true", help="run trials only (the other workers of a shared study)")
    p.add_argument(
        "--baseline",
        action="store_true",
        help="queue today's `cpu` settings as a trial first, so the study measures them on the same rows",
    )
    p.add_argument(
        "--enqueue",
        type=json.loads,
        action="append",
        default=[],
        metavar="JSON",
        help='queue settings to try before the sampler\'s own, e.g. \'{"lr": 2e-4, "label_smoothing": 0.1}\'',
    )
    args = p.parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch looks for GPUs
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA GPU is visible here.")
    from distrinews.model import get_config
    from distrinews.scale import SEARCHED, StorageError, open_storage, open_study, tune_worker

    base = get_config(
        "cpu",
        validation_size=args.validation_size,
        epochs=args.max_epochs,
        output_dir=str(ROOT / "runs" / "tuning_cpu"),
    )
    started = time.perf_counter()
    try:
        storage = open_storage(args.storage)
        study = open_study(storage, args.study, args.startup_trials, args.sampler_seed, args.warmup_epochs)
        queued = ([{k: getattr(base, k) for k in SEARCHED}] if args.baseline else []) + args.enqueue
        for settings in queued:  # tried before the sampler's own suggestions (settings left out are sampled)
            study.enqueue_trial(settings, skip_if_exists=True)
        tune_worker(study, args.trials, base)
    except StorageError as e:
        sys.exit(f"tune_cpu_profile.py: error: {e}")
    if args.no_write:
        return
    summary = study_json(study)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    summary.update(
        profile="cpu",
        model=base.model_name,
        train_rows=base.train_size,
        validation_rows=args.validation_size,
        max_epochs=args.max_epochs,
        eval_split="validation",
        pruner=f"median (after {args.startup_trials} finished trials, from epoch {args.warmup_epochs + 1})",
        machine=f"{platform.machine()}, {device}, torch {torch.__version__}",
        wall_seconds_this_process=round(time.perf_counter() - started),
        written=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    best = summary["best"]
    print(
        f"{len(summary['trials'])} trials {summary['states']}; best: trial {best['number']}, validation accuracy "
        f"{best['value']:.2%}, {best['params']} -> {args.out}"
        if best
        else f"no finished trial yet -> {args.out}"
    )


if __name__ == "__main__":
    main()
