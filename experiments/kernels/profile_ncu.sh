#!/usr/bin/env bash
# Nsight Compute on the codec kernels (profile_codec.py) at 16 and 256 MiB; text reports to $1
# (both BF16 decoders forced with $2 = decoders; the runs with the v5 encoder: commit 952f4b0).
set -u
OUT=${1:?usage: profile_ncu.sh OUTDIR [decoders]}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
DECODERS=${2:+--decoders}
timeout ${NCU_S:-240} ncu --clock-control none --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
  -k regex:'(en|de)code_|scan_counts' -o /tmp/codec_prof -f \
  python3 experiments/kernels/profile_codec.py --sizes-mib 16 256 $DECODERS > "$OUT/ncu_log.txt" 2>&1
ncu -i /tmp/codec_prof.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
ncu -i /tmp/codec_prof.ncu-rep --page raw --csv --metrics \
gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum.per_second,\
sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.avg.per_cycle_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,\
smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_barrier,\
smsp__average_warp_latency_issue_stalled_lg_throttle \
  > "$OUT/ncu_raw.csv" 2>&1
tail -3 "$OUT/ncu_log.txt"; wc -l "$OUT"/ncu_*.txt
