#!/usr/bin/env bash
# The test suite in two tiers (Makefile: `make test`, `make test-slow`; each installs .venv first; CI runs both).
# Offline: nothing here touches the hub.
#   bash tests/run_tests.sh        the test command: generated files, ruff, nbdev_test, the Kaggle rehearsal of every
#                                  notebook but the slow tier's, pytest but the tests marked slow_tier
#   bash tests/run_tests.sh slow   the slow tier: the long proofs -- the rehearsal of the notebooks that measure or
#                                  start clusters (07, 08, 11) and the tests marked slow_tier (killed workers, two agents,
#                                  3 ranks, Slurm, Ray and Optuna on PostgreSQL, the clean image venv, the docs site)
set -euo pipefail
tier=${1:-fast}
SLOW_NOTEBOOKS=(07 08 11)  # 07 measures, 08 starts failing jobs on purpose, 11 starts Ray clusters
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
case $tier in
  fast) name="the test command" stage3="3/4" stage4="4/4" marks="not slow_tier" rehearse=()
        mapfile -t notebooks < <(cd nbs && ls [0-9][0-9]_*.ipynb | cut -c1-2)
        for n in "${notebooks[@]}"; do [[ " ${SLOW_NOTEBOOKS[*]} " =~ " $n " ]] || rehearse+=("$n"); done ;;
  slow) name="the slow tier" stage3="slow tier 1/2" stage4="slow tier 2/2" marks="slow_tier"
        rehearse=("${SLOW_NOTEBOOKS[@]}") ;;
  *) echo "usage: bash $0 [slow]   (no argument: the test command; slow: the slow tier)"; exit 2 ;;
esac
step() { printf '\n=== %s   [%d s into %s]\n' "$*" "$SECONDS" "$name"; }
trap 'printf "\n=== %s took %d s\n" "$name" "$SECONDS"' EXIT

if [ "$tier" = fast ]; then
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
fi

step "$stage3 the Kaggle rehearsal of ${rehearse[*]}: each notebook alone in an empty Kaggle-like session"
KAGGLE_REHEARSAL_PARALLEL=1 bash tests/kaggle_rehearsal.sh "${rehearse[@]}"  # two notebooks at a time

step "$stage4 pytest -m \"$marks\": 2 workers, the slowest tests listed at the end"
# Debian's packages some tests need: the demo-page test drives chromium headless (never `playwright install`: it
# downloads a browser), the Space push test needs git-lfs, the Slurm test (the slow tier's) slurm-wlm and munge
need=()
if [ "$tier" = fast ]; then
  command -v chromium >/dev/null || need+=(chromium)
  git lfs version >/dev/null 2>&1 || need+=(git-lfs)
else
  [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/munged ] || need+=(slurm-wlm munge)
fi
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") \
    >/dev/null || echo "could not install ${need[*]}: the tests that need them will be skipped"
fi
# --dist loadfile: each file's tests on one worker, so a module-scoped fixture (a server, a docs site, a venv, the 2-rank
# run test_ddp.py compares against) is built once. (`--dist loadgroup` with xdist_group marks would do it per group,
# but pytest-xdist 3.8 names the group by setting item._nodeid, which pytest 9 no longer reads: every fixture was
# built on both workers.) The two longest files of each tier go to different workers.
$BIN/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "$marks" tests  # conftest.py's order: longest first
