# The two commands of the README. Both create (or reuse) .venv and install what they need.
#   make main   train with DDP on the `cpu` profile (2 CPU workers, or every GPU), evaluate on the real test set,
#               save a resumable checkpoint in runs/cpu/checkpoint, then serve it on http://127.0.0.1:7860
#   make course execute the notebooks on the `cpu` profile and write their outputs back into nbs/ (about an hour on 2 cores: 03 and 04 train the cpu profile)
#   make test   the test command: generated files in sync, ruff, nbdev_test (profile=smoke), the Kaggle rehearsal (each
#               notebook alone, papermill) and pytest, the slow tier's long proofs aside
#   make test-slow  the slow tier: the rehearsal of 07, 08 and 11 and the tests marked slow_tier (CI runs both tiers)
#   make check  the quick loop while editing (~1 min): export in sync, ruff, the fast tests (pytest -m "not slow")
#   make format ruff's formatter and import sorting over the notebooks, benchmarks, tools and tests
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# This workplace keeps a local AG News copy beside the repo: use it when it is there (and then nothing needs the network).
# Elsewhere the `ag_news` dataset comes from the Hugging Face Hub; set DISTRINEWS_DATA_DIR to use another local copy.
LOCAL_AGNEWS := $(abspath ../shared/data/ag_news)
ifneq ($(wildcard $(LOCAL_AGNEWS)/train.csv),)
export DISTRINEWS_DATA_DIR ?= $(LOCAL_AGNEWS)
endif
# The offline path: with local data (or OFFLINE=1) every hub call is switched off, so none can hang on a closed network.
OFFLINE ?= $(if $(DISTRINEWS_DATA_DIR),1,)
OFFLINE_ENV := $(if $(filter 1,$(OFFLINE)),HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1,)

.PHONY: main test test-slow check format install-hooks venv readme docs course wheelhouse
venv: $(VENV)/.installed
$(VENV)/.installed: settings.ini setup.py deployment/requirements.txt deployment/constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch 2.13.0 first, pinned: the version the image serves with (on Linux x86, PyPI's wheel is the CUDA build)
	$(BIN)/pip install -q torch==2.13.0 uv
	# the image's pins (deployment/requirements.txt and constraints.txt) constrain this environment too: the versions
	# the tests run are the versions the Space serves with, whatever has been released since
	grep -hv '^-' deployment/requirements.txt deployment/constraints.txt > $(VENV)/constraints.txt
	# uv installs the other ~190 packages in parallel: 46 s where pip took 162 s (a 2-core AVX2 EPYC, both caches
	# empty). --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, every process would compile
	# transformers again. uv reads no pip.conf: where only pip's configured index is reachable, pip installs.
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c $(VENV)/constraints.txt -e ".[dev,scale,track]" \
	  || $(BIN)/pip install -q -c $(VENV)/constraints.txt -e ".[dev,scale,track]"
	touch $@

PROFILE ?= cpu
main: venv
	PATH="$(abspath $(BIN)):$$PATH" $(OFFLINE_ENV) \
	  bash nbs/run_ddp.sh --profile $(PROFILE) --global-batch-size 32 --output-dir runs/$(PROFILE)
	$(OFFLINE_ENV) $(BIN)/distrinews-serve --checkpoint runs/$(PROFILE)/checkpoint --host 127.0.0.1 --port 7860

test: venv
	bash tests/run_tests.sh

test-slow: venv
	bash tests/run_tests.sh slow

check: venv
	bash tools/check_generated.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 DISTRINEWS_PROFILE=smoke OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" tests

format: venv
	$(BIN)/ruff check --select I --fix .
	$(BIN)/ruff format .

# nbdev's git hooks: notebooks are cleaned of execution metadata on save in Jupyter (settings.ini: jupyter_hooks) and
# notebook merge conflicts are resolved cell by cell (nbdev_merge)
install-hooks: venv
	$(BIN)/nbdev_install_hooks

# Execute every numbered notebook on the profile it is about and write the outputs back (what readers see on GitHub).
# NOTEBOOKS="03 04" runs some of them. See tools/course.py.
course: venv
	PATH="$(abspath $(BIN)):$$PATH" $(OFFLINE_ENV) $(BIN)/python tools/course.py $(NOTEBOOKS)

# Kaggle with the internet off: the course's wheel and what Kaggle's image lacks, in dist/wheelhouse (downloads them;
# EXTRA=scale adds notebook 11's). Upload the folder as a Kaggle dataset and attach it; see tools/wheelhouse.py.
wheelhouse: venv
	$(BIN)/python tools/wheelhouse.py $(if $(EXTRA),--extra $(EXTRA),)

# README.md is rendered from nbs/index.ipynb (nbdev_readme needs Quarto, which this machine cannot install).
# The index links notebooks as the docs site sees them (`01_model.ipynb`); on GitHub they live in nbs/.
# The benchmark report (benchmarks/README.md, generated from JSON) is appended, so the README shows the latest figures.
README_OUT ?= README.md
readme: venv
	{ $(BIN)/jupyter nbconvert --to markdown nbs/index.ipynb --stdout --log-level WARN \
	    | sed -E 's#\]\(([0-9][0-9]_[a-z_]+\.ipynb)#](nbs/\1#g'; \
	  [ ! -f benchmarks/README.md ] || tail -n +2 benchmarks/README.md \
	    | sed -E 's/^## /### /; s#\]\(([a-zA-Z0-9_]+\.png)\)#](benchmarks/\1)#g'; } > $(README_OUT)

# The course as a website (nbdev_docs renders with Quarto: install it from quarto.org first; `pip install quarto-cli`
# works only where GitHub downloads are allowed)
docs: venv
	$(BIN)/nbdev_docs
