#!/usr/bin/env bash
# The GPU checks and benchmarks of one run on a 2-GPU machine, in order of priority;
# every result file goes to $1 (default: experiments/results/new). Each step is bounded.
set -u
OUT=${1:?usage: run_gpu_suite.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MPI="mpirun --allow-run-as-root -n 2"
step() { echo "=== $*"; }
step codec tests;   timeout 240 python -m pytest -q -m gpu tests/test_gpu_codec.py 2>&1 | tail -3
step launch;        timeout 90 python experiments/bench_launch.py --out "$OUT/launch_gpu.jsonl" 2>&1 | tail -16
step codec bench;   timeout 240 python experiments/bench_codec.py --sizes ${CODEC_SIZES:-1 16 64 256 1024} \
                      --variants copy api v4 --repeats 5 --out "$OUT/codec_gpu.jsonl" 2>&1 | grep -v "^  \|Warn" | tail -40
for link in ${LINKS_TO_RUN:-shm nvlink}; do
  step collectives $link
  timeout ${COLL_S:-200} $MPI python -m mpi4py experiments/bench_collectives.py --link $link \
      --sizes-mib ${COLL_SIZES:-1,16,64,256,1024} --variants ${COLL_VARIANTS:-nccl,always,auto} \
      --time-budget-s $(( ${COLL_S:-200} - 30 )) --out "$OUT/collectives_gpu.jsonl" 2>&1 | grep -v "Warn\|^  warn" | tail -40
done
step collective tests; timeout ${TEST_S:-400} python -m pytest -q -m gpu tests/test_comm_gpu.py 2>&1 | tail -5
