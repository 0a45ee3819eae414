#!/usr/bin/env bash
# The GPU checks and benchmarks that one GPU allows, in order of priority; every record and log
# goes to OUTDIR. Each step is bounded. STEPS picks steps (default: all):
#   cold      experiments/bench_cold_start.py: the first call with an empty kernel cache,
#             `python -m zipccl warmup`, the first call with the cache warm (it stays warm for
#             the steps after it: ZIPCCL_CACHE_DIR is OUTDIR/kernel_cache unless set)
#   tests     pytest -m gpu, every GPU test (make test-gpu), with a JUnit file and durations
#   newcomer  the README's commands on one GPU: the demo (auto and forced NCCL), both examples
#             on the GPU and with --device cpu
#   host      experiments/bench_host_path.py (main-thread cost and waits, 2 gloo ranks)
#   hostcmp   the same at 1, 16, 64 MiB with Python calls counted (and by function), then one rank over NCCL with
#             Policy.loopback, then (OLD_TREE: an earlier tree unpacked there) that tree, 2 ranks
#   kernels   experiments/kernels/v6_round.sh (library kernels before/after, v6 variants)
#   codecab   the public compress / decompress (BF16: bench_codec; FP32, FP16: bench_dtypes) at
#             CODEC_SIZES MiB, this tree, then OLD_TREE (as in hostcmp) with its own scripts
#   graph     the CUDA-graph GPU tests (tests/test_graph_gpu.py), then bench_host_path.py on one
#             rank over NCCL (loopback) with each call also captured and replayed (--graph)
#   api       experiments/bench_api_overhead.py (the public compress / decompress), then its
#             Python calls, launches and waits per call (--count-calls)
#   graphab   bench_host_path.py on one rank over NCCL (loopback) on the default stream, four
#             alternating processes: zipccl's own graphs (ZIPCCL_GRAPHS=1) and plans only (=0)
#   bash experiments/run_one_gpu.sh OUTDIR
set -u
OUTDIR=${1:?usage: run_one_gpu.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ZIPCCL_CACHE_DIR=${ZIPCCL_CACHE_DIR:-$OUTDIR/kernel_cache}
STEPS=${STEPS:-cold tests newcomer host kernels api}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
step() { echo "=== $* ($(date +%T))"; }
step machine; nvidia-smi -L; python3 -c "import cupy, torch, numba_cuda; print('cupy', cupy.__version__, 'torch', torch.__version__)"
if has cold; then
  step cold start
  timeout ${COLD_S:-240} python3 experiments/bench_cold_start.py --out "$OUTDIR/cold_start.jsonl" 2>&1 | tail -25
fi
if has tests; then
  step gpu tests
  ZIPCCL_REQUIRE_GPU=1 timeout ${TESTS_S:-420} python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short \
    --junitxml="$OUTDIR/gpu_tests.xml" --durations=15 ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -${TESTS_TAIL:-60}
fi
if has newcomer; then
  MPI="mpirun --allow-run-as-root -n 2"
  TR="python3 -m torch.distributed.run --standalone --nproc_per_node 2"
  step "demo (auto)"; timeout 150 $MPI python3 -m zipccl demo 2>&1 | tail -12; echo "rc=$?"
  step "demo (--backend nccl)"; timeout 90 $MPI python3 -m zipccl demo --backend nccl 2>&1 | tail -6
  for ex in fsdp2 ddp; do
    for dev in cuda cpu; do
      step "examples/$ex.py --device $dev"; timeout 150 $TR examples/$ex.py --device $dev 2>&1 | grep -v "^W1\|warn" | tail -8
    done
  done
fi
if has host; then
  step host path
  timeout ${HOST_S:-200} python3 experiments/bench_host_path.py --out "$OUTDIR/host_path.jsonl" 2>&1 | tail -20
fi
if has graph; then
  step "CUDA graphs: GPU tests"
  timeout ${GRAPH_TEST_S:-400} python3 -m pytest -m gpu -q tests/test_graph_gpu.py --junitxml "$OUTDIR/graph_tests.xml" 2>&1 | tail -15
  step "CUDA graphs: host path, one rank over NCCL, loopback, eager and replayed"
  timeout ${HOST_S:-200} python3 experiments/bench_host_path.py --ranks 1 --loopback --backend nccl --graph \
    --sizes-mib ${HOST_SIZES:-1,16,64} --out "$OUTDIR/host_path.jsonl" 2>&1 | grep -v Warn | tail -12
fi
if has hostcmp; then
  SZ=${HOST_SIZES:-1,16,64}
  BY="--calls-by-function $OUTDIR/calls_by_function.jsonl"
  step "host path, this tree ($ZIPCCL_COMMIT), 2 gloo ranks"
  timeout ${HOST_S:-200} python3 experiments/bench_host_path.py --sizes-mib $SZ $BY --out "$OUTDIR/host_path.jsonl" 2>&1 | grep -v Warn | tail -6
  step "host path, this tree, one rank over NCCL, loopback"
  timeout ${HOST_S:-200} python3 experiments/bench_host_path.py --ranks 1 --loopback --backend nccl --sizes-mib $SZ $BY \
    --out "$OUTDIR/host_path.jsonl" 2>&1 | grep -v Warn | tail -6
  if [ -n "${OLD_TREE:-}" ]; then
    step "host path, $OLD_TREE (${OLD_COMMIT:-}), 2 gloo ranks"
    cp experiments/bench_host_path.py "$OLD_TREE/experiments/bench_host_path_now.py"
    (cd "$OLD_TREE" && ZIPCCL_COMMIT=${OLD_COMMIT:-} PYTHONPATH=$PWD timeout ${HOST_S:-200} python3 \
      experiments/bench_host_path_now.py --sizes-mib $SZ $BY --out "$OUTDIR/host_path.jsonl" 2>&1 | grep -v Warn | tail -6)
  fi
fi
if has codecab; then
  CS=${CODEC_SIZES:-16 256}
  for tree in "$PWD" ${OLD_TREE:+"$OLD_TREE"}; do
    step "codec A/B: $tree"
    (cd "$tree" && PYTHONPATH=$tree timeout ${CODEC_S:-120} python3 experiments/bench_codec.py --sizes $CS \
      --variants copy api --modes eager --out "$OUTDIR/codec_ab.jsonl" 2>&1 | tail -8
     PYTHONPATH=$tree timeout ${CODEC_S:-120} python3 experiments/bench_dtypes.py \
      --out "$OUTDIR/dtypes_ab_$(basename "$tree").jsonl" gpu --sizes "${CS// /,}" 2>&1 | tail -8)
  done
fi
if has kernels; then
  step kernels
  OUTFILE="$OUTDIR/kernel_variants_v6.jsonl" timeout ${KERNELS_S:-460} bash experiments/kernels/v6_round.sh 2>&1 | tail -30
fi
if has api; then
  step public api
  timeout ${API_S:-200} python3 experiments/bench_api_overhead.py --out "$OUTDIR/api_overhead.jsonl" 2>&1 | tail -20
  timeout ${API_S:-200} python3 experiments/bench_api_overhead.py --count-calls --out "$OUTDIR/api_overhead.jsonl" 2>&1 | tail -9
fi
if has graphab; then
  for g in 1 0 1 0; do
    step "one rank over NCCL, loopback, default stream, ZIPCCL_GRAPHS=$g"
    ZIPCCL_GRAPHS=$g timeout ${HOST_S:-200} python3 experiments/bench_host_path.py --ranks 1 --loopback --backend nccl \
      --sizes-mib ${HOST_SIZES:-1,16,64} --out "$OUTDIR/host_path.jsonl" 2>&1 | grep "call "
  done
fi
step done
