"""What the test files share: the offline environment, a small demo checkpoint, a checkpoint whose head is fitted on AG
News (so its labels mean something), and the real server (`python -m distrinews.serve`) in a subprocess, started by
the package's own `distrinews.harness.server_process`."""

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# offline is the environment's decision; the test environment makes it here (run_tests.sh sets the same)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest

from distrinews.harness import http_json, server_process  # noqa: F401   (http_json: for the test files)

ROOT = Path(__file__).resolve().parents[1]
# the training scripts notebooks 03 and 04 write, and how the DDP tests launch them: torchrun, one thread per worker
TRAIN_SINGLE, TRAIN_DDP = ROOT / "nbs" / "train_single.py", ROOT / "nbs" / "train_ddp.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# PYTHONFAULTHANDLER: a worker killed by a signal (SIGABRT, SIGSEGV) prints where its Python code was
JOB_ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONFAULTHANDLER="1")
JOB_ENV.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # whatever the shell says: a hub call fails at once
# the environment torchrun gives the one worker of a one-process job: train_ddp.py's `main` then runs in this process
ONE_WORKER = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
# a tiny, exact configuration of the DDP tests: fp32, no dropout, 96 training rows = 6 steps of a global batch of 16
TINY = ["--profile", "smoke", "--train-size", "96", "--test-size", "48", "--max-length", "32", "--epochs", "1"]
TINY += ["--precision", "fp32", "--dropout", "0.0", "--eval-batch-size", "16"]
SPORTS_HEADLINE = "Striker scores twice as United beat Chelsea in the cup final"


def load_script(path: Path):
    """The script at `path` (benchmarks/report.py, tools/course.py) imported as a module under its file name: the
    tests reach a script's functions without putting its folder on `sys.path`."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_until(done, what: str = "the condition", timeout: float = 10.0, every: float = 0.005):
    "Poll `done()` every `every` s until it is true; fail, naming `what`, after `timeout` seconds."
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen in {timeout:.0f} s")
        time.sleep(every)


def run_job(cmd, timeout=240) -> str:
    "Run a training job (a command line) from the repository root; returns what it printed, or fails the test."
    try:
        p = subprocess.run(
            [str(c) for c in cmd], env=JOB_ENV, capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired as e:  # what it printed so far (bytes, whatever `text` says): a rank's last stacks
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        pytest.fail(f"{cmd} did not end within {timeout} s:\n{fatal_stack(err) or err[-3000:]}")
    assert p.returncode == 0, (
        f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{fatal_stack(p.stderr) or p.stderr[-3000:]}"
    )
    return p.stdout + p.stderr


def fatal_stack(stderr: str) -> str:
    "faulthandler's report of a process killed by a signal (PYTHONFAULTHANDLER=1) in full; '' if there is none."
    at = stderr.find("Fatal Python error")
    return stderr[at : at + 8000] if at >= 0 else ""


def saved_weights(run_dir) -> dict:
    "The weights a training run saved in `run_dir/checkpoint`."
    from safetensors.torch import load_file

    return load_file(Path(run_dir) / "checkpoint" / "model.safetensors")


@contextlib.contextmanager
def started_server(
    checkpoint=None,
    *args: str,
    env: dict | None = None,
    inherit_env: bool = True,
    **kwargs,
):
    """`distrinews.harness.server_process` as the tests use it: serving `checkpoint`, with this repository's package
    whether or not it is installed; yields the server (its `url`, `process` and `log()`).
    `inherit_env=False`: only `env` (plus PATH), as in a container."""
    base = dict(os.environ) if inherit_env else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env = {**base, **(env or {})}
    if inherit_env:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if checkpoint is not None:
        args = (*args, "--checkpoint", str(checkpoint))
    with server_process(*args, env=env, **kwargs) as server:
        yield server


@contextlib.contextmanager
def running_server(checkpoint=None, *args: str, **kwargs):
    "`started_server`, yielding only its base URL."
    with started_server(checkpoint, *args, **kwargs) as server:
        yield server.url


def fit_head(checkpoint: Path, out: Path, n: int = 512, max_length: int = 64) -> Path:
    "`distrinews.convert.fit_head`, or a skipped test where the AG News files are not local."
    from distrinews.convert import fit_head as fit
    from distrinews.data import find_data_dir

    data_dir = find_data_dir()
    if data_dir is None or not (data_dir / "train.csv").is_file():
        pytest.skip("no local AG News (set DISTRINEWS_DATA_DIR) to fit a classification head on")
    return fit(checkpoint, out, n=n, max_length=max_length)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    "An untrained demo checkpoint (the packaged MiniLM and a fresh head), 32 tokens. Tests that change it undo it."
    from distrinews.convert import make_demo_checkpoint

    return make_demo_checkpoint(tmp_path_factory.mktemp("ckpt") / "demo", max_length=32)


@pytest.fixture(scope="session")
def probe_checkpoint(checkpoint, tmp_path_factory):
    "The demo checkpoint with its head fitted on 512 AG News items: an obvious sports headline comes out as Sports."
    return fit_head(checkpoint, tmp_path_factory.mktemp("probe") / "probe")


# The longest files first. pytest-xdist (`--dist loadfile --no-loadscope-reorder`, as tests/run_tests.sh runs it) hands
# the files to its workers in this order; by default it would start the files with the most tests first, which left the
# two longest (one test each) for last, on one worker, while the other had nothing to do.
# Longest first by the files' summed test times in each tier (pytest --durations=0, a 2-core AVX512-BF16 EPYC,
# 2026-11-27): the test command's test_ddp.py 35 s and test_server_http.py 46 s, then 16 s or less a file; the slow
# tier's 80, 55, 28, 25, 24, 22 and 17 s.
LONGEST_FIRST = (
    "test_ddp_fault_tolerance.py",
    "test_ddp.py",
    "test_server_http.py",
    "test_scale.py",
    "test_run_faults.py",
    "test_deployment.py",
    "test_slurm.py",
    "test_docs.py",
    "test_serving.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the others keep their order


def once(tmp_path_factory, name: str, make) -> Path:
    """The folder `name`, filled by `make(folder)` once per test session: pytest-xdist's two workers share it (the
    first to ask makes it while the other waits), so one encoder and one 2-rank run serve the test files of both."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # the session's folder, above the workers'
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (root / f"{name}.done").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
            folder.mkdir()
            make(folder)
            (root / f"{name}.done").touch()
    return folder


