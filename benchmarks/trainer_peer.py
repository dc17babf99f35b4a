"""The course's training script against Hugging Face's `Trainer`, on the same work, side by side in one run.

A learner's first question about a hand-written loop is "why not just use `transformers.Trainer`?". This measures
the answer. Both sides fine-tune the same encoder from the same seed on the same rows (the script's own tokenized
dataset), for the same epochs, batch and micro-batches, learning rate, linear warmup and decay, weight decay,
clipping, fused AdamW, length-grouped batches (in one process the very same batches: `Trainer` gets the script's
sampler, see `SameBatches`), precision, threads and data loader settings (the script's `loader_options`: its
collator, pinned memory and workers on a GPU); both are evaluated by the same code (`evaluate_counts`) on the same test
rows. Each side as its users run it: the script with its defaults (its word embeddings frozen; in the `cpu` profile, no
dropout and its two lowest layers frozen), `Trainer` training every weight with the model's own dropout;
`--variant "--freeze-layers 0 --no-freeze-word-embeddings"` adds the script training every weight too. Each run is a
fresh process; the sides alternate (script, Trainer, Trainer, script, ...), and each round has its own seed, the same
for both sides, so that each side's seed-to-seed spread is measured before a difference between them is called a
result. Checked: both sides trained the same rows in the same
number of optimizer steps.

The figure of a run is its training samples/s over the epoch's loop (the script's `metrics.json`; for `Trainer`, a
callback times from its first epoch's start to its last epoch's end, after the device has finished), evaluation
outside it on both sides. `--workers 2` runs train_ddp.py under torchrun against `Trainer` under torchrun.

    HF_HUB_OFFLINE=1 DISTRINEWS_DATA_DIR=../shared/data/ag_news python benchmarks/trainer_peer.py   # cpu profile
    python benchmarks/trainer_peer.py --workers 2 --out benchmarks/results/trainer_peer_ddp.json
    python benchmarks/trainer_peer.py --train-size 128 --test-size 64 --repeats 1 --out /tmp/peer.json   # smoke
    # a third side: the script and package of another checkout (e.g. before a change), same flags
    python benchmarks/trainer_peer.py --before /tmp/old-checkout
    # or the script with other flags: what one setting costs (here tracking to TensorBoard, against --report-to none)
    python benchmarks/trainer_peer.py --variant "--report-to tensorboard"
    python benchmarks/trainer_peer.py --variant=--no-group-by-length   # one flag alone: with `=`
"""

import argparse
import dataclasses
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report  # benchmarks/report.py, beside this script

ROOT = Path(__file__).resolve().parents[1]


