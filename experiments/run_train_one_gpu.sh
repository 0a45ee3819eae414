#!/usr/bin/env bash
# Training over a host-staged link on one GPU: two ranks share it over gloo (CUDA tensors,
# TCP through the host). FSDP2 training of the 1.03 B decoder and of its 8-block (0.41 B)
# version, then the MoE layer, each in native / raw / compressed modes in one job, so that
# every run separates the path (native vs raw: zipccl's exchange with the codec off) from the
# compression (raw vs always / auto). Records go to experiments/results/train_e2e.jsonl and
# moe_ep.jsonl; the tables of the newest runs are printed at the end.
#
#   bash experiments/run_train_one_gpu.sh                # every stage
#   bash experiments/run_train_one_gpu.sh check large    # one call: raw-frame GPU check, the 1.03 B model
#   bash experiments/run_train_one_gpu.sh small moe      # another: the 0.41 B model, the MoE layer
#
# With $OUT set, this call's new records are also written to $OUT/train_e2e.new.jsonl and
# $OUT/moe_ep.new.jsonl (append them to experiments/results/). Each stage runs under its own
# time limit; a stage cut short keeps the steps it recorded.
# 11 steps per mode: step 0 (kernel compilation, "auto"'s calibration) is recorded apart and
# the summaries take the median of the 10 after it.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::FutureWarning}"
RUN=(python -m torch.distributed.run --standalone --nproc-per-node 2)
E2E=(experiments/train_e2e.py --backend gloo --modes native,raw,always,auto --steps 11 --warmup 1)
RES=experiments/results
count() { if [ -f "$1" ]; then wc -l < "$1"; else echo 0; fi; }
before_e2e=$(count $RES/train_e2e.jsonl) before_moe=$(count $RES/moe_ep.jsonl)
status=0
for stage in ${@:-check large small moe}; do
    echo "== $stage ($(date -u +%H:%M:%S))"
    case "$stage" in
        check) timeout 90 python -m pytest -q -p no:cacheprovider -m gpu tests/test_raw_exchange.py \
                   || { echo "the raw frames failed on the GPU: not training" >&2; exit 1; } ;;
        large) timeout "${LARGE_S:-480}" "${RUN[@]}" "${E2E[@]}" || status=$? ;;
        small) timeout "${SMALL_S:-300}" "${RUN[@]}" "${E2E[@]}" --layers 8 || status=$? ;;
        moe) timeout "${MOE_S:-240}" "${RUN[@]}" experiments/moe_ep.py --backend gloo \
                 --variants native,raw,slots --tokens 4096,16384 --skews 1.0,4.2 || status=$? ;;
        *) echo "unknown stage $stage (check, large, small, moe)" >&2; exit 2 ;;
    esac
done
echo "== tables ($(date -u +%H:%M:%S))"
python experiments/train_e2e.py --table experiments/results/train_e2e.jsonl
python experiments/moe_ep.py --table experiments/results/moe_ep.jsonl
if [ -n "${OUT:-}" ]; then  # a machine whose $OUT folder comes back: this call's new records alone
    tail -n +$((before_e2e + 1)) $RES/train_e2e.jsonl > "$OUT/train_e2e.new.jsonl" 2>/dev/null
    tail -n +$((before_moe + 1)) $RES/moe_ep.jsonl > "$OUT/moe_ep.new.jsonl" 2>/dev/null
fi
exit "$status"
