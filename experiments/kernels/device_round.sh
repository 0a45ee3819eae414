#!/usr/bin/env bash
# One device run of the kernel work (issue 13): Nsight Compute profiles, zipccl against its
# peers (v5 against v4 ran from this script at commit 952f4b0). Results to $1. Needs the
# nvCOMP wheels installed (PYTHONPATH) and .peers/ (DietGPU library, checkpoint bits); see
# experiments/README.md.
set -u
OUT=${1:?usage: device_round.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
step() { echo "=== $* ($(date +%T))"; }
if [ -z "${SKIP_NCU:-}" ]; then
  step ncu; NCU_S=${NCU_S:-200} experiments/kernels/profile_ncu.sh "$OUT"
fi
if [ -z "${SKIP_PEERS:-}" ]; then
  step peers; timeout ${PEERS_S:-240} python3 experiments/bench_peers.py --sizes ${PEER_SIZES:-1 16 64 256 1024} \
    --out "$OUT/codec_peers.jsonl" > "$OUT/peers_log.txt" 2>&1
  grep -v "Warn\|^\s*$" "$OUT/peers_log.txt" | tail -75
fi
step done
