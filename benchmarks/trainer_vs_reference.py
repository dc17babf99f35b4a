"""Training throughput: our trainer vs a plain training loop, same model, same samples, one run.

The plain loop (the original write-up's `dataset.py` + `train_one_epoch`) pads every item to 128 tokens
at tokenization time, draws random batches and trains in fp32. Ours pads each batch to its own longest item, groups
items of similar length into batches, and uses bf16 autocast where the hardware has it. Both take the same optimizer
steps on the same rows with the same model and batch size; we time only the steps (after warm-up), and report
samples/s and the ratio.

Warm-up matters here. oneDNN, PyTorch's CPU kernel library, compiles a kernel the first time it meets a new tensor
shape. The reference loop has one shape (every batch is 32 x 128), compiled during its warm-up steps; ours has one shape
per batch length, so its warm-up is one full pass over the rows. Timing a few steps after a short warm-up would charge
our trainer for compiling kernels that a real run compiles once, in its first epoch, and reuses in every later one.
By default each side times one full pass over the same rows (`--steps` = rows / batch size), so neither side gets a
luckier mix of short or long items.

    DISTRINEWS_DATA_DIR=../shared/data/ag_news .venv/bin/python benchmarks/trainer_vs_reference.py   # ~3 min, 2 cores
    .venv/bin/python benchmarks/trainer_vs_reference.py --samples 128 --batch-size 8 --out /tmp/smoke.json   # smoke
"""

from pathlib import Path

from distrinews.benchmarks import trainer_vs_reference  # the measuring code (notebook 07 exports it)

if __name__ == "__main__":
    trainer_vs_reference(out=Path(__file__).parent / "results" / "trainer_vs_reference.json")
