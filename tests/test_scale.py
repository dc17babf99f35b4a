"""Distributed tuning on a real PostgreSQL server (notebook 11): a throwaway server started by the test, worker
processes of `python -m distrinews.scale tune-worker` pulling trials from one Optuna study. Every trial is a run of
notebook 03's training script (`distrinews.scripts.train_single.train`, the program `python train_single.py` runs),
whose `on_epoch_end` reports the validation accuracy to Optuna and raises `TrialPruned` when the pruner says so.
Each worker prints Optuna's own line per trial ("Trial 3 pruned. ...", "Trial 1 finished with value: ...").

- two workers share the study: every enqueued trial is run exactly once, by one of them;
- a trial designed to be poor (lr=1e-7, 2 epochs) is pruned after its first epoch by the median rule;
- a worker killed with SIGKILL in the middle of a trial leaves nothing stuck in RUNNING: the next worker to start a
  trial marks it FAIL (its heartbeat stopped) and runs the copy that `RetryHeartbeatStaleTrialCallback` queued;
- the server is gone afterwards, and a storage that cannot be reached is reported in one line.

The server is this file's own (`local_postgres`, a test helper: PostgreSQL's `initdb` and `pg_ctl`, found on PATH or
under /usr/lib/postgresql/*/bin).

Ray Train runs in the notebook itself (nbs/11_scale_out.ipynb): notebook 04's `train_ddp.py` (its `train`, in Ray's
process group) with a worker killed mid-run, whose final weights and test accuracy must equal those of the same script
launched by torchrun.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.slow_tier]  # Ray and PostgreSQL

optuna = pytest.importorskip("optuna")
pytest.importorskip("psycopg")
import sqlalchemy  # noqa: E402  (Optuna's own dependency)
from conftest import wait_until  # noqa: E402

from distrinews.ddp import free_port  # noqa: E402
from distrinews.scale import SEARCHED, StorageError, open_storage, open_study  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
# tiny trials: 96 training rows + 32 held out for validation, short texts, one thread per worker
TINY = [
    "--profile",
    "smoke",
    "--train-size",
    "128",
    "--validation-size",
    "32",
    "--max-length",
    "32",
    "--eval-batch-size",
    "32",
    "--num-threads",
    "1",
]
# every searched setting is fixed, so the three GOOD trials (and the retry) train exactly the same thing; a setting
# left out would be sampled per trial, and a retry that drew another one could be pruned against the others
GOOD = dict(
    lr=3e-4,
    warmup_ratio=0.0,
    batch_size=16,
    weight_decay=0.01,
    label_smoothing=0.0,
    layer_lr_decay=1.0,
    epochs=1,
)
POOR = dict(GOOD, lr=1e-7, epochs=2)  # learns nothing: chance-level accuracy after its first epoch
assert set(GOOD) == set(SEARCHED), f"fix every searched setting in GOOD: {set(SEARCHED) ^ set(GOOD)}"


def postgres_bin() -> Path | None:
    "The folder of PostgreSQL's initdb and pg_ctl (Debian and Ubuntu keep them off PATH), or None."
    found = shutil.which("pg_ctl")
    candidates = [Path(found).parent] if found else sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    return candidates[-1] if candidates else None


@contextlib.contextmanager
def local_postgres():
    "A throwaway PostgreSQL server on a free loopback port: yields its URL; stopped and deleted afterwards."
    bin_dir, folder, port = postgres_bin(), Path(tempfile.mkdtemp(prefix="distrinews-pg-")), free_port()
    as_user = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(folder, "nobody")
        as_user = ["runuser", "-u", "nobody", "--"]

    def pg(*args):
        subprocess.run(as_user + [str(bin_dir / args[0]), *map(str, args[1:])], check=True, capture_output=True)

    try:
        pg("initdb", "-D", folder / "data", "-U", "optuna", "--auth=trust", "--no-sync", "-E", "UTF8")
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off"
        pg("pg_ctl", "-D", folder / "data", "-l", folder / "server.log", "-w", "start", "-o", options)
        yield f"postgresql+psycopg://optuna@127.0.0.1:{port}/postgres"
    finally:
        if (folder / "data" / "postmaster.pid").exists():
            pg("pg_ctl", "-D", folder / "data", "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def worker(url, study, trials, out):
    cmd = [
        sys.executable,
        "-m",
        "distrinews.scale",
        "tune-worker",
        "--storage",
        url,
        "--study",
        study,
        "--trials",
        str(trials),
        "--epochs",
        "2",
        "--startup-trials",
        "1",
        "--heartbeat",
        "2",
        *TINY,
        "--output-dir",
        str(out),
    ]
    return subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def states(study):
    return [t.state.name for t in study.get_trials(deepcopy=False)]


def heartbeats(url: str) -> int:
    "The heartbeats the study's database holds: a trial's first is written a moment after it starts RUNNING."
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as db:
            return db.execute(sqlalchemy.text("SELECT count(*) FROM trial_heartbeats")).scalar()
    finally:
        engine.dispose()


@pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL (initdb, pg_ctl) is not installed")
def test_two_workers_one_postgres_study_with_pruning_and_a_killed_worker(tmp_path):
    with local_postgres() as url:
        study = open_study(open_storage(url, heartbeat_interval=2), "news", startup_trials=1)
        # trial 0 goes to a worker we kill; 1 and 2 to the two workers; 3 (poor) to whichever finishes first, when a
        # finished trial exists for the median rule to compare with
        for params in (GOOD, GOOD, GOOD, POOR):
            study.enqueue_trial(params)

        doomed = worker(url, "news", 1, tmp_path / "doomed")
        deadline = time.monotonic() + 120
        while "RUNNING" not in states(study):
            assert doomed.poll() is None and time.monotonic() < deadline, doomed.communicate()[0][-3000:]
            time.sleep(0.5)
        # the two workers start importing now; the kill comes long before they ask for a trial (they take 1 and 2
        # whenever trial 0 turns out stale: the check runs before every trial, and the retry is queued after trial 3)
        test_started = time.monotonic()
        a, b = worker(url, "news", 2, tmp_path / "a"), worker(url, "news", 2, tmp_path / "b")
        # trial 0's first heartbeat is in the database: it is visibly alive, and then goes silent
        wait_until(lambda: heartbeats(url) > 0, "trial 0's first heartbeat", timeout=60, every=0.2)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        logs = [p.communicate(timeout=400)[0] for p in (a, b)]
        for p, log in zip((a, b), logs):
            assert p.returncode == 0, log[-3000:]
        print(f"two workers, 4 trials: {time.monotonic() - test_started:.0f} s")

        trials = study.get_trials(deepcopy=False)
        by_state = {s: [t for t in trials if t.state.name == s] for s in {t.state.name for t in trials}}
        print({s: [t.number for t in ts] for s, ts in by_state.items()})
        # nothing left RUNNING (the killed worker's trial included) or waiting
        assert set(by_state) <= {"COMPLETE", "PRUNED", "FAIL"}, by_state
        assert len(by_state.get("COMPLETE", [])) + len(by_state.get("PRUNED", [])) >= 4
        # the killed worker's trial was failed by a heartbeat check, and its retry ran to the end
        assert [t.number for t in by_state["FAIL"]] == [0]
        retries = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
        assert len(retries) == 1 and retries[0].state.name == "COMPLETE", retries
        # the poor trial was pruned after 1 of its 2 epochs, below every finished trial
        poor = [t for t in trials if t.params.get("lr") == POOR["lr"]]
        assert len(poor) == 1 and poor[0].state.name == "PRUNED", poor
        assert sorted(poor[0].intermediate_values) == [1]
        assert all(poor[0].intermediate_values[1] < t.value for t in by_state["COMPLETE"])
        # both workers took part, each running its own trials (Optuna's line for each: finished or pruned)
        assert all(len(re.findall(r"Trial \d+ (?:finished|pruned)", log)) == 2 for log in logs), logs
        assert study.best_value == max(t.value for t in by_state["COMPLETE"])
    # the server is stopped when the block ends: the same URL is now refused, in one line that names it
    with pytest.raises(StorageError, match="cannot open the study storage postgresql"):
        open_storage(url)
