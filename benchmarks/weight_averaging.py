r"""Does averaging the weights help the `cpu` profile? Live weights and several averages, side by side in ONE run.

Weight averaging changes nothing in training: the optimizer steps the live weights exactly as before, and each average
is a second copy updated after every step (torch's own `torch.optim.swa_utils.AveragedModel`). So one run measures the
live model and every average on the same trajectory, the same held-out rows and the same batches: the differences are
paired, not two noisy runs against each other.

    DISTRINEWS_PROFILE=cpu python benchmarks/weight_averaging.py --validation-size 2000    # ~20 min on 2 CPU cores
    # other settings, another seed (another held-out draw), written elsewhere: the JSON records the settings it ran
    DISTRINEWS_OVERRIDES='{"lr": 1.5e-4, "label_smoothing": 0.1}' \
        python benchmarks/weight_averaging.py --seed 7 --out runs/x.json

The rows come from the training split (`--validation-size`, stratified, never trained on): this chooses settings, so the
test split is not touched. The one check on the test rows that followed the choice is recorded by hand as `test_check`
in the JSON (see notebook 11), so write further runs elsewhere with `--out`. One process with batch 32 takes the
optimizer steps of the profile's real job (run_ddp.sh with `--global-batch-size 32`: 2 DDP ranks x 16 rows).
Results: benchmarks/results/weight_averaging_cpu.json.
"""

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu", help="smoke: a one-minute check of the script itself")
    p.add_argument("--validation-size", type=int, default=2000)
    p.add_argument(
        "--seed", type=int, default=42, help="the run's seed: the head, dropout, data order and which rows are held out"
    )
    p.add_argument(
        "--decays",
        type=float,
        nargs="+",
        default=[0.95, 0.98, 0.99, 0.995],
        help="exponential moving averages to track (1 / (1 - decay) steps is about what each one remembers)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "weight_averaging_cpu.json")
    args = p.parse_args(argv)
    import torch
    from torch.optim.swa_utils import AveragedModel

    from distrinews.model import get_config
    from distrinews.scale import SEARCHED  # what the study searches (no Ray or Optuna needed to import it)
    from distrinews.train import make_trainer, make_weight_average

    cfg = get_config(
        args.profile,
        validation_size=args.validation_size,
        eval_split="validation",
        seed=args.seed,
        output_dir=str(ROOT / "runs" / "weight_averaging"),
    )
    trainer = make_trainer(cfg)
    live = trainer.unwrapped
    averages = {f"ema {d}": make_weight_average(live, d) for d in args.decays}  # what `ema_decay` keeps (notebook 03)
    averages["mean of the last epoch"] = AveragedModel(
        live
    )  # SWA's equal-weight mean, from the last epoch's first step
    seconds_averaging = [0.0]

    def update(tr):
        started = time.perf_counter()
        for name, avg in averages.items():
            if name.startswith("ema") or tr.epoch == cfg.epochs - 1:
                avg.update_parameters(live)
        seconds_averaging[0] += time.perf_counter() - started

    @torch.inference_mode()
    def predictions(model):
        model.eval()
        preds, labels = [], []
        for batch in trainer.test_dl:
            labels.append(batch.pop("labels"))
            preds.append(model(**batch).logits.argmax(-1))
        return torch.cat(preds), torch.cat(labels)

    epochs = []

    def compare(tr, metrics):
        live_pred, labels = predictions(live)
        row = dict(epoch=metrics["epoch"], step=metrics["step"], live=(live_pred == labels).sum().item() / len(labels))
        for name, avg in averages.items():
            if avg.n_averaged.item() == 0:
                continue
            pred, _ = predictions(avg.module)
            row[name] = (pred == labels).sum().item() / len(labels)
            # paired: rows only the average gets right vs rows only the live weights get right
            row[f"{name} wins/losses"] = [
                int(((pred == labels) & (live_pred != labels)).sum()),
                int(((pred != labels) & (live_pred == labels)).sum()),
            ]
        live.train()
        epochs.append(row)
        print(" | ".join(f"{k} {v:.2%}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)

    started = time.perf_counter()
    trainer.fit(on_epoch_end=compare, on_step_end=update)
    result = dict(
        profile=cfg.profile,
        model=cfg.model_name,
        seed=cfg.seed,
        validation_rows=args.validation_size,
        train_rows=cfg.train_size - args.validation_size,
        epochs=cfg.epochs,
        effective_batch=cfg.batch_size * cfg.grad_accum,
        settings={k: getattr(cfg, k) for k in SEARCHED},  # the keys of the study's trials
        steps=trainer.step,
        decays=args.decays,
        per_epoch=epochs,
        wall_s=round(time.perf_counter() - started, 1),
        averaging_s=round(seconds_averaging[0], 1),
        machine=f"{platform.machine()}, torch {torch.__version__}",
        written=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
