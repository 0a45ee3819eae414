#!/usr/bin/env bash
# One device run of the kernel rounds, on one GPU with CuPy (v6_bench.py and v7_bench.py check
# every buffer bit for bit before they time it): this tree's library kernels (BF16 and FP16; graph
# replay and eager; the public compress / decompress), v6a, v6b and the one-tile-a-ticket encoder,
# then the library's BF16 kernels of a base tree (BASE, a commit, its zipccl/ taken with git
# archive, or BASE_DIR, a folder holding a copy of it), then round 4's variants beside the library
# (v7_bench.py: the library's FP16 decoder, which is round 4's v7a; v7b, the FP32 encoder on
# pairs of tiles), then the peers (bench_peers.py) where their builds are there (.peers/, and nvCOMP
# importable), at 16 MiB, 256 MiB and 1 GiB. V6=0 skips the v6 runs (tree and base), V7=0 round 4's.
# Records are appended to experiments/results/kernel_variants_v6.jsonl and kernel_variants_v7.jsonl
# (peers: codec_peers.jsonl); the last lines printed are one table of every timing of this round.
#   bash experiments/kernels/v6_round.sh            (from the repository root)
set -u
BASE=${BASE:-f2a62fe}
SIZES=${SIZES:-16 256 1024}
OUTFILE=${OUTFILE:-experiments/results/kernel_variants_v6.jsonl}
OUT7=${OUT7:-experiments/results/kernel_variants_v7.jsonl}
PEERS_OUT=${PEERS_OUT:-experiments/results/codec_peers.jsonl}
export PYTHONUNBUFFERED=1
ROUND=$(date +%Y%m%dT%H%M%S)
LOG=${LOG:-$(mktemp -d)}
mkdir -p "$LOG"
echo "=== kernel round $ROUND ($(date +%T)); $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null)"
if [ "${V6:-1}" != 0 ]; then
echo "=== library kernels of this tree and the v6 variants ($(date +%T))"
PYTHONPATH=$PWD timeout "${TREE_S:-200}" python3 experiments/kernels/v6_bench.py --sizes-mib $SIZES --label tree \
  --out "$OUTFILE" > "$LOG/tree.txt" 2>&1 || echo "tree run failed or cut short: see $LOG/tree.txt"
if [ -z "${BASE_DIR:-}" ] && git rev-parse -q --verify "$BASE^{commit}" >/dev/null 2>&1; then
  BASE_DIR=$LOG/base && mkdir -p "$BASE_DIR" && git archive "$BASE" zipccl | tar -x -C "$BASE_DIR"
fi
if [ -n "${BASE_DIR:-}" ]; then
  echo "=== library kernels of the base tree ($(date +%T))"
  PYTHONPATH=$BASE_DIR timeout "${BASE_S:-100}" python3 experiments/kernels/v6_bench.py --sizes-mib $SIZES \
    --label base --variants none --out "$OUTFILE" > "$LOG/base.txt" 2>&1 || echo "base run failed: see $LOG/base.txt"
else
  echo "=== no base tree (no git and no BASE_DIR): the before/after of the library is skipped"
fi
fi
if [ "${V7:-1}" != 0 ]; then
  echo "=== round 4: v7b (FP32 encode on pairs) beside the library, the library FP16 decoder (v7a) ($(date +%T))"
  PYTHONPATH=$PWD timeout "${V7_S:-240}" python3 experiments/kernels/v7_bench.py --sizes-mib $SIZES --label tree \
    --out "$OUT7" > "$LOG/v7.txt" 2>&1 || echo "v7 run failed or cut short: see $LOG/v7.txt"
fi
if [ -f .peers/libdietgpu_bf16.so ] && python3 -c "import nvidia.nvcomp" 2>/dev/null; then
  echo "=== peers ($(date +%T))"
  PYTHONPATH=$PWD timeout "${PEERS_S:-150}" python3 experiments/bench_peers.py --sizes $SIZES --out "$PEERS_OUT" \
    > "$LOG/peers.txt" 2>&1 || echo "peers run failed: see $LOG/peers.txt"
  grep -v "Warn\|^\s*$" "$LOG/peers.txt" | tail -30
else
  echo "=== peers skipped: no .peers/libdietgpu_bf16.so or no nvCOMP (experiments/README.md, round 2)"
fi
grep -h "MiB\|differ\|Error\|error\|zipccl from\|bit exact\|library frame" "$LOG"/tree.txt "$LOG"/base.txt "$LOG"/v7.txt \
  2>/dev/null | grep -iv warn | head -60
echo "=== done ($(date +%T)); logs in $LOG"
PYTHONPATH=$PWD python3 experiments/kernels/v7_bench.py --table --since "$ROUND" --files "$OUTFILE" "$OUT7"
