r"""DistriNews: fine-tune a news classifier on AG News with DistributedDataParallel.

Written by nbs/04_ddp.ipynb -- edit the notebook, not this file. Launch with torchrun:

  # one machine: 2 workers (CPU: gloo, 1 thread each; GPUs: nccl, one GPU each)
  torchrun --standalone --nproc_per_node=2 train_ddp.py --profile cpu --global-batch-size 32
  # fault tolerant: a snapshot every 50 steps; up to 3 restarts, each resuming from the latest snapshot
  torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py --profile cpu --save-every 50
  # two machines, 2 GPUs each: run on both (node_rank 0 on the first, 1 on the second), pointing at node 0
  # (open port 29500 between them)
  torchrun --nnodes=2 --node_rank=0 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 \
      --rdzv_id=news train_ddp.py --profile kaggle
  # without torchrun it is a plain single-process run (the same program as the `distrinews-train` command)
  python train_ddp.py --profile smoke

Every RunConfig field is a flag (--lr 5e-5, --epochs 3, --comm-hook bf16); `--help` lists them.
"""

from distrinews.ddp import main  # the command line: flags -> RunConfig -> train_distributed (notebook 04)

if __name__ == "__main__":
    main()
