#!/usr/bin/env bash
# One device session of the v6 work, on one GPU with CuPy (v6_bench.py checks every buffer bit
# for bit before it times it): this tree's library kernels (BF16 and FP16; graph replay and
# eager; the public compress / decompress), v6a, v6b, v6c and the FP16 table encoder, then the
# library's BF16 kernels of a base tree (BASE, a commit, its zipccl/ taken with git archive, or
# BASE_DIR, a folder holding a copy of it), then the peers (bench_peers.py) where their builds
# are there (.peers/, and nvCOMP importable), at 16 MiB, 256 MiB and 1 GiB.
# Records are appended to experiments/results/kernel_variants_v6.jsonl (peers:
# codec_peers.jsonl); the last lines printed are one table of every timing of this round.
#   bash experiments/kernels/v6_round.sh            (from the repository root)
set -u
BASE=${BASE:-f2a62fe}
SIZES=${SIZES:-16 256 1024}
OUTFILE=${OUTFILE:-experiments/results/kernel_variants_v6.jsonl}
PEERS_OUT=${PEERS_OUT:-experiments/results/codec_peers.jsonl}
export PYTHONUNBUFFERED=1
ROUND=$(date +%Y%m%dT%H%M%S)
LOG=${LOG:-$(mktemp -d)}
mkdir -p "$LOG"
echo "=== v6 round $ROUND ($(date +%T)); $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null)"
echo "=== library kernels of this tree and the v6 variants ($(date +%T))"
PYTHONPATH=$PWD timeout "${TREE_S:-270}" python3 experiments/kernels/v6_bench.py --sizes-mib $SIZES --label tree \
  --out "$OUTFILE" > "$LOG/tree.txt" 2>&1 || echo "tree run failed or cut short: see $LOG/tree.txt"
if [ -z "${BASE_DIR:-}" ] && git rev-parse -q --verify "$BASE^{commit}" >/dev/null 2>&1; then
  BASE_DIR=$LOG/base && mkdir -p "$BASE_DIR" && git archive "$BASE" zipccl | tar -x -C "$BASE_DIR"
fi
if [ -n "${BASE_DIR:-}" ]; then
  echo "=== library kernels of the base tree ($(date +%T))"
  PYTHONPATH=$BASE_DIR timeout "${BASE_S:-110}" python3 experiments/kernels/v6_bench.py --sizes-mib $SIZES \
    --label base --variants none --out "$OUTFILE" > "$LOG/base.txt" 2>&1 || echo "base run failed: see $LOG/base.txt"
else
  echo "=== no base tree (no git and no BASE_DIR): the before/after of the library is skipped"
fi
if [ -f .peers/libdietgpu_bf16.so ] && python3 -c "import nvidia.nvcomp" 2>/dev/null; then
  echo "=== peers ($(date +%T))"
  PYTHONPATH=$PWD timeout "${PEERS_S:-150}" python3 experiments/bench_peers.py --sizes $SIZES --out "$PEERS_OUT" \
    > "$LOG/peers.txt" 2>&1 || echo "peers run failed: see $LOG/peers.txt"
  grep -v "Warn\|^\s*$" "$LOG/peers.txt" | tail -30
else
  echo "=== peers skipped: no .peers/libdietgpu_bf16.so or no nvCOMP (experiments/README.md, round 2)"
fi
grep -h "MiB\|differ\|Error\|error\|zipccl from" "$LOG"/tree.txt "$LOG"/base.txt 2>/dev/null | grep -iv warn | head -40
echo "=== done ($(date +%T)); logs in $LOG"
python3 - "$OUTFILE" "$ROUND" <<'PY'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
recs = [r for r in recs if r.get("bench") == "kernel_variants_v6" and r["run_id"] >= sys.argv[2]]
sizes = sorted({r["size_mib"] for r in recs})
print(f"{'tree':>4} {'type':>4} {'mode':>5} {'kernel':>31} " + " ".join(f"{m:>7g}" for m in sizes) + "  GB/s of input")
for key in dict.fromkeys((r["tree"], r.get("dtype", "bf16"), r["mode"], r["variant"]) for r in recs):
    got = {r["size_mib"]: r["gbps"] for r in recs
           if (r["tree"], r.get("dtype", "bf16"), r["mode"], r["variant"]) == key}
    print(f"{key[0]:>4} {key[1]:>4} {key[2]:>5} {key[3][:31]:>31} "
          + " ".join(f"{got.get(m, float('nan')):7.0f}" for m in sizes))
PY
