"""What test_ddp.py proves in a process group of 3 ranks, in one torchrun job: one checkpoint evaluated on every rank
with train_ddp.py's own `make_loaders` and `evaluate` (the summed metrics), then `replicas_in_sync` on a layer that one
rank changes by 1e-6 (every rank must see it). Rank 0 writes both to OUT.json. test_ddp.py calls `evaluate_checkpoint`
in a group of one in its own process: the reference the 3 ranks must equal.

torchrun --standalone --nproc_per_node=3 tests/ddp_eval_worker.py CHECKPOINT OUT.json --test-size 203
"""

import argparse
import json

import torch
import torch.distributed as dist

from distrinews.ddp import init_options, replicas_in_sync
from distrinews.model import build_classifier, get_config, load_tokenizer
from distrinews.scripts.train_ddp import evaluate, make_loaders


def evaluate_checkpoint(checkpoint, test_size: int) -> dict:
    "This rank's part of the evaluation of `checkpoint` on `test_size` test rows: the summed metrics, and its rows."
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    cfg = get_config(
        "smoke", train_size=64, test_size=test_size, eval_batch_size=16, precision="fp32", output_dir="/tmp/unused"
    )
    tok = load_tokenizer(checkpoint)
    if rank != 0:  # as in train_ddp.py: rank 0 alone fills the tokenization cache, the others read it after
        dist.barrier()
    _, test_dl, _ = make_loaders(cfg, tok, device, "fp32", rank, world_size)
    if rank == 0:
        dist.barrier()
    metrics = evaluate(build_classifier(checkpoint), test_dl, device, "fp32")
    return dict(metrics, world_size=world_size, rank0_items=sum(len(b["labels"]) for b in test_dl))


def replica_check() -> dict:
    "Are identical replicas found in sync, and replicas of which rank 1 changed one weight by 1e-6 found apart?"
    m = torch.nn.Linear(4, 2)
    torch.manual_seed(0)
    m.reset_parameters()
    same = replicas_in_sync(m)
    with torch.no_grad():
        if dist.get_rank() == 1:
            m.weight[0, 0] += 1e-6
    return dict(same=same, diverged=not replicas_in_sync(m))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--test-size", type=int, default=203)
    a = p.parse_args()
    dist.init_process_group("gloo", **init_options())  # as train_ddp.py: a restarted attempt gets a store of its own
    try:
        result = evaluate_checkpoint(a.checkpoint, a.test_size)
        replicas = [None] * dist.get_world_size()
        dist.all_gather_object(replicas, replica_check())  # what each rank found
        if dist.get_rank() == 0:
            json.dump(dict(result, replicas=replicas), open(a.out, "w"))
        dist.barrier()  # all ranks leave together: none closes its connections while rank 0 still writes
    finally:
        dist.destroy_process_group()
