#!/usr/bin/env bash
# The GPU checks and benchmarks that one GPU allows, in order of priority; every record and log
# goes to OUTDIR. Each step is bounded. STEPS picks steps (default: all):
#   tests    pytest -m gpu on the codec, types, reductions, array kinds and spill kernels
#   slots    zipccl.torch's slot and spill paths, 2 ranks sharing the GPU over gloo, with
#            CUDA_DEVICE_MAX_CONNECTIONS=1 and with the default
#   backend  the torch.distributed backend over NCCL (1 rank) and over gloo (2 ranks)
#   host     experiments/bench_host_path.py (main-thread cost and waits, 2 gloo ranks)
#   kernels  experiments/kernels/v6_round.sh (library kernels before/after, v6 variants)
#   api      experiments/bench_api_overhead.py (the public compress / decompress)
#   bash experiments/run_one_gpu.sh OUTDIR
set -u
OUTDIR=${1:?usage: run_one_gpu.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
STEPS=${STEPS:-tests slots backend host kernels api}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
step() { echo "=== $* ($(date +%T))"; }
step machine; nvidia-smi -L; python3 -c "import cupy, torch, numba_cuda; print('cupy', cupy.__version__, 'torch', torch.__version__)"
if has tests; then
  step gpu tests
  timeout ${TESTS_S:-300} python3 -m pytest -q -m gpu -p no:cacheprovider -x --tb=short \
    tests/test_spill_gpu.py tests/test_gpu_codec.py tests/test_gpu_dtypes.py tests/test_gpu_reduce.py \
    tests/test_array_kinds.py 2>&1 | tail -25
fi
if has slots; then
  for conn in 1 default; do
    step "slot and spill paths, CUDA_DEVICE_MAX_CONNECTIONS=$conn"
    if [ $conn = default ]; then unset CUDA_DEVICE_MAX_CONNECTIONS; else export CUDA_DEVICE_MAX_CONNECTIONS=$conn; fi
    timeout ${SLOTS_S:-180} python3 tests/torchdist/gpu_slots_check.py 2>&1 | grep -v "^rank 0 ok" | tail -30
  done
  unset CUDA_DEVICE_MAX_CONNECTIONS
fi
if has backend; then
  step backend; timeout ${BACKEND_S:-150} python3 tests/torchdist/backend_gpu_check.py 2>&1 | tail -20
fi
if has host; then
  step host path
  timeout ${HOST_S:-200} python3 experiments/bench_host_path.py --out "$OUTDIR/host_path.jsonl" 2>&1 | tail -20
fi
if has kernels; then
  step kernels
  OUTFILE="$OUTDIR/kernel_variants_v6.jsonl" timeout ${KERNELS_S:-460} bash experiments/kernels/v6_round.sh 2>&1 | tail -30
fi
if has api; then
  step public api
  timeout ${API_S:-200} python3 experiments/bench_api_overhead.py --out "$OUTDIR/api_overhead.jsonl" 2>&1 | tail -20
fi
step done
