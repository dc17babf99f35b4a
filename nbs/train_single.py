"""Fine-tune a news classifier on AG News in one process: one GPU, or the CPU's cores.

Notebook 03 writes train_single.py and notebook 04 train_ddp.py: `diff -u train_single.py train_ddp.py` shows every
line that DDP adds. Every RunConfig field is a flag (--lr 5e-5, --epochs 3, --precision bf16); --help lists them.

  python train_single.py --profile cpu --global-batch-size 32
  python train_single.py --profile cpu --save-every 50   # a snapshot every 50 steps: run it again to resume
"""

import itertools
import math
import time

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from tqdm.auto import tqdm

from distrinews.ddp import step_profiler
from distrinews.data import LengthGroupedSampler, load_tokenized_splits, loader_options
from distrinews.model import config_from_args, make_grad_scaler, pick_device, pick_precision
from distrinews.tracking import Tracker, peak_flops, training_flops
from distrinews.train import (
    autocast, check_config, check_finite_loss, check_finite_weights, clear_errors, epoch_metrics,
    evaluate_counts, load_model, make_optimizer, make_scheduler, metrics_from_counts,
    optimizer_step, per_rank_batch_size, prepare_run, simulate_failure, training_parser,
)  # fmt: skip
from distrinews.checkpoint import checkpoint_dir, resume_from, rng_state, save_checkpoint, training_state, write_metrics


