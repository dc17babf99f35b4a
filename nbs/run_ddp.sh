#!/usr/bin/env bash
# Launch train_ddp.py with torchrun on this machine: one worker per GPU, or 2 CPU workers (gloo) without GPUs.
#   bash run_ddp.sh --profile cpu --global-batch-size 32         NPROC=4 bash run_ddp.sh ...   (override the count)
# Written by nbs/04_ddp.ipynb -- edit the notebook, not this file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
nproc="${NPROC:-$([ "$gpus" -gt 0 ] && echo "$gpus" || echo 2)}"
# CPU workers share the cores, each its share of threads (torchrun would give each 1, leaving the others idle)
threads=$(( $(getconf _NPROCESSORS_ONLN) / nproc ))
[ "$gpus" -gt 0 ] || export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}"
# check the configuration once before starting workers: a mistake gives one clear message, not one per worker
python "$here/train_ddp.py" "$@" --check
exec torchrun --standalone --nproc_per_node="$nproc" --max-restarts="${MAX_RESTARTS:-0}" "$here/train_ddp.py" "$@"
