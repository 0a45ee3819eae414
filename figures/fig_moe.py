"""Figure: MoE dispatch + combine under expert imbalance: all-to-all time vs skew, per link.

Reads ``experiments/results/moe_ep.jsonl`` (``experiments/moe_ep.py``). One panel per link (the
newest run on it): x = the skew reached (token slots of rank 0's experts / rank 1's), y = the
busier rank's time in the layer's four all-to-alls (forward and backward dispatch and combine;
it arrives last, so this is the transfer with its codec work and no wait for the other rank's
experts), one colour per variant (native, zipccl's slots, exact lengths; older runs: zipccl's
one-phase and two-phase exchanges), one line style per tokens-per-rank. Times nothing, imports
no CUDA or MPI module.

    python fig_moe.py out/moe.png ../experiments/results/moe_ep.jsonl
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

# this script's variants, then those of runs before the slot exchange (zipccl's exact-length
# exchanges then: lengths first, or static part then escapes)
VARIANTS = {"native": ("k", "native (torch.distributed)"), "slots": ("C2", "zipccl (slots)"),
            "exact": ("C4", "exact lengths (lengths, then frames)"),
            "one_phase": ("C1", "zipccl one-phase"),
            "two_phase": ("C0", "zipccl two-phase (static + dynamic)")}
STYLES = ["-", "--", "-.", ":"]


def newest(recs: list[dict]) -> dict[str, str]:
    """link -> the newest run with measurements on it."""
    runs: dict[str, str] = {}
    for r in recs:
        if r.get("kind") == "measure" and "a2a_busier_s" in r:
            runs[r["link"]] = max(runs.get(r["link"], ""), r["run"])
    return runs


def main(out: str, path: str) -> None:
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    runs = newest(recs)
    links = sorted(runs, key=lambda link: "NVLink" in link)  # shared memory first
    fig, axes = plt.subplots(1, len(links), figsize=(6.5 * len(links), 4.8), squeeze=False)
    drawn: set[str] = set()
    for ax, link in zip(axes[0], links, strict=True):
        mine = [r for r in recs
                if r.get("kind") == "measure" and r["link"] == link and r["run"] == runs[link]]
        tokens = sorted({r["tokens_per_rank"] for r in mine})
        for i, tok in enumerate(tokens):
            for v, (color, _) in VARIANTS.items():
                pts = sorted((r["recv_ratio"], 1e3 * r["a2a_busier_s"]) for r in mine
                             if r["tokens_per_rank"] == tok and r["variant"] == v)
                if pts:
                    drawn.add(v)
                    ax.plot(*zip(*pts, strict=True), color=color, ls=STYLES[i % len(STYLES)],
                            marker="o", ms=3)
        bad = sum(r["differing_bits"] for r in mine)
        ax.set_yscale("log")
        ax.set_xlabel("skew: token slots to rank 0's experts / rank 1's")
        ax.set_ylabel("busier rank's all-to-all time per layer step (ms)")
        ax.set_title(f"{link}, {mine[0]['machine']}\n{runs[link]}; differing bits vs native: {bad}",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=c, label=lab) for v, (c, lab) in VARIANTS.items() if v in drawn]
    handles += [Line2D([], [], color="grey", ls=STYLES[i % len(STYLES)], label=f"{t // 1024}k tokens/rank")
                for i, t in enumerate(tokens)]
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles))
    cfg = recs[-1].get("config", {})
    fig.suptitle(f"MoE expert parallelism 2, {cfg.get('model', '')}: dispatch + combine, "
                 "forward and backward", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
