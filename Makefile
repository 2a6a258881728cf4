# Two entry points, both safe on a fresh machine: each installs what it needs first.
#   make demo   the operator reconciling examples/minicpmspeech.yaml on an embedded API emulator
#   make test   lint, type checks and the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test
demo: $(VENV)/.installed-demo
	$(BIN)/minicpm-speech demo

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/mypy operator/minicpm_speech_operator perf-jobs/minicpm_speech_perf
	$(BIN)/pytest

$(VENV)/.installed-demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed-demo
	.ci/system-packages
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@
