"""zipccl beside its GPU codec peers: throughput against buffer size, every codec measured
in the same run on the same buffers (experiments/bench_peers.py).

Usage: python fig_codec_peers.py OUT.png codec_peers.jsonl

Two rows (N(0, 0.02) Gaussian BF16 data; the bundled real checkpoint's BF16 tensors), two
columns (compress, decompress); GB/s of BF16 input against size, latest run only. zipccl:
the public API (``zipccl.compress`` / ``decompress``, eager, solid), ``encode_into`` /
``decode_into`` eager (dashed) and replayed as a CUDA graph (dotted); DietGPU's float codec
and nvCOMP's ANS and Bitcomp, eager. The legend gives each codec's compressed / input ratio
at the largest size. Reads saved records only.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (codec, mode, label, colour, line style)
SERIES = (("zipccl-api", "eager", "zipccl compress / decompress (API)", "tab:blue", "-"),
          ("zipccl", "eager", "zipccl encode_into / decode_into", "tab:blue", "--"),
          ("zipccl", "graph", "zipccl encode_into / decode_into, graph replay", "tab:cyan", ":"),
          ("dietgpu", "eager", "DietGPU float codec", "tab:red", "-"),
          ("nvcomp-ans", "eager", "nvCOMP ANS (<f2)", "tab:orange", "-"),
          ("nvcomp-bitcomp", "eager", "nvCOMP Bitcomp (<u2)", "tab:purple", "-"))


def _latest(path: str) -> list[dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    latest = max(r["run_id"] for r in rows)
    return [r for r in rows if r["run_id"] == latest]


def main(out: str, path: str) -> None:
    rows = _latest(path)
    kinds = [k for k in ("gaussian", "checkpoint") if any(r["data"] == k for r in rows)]
    fig, axes = plt.subplots(len(kinds), 2, figsize=(10, 3.6 * len(kinds)), sharey=True, squeeze=False)
    for row, kind in enumerate(kinds):
        for col, op in enumerate(("compress", "decompress")):
            ax = axes[row][col]
            for codec, mode, label, color, ls in SERIES:
                pts = sorted((r["size_mib"], r["gbps"], r["ratio"]) for r in rows
                             if r["data"] == kind and r["codec"] == codec and r["mode"] == mode
                             and r["op"] == op)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, ls=ls,
                            color=color, label=f"{label} (ratio {pts[-1][2]:.3f})")
            ax.set(xscale="log", yscale="log", xlabel="BF16 buffer (MiB)", title=f"{op}, {kind} data")
            ax.grid(True, which="both", lw=0.3)
            ax.legend(fontsize=6, loc="lower right")
        axes[row][0].set_ylabel("GB/s of BF16 input")
    fig.suptitle(f"GPU codecs in one run ({rows[0]['machine']}, run {rows[0]['run_id']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main(*sys.argv[1:])
