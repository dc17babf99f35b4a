"""A run never ends badly in silence (#27), in-process on a tiny configuration (32 rows: 2 optimizer steps):

- a diverging run (learning rate 1e30) stops with a message and a non-zero exit, and saves no non-finite weights;
- `--fresh` acts once per job: an elastic restart (TORCHELASTIC_RESTART_COUNT > 0) continues from what the job saved;
- a checkpoint whose files changed after the save (flipped bytes, a truncated file, no manifest) is refused by name;
- an output folder that cannot be written is reported before any training.

Leftover partial checkpoints, damaged training_state.pt / run_config.json, a full disk and map_location are checked in
notebook 03 (nbdev_test), the world-size check under torchrun in test_ddp.py.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from distrinews.checkpoint import MANIFEST_FILE, verify_checkpoint
from distrinews.scripts import train_single  # nbs/train_single.py, the program notebook 03 writes
from distrinews.train import clear_errors

TINY = ["--profile", "smoke", "--data-source", "local", "--train-size", "32", "--test-size", "16"]
TINY += ["--batch-size", "16", "--eval-batch-size", "16", "--max-length", "32", "--precision", "fp32"]


def train(out, *extra) -> str:
    "Run train_single.py in this process; the message it exits with ('' when it succeeds)."
    try:
        with clear_errors("train_single.py"):  # as the script's `if __name__ == "__main__":` does
            train_single.main([*TINY, "--output-dir", str(out), *extra])
    except SystemExit as e:
        assert e.code not in (0, None), "exited 0 through SystemExit"
        return str(e.code)
    return ""


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("good")
    assert train(out) == ""
    return out


def test_diverging_run_stops_before_saving(tmp_path, capsys):
    message = train(tmp_path, "--lr", "1e30")  # today: loss nan, every saved tensor NaN, exit status 0
    assert "the run diverged" in message, message
    checkpoint = tmp_path / "checkpoint"
    if checkpoint.exists():  # a snapshot from before the divergence may exist; none may hold NaN
        assert all(torch.isfinite(t).all() for t in load_file(checkpoint / "model.safetensors").values())
    assert not (tmp_path / "metrics.json").exists() or "nan" not in (tmp_path / "metrics.json").read_text()


def test_fresh_acts_once_per_job(good_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    sealed = json.loads((run / "checkpoint" / MANIFEST_FILE).read_text())
    # an elastic restart of a `--fresh` job (torchrun sets the count): continue, never delete what the job saved
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert train(run, "--fresh") == ""
    assert "resumed from" in capsys.readouterr().out
    assert json.loads((run / "checkpoint" / MANIFEST_FILE).read_text()) == sealed  # the same files, not a new run
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a Slurm job requeued (preempted): the same arguments, torchrun's 0
    assert train(run, "--fresh") == ""
    assert "resumed from" in capsys.readouterr().out
    assert json.loads((run / "checkpoint" / MANIFEST_FILE).read_text()) == sealed
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the job's first attempt: --fresh starts over
    assert train(run, "--fresh") == ""
    assert "resumed from" not in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["flipped bytes", "truncated", "no manifest"])
def test_damaged_checkpoint_is_refused_by_name(good_run, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    weights = run / "checkpoint" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "flipped bytes":  # 4 KiB in the middle of the tensors: today it resumes and trains to 25 %
        data[len(data) // 2 : len(data) // 2 + 4096] = bytes(
            b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 4096]
        )
        weights.write_bytes(data)
    elif damage == "truncated":
        weights.write_bytes(data[: len(data) // 3])
    else:
        (run / "checkpoint" / MANIFEST_FILE).unlink()
    message = train(run, "--epochs", "2")  # resume and go on
    expected = "has no manifest.json" if damage == "no manifest" else "model.safetensors is corrupted"
    assert expected in message and str(run / "checkpoint") in message, message
    with pytest.raises(Exception, match=expected):
        verify_checkpoint(run / "checkpoint")


def test_unwritable_output_folder_fails_before_training(tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    message = train(tmp_path / "a-file" / "run")
    assert message.startswith("train_single.py: error: Could not write") and "a-file" in message, message
    assert "epoch" not in capsys.readouterr().out  # no training happened
