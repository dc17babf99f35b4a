"""The README's quick start away from this workplace: a clone with no ../shared beside it."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test runs `make` in a bare clone

ROOT = Path(__file__).resolve().parents[1]


def bare_clone(tmp_path: Path) -> Path:
    "The files `make main` uses, in a folder with no ../shared beside it, sharing this checkout's .venv."
    clone = tmp_path / "clone"
    (clone / "nbs").mkdir(parents=True)
    for name in ("Makefile", "settings.ini", "setup.py", "nbs/run_ddp.sh", "nbs/train_ddp.py"):
        shutil.copy2(ROOT / name, clone / name)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    return clone


def test_make_main_offline_without_data_stops_at_once_naming_both_fixes(tmp_path):
    clone = bare_clone(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTRINEWS_", "HF_"))}
    env.update(
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DISTRINEWS_CACHE=str(tmp_path / "cache")
    )  # the user's shell is offline
    started = time.perf_counter()
    # -o: the shared .venv counts as installed (no pip run inside the test)
    p = subprocess.run(
        ["make", "-o", ".venv/.installed", "main"], cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )
    seconds = time.perf_counter() - started
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-2000:]
    assert "DISTRINEWS_DATA_DIR is not set" in out and "go online (unset HF_HUB_OFFLINE" in out, out[-2000:]
    assert "Traceback" not in out, out[-3000:]
    assert not (clone / "runs" / "cpu" / "checkpoint").exists()
    # it stops before loading a model: seconds, not the ~50 s each hub call takes to time out on a closed network
    assert seconds < 60, f"make main took {seconds:.0f} s to fail"


def test_makefile_uses_the_local_copy_only_where_it_exists(tmp_path):
    clone = bare_clone(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTRINEWS_", "HF_"))}
    dry = lambda: (
        subprocess.run(
            ["make", "-n", "-o", ".venv/.installed", "main"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert "HF_HUB_OFFLINE=1" not in dry()  # no local data: online, the hub's ag_news
    data = tmp_path / "shared" / "data" / "ag_news"
    data.mkdir(parents=True)
    (data / "train.csv").write_text("")
    assert "HF_HUB_OFFLINE=1" in dry()  # this workplace's layout: the local copy, nothing from the network
