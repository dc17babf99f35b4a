"""Ways a training run ended badly (#35), each reproduced:

- a disk that fills while `model.safetensors` is written (a real 3 MiB tmpfs) ends in one line, not a traceback;
- a run killed after its last checkpoint but before its report: the same command again writes metrics.json and prints
  the test accuracy (the state a kill leaves is made here by deleting the report);
- a CSV cut off inside a quoted field is refused, naming the line; a non-UTF-8 byte is reported on its own line;
- a checkpoint of 2 workers is not resumed by 1 or 3 (each world size deals the rows differently: some would be trained
  twice, others never), with a line naming both numbers and the fix; `--fresh` starts over;
- a read-only filesystem is not "full", a full one keeps no probe file, an unknown profile gets no torchrun advice;
- `--resume` with nothing to resume, and fp16 without a GPU, are refused in one line (notebook 03 shows the mechanism);
- a finished DDP run leaves no wrapper holding its destroyed process group (gloo could abort at exit over it).

The tmpfs tests mount filesystems, which needs root: elsewhere they are skipped, saying so.
"""

import contextlib
import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import JOB_ENV, ONE_WORKER, ROOT, TORCHRUN, TRAIN_DDP, TRAIN_SINGLE, load_script, saved_weights

from distrinews.checkpoint import CheckpointWriteError, check_writable
from distrinews.data import DataFolderError, read_agnews_csv
from distrinews.ddp import free_port
from distrinews.train import clear_errors

# 32 rows: 2 optimizer steps of 16; the script as this checkout's notebook 03 writes it
TINY = ["--profile", "smoke", "--data-source", "local", "--train-size", "32", "--test-size", "16"]
TINY += ["--batch-size", "16", "--eval-batch-size", "16", "--max-length", "32", "--precision", "fp32"]


def train(out, *extra, script=TRAIN_SINGLE) -> str:
    "Run train_single.py (or `script`) in this process; the message it exits with ('' when it succeeds)."
    try:
        with clear_errors(script.name):  # as the script's `if __name__ == "__main__":` does
            load_script(script).main([*TINY, "--output-dir", str(out), *extra])
    except SystemExit as e:
        assert e.code not in (0, None), "exited 0 through SystemExit"
        return str(e.code)
    return ""


