"""Multi-process DDP tests: real torchrun jobs with the gloo backend on CPU (fp32, one thread per worker).

- exact evaluation: the same checkpoint gives identical counts (accuracy, confusion matrix) with 1 and 3 ranks of
  train_ddp.py's own `evaluate`, and the loss to fp32 rounding;
- correctness: train_ddp.py with 2 ranks x batch b == train_single.py with batch 2b, parameter by parameter (dropout
  off, fp32): the diff between the two scripts changes nothing but who computes what;
- all ranks end with identical parameters (the script checks; we also read its report);
- multi-node: two torchrun agents (one process each) meet over loopback with the c10d rendezvous.

Fault tolerance (workers killed, an exact resume) is test_ddp_fault_tolerance.py: a file of its own, so that pytest's
two workers can each take one of the two longest files. These tests train a 2-layer BERT (the `encoder` fixture): the
program is the course's, the model is small.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JOB_ENV, ROOT, TORCHRUN, TRAIN_DDP, TRAIN_SINGLE, run_job, saved_weights

from distrinews.ddp import free_port

pytestmark = pytest.mark.slow  # torchrun jobs
# a tiny, exact configuration: fp32, no dropout, 96 training rows = 6 steps of a global batch of 16
TINY = [
    "--profile",
    "smoke",
    "--train-size",
    "96",
    "--test-size",
    "48",
    "--max-length",
    "32",
    "--epochs",
    "1",
    "--precision",
    "fp32",
    "--dropout",
    "0.0",
    "--eval-batch-size",
    "16",
]


def weights_initial(encoder):
    "The weights both runs start from (same seed, same model)."
    from distrinews.model import build_classifier

    return build_classifier(encoder, seed=42, dropout=0.0).state_dict()


@pytest.fixture(scope="module")
def tiny(encoder):
    "The tiny, exact configuration on the tiny encoder."
    return [*TINY, "--model-name", encoder]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, tiny):
    "One uninterrupted 2-rank run, shared by the tests that compare against it."
    out = tmp_path_factory.mktemp("ddp2")
    launch = [*TORCHRUN, "--standalone", "--nproc_per_node=2"]
    log = run_job([*launch, TRAIN_DDP, *tiny, "--batch-size", "8", "--output-dir", out])
    return out, log


def test_two_ranks_equal_one_process_with_double_batch(two_rank_run, tiny, encoder, tmp_path):
    out2, _ = two_rank_run
    # the one-process script with twice the batch
    run_job([sys.executable, TRAIN_SINGLE, *tiny, "--batch-size", "16", "--output-dir", tmp_path])
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


def test_replica_check_detects_divergence():
    code = r"""
import torch, torch.distributed as dist
from distrinews.ddp import replicas_in_sync
dist.init_process_group("gloo")
m = torch.nn.Linear(4, 2); torch.manual_seed(0); m.reset_parameters()
same = replicas_in_sync(m)
with torch.no_grad():
    if dist.get_rank() == 1: m.weight[0, 0] += 1e-6
diverged = not replicas_in_sync(m)
print(f"rank{dist.get_rank()} same={same} diverged={diverged}"); dist.destroy_process_group()
"""
    log = run_job(TORCHRUN + ["--standalone", "--nproc_per_node=2", "--no-python", sys.executable, "-c", code])
    assert "rank0 same=True diverged=True" in log and "rank1 same=True diverged=True" in log


def test_evaluation_is_exact_for_any_world_size(two_rank_run, tmp_path):
    ckpt = two_rank_run[0] / "checkpoint"
    results = {}
    for n in (1, 3):  # one rank is the reference; 3 ranks split the 203 rows unevenly (68, 68, 67)
        out = tmp_path / f"eval{n}.json"
        run_job(
            TORCHRUN
            + [
                "--standalone",
                f"--nproc_per_node={n}",
                ROOT / "tests" / "ddp_eval_worker.py",
                ckpt,
                out,
                "--test-size",
                "203",
            ]
        )
        results[n] = json.loads(out.read_text())
    for n in (1, 3):
        assert results[n]["eval_count"] == 203  # every item once: no padding double-counted
        assert results[n]["confusion"] == results[1]["confusion"]
        assert results[n]["accuracy"] == results[1]["accuracy"]
        # the counts are exact; the loss is a sum of fp32 logits' cross-entropies, and shards cut the length-sorted
        # rows into batches of other shapes, so it agrees to fp32 rounding, not bit for bit
        assert abs(results[n]["eval_loss"] - results[1]["eval_loss"]) < 1e-6
    assert results[3]["rank0_items"] < 203  # the work really was split


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
                    f"--node_rank={i}",
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
        for i in range(2)
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
