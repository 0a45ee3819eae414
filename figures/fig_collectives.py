"""Figure: zipccl's collectives against native NCCL, time and speed-up vs per-rank size.

Reads the records of ``experiments/bench_collectives.py`` (results/collectives.jsonl);
one column per operation, two rows per link (time, then speed-up over NCCL); each link
shows its newest run that timed both paths only (runs differ in method;
``experiments/records.py``'s ``select_latest``). Dotted lines: the times the
calibrated cost model predicted in that run (native, and compressed for "always").
Times nothing, imports no CUDA or MPI module.

    python fig_collectives.py out/collectives.png ../experiments/results/collectives.jsonl
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/records.py
from experiments.records import load_records, run_id, select_latest  # noqa: E402
from zipccl.costmodel import OPS  # noqa: E402

LINK_NAMES = {"nvlink": "NVLink", "shm": "shared memory (NCCL_P2P_DISABLE=1)",
              "socket": "sockets"}
STYLE = {"nccl": ("k", "o", "native NCCL"), "always": ("C3", "s", 'zipccl policy="always"'),
         "auto": ("C0", "^", 'zipccl policy="auto"')}


def main(out: str, paths: list[str]) -> None:
    recs = select_latest(load_records(paths))  # each link's newest run that timed both paths
    newest = {r["link"]: run_id(r) for r in recs}
    links = [lk for lk in LINK_NAMES if any(r["link"] == lk for r in recs)]
    series = defaultdict(list)
    for r in recs:
        series[(r["link"], r["op"], r["variant"])].append(r)
    fig, axes = plt.subplots(2 * len(links), len(OPS), figsize=(4 * len(OPS), 3.2 * 2 * len(links)),
                             squeeze=False, sharex=True)
    for li, link in enumerate(links):
        for oi, op in enumerate(OPS):
            at, asp = axes[2 * li, oi], axes[2 * li + 1, oi]
            for v, (color, marker, label) in STYLE.items():
                pts = sorted(series.get((link, op, v), []), key=lambda r: r["per_rank_bytes"])
                if not pts:
                    continue
                x = [r["per_rank_bytes"] / 2**20 for r in pts]
                at.plot(x, [1e3 * r["time_s"] for r in pts], color=color, marker=marker, label=label)
                key = {"nccl": "predicted_native_s", "always": "predicted_compressed_s"}.get(v)
                pred = [(xi, 1e3 * r[key]) for xi, r in zip(x, pts, strict=True) if key and key in r]
                if pred:
                    at.plot(*zip(*pred, strict=True), color=color, ls=":", lw=1,
                            label="cost model: native" if v == "nccl" else "cost model: compressed")
                if v != "nccl":
                    asp.plot(x, [r["speedup_vs_nccl"] for r in pts], color=color, marker=marker,
                             label=label)
            at.set_xscale("log", base=2)
            at.set_yscale("log")
            at.set_title(f"{op} — {LINK_NAMES[link]}", fontsize=9)
            at.set_ylabel("time (ms)")
            asp.axhline(1.0, color="k", lw=0.8, ls="--")
            asp.set_xscale("log", base=2)
            asp.set_ylabel("speed-up vs NCCL")
            asp.set_xlabel("per-rank message (MiB)")
            if li == 0 and oi == 0:
                at.legend(fontsize=7)
    machine = recs[0]["machine"] if recs else "?"
    exact = all(r["exact"] for r in recs)
    fig.suptitle(f"zipccl collectives vs NCCL, {machine}, {recs[0]['nranks'] if recs else '?'} ranks, "
                 f"BF16 N(0, 0.02²), runs {', '.join(sorted(set(newest.values())))}; "
                 f"all results bit-exact: {exact}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
