"""Training throughput: our trainer vs the reference design's loop, same model, same samples, one run.

The reference design's loop (../shared/reference/, `dataset.py` + `train_one_epoch`) pads every item to 128 tokens at
tokenization time, draws random batches and trains in fp32. Ours pads each batch to its own longest item, groups items of
similar length into batches, and uses bf16 autocast where the hardware has it. Both take the same optimizer steps on the
same rows with the same model and batch size; we time only the steps (after warm-up), and report samples/s and the ratio.

Warm-up matters here. oneDNN, PyTorch's CPU kernel library, compiles a kernel the first time it meets a new tensor
shape. The reference loop has one shape (every batch is 32 x 128), compiled during its warm-up steps; ours has one shape
per batch length, so its warm-up is one full pass over the rows. Timing a few steps after a short warm-up would charge
our trainer for compiling kernels that a real run compiles once, in its first epoch, and reuses in every later one.
By default each side times one full pass over the same rows (`--steps` = rows / batch size), so neither side gets a
luckier mix of short or long items.

    DISTRINEWS_DATA_DIR=../shared/data/ag_news .venv/bin/python benchmarks/trainer_vs_reference.py            # ~3 min on 2 cores
    .venv/bin/python benchmarks/trainer_vs_reference.py --samples 128 --batch-size 8 --out /tmp/smoke.json    # smoke
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from distrinews.data import load_agnews, stratified_subset
from distrinews.model import OFFLINE_ENCODER, build_classifier, get_config, load_tokenizer
from distrinews.train import Trainer, make_trainer


def reference_loop(model_name, texts, labels, batch_size, steps, warmup, lr=2e-5, seed=0):
    "The reference design's loop: pad to 128 up front, shuffled DataLoader, fp32 AdamW. Returns samples/s over `steps`."
    torch.manual_seed(seed)
    tokenizer, model = load_tokenizer(model_name), build_classifier(model_name, seed=seed)
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=128, return_tensors="pt")
    ds = torch.utils.data.TensorDataset(enc["input_ids"], enc["attention_mask"], torch.tensor(labels))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    done, samples, started = 0, 0, None
    while done < warmup + steps:
        for input_ids, attention_mask, y in loader:
            if done == warmup:
                started, samples = time.perf_counter(), 0
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=y).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            samples += len(y)
            if done == warmup + steps:
                break
    return samples / (time.perf_counter() - started)


def our_trainer(model_name, n_samples, batch_size, steps, precision="auto", seed=0):
    "Our `Trainer` on the same rows (a stratified subset of the train split): samples/s over `steps` optimizer steps."
    cfg = get_config(
        "cpu",
        use_env=False,
        model_name=model_name,
        train_size=n_samples,
        test_size=64,
        batch_size=batch_size,
        precision=precision,
        seed=seed,
        epochs=2,
        output_dir=tempfile.mkdtemp(prefix="distrinews-bench-trainer-"),
    )
    trainer = make_trainer(cfg, progress=False, log=lambda *a: None)
    trainer.train_epoch()  # warm-up: one pass, so every batch shape has met the kernels once
    # the next pass over the same rows (same batches, new order), timed
    return trainer.train_epoch(stop_at_step=trainer.step + steps)["train_samples_per_s"], trainer.precision


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=OFFLINE_ENCODER)
    p.add_argument("--samples", type=int, default=1024, help="rows of the local train split to use (stratified)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, help="timed optimizer steps for each side (default: one pass over --samples)")
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed steps of the reference loop (ours warms up for one pass)"
    )
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "trainer_vs_reference.json"))
    a = p.parse_args(argv)
    a.steps = a.steps or a.samples // a.batch_size
    if a.samples < a.batch_size * a.steps:
        p.error(f"--samples must cover the timed steps: at least {a.batch_size * a.steps}")
    torch.set_num_threads(a.threads)
    rows = stratified_subset(load_agnews("train"), a.samples, seed=0)
    ref = reference_loop(a.model, list(rows["text"]), list(rows["label"]), a.batch_size, a.steps, a.warmup)
    ours, precision = our_trainer(a.model, a.samples, a.batch_size, a.steps)
    result = dict(
        benchmark="trainer_vs_reference",
        model=a.model,
        samples=a.samples,
        batch_size=a.batch_size,
        timed_steps=a.steps,
        threads=a.threads,
        reference_samples_per_s=round(ref, 2),
        ours_samples_per_s=round(ours, 2),
        ours_precision=precision,
        speedup=round(ours / ref, 2),
        machine=dict(
            cpu=platform.processor() or platform.machine(),
            cores=os.cpu_count(),
            capability=torch.backends.cpu.get_cpu_capability(),
            torch=torch.__version__,
            gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        ),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"reference loop (pad to 128, fp32, random batches): {ref:7.1f} samples/s")
    print(f"our trainer ({precision}, length-grouped, dynamic padding): {ours:7.1f} samples/s")
    print(f"speed-up: {ours / ref:.2f}x   -> {a.out}")
    return result


if __name__ == "__main__":
    main()
