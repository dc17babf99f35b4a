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
# What a Kaggle learner runs, with only what this machine cannot have swapped for local parts: the model (the packaged
# MiniLM instead of a distilbert-base-uncased download) and the data (the local CSVs instead of the hub), both through
# the documented DISTRINEWS_OVERRIDES; tiny sizes so it costs about what the smoke run does. No offline flags: the
# notebooks must not need them. A hub call that slips in fails at once on a closed local port instead of waiting ~50 s.
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT   # the executed copies and 07's scratch results
kaggle_env=(env -u HF_HUB_OFFLINE -u HF_DATASETS_OFFLINE -u DISTRINEWS_PROFILE KAGGLE_KERNEL_RUN_TYPE=Interactive
  HF_ENDPOINT=http://127.0.0.1:9 HF_HUB_ETAG_TIMEOUT=2 HF_HUB_DOWNLOAD_TIMEOUT=2
  DISTRINEWS_OVERRIDES='{"model_name": "sentence-transformers/all-MiniLM-L6-v2", "data_source": "local", "train_size": 512, "test_size": 256, "max_length": 64, "eval_batch_size": 64}')
for nb in nbs/[0-9]*.ipynb; do
  name=$(basename "$nb"); extra=()
  # 07 measures: the driver's tiny parameters, results into a scratch folder (never the committed benchmarks/results)
  [ "$name" = 07_benchmarks.ipynb ] && extra=(-p steps 2 -p warmup 1 -p batch_size 8 -p trainer_samples 32 -p repeats 1
    -y "serving_clients: [4]" -p serving_requests 16 -p out_dir "$out/results")
  start=$SECONDS
  (cd nbs && "${kaggle_env[@]}" ../$BIN/papermill --no-progress-bar --log-level WARNING -p profile kaggle "${extra[@]}" "$name" "$out/$name")
  echo "$name (kaggle rehearsal): $((SECONDS - start)) s"
done

step "4/4 pytest"
# the demo-page test drives Debian's chromium headless (never `playwright install`: it downloads a browser)
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null \
    || echo "could not install chromium: the browser test will be skipped"
fi
# tmp_path folders of passed tests are deleted (checkpoints: ~4 GB a run); a failed test keeps its own to look into
$BIN/python -m pytest -q -o tmp_path_retention_policy=failed tests
