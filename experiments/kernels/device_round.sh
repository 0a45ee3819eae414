#!/usr/bin/env bash
# One device run of the kernel work (issue 13): Nsight Compute profiles, v5 against v4,
# zipccl against its peers. Results to $1. Needs the nvCOMP wheels installed (PYTHONPATH)
# and .peers/ (DietGPU library, checkpoint bits); see experiments/README.md.
set -u
OUT=${1:?usage: device_round.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
step() { echo "=== $* ($(date +%T))"; }
if [ -z "${SKIP_NCU:-}" ]; then
  step ncu; NCU_S=${NCU_S:-200} experiments/kernels/profile_ncu.sh "$OUT" ${V5_PROFILE:-2:8}
fi
if [ -z "${SKIP_V5:-}" ]; then
  step v5; timeout ${V5_S:-150} python3 experiments/kernels/v5_check.py --sizes-mib ${V5_SIZES:-16 256 1024} \
    --configs ${V5_CONFIGS:-1:8 2:8 2:6} --out "$OUT/codec_gpu_v5.jsonl" > "$OUT/v5_log.txt" 2>&1
  grep -v "^\s*$" "$OUT/v5_log.txt" | grep -v Warn | tail -14
fi
if [ -z "${SKIP_PEERS:-}" ]; then
  step peers; timeout ${PEERS_S:-240} python3 experiments/bench_peers.py --sizes ${PEER_SIZES:-1 16 64 256 1024} \
    --out "$OUT/codec_peers.jsonl" > "$OUT/peers_log.txt" 2>&1
  grep -v "Warn\|^\s*$" "$OUT/peers_log.txt" | tail -75
fi
step done
