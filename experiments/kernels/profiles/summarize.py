"""One line per profiled kernel from an Nsight Compute ``--page details`` text report.

    python experiments/kernels/profiles/summarize.py ncu_details.txt > summary.txt
"""

from __future__ import annotations

import re
import sys

KEYS = ("Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput",
        "Issued Warp Per Scheduler", "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
        "Registers Per Thread", "Grid Size", "Achieved Occupancy", "Theoretical Occupancy",
        "Static Shared Memory Per Block")


def main(path: str) -> None:
    kernels: list[tuple[str, dict[str, str], list[str]]] = []
    for line in open(path):
        m = re.match(r"\s{2}(\w+)::(\w+)\[", line)
        if m:
            kernels.append((m.group(2), {}, []))
            continue
        if not kernels:
            continue
        vals, notes = kernels[-1][1], kernels[-1][2]
        s = line.strip()
        for k in KEYS:
            if s.startswith(k + " ") and k not in vals:
                parts = s[len(k):].split()
                vals[k] = f"{parts[-1]} {parts[-2]}" if len(parts) >= 2 else parts[-1]
        m = re.search(r"spends ([\d.]+) cycles being stalled (.*)", s)
        if m:
            notes.append(f"{m.group(1)} cycles stalled {m.group(2).rstrip('.')}")
    for name, vals, notes in kernels:
        print(name)
        for k in KEYS:
            if k in vals:
                print(f"    {k}: {vals[k]}")
        for nline in notes:
            print(f"    stall: {nline} ...")


if __name__ == "__main__":
    main(sys.argv[1])
