"""Multi-process DDP tests: real torchrun jobs with the gloo backend on CPU (fp32, one thread per worker).

- exact evaluation: the same checkpoint gives identical counts (accuracy, confusion matrix) with 1 and 3 ranks of
  train_ddp.py's own `evaluate`, and the loss to fp32 rounding;
- correctness: train_ddp.py with 2 ranks x batch b == train_single.py with batch 2b, parameter by parameter (dropout
  off, fp32): the diff between the two scripts changes nothing but who computes what;
- all ranks end with identical parameters (the script checks; we also read its report);
- fault tolerance: workers killed mid-epoch and mid-snapshot under --max-restarts resume from the last complete
  snapshot and end bit for bit where an uninterrupted run ends (dropout on: every rank's random stream is restored);
- multi-node: two torchrun agents (one process each) meet over loopback with the c10d rendezvous.

All but the fault test train a 2-layer BERT (the `encoder` fixture): the program is the course's, the model is small.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distrinews.ddp import free_port

pytestmark = pytest.mark.slow  # torchrun jobs
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "nbs" / "train_ddp.py"  # notebook 04 writes it
SINGLE = ROOT / "nbs" / "train_single.py"  # notebook 03 writes it
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
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
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def run(cmd, timeout=240):
    p = subprocess.run([str(c) for c in cmd], env=ENV, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout + p.stderr


def weights(run_dir):
    return load_file(Path(run_dir) / "checkpoint" / "model.safetensors")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A 2-layer BERT with random weights and MiniLM's tokenizer, saved as a model folder (`--model-name`): what these
    tests prove is the same for any encoder, and a 4 MB model writes each of the many snapshots here in milliseconds
    where MiniLM's (90 MB of weights, twice that of optimizer state) takes a second. The fault test keeps MiniLM: its
    kill must land inside a snapshot write."""
    from transformers import BertConfig, BertModel

    from distrinews.model import OFFLINE_ENCODER, load_tokenizer

    folder = tmp_path_factory.mktemp("encoder")
    tokenizer = load_tokenizer(OFFLINE_ENCODER)
    torch.manual_seed(0)
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, **shape)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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
    log = run([*launch, SCRIPT, *tiny, "--batch-size", "8", "--output-dir", out])
    return out, log


def test_two_ranks_equal_one_process_with_double_batch(two_rank_run, tiny, encoder, tmp_path):
    out2, _ = two_rank_run
    run([sys.executable, SINGLE, *tiny, "--batch-size", "16", "--output-dir", tmp_path])  # the one-process script
    w1, w2 = weights(tmp_path), weights(out2)
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
    log = run(TORCHRUN + ["--standalone", "--nproc_per_node=2", "--no-python", sys.executable, "-c", code])
    assert "rank0 same=True diverged=True" in log and "rank1 same=True diverged=True" in log


def test_evaluation_is_exact_for_any_world_size(two_rank_run, tmp_path):
    ckpt = two_rank_run[0] / "checkpoint"
    results = {}
    for n in (1, 3):  # one rank is the reference; 3 ranks split the 203 rows unevenly (68, 68, 67)
        out = tmp_path / f"eval{n}.json"
        run(
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


# dropout on, with texts long enough that the ranks' batches differ in length: each rank draws dropout masks of its own
# shapes, so its random stream is its own (a resume that restored one rank's stream on every rank was not exact)
EXACT_WITH_DROPOUT = [*TINY[: TINY.index("--max-length")], "--max-length", "64", "--epochs", "1", "--precision", "fp32"]
EXACT_WITH_DROPOUT += ["--eval-batch-size", "16", "--batch-size", "8", "--save-every", "2"]


def test_killed_workers_resume_exactly(tmp_path):
    """Fault tolerance, proven once: one torchrun job (2 workers, --max-restarts=2, a snapshot every 2 of its 6 steps)
    loses a worker twice -- rank 1 SIGKILLs itself at step 3, after the step-2 snapshot; in the restarted attempt rank 0
    is SIGKILLed from outside while it writes the step-4 snapshot. Each attempt resumes from the last complete snapshot
    and the job ends with the weights of an uninterrupted run, bit for bit."""
    straight = tmp_path / "straight"
    run(TORCHRUN + ["--standalone", "--nproc_per_node=2", SCRIPT, *EXACT_WITH_DROPOUT, "--output-dir", straight])
    out = tmp_path / "faults"
    cmd = TORCHRUN + ["--standalone", "--nproc_per_node=2", "--max-restarts=2", SCRIPT, *EXACT_WITH_DROPOUT]
    cmd += ["--simulate-failure-at-step", "3", "--output-dir", out]
    job = subprocess.Popen(
        [str(c) for c in cmd], env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
    reader.start()
    killed, deadline = None, time.monotonic() + 240
    while job.poll() is None and time.monotonic() < deadline:
        if killed is None and any("simulated crash at step 3" in line for line in lines):
            # the restarted attempt's rank 0 names its half-written snapshot after its process id
            for tmp in out.glob(".checkpoint.tmp-*"):
                pid = int(tmp.name.rsplit("-", 1)[1])
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)
                killed = (pid, tmp.exists())  # still there: the kill landed inside the write
                break
        time.sleep(0.001)
    job.wait(timeout=10)
    reader.join(timeout=10)
    log = "".join(lines)
    assert job.returncode == 0, log[-4000:]
    assert killed is not None and killed[1], f"no kill inside a snapshot write: {killed}\n{log[-3000:]}"
    assert log.count("resumed from") == 2 and "epoch 1, step 2" in log, log[-3000:]
    assert not list(out.glob(".checkpoint.*")), "a partial snapshot was left behind"
    w_fault, w_straight = weights(out), weights(straight)
    different = [k for k in w_straight if not torch.equal(w_fault[k], w_straight[k])]
    assert not different, f"the resumed run differs from the uninterrupted one in {len(different)} tensors"
    from distrinews.train import load_training_state

    state, _ = load_training_state(out / "checkpoint")  # loads: not corrupt
    assert (state["epoch"], state["step"], len(state["rng"])) == (1, 6, 2)
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])  # the ranks' streams really differ


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
                    SCRIPT,
                    *tiny,
                    "--batch-size",
                    "8",
                    "--output-dir",
                    tmp_path,
                ]
            ],
            env=ENV,
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
    w, w_single_node = weights(tmp_path), weights(out2)  # same job as two ranks on one node: same result
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
            [sys.executable, SCRIPT, *TINY, "--output-dir", tmp_path],
            env={**ENV, **env},
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert "train_ddp.py: error:" in p.stderr and "Start train_ddp.py with torchrun" in p.stderr, p.stderr
