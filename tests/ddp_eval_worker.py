"""Evaluate one checkpoint on every rank of a torchrun job and write the summed metrics (rank 0). Used by test_ddp.py.

torchrun --standalone --nproc_per_node=3 tests/ddp_eval_worker.py CHECKPOINT OUT.json --test-size 203
"""

import argparse
import json

from distrinews.data import build_dataloaders
from distrinews.ddp import DDPTrainer, cleanup_distributed, setup_distributed
from distrinews.model import build_classifier, get_config, load_tokenizer

p = argparse.ArgumentParser()
p.add_argument("checkpoint")
p.add_argument("out")
p.add_argument("--test-size", type=int, default=203)
a = p.parse_args()
info = setup_distributed()
try:
    cfg = get_config(
        "smoke", train_size=64, test_size=a.test_size, eval_batch_size=16, precision="fp32", output_dir="/tmp/unused"
    )
    tok = load_tokenizer(a.checkpoint)
    train_dl, test_dl = build_dataloaders(cfg, tok, num_replicas=info.world_size, rank=info.rank)
    trainer = DDPTrainer(cfg, build_classifier(a.checkpoint), tok, train_dl, test_dl, dist_info=info, progress=False)
    metrics = trainer.evaluate()
    local = sum(len(b["labels"]) for b in test_dl)
    if info.is_main:
        json.dump(dict(metrics, world_size=info.world_size, rank0_items=local), open(a.out, "w"))
finally:
    cleanup_distributed()
