r"""Does averaging the weights help the `cpu` profile? Live weights and several averages, side by side in ONE run.

Weight averaging changes nothing in training: the optimizer steps the live weights exactly as before, and each average
is a second copy updated after every step (by a hook torch calls after every optimizer step, with the update rules of
`torch.optim.swa_utils`; the training script itself is not changed). So one run measures the
live model and every average on the same trajectory, the same held-out rows and the same batches: the differences are
paired, not two noisy runs against each other.

    DISTRINEWS_PROFILE=cpu python benchmarks/weight_averaging.py --validation-size 2000    # ~20 min on 2 CPU cores
    # other settings, another seed (another held-out draw), written elsewhere: the JSON records the settings it ran
    DISTRINEWS_LR=1.5e-4 DISTRINEWS_LABEL_SMOOTHING=0.1 \
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
    import copy

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from distrinews.model import get_config, load_tokenizer, pick_device, pick_precision
    from distrinews.scale import SEARCHED  # what the study searches (no Ray or Optuna needed to import it)
    from distrinews.scripts import train_single  # notebook 03's script: the run is that script's `train`

    cfg = get_config(
        args.profile,
        validation_size=args.validation_size,
        eval_split="validation",
        seed=args.seed,
        output_dir=str(ROOT / "runs" / "weight_averaging"),
    )
    device = pick_device()
    precision = pick_precision(cfg.precision, device)
    # the rows the script evaluates on (the same loader it builds), here to compare predictions row by row
    _, validation_dl, _ = train_single.make_loaders(cfg, load_tokenizer(cfg.model_name), device, precision, 0, 1)
    averages = {}  # name -> [its copy of every trained tensor, the steps it has averaged], from the first step on
    index = {}  # id of a trained tensor -> its place in the averages' lists (the optimizer's order)
    seconds_averaging = [0.0]
    epochs = []

    @torch.no_grad()
    def average(optimizer, *_):
        "After each optimizer step (torch's global hook: the script is not touched), every average takes the weights."
        started, live = time.perf_counter(), [p for group in optimizer.param_groups for p in group["params"]]
        if not averages:
            index.update({id(p): i for i, p in enumerate(live)})
            averages.update({f"ema {d}": [None, 0] for d in args.decays})
            averages["mean of the last epoch"] = [None, 0]  # SWA's equal-weight mean
        for name, avg in averages.items():
            if not name.startswith("ema") and len(epochs) < cfg.epochs - 1:  # `epochs` has a row per finished epoch
                continue
            if avg[0] is None:  # an average starts as a copy of the weights
                avg[0] = [p.detach().clone() for p in live]
            else:  # ema: avg += (1 - decay) (p - avg), torch's `get_ema_multi_avg_fn`; the mean: (p - avg) / (n + 1)
                weight = 1 - float(name.split()[1]) if name.startswith("ema") else 1 / (avg[1] + 1)
                for a, p in zip(avg[0], live):
                    a.lerp_(p, weight)
            avg[1] += 1
        seconds_averaging[0] += time.perf_counter() - started

    @torch.inference_mode()
    def predictions(model):
        model.eval()
        preds, labels = [], []
        for batch in validation_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            labels.append(batch.pop("labels"))
            preds.append(model(**batch).logits.argmax(-1))
        return torch.cat(preds), torch.cat(labels)

    def compare(metrics, live):
        live_pred, labels = predictions(live)
        row = dict(epoch=metrics["epoch"], step=metrics["step"], live=(live_pred == labels).sum().item() / len(labels))
        for name, (tensors, steps) in averages.items():
            if not steps:
                continue
            averaged = copy.deepcopy(live)  # the live model with the average's values in its trained tensors
            with torch.no_grad():
                for p, q in zip(live.parameters(), averaged.parameters()):
                    if id(p) in index:
                        q.copy_(tensors[index[id(p)]])
            pred, _ = predictions(averaged)
            row[name] = (pred == labels).sum().item() / len(labels)
            # paired: rows only the average gets right vs rows only the live weights get right
            row[f"{name} wins/losses"] = [
                int(((pred == labels) & (live_pred != labels)).sum()),
                int(((pred != labels) & (live_pred == labels)).sum()),
            ]
        epochs.append(row)
        print(" | ".join(f"{k} {v:.2%}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)

    started = time.perf_counter()
    hook = register_optimizer_step_post_hook(average)
    try:
        run = train_single.train(cfg, device, resume="no", on_epoch_end=compare)
    finally:
        hook.remove()
    result = dict(
        profile=cfg.profile,
        model=cfg.model_name,
        seed=cfg.seed,
        validation_rows=args.validation_size,
        train_rows=cfg.train_size - args.validation_size,
        epochs=cfg.epochs,
        effective_batch=cfg.batch_size * cfg.grad_accum,
        settings={k: getattr(cfg, k) for k in SEARCHED},  # the keys of the study's trials
        steps=run.step,
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
