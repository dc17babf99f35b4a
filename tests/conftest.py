"""What the test files share: the offline environment, a small demo checkpoint, a checkpoint whose head is fitted on AG
News (so its labels mean something), and the real server (`python -m distrinews.serve`) in a subprocess, started by
the package's own `distrinews.serve.server_process`."""

import contextlib
import importlib.util
import os
from pathlib import Path

# offline is the environment's decision; the test environment makes it here (run_tests.sh sets the same)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest

from distrinews.serve import http_json, server_process  # noqa: F401   (http_json: for the test files)

ROOT = Path(__file__).resolve().parents[1]
SPORTS_HEADLINE = "Striker scores twice as United beat Chelsea in the cup final"


def load_script(path: Path):
    """The script at `path` (benchmarks/report.py, tools/course.py) imported as a module under its file name: the
    tests reach a script's functions without putting its folder on `sys.path`."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def started_server(
    checkpoint=None,
    *args: str,
    env: dict | None = None,
    inherit_env: bool = True,
    **kwargs,
):
    """`distrinews.serve.server_process` as the tests use it: serving `checkpoint`, with this repository's package
    whether or not it is installed; yields the `ServerProcess` (its `url`, `process` and `log()`).
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
    "`distrinews.inference.fit_head`, or a skipped test where the AG News files are not local."
    from distrinews.data import find_data_dir
    from distrinews.inference import fit_head as fit

    data_dir = find_data_dir()
    if data_dir is None or not (data_dir / "train.csv").is_file():
        pytest.skip("no local AG News (set DISTRINEWS_DATA_DIR) to fit a classification head on")
    return fit(checkpoint, out, n=n, max_length=max_length)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    "An untrained demo checkpoint (the packaged MiniLM and a fresh head), 32 tokens. Tests that change it undo it."
    from distrinews.inference import make_demo_checkpoint

    return make_demo_checkpoint(tmp_path_factory.mktemp("ckpt") / "demo", max_length=32)


@pytest.fixture(scope="session")
def probe_checkpoint(checkpoint, tmp_path_factory):
    "The demo checkpoint with its head fitted on 512 AG News items: an obvious sports headline comes out as Sports."
    return fit_head(checkpoint, tmp_path_factory.mktemp("probe") / "probe")
