"""Notebook 04's `train_ddp.sbatch` on a real Slurm cluster: one node on 127.0.0.1, started here and stopped afterwards.

The job (one `srun` task running torchrun, 2 CPU workers) writes the checkpoint that a `torchrun --standalone` run of
the same settings writes, tensor for tensor; a job whose training fails is a failed job (Slurm's state FAILED); a job
sent the signal that comes 90 s before its time limit goes back to the queue and ends the same.

The tests wait on a job with `scontrol show job`, polled every 0.1 s, not `sbatch --wait`: that polls at 2 s and then
every 8 s for a job whose state counts as ended, and a requeued job's does while it completes: CI's first poll once
came then, and sbatch exited 1 at 2 s.

The cluster is Debian's `munge` and `slurm-wlm` (tests/run_tests.sh installs them with apt-get where it runs as root),
with no systemd and no cgroups: munged runs as the munge user, then `slurmctld -i` and `slurmd` read a one-node
slurm.conf of this test's own (`SLURM_CONF`): state, spool, logs and ports of its own. On the shared 2-core host it was
written on, the node was idle 0.1 s after slurmctld started.
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import JOB_ENV, ROOT, TINY, saved_weights, wait_until

from distrinews.ddp import free_port

pytestmark = [pytest.mark.slow, pytest.mark.slow_tier]  # daemons and torchrun jobs
SBATCH = ROOT / "nbs" / "train_ddp.sbatch"
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
MUNGE_PID = Path("/run/munge/munged.pid")
CONF = """\
ClusterName=distrinews-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
AuthType=auth/munge
MailProg=/bin/true
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
# a finished job's record stays 10 s (the tests read its state every 0.1 s); at 2 s, `sbatch --wait`'s poll once came
# too late on a loaded host ("Job 2 no longer found and exit code not found", exit 0)
MinJobAge=10
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(pid_file: Path):
    "SIGTERM to the daemon whose pid `pid_file` holds, and wait (up to 10 s) until it is gone."
    if not pid_file.is_file():
        return
    pid = int(pid_file.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return
        time.sleep(0.1)


def _munge_works(env) -> bool:
    "Does a running munged sign and check a credential?"
    cred = subprocess.run(["munge", "-n"], env=env, capture_output=True)
    return cred.returncode == 0 and subprocess.run(["unmunge"], input=cred.stdout, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    "A one-node Slurm cluster on 127.0.0.1; yields the environment (SLURM_CONF) to submit with. Stops what it started."
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo") if not shutil.which(c, path=SBIN)]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start jobs: run this test as root")
    folder = tmp_path_factory.mktemp("slurm")
    (folder / "state").mkdir(), (folder / "spool").mkdir()
    host = socket.gethostname().split(".")[0]  # slurmd finds its node by this name, and the job's rendezvous uses it
    conf = CONF.format(host=host, ctld_port=free_port(), d_port=free_port(), dir=folder, cpus=os.cpu_count())
    (folder / "slurm.conf").write_text(conf)
    env = dict(JOB_ENV, PATH=f"{Path(sys.executable).parent}{os.pathsep}{SBIN}", SLURM_CONF=str(folder / "slurm.conf"))
    started, t0 = [], time.monotonic()
    try:
        if not _munge_works(env):  # a munged already running (another test session's) serves us too
            subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"], check=True)
            subprocess.run(["runuser", "-u", "munge", "--", shutil.which("munged", path=SBIN)], check=True, env=env)
            started.append(MUNGE_PID)
        for daemon, args in (("slurmctld", ["-i"]), ("slurmd", [])):
            subprocess.run([shutil.which(daemon, path=SBIN), *args], check=True, env=env)
            started.append(folder / f"{daemon}.pid")
        for _ in range(300):
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=10)
            if state.stdout.strip() == "idle":
                break
            time.sleep(0.1)
        else:
            logs = "\n".join((folder / f"{d}.log").read_text()[-1500:] for d in ("slurmctld", "slurmd"))
            pytest.fail(f"the Slurm node never became idle ({state.stdout.strip()!r}):\n{logs}")
        print(f"Slurm cluster up in {time.monotonic() - t0:.1f} s")
        yield env
    finally:
        for pid_file in reversed(started):
            _stop(pid_file)


