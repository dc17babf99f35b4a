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

step "1/4 the exported package is in sync with the notebooks"
$BIN/nbdev_export
git diff --exit-code --stat -- distrinews || { echo "distrinews/ differs from what nbs/ export: run nbdev_export and commit."; exit 1; }
make -s readme
git diff --exit-code --stat -- README.md || { echo "README.md differs from nbs/index.ipynb: run 'make readme' and commit."; exit 1; }

step "2/4 nbdev_test: every notebook, profile=smoke"
(cd nbs && ../$BIN/nbdev_test --n_workers 1 --timing)
# 04_ddp writes the DDP script and its launcher (%%writefile), 06_deploy writes deployment/: the committed copies must be
# exactly what the notebooks write
git diff --exit-code --stat -- nbs/train_ddp.py nbs/run_ddp.sh deployment || { echo "nbs/train_ddp.py, nbs/run_ddp.sh or deployment/ differ from what 04_ddp / 06_deploy write: edit the notebooks and commit what they write."; exit 1; }

step "3/4 Kaggle rehearsal: every notebook with papermill -p profile kaggle, as on a Kaggle kernel"
bash tests/kaggle_rehearsal.sh

step "4/4 pytest"
# the demo-page test drives Debian's chromium headless (never `playwright install`: it downloads a browser)
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null \
    || echo "could not install chromium: the browser test will be skipped"
fi
# tmp_path folders of passed tests are deleted (checkpoints: ~4 GB a run); a failed test keeps its own to look into
$BIN/python -m pytest -q -o tmp_path_retention_policy=failed tests
