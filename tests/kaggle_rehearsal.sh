#!/usr/bin/env bash
# The Kaggle rehearsal (stage 3 of tests/run_tests.sh): every numbered notebook run with papermill as a Kaggle learner
# runs it. Called by run_tests.sh with .venv on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
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

