# The two commands of the README. Both create (or reuse) .venv and install what they need.
#   make main   train on the `cpu` profile, evaluate on the real test set, save a checkpoint
#   make test   every test: exported package in sync, nbdev_test, papermill (profile=smoke), pytest
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DISTRINEWS_DATA_DIR ?= $(abspath ../shared/data/ag_news)

.PHONY: main test venv
venv: $(VENV)/.installed
$(VENV)/.installed: settings.ini setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch 2.13.0 first: an unpinned torch would pull several GB of CUDA packages on a CPU machine
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

main: venv
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/distrinews-train --profile cpu

test: venv
	bash tests/run_tests.sh