def trainer_side(argv: list[str]):
    "Train with `Trainer` on what train_single.py's flags `argv` describe; write the script's metrics.json keys."
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_pt_utils import LengthGroupedSampler as TrainerSampler

    from distrinews.data import LengthGroupedSampler, load_tokenized_splits, loader_options
    from distrinews.model import config_from_args, pick_device, pick_precision
    from distrinews.train import evaluate_counts, load_model, metrics_from_counts, prepare_run, training_parser
    from distrinews.train import per_rank_batch_size as per_process_batch

    args = training_parser("trainer_peer.py").parse_args(argv)
    cfg, world = config_from_args(args), int(os.environ.get("WORLD_SIZE", 1))
    if args.dropout is None:  # Trainer as its users run it: the model's own dropout (the cpu profile turns it off)
        cfg = dataclasses.replace(cfg, dropout=None)
    device = pick_device(local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    precision = pick_precision(cfg.precision, device)
    prepare_run(cfg, "no")  # the script's own setup: threads, the data found, the output folder fresh
    accum = cfg.grad_accum  # the script's --grad-accum: as many micro-batches per optimizer step on both sides
    batch = per_process_batch(args.global_batch_size, world, accum) if args.global_batch_size else cfg.batch_size
    tokenizer, model = load_model(cfg, None, device)  # seeded, the same attention kernel as the script's
    model.requires_grad_(True)  # Trainer as its users run it: every weight trained (the script freezes word embeddings)
    train_ds, test_ds = load_tokenized_splits(cfg, tokenizer)
    steps = math.ceil(math.ceil(math.ceil(len(train_ds) / world) / batch) / accum) * cfg.epochs
    loader = loader_options(tokenizer, device, precision)
    sig = TrainingArguments.__init__.__code__.co_varnames  # transformers 5 renamed two settings
    version_specific = (dict(group_by_length=True) if "group_by_length" in sig
                        else dict(train_sampling_strategy="group_by_length"))  # fmt: skip
    settings = TrainingArguments(
        output_dir=cfg.output_dir, per_device_train_batch_size=batch, gradient_accumulation_steps=accum,
        num_train_epochs=cfg.epochs, learning_rate=cfg.lr,
        lr_scheduler_type="linear", warmup_steps=int(cfg.warmup_ratio * steps), weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, label_smoothing_factor=cfg.label_smoothing, optim="adamw_torch_fused",
        bf16=precision == "bf16", fp16=precision == "fp16", use_cpu=device.type == "cpu", seed=cfg.seed,
        dataloader_num_workers=loader["num_workers"], dataloader_pin_memory=loader["pin_memory"],
        dataloader_persistent_workers=loader["persistent_workers"], remove_unused_columns=False,
        save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True, logging_steps=max(steps, 1),
        **version_specific,
    )  # fmt: skip

    class EpochClock(TrainerCallback):
        "The training loop's wall time: the first epoch's start to the last epoch's end, the device's work included."

        def on_epoch_begin(self, *a, **kw):
            self.started = getattr(self, "started", time.perf_counter())

        def on_epoch_end(self, *a, **kw):
            if device.type == "cuda":
                torch.cuda.synchronize()
            self.seconds = time.perf_counter() - self.started

    class SameBatches(Trainer):
        """`Trainer` with the script's batches. In one process: the script's sampler itself (Trainer's own sorts
        `min(rows // (4 x batch), 50)` batches at a time, so below 6,400 rows it pads more: 11 % more tokens at 1,024
        rows). With workers, accelerate deals a sampler's batches to the ranks: Trainer's own sampler, its lengths read
        before the clock starts (given the dataset's column, it reads them a row at a time inside the epoch)."""

        def _get_train_sampler(self, train_dataset=None):
            if world == 1:
                return LengthGroupedSampler(train_ds, batch, num_replicas=1, rank=0, seed=cfg.seed)
            return TrainerSampler(batch, dataset=train_ds, lengths=[int(n) for n in train_ds["length"]])

    clock = EpochClock()
    trainer = SameBatches(model=model, args=settings, train_dataset=train_ds, data_collator=loader["collate_fn"],
                          callbacks=[clock])  # fmt: skip
    trainer.train()
    if trainer.is_world_process_zero():  # rank 0 evaluates every test row with the script's own code
        test_dl = torch.utils.data.DataLoader(test_ds, cfg.eval_batch_size, collate_fn=loader["collate_fn"])
        metrics = metrics_from_counts(evaluate_counts(trainer.model, test_dl, device, precision))
        samples = math.ceil(len(train_ds) / world) * world * cfg.epochs  # DistributedSampler pads to a multiple
        metrics.update(step=trainer.state.global_step, train_samples=samples, train_seconds=clock.seconds,
                       train_samples_per_s=samples / clock.seconds, precision=precision)  # fmt: skip
        Path(cfg.output_dir, "metrics.json").write_text(json.dumps([metrics]))


def command(side: str, flags: list[str], workers: int, checkout: Path = ROOT) -> list[str]:
    "The command line of one run of `side` (script or trainer), `workers` processes."
    script = "train_single.py" if workers == 1 else "train_ddp.py"
    program = [str(checkout / "nbs" / script)] if side != "trainer" else [__file__, "--trainer-side"]
    launcher = [sys.executable] if workers == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      f"--nproc_per_node={workers}"]  # fmt: skip
    return [*launcher, *program, *flags]