@contextlib.contextmanager
def mounted_tmpfs(folder, options: str):
    "A real tmpfs at `folder` (`options` as for mount -o), unmounted afterwards; the test is skipped without root."
    folder.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if p.returncode:
        pytest.skip(f"cannot mount a tmpfs here (mount needs root): {p.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def fill(folder):
    "Write into `folder` until its filesystem is full."
    with contextlib.suppress(OSError):
        (folder / "filler").write_bytes(bytes(64 * 2**20))


def test_disk_full_while_writing_the_weights_is_one_line(tmp_path):
    # the run starts (3 MiB are free), then the first snapshot's 90 MB of weights fill the disk: safetensors' error
    # once ended the run in a traceback (SafetensorError derives from Exception, not OSError)
    with mounted_tmpfs(tmp_path / "small", "size=3m") as out:
        message = train(out, "--save-every", "2")
        assert message.startswith("train_single.py: error: Could not write"), message
        assert "model.safetensors: the disk is full" in message and len(message.splitlines()) == 1, message
        assert not (out / "checkpoint").exists()


def test_small_read_only_filesystem_is_not_called_full(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "size=1m,ro") as folder:
        with pytest.raises(CheckpointWriteError, match="is not writable .*choose another --output-dir") as e:
            check_writable(folder)
        assert "full" not in str(e.value)


def test_full_filesystem_keeps_no_probe_file(tmp_path):
    with mounted_tmpfs(tmp_path / "full", "size=1m") as folder:
        fill(folder)
        with pytest.raises(CheckpointWriteError, match="the disk is full"):
            check_writable(folder)
        assert sorted(p.name for p in folder.iterdir()) == ["filler"]  # no 0-byte .write-test-<pid> left


def test_a_run_killed_before_its_report_reports_when_run_again(tmp_path, capsys):
    assert train(tmp_path) == ""
    first = capsys.readouterr().out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    # a kill after the last checkpoint, before metrics.json: the checkpoint says the run is done, the report is lost
    (tmp_path / "metrics.json").unlink()
    assert train(tmp_path) == ""  # the same command again
    again = capsys.readouterr().out
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    result = next(line for line in first.splitlines() if line.startswith("Test accuracy"))
    assert result in again.splitlines(), again


def test_a_csv_cut_inside_a_quoted_field_is_refused(tmp_path):
    rows = '"3","Stocks rise","Shares rose on Monday."\n"2","Cup final","United beat Chelsea 2-1."\n'
    cut = tmp_path / "train.csv"
    cut.write_text(rows + '"4","Chips get faster","A new processor runs twi')  # `head -c` stopped mid-word
    with pytest.raises(DataFolderError, match=rf"{cut}:3: .*cut off"):
        read_agnews_csv(cut)
    (tmp_path / "whole.csv").write_text(rows)
    assert len(read_agnews_csv(tmp_path / "whole.csv")[0]) == 2


def test_a_non_utf8_byte_is_reported_on_its_line(tmp_path):
    bad = tmp_path / "train.csv"
    good = b'"3","Stocks rise","Shares rose on Monday, as oil fell."\n' * 3000
    bad.write_bytes(good + '"1","Caf\u00e9 owners","March on city hall"\n'.encode("latin-1") + good)
    with pytest.raises(DataFolderError, match=r"not UTF-8 text \(byte b'\\xe9' on line 3001\)"):
        read_agnews_csv(bad)


def test_an_unknown_profile_gets_no_torchrun_advice(tmp_path):
    message = train(tmp_path, "--profile", "nosuch")
    assert "Unknown profile 'nosuch'" in message and "torchrun" not in message and ".." not in message, message


def test_a_launch_that_cannot_work_is_refused_in_one_line(tmp_path):
    message = train(tmp_path / "empty", "--resume")  # nothing to resume
    assert message.startswith("train_single.py: error: --resume: no checkpoint in") and "\n" not in message, message
    if not torch.cuda.is_available():
        message = train(tmp_path, "--precision", "fp16", "--check")  # fp16 needs a GradScaler on a GPU
        assert "needs a CUDA GPU" in message and "\n" not in message, message
    empty = tmp_path / "no-csvs"
    empty.mkdir()
    for flags, says in [
        (["--data-dir", empty], "no-csvs/train.csv is missing or empty"),
        (["--model-name", empty], "no-csvs"),
    ]:
        message = train(tmp_path, *map(str, flags), "--check")  # --check reads the data and finds the model, as runs do
        assert message.startswith("train_single.py: error: ") and says in message and "\n" not in message, message


def torchrun(nproc: int, out, *extra) -> subprocess.CompletedProcess:
    "train_ddp.py under torchrun with `nproc` workers, 8 rows each per step (96 rows: 6 steps with 2 workers)."
    cmd = [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", TRAIN_DDP, *TINY, "--train-size", "96"]
    cmd += ["--batch-size", "8", "--dropout", "0.0", "--output-dir", out, *extra]
    return subprocess.run([str(c) for c in cmd], env=JOB_ENV, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.slow_tier
def test_resuming_with_another_number_of_workers_is_refused(tmp_path, encoder, monkeypatch, capsys):
    # 2 workers save at step 2 and one dies at step 3: the checkpoint is 4 of the epoch's 12 micro-batches in
    crashed = torchrun(2, tmp_path, "--model-name", encoder, "--save-every", "2", "--simulate-failure-at-step", "3")
    assert crashed.returncode != 0 and "simulated crash at step 3" in crashed.stdout, crashed.stderr[-2000:]
    # each other number deals the epoch's rows in another order: going on would repeat some rows, skip others.
    # 1 worker: train_ddp.py's `main` in this process, in the environment torchrun gives its one worker
    for name, value in ONE_WORKER.items():
        monkeypatch.setenv(name, value)
    ddp = ["--train-size", "96", "--batch-size", "8", "--dropout", "0.0", "--model-name", str(encoder)]
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    said = {1: train(tmp_path, *ddp, script=TRAIN_DDP)}
    p = torchrun(3, tmp_path, "--model-name", encoder)  # 3 workers: torchrun
    our_frame = re.search(r'File "[^"]*(train_ddp\.py|distrinews/\w+\.py)"', p.stderr)  # torchrun's are not ours
    assert p.returncode != 0 and not our_frame, p.stderr[-3000:]
    said[3] = p.stderr
    for nproc, text in said.items():
        expected = f"was written by 2 process(es) and this job has {nproc}: resuming would train some rows twice"
        lines = [line for line in text.splitlines() if expected in line]
        assert lines and "--nproc_per_node=2" in lines[0] and "--fresh" in lines[0], text[-3000:]
    assert "\n" not in said[1], said[1]  # one line
    capsys.readouterr()
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert train(tmp_path, *ddp, "--fresh", script=TRAIN_DDP) == ""
    assert "Test accuracy" in capsys.readouterr().out


def test_a_finished_ddp_run_leaves_no_wrapper_behind(tmp_path, encoder):
    # a fresh worker, as torchrun starts one, with Python's automatic collection off: what still holds the DDP wrapper
    # once `main` returns holds it (and the process group it keeps) until Python's shutdown, where a gloo rank could
    # die of SIGABRT after a finished run. In a fresh process the first `from_pretrained` leaves a reference cycle
    # through the training function's frame; train_ddp.py collects it before it destroys the group.
    code = "import gc, runpy, sys; gc.disable(); from torch.nn.parallel import DistributedDataParallel as DDP; "
    code += f"runpy.run_path({str(TRAIN_DDP)!r})['main'](sys.argv[1:]); "
    code += "print('wrappers left:', sum(type(o) is DDP for o in gc.get_objects()))"
    env = dict(JOB_ENV, **ONE_WORKER, MASTER_PORT=str(free_port()))
    args = [*TINY, "--model-name", str(encoder), "--output-dir", str(tmp_path), "--report-to", "none"]
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "wrappers left: 0" in p.stdout, p.stdout[-2000:]


def test_the_epochs_last_short_accumulation_step_averages_its_own_micro_batches(tmp_path):
    """40 rows in micro-batches of 8, 4 to a step: the epoch's second step has 1 micro-batch. Its loss is divided by 1,
    not 4, so the run ends with the weights of plain batches of 32 (each step the gradient of its rows' mean loss)."""
    same = ["--train-size", "40", "--no-group-by-length", "--dropout", "0", "--lr", "1e-3"]
    assert train(tmp_path / "accumulated", *same, "--batch-size", "8", "--grad-accum", "4") == ""
    assert train(tmp_path / "plain", *same, "--batch-size", "32") == ""
    accumulated, plain = saved_weights(tmp_path / "accumulated"), saved_weights(tmp_path / "plain")
    assert max((accumulated[k] - plain[k]).abs().max().item() for k in plain) < 1e-5  # divided by 4: 2e-4


def test_a_run_that_dies_in_its_evaluation_reports_the_whole_epoch_when_run_again(tmp_path):
    """A snapshot every 2 steps in an epoch of 2: the epoch's own snapshot (after its evaluation) is the only one, so a
    run that dies in the evaluation trains the epoch again, instead of resuming at its end and reporting 0 samples."""
    script = load_script(TRAIN_SINGLE)

    def dies(*args):
        raise RuntimeError("the evaluation died")

    script.evaluate = dies
    with pytest.raises(SystemExit, match="the evaluation died"), clear_errors("train_single.py"):
        script.main([*TINY, "--output-dir", str(tmp_path), "--save-every", "2"])
    assert not (tmp_path / "checkpoint").exists()  # no snapshot at the epoch's last step
    assert train(tmp_path, "--save-every", "2") == ""
    (epoch,) = json.loads((tmp_path / "metrics.json").read_text())
    assert epoch["train_samples"] == 32 and epoch["train_loss"] > 0, epoch
