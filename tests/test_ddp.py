"""Multi-process DDP tests: real torchrun jobs with the gloo backend on CPU (fp32, one thread per worker).

- exact evaluation: the same checkpoint gives identical counts (accuracy, confusion matrix) with 1 rank (in this
  process) and 3 ranks (torchrun) of train_ddp.py's own `evaluate`, and the loss to fp32 rounding;
- correctness: train_ddp.py with 2 ranks x batch b == train_single.py with batch 2b, parameter by parameter (dropout
  off, fp32): the diff between the two scripts changes nothing but who computes what;
- all ranks end with identical parameters (the script checks; we also read its report);
- multi-node: two torchrun agents (one process each) meet over loopback with the c10d rendezvous.
- the word embeddings, frozen by default: DDP trains the rest of the model and leaves them as pretrained.

Fault tolerance (workers killed, an exact resume) is test_ddp_fault_tolerance.py: a file of its own, so that pytest's
two workers can each take one of the two longest files. These tests train a 2-layer BERT (the `encoder` fixture): the
program is the course's, the model is small. The 2-rank run they compare against (conftest's `two_rank_run`) also
serves test_slurm.py and test_tracking.py, and one 3-rank job both the evaluation and the replica check: fewer
processes to start, the same proofs.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import (
    JOB_ENV,
    ONE_WORKER,
    ROOT,
    TINY,
    TORCHRUN,
    TRAIN_DDP,
    TRAIN_SINGLE,
    fatal_stack,
    load_script,
    run_job,
    saved_weights,
)

from distrinews.ddp import free_port

pytestmark = pytest.mark.slow  # torchrun jobs


def weights_initial(encoder):
    "The weights both runs start from (same seed, same model)."
    from distrinews.model import build_classifier

    return build_classifier(encoder, seed=42, dropout=0.0).state_dict()


@pytest.fixture(scope="module")
def tiny(encoder):
    "The tiny, exact configuration on the tiny encoder."
    return [*TINY, "--model-name", encoder]


def test_two_ranks_equal_one_process_with_double_batch(two_rank_run, tiny, encoder, tmp_path):
    out2, _ = two_rank_run
    # the one-process script with twice the batch, in this process: its `main`, what `python train_single.py` runs
    load_script(TRAIN_SINGLE).main([*map(str, tiny), "--batch-size", "16", "--output-dir", str(tmp_path)])
    w1, w2 = saved_weights(tmp_path), saved_weights(out2)
    assert w1.keys() == w2.keys()
    worst = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert worst < 1e-5, f"largest parameter difference {worst:.2e}"
    moved = max((w1[k] - weights_initial(encoder)[k]).abs().max().item() for k in ("classifier.weight",))
    assert moved > 1e-4, "training did not change the weights: the comparison would be empty"


def test_all_ranks_hold_identical_parameters(two_rank_run):
    _, log = two_rank_run
    assert "2 process(es) x batch 8 x 1 accumulation" in log
    assert "replicas in sync after training: True" in log


@pytest.fixture(scope="module")
def three_ranks(two_rank_run, tmp_path_factory) -> dict:
    """One torchrun job of 3 ranks (tests/ddp_eval_worker.py): the 2-rank run's checkpoint evaluated on 203 test rows,
    which 3 ranks split unevenly (68, 68, 67), and the replica check; what rank 0 wrote."""
    out = tmp_path_factory.mktemp("ranks3") / "ranks3.json"
    worker = ROOT / "tests" / "ddp_eval_worker.py"
    # --max-restarts=1: in 2 of the last 3 full runs on 2 busy cores one rank of this job died of SIGABRT inside
    # C++ (std::terminate; cause not found); torchrun restarts the group once, and a real failure fails twice. The
    # restart works because the worker joins with `init_options()` (a store per attempt), as train_ddp.py does: with
    # a plain init_process_group the restarted ranks dialled the dead attempt's addresses and the job hung
    printed = run_job(
        TORCHRUN
        + ["--standalone", "--nproc_per_node=3", "--max-restarts=1", worker, two_rank_run[0] / "checkpoint", out]
    )
    if stack := fatal_stack(printed):  # a restart hid an abort: its stack goes to the warnings summary, to find it
        warnings.warn(f"a rank of the 3-rank job was restarted after:\n{stack}", stacklevel=1)
    return json.loads(out.read_text())


@pytest.mark.slow_tier
def test_replica_check_detects_divergence(three_ranks):
    # identical replicas are in sync, and a change of 1e-6 on rank 1 alone is seen by every rank
    assert three_ranks["replicas"] == [dict(same=True, diverged=True)] * 3


def evaluate_alone(checkpoint, test_size: int) -> dict:
    "ddp_eval_worker's evaluation in a process group of one rank: this process, on one thread as a torchrun worker."
    import torch
    import torch.distributed as dist
    from ddp_eval_worker import evaluate_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        return evaluate_checkpoint(checkpoint, test_size)
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)


@pytest.mark.slow_tier
def test_evaluation_is_exact_for_any_world_size(two_rank_run, three_ranks):
    # one rank is the reference; 3 ranks split the 203 rows unevenly (68, 68, 67)
    results = {1: evaluate_alone(two_rank_run[0] / "checkpoint", 203), 3: three_ranks}
    for n in (1, 3):
        assert results[n]["world_size"] == n
        assert results[n]["eval_count"] == 203  # every item once: no padding double-counted
        assert results[n]["confusion"] == results[1]["confusion"]
        assert results[n]["accuracy"] == results[1]["accuracy"]
        # the counts are exact; the loss is a sum of fp32 logits' cross-entropies, and shards cut the length-sorted
        # rows into batches of other shapes, so it agrees to fp32 rounding, not bit for bit
        assert abs(results[n]["eval_loss"] - results[1]["eval_loss"]) < 1e-6
    assert results[3]["rank0_items"] < 203  # the work really was split


@pytest.mark.slow_tier
def test_two_agents_multi_node_over_loopback(two_rank_run, tiny, tmp_path):
    out2, _ = two_rank_run
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                str(c)
                for c in TORCHRUN
                + [
                    "--nnodes=2",
                    "--nproc_per_node=1",
                    "--rdzv_backend=c10d",
                    f"--rdzv_endpoint=127.0.0.1:{port}",
                    "--rdzv_id=distrinews-test",
                    TRAIN_DDP,
                    *tiny,
                    "--batch-size",
                    "8",
                    "--output-dir",
                    tmp_path,
                ]
            ],
            env=JOB_ENV,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    logs = [a.communicate(timeout=240)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(lg[-2000:] for lg in logs)
    assert any("2 process(es) x batch 8" in lg for lg in logs)
    w, w_single_node = saved_weights(tmp_path), saved_weights(out2)  # same job as two ranks on one node: same result
    assert max((w[k] - w_single_node[k]).abs().max().item() for k in w) < 1e-6


def test_a_failing_torchrun_fails_its_cell(tmp_path, monkeypatch):
    "04's launch cell is a %%bash cell: torchrun's exit status reaches the notebook, so a failed run fails the cell."
    from execnb.shell import CaptureShell

    cells = ["".join(c["source"]) for c in json.loads((ROOT / "nbs" / "04_ddp.ipynb").read_text())["cells"]]
    launch = next(c for c in cells if c.startswith("%%bash") and "torchrun" in c and "--fresh" in c)
    monkeypatch.chdir(ROOT / "nbs")  # where the notebook runs, beside train_ddp.py
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # torchrun of this venv
    shell = CaptureShell()
    shell.run_cell(f"nproc, global_batch, run_dir = 1, 16, {str(tmp_path)!r}\nclass cfg: profile = 'no-such-profile'")
    outputs = shell.run(launch)
    assert isinstance(shell.exc, subprocess.CalledProcessError), outputs
    assert "Unknown profile 'no-such-profile'" in json.dumps(outputs)


def test_bad_launches_fail_clearly(tmp_path):
    "train_ddp.py started without torchrun, or with half of its environment, says how to launch it: no traceback."
    for env in ({}, {"RANK": "0", "WORLD_SIZE": "2"}):
        p = subprocess.run(
            [sys.executable, TRAIN_DDP, *TINY, "--output-dir", tmp_path],
            env={**JOB_ENV, **env},
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert "train_ddp.py: error:" in p.stderr and "Start train_ddp.py with torchrun" in p.stderr, p.stderr


def test_frozen_word_embeddings_stay_as_pretrained(tiny, encoder, tmp_path, monkeypatch):
    "By default DDP trains the rest and leaves the word embeddings as they were (no update, no weight decay)."
    for name, value in {**ONE_WORKER, "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    load_script(TRAIN_DDP).main([*map(str, tiny), "--output-dir", str(tmp_path)])
    trained, start = saved_weights(tmp_path), weights_initial(encoder)
    changed = {k for k in start if not (trained[k] == start[k]).all()}
    assert "bert.embeddings.word_embeddings.weight" not in changed and "classifier.weight" in changed, changed