def run_once(cmd: list[str], output_dir: Path, env: dict) -> dict:
    p = subprocess.run([*cmd, "--output-dir", str(output_dir)], env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"exit status {p.returncode}: {shlex.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    epochs = json.loads((output_dir / "metrics.json").read_text())  # the script: a row per epoch; Trainer: one row
    m = epochs[-1] | {k: sum(e[k] for e in epochs) for k in ("train_samples", "train_seconds")}  # the whole run
    m["train_samples_per_s"] = m["train_samples"] / m["train_seconds"]
    keys = ("train_samples_per_s", "accuracy", "train_samples", "step", "train_seconds", "eval_count", "mfu")
    return {k: round(m[k], 4) if isinstance(m[k], float) else m[k] for k in keys if k in m}


def spread(values: list[float]) -> dict:
    return dict(median=round(statistics.median(values), 4), min=min(values), max=max(values),
                stdev=round(statistics.stdev(values), 4) if len(values) > 1 else None)  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="cpu")
    p.add_argument("--train-size", type=int, default=10_429, help="training rows (the cpu profile's)")
    p.add_argument("--test-size", type=int, default=None, help="test rows (default: all 7,600)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--precision", default="auto", help="fp32, bf16, fp16, or auto (the script's choice)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")
    p.add_argument("--workers", type=int, default=1, help="processes: 1 (train_single.py) or N (torchrun)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; each round one run per side, its own seed")
    p.add_argument("--model-name", default=None, help="the encoder (default: the profile's)")
    p.add_argument("--before", type=Path, help="a checkout whose script and package run as a third side")
    p.add_argument("--extra", default="", help="more flags for every side (e.g. '--log-every 1')")
    p.add_argument(
        "--variant", default="", help="a third side: the script with these flags (e.g. '--report-to tensorboard')"
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "trainer_peer.json"))
    a = p.parse_args(argv)
    if a.workers < 1 or a.repeats < 1:  # the other flags are the script's: it says what is wrong with them
        p.error(f"--workers {a.workers}, --repeats {a.repeats}: each must be 1 or more")
    flags = ["--profile", a.profile, "--train-size", str(a.train_size), "--epochs", str(a.epochs)]
    flags += ["--global-batch-size", str(a.global_batch_size), "--lr", str(a.lr), "--precision", a.precision]
    flags += ["--report-to", "none", *(["--test-size", str(a.test_size)] if a.test_size else [])]
    flags += [*(["--num-threads", str(a.threads)] if a.threads else []), *shlex.split(a.extra)]
    flags += ["--model-name", a.model_name] if a.model_name else []
    sides = {"script": ROOT, "trainer": ROOT, **({"before": a.before.resolve()} if a.before else {})}
    sides |= {"variant": ROOT} if a.variant else {}
    env = {
        name: dict(os.environ, PYTHONPATH=os.pathsep.join([str(c), os.environ.get("PYTHONPATH", "")]))
        for name, c in sides.items()
    }

    import torch  # after the arguments: --help needs no torch

    runs = []
    with tempfile.TemporaryDirectory(prefix="distrinews-trainer-peer-") as work:
        for r in range(a.repeats):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]  # ABBA: drifts in the machine's speed cancel
            for name in order:
                variant = shlex.split(a.variant) if name == "variant" else []  # last: it overrides the common flags
                cmd = command(name, [*flags, "--seed", str(r), *variant], a.workers, sides[name])
                m = run_once(cmd, Path(work) / f"{name}{r}", env[name])
                runs.append(dict(side=name, round=r + 1, seed=r, **m))
                print(f"[{r + 1}/{a.repeats}] {name:8} {m['train_samples_per_s']:9.1f} samples/s  accuracy "
                      f"{m['accuracy']:.2%}  ({m['train_samples']} rows, {m['step']} steps)", flush=True)  # fmt: skip
    work_done = {(x["train_samples"], x["step"], x["eval_count"]) for x in runs}
    if len(work_done) != 1:
        sys.exit(f"the sides did different work (rows, steps, test rows): {sorted(work_done)}")
    summary = {
        name: dict(samples_per_s=spread([x["train_samples_per_s"] for x in runs if x["side"] == name]),
                   accuracy=spread([x["accuracy"] for x in runs if x["side"] == name]))
        for name in sides
    }  # fmt: skip
    ratio = summary["script"]["samples_per_s"]["median"] / summary["trainer"]["samples_per_s"]["median"]
    accuracy_gap = report.paired_gap(dict(runs=runs), "script", "trainer")  # the median seed by seed
    seed_spread = max(summary[s]["accuracy"]["max"] - summary[s]["accuracy"]["min"] for s in ("script", "trainer"))
    within = abs(accuracy_gap) <= seed_spread if a.repeats > 1 else None  # one round: no spread measured
    verdict = {True: "within it", False: "beyond it", None: "one round: not measured"}[within]
    print(f"script / Trainer: {ratio:.2f}x samples/s; accuracy {accuracy_gap:+.2%} (seed-to-seed spread "
          f"{seed_spread:.2%}: {verdict})")  # fmt: skip
    median = {name: summary[name]["samples_per_s"]["median"] for name in sides}
    others = {name: round(median[name] / median["script"], 3) for name in sides if name not in ("script", "trainer")}
    for name, x in others.items():
        print(f"{name} / script: {x:.3f}x samples/s")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    from distrinews.model import config_from_args
    from distrinews.train import training_parser

    script = config_from_args(training_parser("trainer_peer.py").parse_args(flags))
    result = dict(benchmark="trainer_peer", workers=a.workers, settings=vars(a) | dict(before=str(a.before or "")),
                  flags=shlex.join(flags), runs=runs, summary=summary, ratio_script_over_trainer=round(ratio, 3),
                  accuracy_gap=round(accuracy_gap, 4), accuracy_seed_spread=round(seed_spread, 4),
                  accuracy_gap_within_spread=within, other_sides_over_script=others, gpu=gpu,
                  script_freezes_word_embeddings=script.freeze_word_embeddings,
                  script_dropout=script.dropout, script_freeze_layers=script.freeze_layers,
                  trainer_sampler="the script's" if a.workers == 1 else "Trainer's, lengths read first")  # fmt: skip
    report.save(result, a.out)  # with the machine and the date


if __name__ == "__main__":
    if sys.argv[1:2] == ["--trainer-side"]:
        trainer_side(sys.argv[2:])
    else:
        main()