@pytest.fixture(scope="session")
def encoder(tmp_path_factory):
    """A 2-layer BERT with random weights and MiniLM's tokenizer, saved as a model folder (`--model-name`): what the DDP
    tests (test_ddp, test_run_faults, test_slurm, test_tracking) prove is the same for any encoder, and a 4 MB model
    writes each of the many snapshots in milliseconds where MiniLM's (90 MB of weights, twice that of optimizer state)
    takes a second. The fault-tolerance test keeps MiniLM: its kill must land inside a snapshot write."""

    def make(folder):
        import torch
        from transformers import BertConfig, BertModel

        from distrinews.model import OFFLINE_ENCODER, load_tokenizer

        tokenizer = load_tokenizer(OFFLINE_ENCODER)
        torch.manual_seed(0)
        shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size, **shape)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return once(tmp_path_factory, "encoder", make)


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory, encoder):
    """One uninterrupted run of train_ddp.py, 2 ranks x batch 8 on the tiny encoder, its steps 3-4 traced by
    torch.profiler (`--profile-steps 2`: it records, it changes no number): the run test_ddp.py, test_slurm.py and
    test_tracking.py compare against or read. Returns its folder and what it printed."""
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node=2", TRAIN_DDP, *TINY, "--model-name", encoder]
    cmd += ["--batch-size", "8", "--profile-steps", "2", "--report-to", "none"]

    def make(out):
        (out / "log.txt").write_text(run_job([*cmd, "--output-dir", out]))

    out = once(tmp_path_factory, "ddp2", make)
    return out, (out / "log.txt").read_text()


class Payload:
    "Unpickling this calls Path.touch(marker): a stand-in for any code an attacker would run."

    def __init__(self, marker):
        self.marker = Path(marker)

    def __reduce__(self):
        return (Path.touch, (self.marker,))
