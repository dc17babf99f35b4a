"""Training throughput: the course's training script vs a plain training loop, same model, same rows, one run.

The plain loop (the original write-up's `dataset.py` + `train_one_epoch`) pads every item to 128 tokens at tokenization
time, draws random batches and trains in fp32. `train_single.py` (notebook 03, the script a learner reads, as the course
installs it) pads each batch to its own longest item, groups items of similar length into batches, and uses bf16
autocast where the hardware has it. Both train the same rows (the plain loop gets the very rows the script loads, from
the script's own flags) with the same model and batch size, and both time one full pass over them: the same samples in
the same number of optimizer steps (checked; the run stops with an error otherwise). We report samples/s and the ratio.

Warm-up matters here. oneDNN, PyTorch's CPU kernel library, compiles a kernel the first time it meets a new tensor
shape. The plain loop has one shape (every batch is 32 x 128), compiled during its warm-up steps; the script has one
shape per batch length, so it warms up for one whole epoch and the second epoch is timed (by the script itself: its
`metrics.json`). Timing a few steps after a short warm-up would charge the script for compiling kernels that a real
run compiles once, in its first epoch, and reuses in every later one.

    DISTRINEWS_DATA_DIR=../shared/data/ag_news .venv/bin/python benchmarks/trainer_vs_reference.py   # ~3 min, 2 cores
    .venv/bin/python benchmarks/trainer_vs_reference.py --samples 128 --batch-size 8 --out /tmp/smoke.json   # smoke
"""

from pathlib import Path

from cli import run  # benchmarks/cli.py: one flag per parameter of the function

from distrinews.benchmarks import trainer_vs_reference  # the measuring code (notebook 07 exports it)

if __name__ == "__main__":
    run(trainer_vs_reference, out=str(Path(__file__).parent / "results" / "trainer_vs_reference.json"))
