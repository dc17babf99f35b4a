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
step() { printf '\n=== %s\n' "$*"; }

step "1/4 the generated files are in sync with their sources, and ruff passes"
bash tools/check_generated.sh   # distrinews/ = nbdev_export(nbs/), notebooks nbdev_clean, README = make readme
$BIN/ruff check .
$BIN/ruff format --check .

step "2/4 nbdev_test: every notebook once, profile=smoke   |   3/4 the Kaggle rehearsal: every notebook once more, alone"
# the two stages run side by side (their log is printed as it comes: the rehearsal's here, nbdev_test's when it ends);
# most of a notebook's time is starting processes and waiting on them, so two stages fill the two cores better than one
logs=$(mktemp -d); trap 'rm -rf "$logs"' EXIT
( cd nbs && ../$BIN/nbdev_test --n_workers 2 --timing >"$logs/nbdev_test.log" 2>&1; echo $? >"$logs/nbdev_test.rc" ) &
rehearsal=0; bash tests/kaggle_rehearsal.sh || rehearsal=$?
wait
printf '\n--- nbdev_test (profile=smoke):\n'; cat "$logs/nbdev_test.log"
[ "$(cat "$logs/nbdev_test.rc")" = 0 ] || { echo "nbdev_test failed"; exit 1; }
[ "$rehearsal" = 0 ] || { echo "the Kaggle rehearsal failed"; exit 1; }
# the %%writefile cells of 04 write the training script and its launcher, 06 writes deployment/ and the demo page: the
# committed copies must be exactly what the notebooks write
git diff --exit-code --stat -- nbs/*.py nbs/*.sh deployment distrinews/static || {
  echo "a file a notebook writes differs from the committed one: edit the notebook and commit what it writes."; exit 1; }

step "4/4 pytest: the library, the scripts, the server, the deployment (2 workers; slowest tests listed at the end)"
# the demo-page test drives Debian's chromium headless (never `playwright install`: it downloads a browser)
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null \
    || echo "could not install chromium: the browser test will be skipped"
fi
# --dist loadfile: a test file's tests share one worker, so its module-scoped fixtures (a server, a site) are built once
$BIN/python -m pytest -q -n 2 --dist loadfile tests
