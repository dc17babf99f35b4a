"""`torch.compile` measured alone: the scripts' training step, eager against compiled, on the same batches in one run.

nanoGPT compiles its model, and issue #36 lists it among the changes to measure before keeping one. This trains two
copies of the profile's model from the same seed, one as the scripts run it and one wrapped in `torch.compile` (with
its defaults: a shape it has not seen compiles again, and after the first such shape the lengths become dynamic), on
the very batches `train_single.py` draws (its tokenized rows, its length-grouped sampler, its collator), with the
scripts' own forward pass, loss, clipping, fused AdamW and schedule. Each side first makes one whole warm-up pass over
the rows: what a run's first epoch pays (compiling, and oneDNN's kernel for each new shape on both sides). Then
`--repeats` timed passes per side, alternating (eager, compiled, compiled, eager, ...), so that a drift of the
machine's speed hits both alike. Checked: both sides trained the same rows in the same steps, and their mean losses
agree. The figure is training samples/s per pass; the ratio is compiled over eager, medians.

    HF_HUB_OFFLINE=1 DISTRINEWS_DATA_DIR=../shared/data/ag_news OMP_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/compile_step.py --precision bf16 --out benchmarks/results/compile_cpu_bf16.json
    .venv/bin/python benchmarks/compile_step.py --train-size 64 --repeats 1 --out /tmp/compile.json   # smoke
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import report  # benchmarks/report.py, beside this script


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="cpu")
    p.add_argument("--train-size", type=int, default=1024)
    p.add_argument("--precision", default="auto", help="fp32, bf16, fp16, or auto (the scripts' choice)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per side, after one warm-up pass each")
    p.add_argument("--out", default="benchmarks/results/compile_step.json")
    a = p.parse_args(argv)
    if a.repeats < 1 or a.train_size < 1:
        p.error(f"--repeats {a.repeats}, --train-size {a.train_size}: each must be 1 or more")

    # a cache of its own: the warm-up pass compiles as a learner's first run does (the default cache outlives a run)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="distrinews-inductor-"))
    import torch
    from torch.utils.data import DataLoader

    from distrinews.data import LengthGroupedSampler, load_tokenized_splits, loader_options
    from distrinews.model import get_config, make_grad_scaler, pick_device, pick_precision
    from distrinews.train import autocast, load_model, make_optimizer, make_scheduler, optimizer_step

    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = get_config(a.profile, use_env=False, train_size=a.train_size, test_size=8)
    device = pick_device()
    precision = pick_precision(a.precision, device)
    tokenizer = load_model(cfg, device=device)[0]
    rows = load_tokenized_splits(cfg, tokenizer)[0]
    sampler = LengthGroupedSampler(rows, cfg.batch_size, num_replicas=1, rank=0, seed=cfg.seed)
    batches = list(DataLoader(rows, cfg.batch_size, sampler=sampler, **loader_options(tokenizer, device, precision)))

    def side(compiled: bool):
        "A training pass over `batches` for a fresh model (same seed on both sides): returns (seconds, mean loss)."
        model = load_model(cfg, device=device)[1].train()
        forward = torch.compile(model) if compiled else model
        optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay, cfg.layer_lr_decay)
        scheduler = make_scheduler(optimizer, len(batches) * (a.repeats + 1), int(cfg.warmup_ratio * len(batches)))
        scaler = make_grad_scaler(precision, device)

        def one_pass():
            losses, started = [], time.perf_counter()
            for batch in batches:
                batch = {k: v.to(device) for k, v in batch.items()}
                labels = batch.pop("labels")
                with autocast(device, precision):
                    logits = forward(**batch).logits
                loss = torch.nn.functional.cross_entropy(logits.float(), labels, label_smoothing=cfg.label_smoothing)
                scaler.scale(loss).backward()
                optimizer_step(optimizer, scaler, scheduler, model, cfg.max_grad_norm)
                losses.append(loss.detach())
            mean = torch.stack(losses).mean().item()  # waits for the device: the pass's work is done
            return time.perf_counter() - started, mean

        return one_pass

    passes = {"eager": side(False), "compiled": side(True)}
    warmup = {name: dict(zip(("seconds", "loss"), map(lambda x: round(x, 4), f()))) for name, f in passes.items()}
    runs = []
    for r in range(a.repeats):
        for name in passes if r % 2 == 0 else list(passes)[::-1]:  # ABBA
            seconds, loss = passes[name]()
            runs.append(dict(side=name, round=r + 1, samples_per_s=round(len(rows) / seconds, 3), loss=round(loss, 5)))
            print(f"[{r + 1}/{a.repeats}] {name:8} {runs[-1]['samples_per_s']:8.1f} samples/s  loss {loss:.4f}")
    for name, w in warmup.items():
        print(f"warm-up pass, {name}: {w['seconds']:.1f} s")
    losses = [[x["loss"] for x in runs if x["side"] == name] for name in passes]
    if any(abs(e - c) > 0.02 * max(abs(e), 1e-3) for e, c in zip(*losses)):  # bf16 rounds differently, not this much
        sys.exit(f"the two sides' mean losses part ways (eager, compiled): {losses}")
    summary = {name: report_spread([x["samples_per_s"] for x in runs if x["side"] == name]) for name in passes}
    ratio = summary["compiled"]["median"] / summary["eager"]["median"]
    first = warmup["eager"]["seconds"] / warmup["compiled"]["seconds"]
    print(f"compiled / eager: {ratio:.3f}x samples/s after the warm-up pass; in the warm-up pass {first:.3f}x")
    result = dict(benchmark="compile_step", settings=vars(a) | dict(precision=precision, rows=len(rows)),
                  steps_per_pass=len(batches), shapes=len({tuple(b["input_ids"].shape) for b in batches}),
                  warmup=warmup, runs=runs, summary=summary, ratio_compiled_over_eager=round(ratio, 3),
                  warmup_ratio_compiled_over_eager=round(first, 3), torch_version=torch.__version__,
                  gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)  # fmt: skip
    report.save(result, a.out)  # with the machine and the date


def report_spread(values: list[float]) -> dict:
    return dict(median=round(statistics.median(values), 3), min=min(values), max=max(values))


if __name__ == "__main__":
    main()
