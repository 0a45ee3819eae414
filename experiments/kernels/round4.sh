#!/usr/bin/env bash
# One device run of round 4's closing measurements, on one GPU, records and logs to $1:
#   1. v7_bench.py: the library's BF16 / FP32 decoders as called and both forced (the block
#      decoder, the warp-a-tile decoder), the FP16 decoder, the FP32 encoder, at 16 MiB-1 GiB;
#   2. pytest -m gpu on the kernel suites;
#   3. bench_peers.py: the library beside DietGPU and nvCOMP, where .peers/ and nvCOMP are there;
#   4. Nsight Compute on the library's kernels (profile_ncu.sh, both BF16 decoders forced);
#   5. frame_check.py --no-sync: the bench's old unsynchronised host copy, once.
# Logs go to $1/log.txt. Each step has its own time limit (seconds: BENCH_S, TESTS_S, PEERS_S, NCU_S, CHECK_S); the last
# lines printed are the v7 table.
#   bash experiments/kernels/round4.sh OUTDIR          (from the repository root)
set -u
OUT=${1:?usage: round4.sh OUTDIR}
mkdir -p "$OUT"
LOG=$OUT/log.txt
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
step() { echo "=== $* ($(date +%T))"; }
step "v7_bench"
timeout "${BENCH_S:-200}" python3 experiments/kernels/v7_bench.py --skip v7b \
  --sizes-mib ${SIZES:-16 32 64 128 256 1024} --out "$OUT/kernel_variants_v7.jsonl" > "$LOG" 2>&1
echo "v7_bench: exit $?"; grep -v Warn "$LOG" | grep -i "differ\|error\|traceback" | head
step "pytest -m gpu"
timeout "${TESTS_S:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_codec.py \
  tests/test_gpu_dtypes.py tests/test_gpu_reduce.py tests/test_array_kinds.py tests/test_spill_gpu.py \
  > "$OUT/part.txt" 2>&1
echo "gpu tests: exit $?"; tail -4 "$OUT/part.txt"; cat "$OUT/part.txt" >> "$LOG"
if [ -f .peers/libdietgpu_bf16.so ] && python3 -c "import nvidia.nvcomp" 2>/dev/null; then
  step "peers"
  timeout "${PEERS_S:-130}" python3 experiments/bench_peers.py --sizes 16 256 1024 \
    --out "$OUT/codec_peers.jsonl" > "$OUT/part.txt" 2>&1
  echo "peers: exit $?"; grep -v "Warn\|^\s*$" "$OUT/part.txt" | grep "zipccl\|dietgpu\|nvcomp" | grep -v checkpoint \
    | head -40; cat "$OUT/part.txt" >> "$LOG"
fi
step "ncu"
NCU_S=${NCU_S:-110} bash experiments/kernels/profile_ncu.sh "$OUT" decoders > /dev/null 2>&1
python3 experiments/kernels/profiles/summarize.py "$OUT/ncu_details.txt" > "$OUT/ncu_summary.txt" 2>&1
echo "ncu: $(grep -c Duration "$OUT/ncu_summary.txt") kernels"
step "frame_check --no-sync"
timeout "${CHECK_S:-45}" python3 experiments/kernels/frame_check.py --sizes-mib 256 --seeds 300 --no-sync \
  > "$OUT/part.txt" 2>&1
grep -v Warn "$OUT/part.txt" | head -8; cat "$OUT/part.txt" >> "$LOG"; rm -f "$OUT/part.txt"
step "done"
python3 experiments/kernels/v7_bench.py --table --files "$OUT/kernel_variants_v7.jsonl"
