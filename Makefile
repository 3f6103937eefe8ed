# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv if missing and install the project with every extra (.[dev]) and the exact pins of
# constraints.txt. `make install-gpu` swaps faiss-cpu for faiss-gpu in that venv (docs/install.md).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# left by `make install-gpu`: a reinstall (pyproject.toml or constraints.txt changed) keeps faiss-gpu
GPU_STAMP := $(VENV)/.faiss-gpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# llama-cpp-python (the `servers` extra) builds llama.cpp from source: without its multimodal library the build
# takes about 6 min on 2 cores instead of about 30 (a CPU build for this machine's instruction set)
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=ON

.PHONY: test test-fast probe demo install install-gpu faiss-gpu lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# the distribution was called memento before memento-mdp: drop an old editable install of it first
	if $(BIN)/python -m pip show --quiet memento 2>/dev/null; then $(BIN)/python -m pip uninstall --quiet --yes memento; fi
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	if test -f $(GPU_STAMP); then $(MAKE) --no-print-directory faiss-gpu; fi
	touch $(STAMP)

install: $(STAMP)

## the project with the GPU build of faiss instead of the CPU one: faiss-cpu and faiss-gpu ship the same
## `faiss` module, so the one is removed before the other goes in (both, then a clean faiss-gpu)
install-gpu: $(STAMP)
	$(MAKE) --no-print-directory faiss-gpu
	touch $(GPU_STAMP)

# (GPU_PIP_FLAGS: extra flags for that pip install; the packaging test passes --no-deps to skip the CUDA wheels)
faiss-gpu:
	$(BIN)/python -m pip uninstall --quiet --yes faiss-cpu faiss-gpu
	$(BIN)/python -m pip install --quiet -c constraints.txt $(GPU_PIP_FLAGS) faiss-gpu
	$(BIN)/python -c "import importlib.metadata as m; \
	    found = sorted({d.metadata['Name'].lower() for d in m.distributions()} & {'faiss-cpu', 'faiss-gpu'}); \
	    assert found == ['faiss-gpu'], found; print('faiss build:', m.version('faiss-gpu'))"

## everything except GPU tests (what CI runs)
test: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu" -q

## the fuzz and kill tests (marker `probe`) with PROBE_SCALE times their examples; the counts (inputs tried,
## requests, SIGKILLs, acknowledged items lost, tracebacks) go to runs/probe/report.json and are printed
PROBE_SCALE ?= 3
probe: $(STAMP)
	mkdir -p runs/probe
	MEMENTO_PROBE_SCALE=$(PROBE_SCALE) MEMENTO_PROBE_REPORT=runs/probe/report.json \
	    $(BIN)/python -m pytest -m "probe and not gpu" -q; \
	    status=$$?; $(BIN)/python -m tests.probe_summary runs/probe/report.json && exit $$status

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
