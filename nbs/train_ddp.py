"""DistriNews: fine-tune a news classifier on AG News with DistributedDataParallel.

Written by nbs/04_ddp.ipynb -- edit the notebook, not this file. Launch with torchrun:

  # one machine: 2 workers (CPU: gloo, 1 thread each; GPUs: nccl, one GPU each)
  torchrun --standalone --nproc_per_node=2 train_ddp.py --profile cpu --global-batch-size 32
  # fault tolerant: a snapshot every 50 steps; up to 3 restarts, each resuming from the latest snapshot
  torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py --profile cpu --save-every 50
  # two machines, 2 GPUs each: run on both, pointing at node 0 (open port 29500 between them)
  torchrun --nnodes=2 --node_rank=0 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 --rdzv_id=news train_ddp.py --profile kaggle
  torchrun --nnodes=2 --node_rank=1 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 --rdzv_id=news train_ddp.py --profile kaggle
  # without torchrun it is a plain single-process run
  python train_ddp.py --profile smoke
"""
import argparse
import sys

from distrinews.ddp import train_distributed
from distrinews.model import add_config_args, config_from_args


def main(argv=None):
    p = argparse.ArgumentParser(description="Fine-tune a news classifier on AG News with DDP (launch with torchrun).")
    add_config_args(p)
    p.add_argument("--global-batch-size", type=int, help="batch per optimizer step over all ranks (sets the per-rank batch)")
    p.add_argument("--backend", choices=["nccl", "gloo"], help="default: nccl with GPUs, gloo without")
    p.add_argument("--timeout", type=float, default=300, help="seconds a collective may wait for a missing rank")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in --output-dir and start over")
    p.add_argument("--simulate-failure-at-step", type=int, help="rank 1 kills itself at this step (fault-tolerance demo)")
    args = p.parse_args(argv)
    try:
        train_distributed(config_from_args(args), resume="no" if args.fresh else "auto", backend=args.backend,
                          global_batch_size=args.global_batch_size, timeout_s=args.timeout,
                          fail_at_step=args.simulate_failure_at_step)
    except (ValueError, RuntimeError) as e:
        sys.exit(f"train_ddp.py: error: {e}")


if __name__ == "__main__":
    main()
