# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv if missing and install the project with the exact pins of constraints.txt.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: test test-fast demo install lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## everything except GPU tests (what CI runs)
test: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu" -q

## the quick loop while developing
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not gpu" -q

lint: $(STAMP)
	$(BIN)/ruff check memento policies training tests

## the main job: the online loop on the shipped facts-real suite (test split) with the real Gemma 3 270M
## planner, soft-Q (from the selector pre-trained on its train split) against similarity (`memento demo --help`).
demo: $(STAMP)
	$(BIN)/memento demo

clean:
	rm -rf runs .pytest_cache .ruff_cache .mypy_cache
