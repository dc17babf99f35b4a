#!/usr/bin/env bash
# The whole test suite (called by `make test`, which installs .venv first). Offline: nothing here touches the hub.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PATH="$PWD/$BIN:$PATH"            # torchrun for the notebooks' launch cells
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DISTRINEWS_DATA_DIR="${DISTRINEWS_DATA_DIR:-$(cd .. && pwd)/shared/data/ag_news}"
export DISTRINEWS_PROFILE=smoke
export DISTRINEWS_CACHE="${DISTRINEWS_CACHE:-$PWD/.cache}"
# every stage below runs jobs side by side (2 notebooks, 2 rehearsal lanes, 2 pytest workers): one torch thread
# each. With torch's default (a thread per core), jobs side by side on 2 cores make OpenMP's threads spin waiting for
# each other: 03's training took 586 s beside another notebook instead of 59 s alone. Set OMP_NUM_THREADS to override.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# The few runs with more threads (04's fair comparison, 09's threads demo) wait without spinning, so that they do not
# burn the CPU of the job beside them. Measured, a 2-thread run beside a 1-thread one: 12.5 s and 11.7 CPU-s spinning,
# 9.0 s and 7.4 CPU-s passive (the 1-thread neighbour: 10.0 s, 9.2 s).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
step() { printf '\n=== %s   [%d s into the test command]\n' "$*" "$SECONDS"; }
trap 'printf "\n=== the test command took %d s\n" "$SECONDS"' EXIT

step "1/4 the generated files are in sync with their sources, and ruff passes"
bash tools/check_generated.sh   # distrinews/ = nbdev_export(nbs/), notebooks nbdev_clean, README = make readme
$BIN/ruff check .
$BIN/ruff format --check .

step "2/4 nbdev_test: every notebook once, profile=smoke"
(cd nbs && ../$BIN/nbdev_test --n_workers 2 --timing)
# the %%writefile cells of 04 write the training script and its launchers (run_ddp.sh, train_ddp.sbatch), 06 writes
# deployment/ and the demo page: the committed copies must be exactly what the notebooks write
git diff --exit-code --stat -- nbs/*.py nbs/*.sh nbs/*.sbatch deployment distrinews/static || {
  echo "a file a notebook writes differs from the committed one: edit the notebook and commit what it writes."; exit 1; }

step "3/4 the Kaggle rehearsal: every notebook once more, alone in an empty Kaggle-like session"
KAGGLE_REHEARSAL_PARALLEL=1 bash tests/kaggle_rehearsal.sh  # two notebooks at a time

step "4/4 pytest: the library, the scripts, the server, the deployment (2 workers; slowest tests listed at the end)"
# Debian's packages some tests need: the demo-page test drives chromium headless (never `playwright install`: it
# downloads a browser), the Space push test needs git-lfs, the Slurm test slurm-wlm and munge
need=()
command -v chromium >/dev/null || need+=(chromium)
git lfs version >/dev/null 2>&1 || need+=(git-lfs)
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/munged ] || need+=(slurm-wlm munge)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") \
    >/dev/null || echo "could not install ${need[*]}: the tests that need them will be skipped"
fi
# --dist loadfile: each file's tests on one worker, so a module-scoped fixture (a server, a docs site, a venv, the 2-rank
# run test_ddp.py compares against) is built once. (`--dist loadgroup` with xdist_group marks would do it per group,
# but pytest-xdist 3.8 names the group by setting item._nodeid, which pytest 9 no longer reads: every fixture was
# built on both workers.) The two longest files, test_ddp.py and test_ddp_fault_tolerance.py, go to different workers.
$BIN/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests  # in the order conftest.py sets: longest first
