"""Experiment tracking from rank 0 (`--report-to`): `check_tracking` reads back what a torchrun job that lost workers
and resumed from its snapshots logged (test_ddp_fault_tolerance.py's job: one job proves both): every optimizer step
exactly once, with the values the run itself kept (the checkpoint's loss per step, `metrics.json` per epoch), and
nothing from rank 1. Read back with TensorBoard's own reader and from the offline W&B run files. And the timeline of
`--profile-steps`: an all-reduce per bucket per step on each rank."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # a torchrun job
HAS_WANDB = importlib.util.find_spec("wandb") is not None


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file: a 7-byte header, then records in LevelDB's log format (blocks of
    32 KiB; each piece with a 7-byte header: checksum, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, pos, piece, rows = run_file.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        piece, pos = piece + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = Record.FromString(piece)
            piece = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def check_tracking(out: Path, steps: int, resumed_from: int, attempts: int):
    """What a job of `steps` optimizer steps in `attempts` attempts, the last resumed from step `resumed_from`, must
    have logged with `--report-to tensorboard,wandb`, read back from its files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    from distrinews.checkpoint import load_training_state
    from distrinews.train import make_scheduler

    runs = out / "runs"
    # one events file per attempt, all rank 0's: a writer on rank 1 would have made twice as many
    assert len(list(runs.glob("events.out.tfevents.*"))) == attempts, sorted(os.listdir(runs))
    acc = EventAccumulator(str(runs), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    state, cfg = load_training_state(out / "checkpoint")
    history = json.loads((out / "metrics.json").read_text())
    assert all(0 < m["mfu"] < 1 for m in history), history  # the model-FLOPs utilisation, a share of the peak

    losses = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    every = list(range(1, steps + 1))
    assert [s for s, _ in losses] == every  # every step exactly once: those logged again replace the first ones
    assert [s for s, _ in state["train_log"]] == every
    assert [v for _, v in losses] == pytest.approx([v for _, v in state["train_log"]], rel=1e-6)  # the run's own
    for tag in ("train/grad_norm", "train/samples_per_s"):
        values = [e.value for e in acc.Scalars(tag)]
        assert len(values) == steps and all(0 < v < float("inf") for v in values), (tag, values)
    # the learning rate each step used: the run's schedule (the same function, its saved configuration)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg["lr"])
    schedule, lrs = make_scheduler(opt, steps, int(cfg["warmup_ratio"] * steps)), []
    for _ in range(steps):
        lrs.append(schedule.get_last_lr()[0])
        opt.step()
        schedule.step()
    assert [e.value for e in acc.Scalars("train/learning_rate")] == pytest.approx(lrs, rel=1e-6)
    for m in history:  # every number of metrics.json, at the epoch's last step
        for k, v in m.items():
            if isinstance(v, (int, float)) and k != "step":
                event = acc.Scalars(f"epoch/{k}")[m["epoch"] - 1]
                assert (event.step, event.value) == (m["step"], pytest.approx(v, rel=1e-6)), k
        for label, v in m["per_class_accuracy"].items():
            assert acc.Scalars(f"epoch/accuracy/{label}")[m["epoch"] - 1].value == pytest.approx(v, rel=1e-6)
    tables = acc.Tensors("epoch/confusion/text_summary")
    assert [t.step for t in tables] == [m["step"] for m in history]
    for t, m in zip(tables, history):
        rows = t.tensor_proto.string_val[0].decode().split("\n")[2:]
        assert [[int(x) for x in row.strip("| ").split(" | ")[1:]] for row in rows] == m["confusion"]
    hparams = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]  # the configuration, logged once
    hparams = HParamsPluginData.FromString(hparams).session_start_info.hparams
    assert (hparams["lr"].number_value, hparams["model_name"].string_value) == (cfg["lr"], cfg["model_name"])

    if not HAS_WANDB:  # (the `track` extra, which `make venv` installs, has it)
        return print("wandb is not installed (pip install wandb): the TensorBoard half passed")
    run_id = (runs / "wandb_run_id").read_text()
    folders = sorted((runs / "wandb").glob("offline-run-*"))
    assert [f.name.rsplit("-", 1)[1] for f in folders] == [run_id] * attempts  # one per attempt, one run id: rank 0's
    losses = dict(state["train_log"])
    *killed, resumed = ([r for r in wandb_history(f / f"run-{run_id}.wandb") if "train/loss" in r] for f in folders)
    # the last attempt: the steps after its snapshot, each once, with the run's values and the epoch's metrics
    expected = [(s, pytest.approx(losses[s])) for s in range(resumed_from + 1, steps + 1)]
    assert [(r["_step"], r["train/loss"]) for r in resumed] == expected
    assert resumed[-1]["epoch/accuracy"] == pytest.approx(history[-1]["accuracy"])
    # a killed attempt: what its writer had flushed (every 0.5 s) before the kill, a run of steps from where the
    # attempt began (step 1, or after a snapshot), each once, with the values of the run (a resume is exact: a step
    # logged again has the same value)
    for attempt, rows in enumerate(killed, 1):
        logged = [r["_step"] for r in rows]
        first = 1 if attempt == 1 else (logged or [0])[0]
        assert logged == list(range(first, first + len(logged))) and len(logged) < steps, (attempt, logged)
        assert [r["train/loss"] for r in rows] == pytest.approx([losses[s] for s in logged])
        print(f"W&B: killed attempt {attempt}'s file holds steps {logged}")


def ddp_buckets(model_name) -> int:
    "How many gradient buckets DDP makes of the classifier (its own logging data, in a group of one)."
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distrinews.ddp import free_port
    from distrinews.model import get_config
    from distrinews.train import load_model

    model = load_model(get_config("smoke", use_env=False, model_name=str(model_name)))[1]  # as the script builds it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = DDP(model, gradient_as_bucket_view=True)
        return len(ddp._get_ddp_logging_data()["bucket_sizes"].split(","))
    finally:
        dist.destroy_process_group()


def test_profile_steps_trace_each_bucket_on_each_rank(two_rank_run, encoder):
    from distrinews.ddp import ddp_timeline, plot_timeline

    out = two_rank_run[0]  # conftest's 2-rank run: `--profile-steps 2`, 2 ranks x batch 8 on the tiny encoder
    assert sorted(p.name for p in out.glob("trace_rank*.json")) == ["trace_rank0.json", "trace_rank1.json"]
    timeline, buckets = ddp_timeline(out), ddp_buckets(encoder)
    assert sorted(timeline) == [0, 1]
    for rank, t in timeline.items():
        assert len(t["steps"]) == 2, rank  # the 2 profiled steps (after 1 skipped and 1 warm-up)
        for s in t["steps"]:
            assert len(s["all_reduce"]) == buckets, (rank, s["all_reduce"], buckets)  # one per bucket per step
            assert s["forward"][0] < s["forward"][1] <= s["backward"][0] < s["backward"][1]
            assert all(s["backward"][0] <= a < b for a, b in s["all_reduce"])  # started by backward's hooks
        assert 0 <= t["overlap"] <= 1
    fig = plot_timeline(timeline)  # the chart says what the function measured
    labels = [label.get_text() for label in fig.axes[0].get_yticklabels()]
    assert labels == [f"rank {r}: {timeline[r]['overlap']:.0%} hidden" for r in (0, 1)]