def submit(env, out_file, *args) -> str:
    "Submit 04's train_ddp.sbatch on one node for 2 CPU workers; returns the job's id."
    env = dict(env, NPROC_PER_NODE="2", RDZV_PORT=str(free_port()))
    cmd = ["sbatch", "--parsable", "--nodes", "1", "--output", str(out_file), str(SBATCH), *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def job_state(env, job_id: str) -> tuple[str, int]:
    "A job's JobState and Restarts, as `scontrol show job` prints them (a finished job's for MinJobAge seconds)."
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    state, restarts = re.search(r"JobState=(\w+)", shown), re.search(r"Restarts=(\d+)", shown)
    return (state[1], int(restarts[1])) if state and restarts else ("", -1)  # "": scontrol failed this once


def wait_for_end(env, job_id: str, timeout=300.0) -> tuple[str, int]:
    "Wait until the job has ended; returns its final state and restarts."
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    wait_until(lambda: job_state(env, job_id)[0] in ended, f"the end of job {job_id}", timeout, every=0.1)
    return job_state(env, job_id)


def test_sbatch_job_equals_torchrun(slurm, encoder, two_rank_run, tmp_path):
    tiny = [*TINY, "--model-name", encoder, "--batch-size", "8"]
    job = submit(slurm, tmp_path / "job.out", *tiny, "--output-dir", tmp_path / "slurm")
    state = wait_for_end(slurm, job)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert state == ("COMPLETED", 0), f"{state}\n{log[-3000:]}"
    assert "2 process(es) x batch 8" in log and "replicas in sync after training: True" in log, log[-3000:]
    # the same settings under `torchrun --standalone` (conftest's 2-rank run, shared with test_ddp.py)
    w_slurm, w_torchrun = saved_weights(tmp_path / "slurm"), saved_weights(two_rank_run[0])
    assert w_slurm.keys() == w_torchrun.keys() and w_slurm
    assert [k for k in w_slurm if not torch.equal(w_slurm[k], w_torchrun[k])] == []
    # a job whose training fails is a failed job, and the job's output says why
    bad = submit(slurm, tmp_path / "bad.out", *tiny, "--profile", "no-such-profile", "--output-dir", tmp_path / "bad")
    assert wait_for_end(slurm, bad) == ("FAILED", 0)
    assert "Unknown profile 'no-such-profile'" in (tmp_path / "bad.out").read_text()


def test_a_job_near_its_time_limit_requeues_itself_and_trains_as_if_uninterrupted(
    slurm, encoder, two_rank_run, tmp_path
):
    """What `--signal=B:USR1@90` sends 90 s before the time limit, sent here (by `scancel`) at the job's first start:
    the job goes back to the queue, starts again, and its checkpoint equals an uninterrupted run's tensor for tensor."""
    out = tmp_path / "job.out"
    output = lambda: out.read_text() if out.exists() else ""  # noqa: E731
    job = submit(slurm, out, *TINY, "--model-name", encoder, "--batch-size", "8", "--output-dir", tmp_path / "slurm")
    # the batch script's first line: its trap is set, and train_ddp.py is still importing torch
    wait_until(lambda: f"job {job}, start 1:" in output(), f"job {job}'s first start", 60, every=0.1)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=slurm, check=True, timeout=30)
    # Slurm holds a requeued job a while (Reason=BeginTime, about 2 minutes): here it starts at once
    wait_until(lambda: job_state(slurm, job) == ("PENDING", 1), f"job {job}'s requeue", 60, every=0.1)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm, check=True, timeout=30)
    state, log = wait_for_end(slurm, job), output()  # both starts: --open-mode=append
    assert state == ("COMPLETED", 1), f"{state}\n{log[-3000:]}"
    assert "goes back to the queue, and will resume" in log and f"job {job}, start 2:" in log, log[-3000:]
    assert log.count("replicas in sync after training: True") == 1, log[-3000:]  # the second start trained
    w_slurm, w_torchrun = saved_weights(tmp_path / "slurm"), saved_weights(two_rank_run[0])
    assert w_slurm.keys() == w_torchrun.keys() and w_slurm
    assert [k for k in w_slurm if not torch.equal(w_slurm[k], w_torchrun[k])] == []
