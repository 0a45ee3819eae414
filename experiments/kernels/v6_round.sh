#!/usr/bin/env bash
# One device session of the v6 work, on one GPU with CuPy: the library's BF16 kernels as they
# were before the one-skeleton refactor (BASE, a commit; its zipccl/ taken with git archive, or
# BASE_DIR, a folder holding a copy of it) and as they are in this tree, then the v6 variants,
# each checked bit for bit before it is timed (v6_bench.py), at 16 MiB, 256 MiB and 1 GiB.
# Records are appended to experiments/results/kernel_variants_v6.jsonl; the last lines printed
# are one table of every timing of this round.
#   bash experiments/kernels/v6_round.sh            (from the repository root)
set -u
BASE=${BASE:-da28525}
SIZES=${SIZES:-16 256 1024}
OUTFILE=${OUTFILE:-experiments/results/kernel_variants_v6.jsonl}
export PYTHONUNBUFFERED=1
ROUND=$(date +%Y%m%dT%H%M%S)
LOG=$(mktemp -d)
echo "=== v6 round $ROUND ($(date +%T))"
if [ -z "${BASE_DIR:-}" ] && git rev-parse -q --verify "$BASE^{commit}" >/dev/null 2>&1; then
  BASE_DIR=$LOG/base && mkdir -p "$BASE_DIR" && git archive "$BASE" zipccl | tar -x -C "$BASE_DIR"
fi
if [ -n "${BASE_DIR:-}" ]; then
  echo "=== library kernels of $BASE ($(date +%T))"
  PYTHONPATH=$BASE_DIR timeout 200 python3 experiments/kernels/v6_bench.py --sizes-mib $SIZES --label base \
    --variants none --out "$OUTFILE" > "$LOG/base.txt" 2>&1 || echo "base run failed: see $LOG/base.txt"
else
  echo "=== no base tree (no git and no BASE_DIR): the refactor's before/after is skipped"
fi
echo "=== library kernels of this tree and the v6 variants ($(date +%T))"
PYTHONPATH=$PWD timeout 240 python3 experiments/kernels/v6_bench.py --sizes-mib $SIZES --label tree \
  --out "$OUTFILE" > "$LOG/tree.txt" 2>&1 || echo "tree run failed: see $LOG/tree.txt"
grep -h "MiB" "$LOG"/*.txt | grep -v "^ *tree\|^ *base" | grep -iv warn
echo "=== done ($(date +%T)); logs in $LOG"
python3 - "$OUTFILE" "$ROUND" <<'PY'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
recs = [r for r in recs if r.get("bench") == "kernel_variants_v6" and r["run_id"] >= sys.argv[2]]
print(f"{'tree':>5} {'kernel':>30} " + " ".join(f"{m:>8g}" for m in sorted({r['size_mib'] for r in recs})) + "  GB/s of BF16 input")
sizes = sorted({r["size_mib"] for r in recs})
for key in dict.fromkeys((r["tree"], r["variant"]) for r in recs):
    got = {r["size_mib"]: r["gbps"] for r in recs if (r["tree"], r["variant"]) == key}
    print(f"{key[0]:>5} {key[1]:>30} " + " ".join(f"{got.get(m, float('nan')):8.0f}" for m in sizes))
PY
