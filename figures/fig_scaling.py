"""Figure: speed-up over NCCL vs number of GPUs, measured points over the calibrated projection.

Reads ``experiments/results/scaling_projection.jsonl`` (``experiments/project_scaling.py``):
one column per operation, one row per per-rank size; curves are the projected
speed-up (NCCL time / zipccl time) of each arrangement (solid: codec fixed cost
once per stage, as a batched launch; dashed: once per peer, as the library
launches today), markers the measured
``policy="always"`` speed-ups (filled: the run the model was fitted on; hollow:
older runs). Times nothing, imports no CUDA or MPI module.

    python fig_scaling.py out/scaling.png ../experiments/results/scaling_projection.jsonl
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/records.py
from experiments.records import load_records  # noqa: E402
from zipccl.costmodel import OPS  # noqa: E402

MiB = 1 << 20
SIZES = (64 * MiB, 256 * MiB, 1024 * MiB)
# (arrangement, transport) -> colour, label; measured points take their link's colour
CURVES = {("ring", "shm"): ("C3", "ring, shared memory (~25 GB/s, network stand-in)"),
          ("ring", "nvlink"): ("C0", "ring, NVLink (one node)"),
          ("hierarchical", "nvlink+shm"): ("C2", "hierarchical: NVLink in node + shm between")}
LINK_COLOR = {"shm": "C3", "nvlink": "C0"}


def main(out: str, path: str) -> None:
    recs = load_records([path])
    head = next(r for r in recs if r["record"] == "inputs")
    ratio = min(r["ratio"] for r in recs if r["record"] == "link")
    curves = defaultdict(list)
    for r in recs:
        if r["record"] == "projection":
            curves[(r["arrangement"], r["transport"], r["op"], r["per_rank_bytes"])].append(r)
    points = [r for r in recs if r["record"] == "check" and r["variant"] == "always"]
    ranks = sorted({r["nranks"] for r in recs if r["record"] == "projection"})
    sizes = [s for s in SIZES if any(k[3] == s for k in curves)]

    fig, axes = plt.subplots(len(sizes), len(OPS), figsize=(4 * len(OPS), 3.1 * len(sizes)),
                             squeeze=False, sharex=True)
    for si, size in enumerate(sizes):
        for oi, op in enumerate(OPS):
            ax = axes[si, oi]
            for (arr, tr), (color, label) in CURVES.items():
                pts = sorted(curves.get((arr, tr, op, size), []), key=lambda r: r["nranks"])
                if pts:
                    ax.plot([r["nranks"] for r in pts], [r["speedup"] for r in pts], color=color,
                            lw=1.6, label=f"projected: {label}")
                    ax.plot([r["nranks"] for r in pts], [r["speedup_per_peer"] for r in pts], color=color,
                            lw=0.9, ls="--")
            for r in points:
                if r["op"] == op and r["per_rank_bytes"] == size and r["measured_speedup"]:
                    c = LINK_COLOR.get(r["link"], "k")
                    ax.plot(r["nranks"], r["measured_speedup"], ls="none", marker="o",
                            ms=7 if r["in_fit"] else 5, color=c, mfc=c if r["in_fit"] else "none",
                            zorder=5)
            ax.axhline(1.0, color="0.3", lw=0.7)
            ax.axhline(1.0 / ratio, color="0.5", lw=0.8, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_xticks(ranks, [str(p) for p in ranks])
            ax.set_title(f"{op}, {size // MiB} MiB per rank", fontsize=9)
            if oi == 0:
                ax.set_ylabel("speed-up vs NCCL")
            if si == len(sizes) - 1:
                ax.set_xlabel("GPUs")
    ax0 = axes[0, 0]
    ax0.plot([], [], ls="none", marker="o", color="k", label="measured, 2 x H200 (fitted run)")
    ax0.plot([], [], ls="none", marker="o", color="k", mfc="none", label="measured, older run")
    ax0.plot([], [], color="k", lw=0.9, ls="--",
             label="projected, codec fixed cost paid per peer (today's library; upper bound)")
    ax0.plot([], [], color="0.5", ls=":", label=f"ratio bound 1/{ratio:.3f}")
    handles, labels = ax0.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    measured = ", ".join(str(p) for p in head["measured_ranks"])
    beyond = "no 4- or 8-GPU run: every other point is the calibrated alpha-beta projection" \
        if head["measured_ranks"] == [2] else "curves: alpha-beta projection calibrated on 2 ranks"
    fig.suptitle(f"zipccl speed-up vs GPUs, measured on {measured} ranks "
                 f"({', '.join(head['calibrated_on'])}); {beyond}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
