"""Evaluate one checkpoint on every rank of a torchrun job with train_ddp.py's own `make_loaders` and `evaluate`, and
write the summed metrics (rank 0). Used by test_ddp.py.

torchrun --standalone --nproc_per_node=3 tests/ddp_eval_worker.py CHECKPOINT OUT.json --test-size 203
"""

import argparse
import json

import torch
import torch.distributed as dist

from distrinews.model import build_classifier, get_config, load_tokenizer
from distrinews.scripts.train_ddp import evaluate, make_loaders

p = argparse.ArgumentParser()
p.add_argument("checkpoint")
p.add_argument("out")
p.add_argument("--test-size", type=int, default=203)
a = p.parse_args()
dist.init_process_group("gloo")
try:
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    cfg = get_config(
        "smoke", train_size=64, test_size=a.test_size, eval_batch_size=16, precision="fp32", output_dir="/tmp/unused"
    )
    tok = load_tokenizer(a.checkpoint)
    _, test_dl, _ = make_loaders(cfg, tok, device, "fp32", rank, world_size)
    metrics = evaluate(build_classifier(a.checkpoint), test_dl, device, "fp32")
    local = sum(len(b["labels"]) for b in test_dl)
    if rank == 0:
        json.dump(dict(metrics, world_size=world_size, rank0_items=local), open(a.out, "w"))
finally:
    dist.destroy_process_group()