def make_loaders(cfg, tokenizer, device, precision, rank, world_size):
    "The training rows, shuffled every epoch and split between the ranks, and the test rows, each on exactly one rank."
    train_ds, test_ds = load_tokenized_splits(cfg, tokenizer)  # tokenized once and cached; test rows sorted by length
    shard = dict(num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
    if cfg.group_by_length:  # DistributedSampler with one change: similar lengths in a batch, so little padding
        sampler = LengthGroupedSampler(train_ds, cfg.batch_size, **shard)
    else:
        sampler = DistributedSampler(train_ds, **shard)
    train_dl = DataLoader(train_ds, cfg.batch_size, sampler=sampler, **loader_options(tokenizer, device, precision))
    test_ds = test_ds.shard(world_size, rank, contiguous=False)  # every world_size-th row: balanced lengths
    test_dl = DataLoader(test_ds, cfg.eval_batch_size, **loader_options(tokenizer, device, precision))
    return train_dl, test_dl, sampler


def evaluate(model, test_dl, device, precision) -> dict:
    "Loss, accuracy, per-class accuracy and confusion matrix over every test row."
    counts = evaluate_counts(model, test_dl, device, precision)  # this rank's loss sum and confusion matrix
    return metrics_from_counts(counts)


def train(cfg, device, resume="auto", fail_at_step=None, on_epoch_end=None, report_to="none", profile_steps=0):
    "Train `cfg` to its last epoch (resuming from its checkpoint if there is one); returns the run's progress."
    rank, world_size = 0, 1  # one process: train_ddp.py gets these two numbers from torchrun
    master_process = rank == 0
    log = print if master_process else lambda *args: None
    precision = pick_precision(cfg.precision, device)
    checkpoint = prepare_run(cfg, resume, tidy=master_process)  # the folder checked, the checkpoint found (or None)
    tokenizer, model = load_model(cfg, checkpoint, device)  # downloads the model once (the hub's cache)
    train_dl, test_dl, sampler = make_loaders(cfg, tokenizer, device, precision, rank, world_size)

    raw_model = model  # the model itself: what the optimizer steps and the checkpoint holds
    optimizer = make_optimizer(raw_model, cfg.lr, cfg.weight_decay, cfg.layer_lr_decay)
    total_steps = math.ceil(len(train_dl) / cfg.grad_accum) * cfg.epochs
    scheduler = make_scheduler(optimizer, total_steps, int(cfg.warmup_ratio * total_steps))
    scaler = make_grad_scaler(precision, device)  # fp16 only: scales the loss so that small gradients survive
    run = resume_from(checkpoint, cfg, train_dl.dataset, rank, world_size, optimizer, scheduler, scaler, log)
    tracker = Tracker(cfg, report_to, run.step, rank)  # --report-to: TensorBoard or W&B, from rank 0 only
    steps_to_log = []  # (step, loss, lr, gradient norm), the tensors still on the device until they are read
    profiler = step_profiler(cfg, profile_steps, rank)  # --profile-steps N: a timeline of N steps, a trace per rank
    row_flops = training_flops(raw_model, train_dl.dataset["length"]) / len(train_dl.dataset)  # per training row
    peak, peak_source = peak_flops(device, precision)  # one process's: the job's is world_size times this

    def read_steps():
        "Read the steps' losses from the device: one wait for the GPU every --log-every steps, not one per step."
        values = torch.stack([torch.stack([loss, norm.float()]) for _, loss, _, norm in steps_to_log]).tolist()
        steps = [(step, loss, lr, norm) for (step, _, lr, _), (loss, norm) in zip(steps_to_log, values)]
        for step, loss, _, _ in steps:
            check_finite_loss(loss, step, precision)
            run.train_log.append((step, loss))
        tracker.log_steps(steps, samples * world_size)
        steps_to_log.clear()

    def save_snapshot():
        "A resumable checkpoint: weights, optimizer, schedule, the place in the data and the random streams."
        check_finite_weights(raw_model, run.step)  # a diverged run must not overwrite the last good checkpoint
        rng_states = [rng_state()]
        if master_process:
            state = training_state(run, optimizer, scheduler, scaler, rng_states)
            save_checkpoint(checkpoint_dir(cfg), raw_model, tokenizer, cfg, state)

    log(f"{world_size} process(es) x batch {cfg.batch_size} x {cfg.grad_accum} accumulation, {device}, {precision}, "
        f"peak {world_size * peak / 1e12:.3g} TFLOP/s ({world_size} x {peak_source})")  # fmt: skip
    for epoch in range(run.epoch, cfg.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch
        model.train()
        loss_sum, batches, samples, started = torch.zeros((), device=device), 0, 0, time.perf_counter()
        bar = tqdm(total=len(train_dl), initial=run.batches_done, desc=f"epoch {epoch + 1}/{cfg.epochs}",
                   disable=not master_process, leave=False, mininterval=2)  # fmt: skip
        for i, batch in enumerate(itertools.islice(train_dl, run.batches_done, None), start=run.batches_done):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            labels = batch.pop("labels")
            last_micro_batch = (i + 1) % cfg.grad_accum == 0 or i + 1 == len(train_dl)  # then the optimizer steps
            micro_batches = min(cfg.grad_accum, len(train_dl) - i + i % cfg.grad_accum)  # fewer in the last step
            with autocast(device, precision):
                logits = model(**batch).logits
            loss = torch.nn.functional.cross_entropy(logits.float(), labels, label_smoothing=cfg.label_smoothing)
            scaler.scale(loss / micro_batches).backward()  # the gradient of the step's mean loss
            loss_sum, batches, samples = loss_sum + loss.detach(), batches + 1, samples + len(labels)
            run.batches_done = i + 1
            bar.update()
            if last_micro_batch:
                lr = scheduler.get_last_lr()[0]  # this step's learning rate (optimizer_step moves the schedule on)
                grad_norm = optimizer_step(optimizer, scaler, scheduler, raw_model, cfg.max_grad_norm)  # clip, step
                run.step += 1
                steps_to_log.append((run.step, loss.detach().float(), lr, grad_norm))
                saving = cfg.save_every and run.step % cfg.save_every == 0 and i + 1 < len(train_dl)  # the last: below
                if run.step % cfg.log_every == 0 or saving or i + 1 == len(train_dl):
                    read_steps()  # and check that the loss is finite: a diverged run stops within --log-every steps
                profiler.step()
                simulate_failure(fail_at_step, run.step, rank)  # the fault-tolerance demo (--simulate-failure-at-step)
                if saving:
                    save_snapshot()
        bar.close()
        totals = torch.tensor([loss_sum.item(), batches, samples], dtype=torch.float64, device=device)
        seconds = time.perf_counter() - started  # after .item(), which waits until the device has done the epoch's work
        run.epoch, run.batches_done = epoch + 1, 0
        metrics = dict(epoch=run.epoch, step=run.step, **epoch_metrics(totals, seconds))
        metrics["mfu"] = row_flops * metrics["train_samples_per_s"] / (world_size * peak)  # model-FLOPs utilisation
        metrics.update(evaluate(raw_model, test_dl, device, precision))
        run.history.append(metrics)
        tracker.log_epoch(metrics)  # logged before the checkpoint: a crash in between logs it again, after a purge
        save_snapshot()
        if master_process:
            print(write_metrics(cfg, run))  # metrics.json, the training curves and a line for this epoch
        if on_epoch_end is not None:  # Optuna prunes a poor trial here, Ray Train reports to its driver
            on_epoch_end(metrics, raw_model)
    tracker.close()
    profiler.stop()
    return run


def main(argv=None):
    args = training_parser("train_single.py").parse_args(argv)
    cfg, device = config_from_args(args), pick_device()
    if args.check:  # check the configuration and stop: one clear message before any real work
        return check_config(cfg, device)
    if args.global_batch_size is not None:
        cfg.batch_size = per_rank_batch_size(args.global_batch_size, 1, cfg.grad_accum)
    train(cfg, device, args.resume, args.simulate_failure_at_step, None, args.report_to, args.profile_steps)


if __name__ == "__main__":
    with clear_errors("train_single.py"):  # a mistake ends with one line saying what to change, not a traceback
        main()
