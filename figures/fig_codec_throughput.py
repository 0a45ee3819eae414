"""GPU codec throughput against buffer size: zipccl's kernels beside the copy ceiling and baselines.

Usage: python fig_codec_throughput.py OUT.png codec_gpu.jsonl codec_gpu_v4.jsonl [codec_gpu_baselines.jsonl]

Encode and decode GB/s of BF16 input against size: the v4 kernels (the library's until
the v5 encoder, fced2d3; from the latest run of codec_gpu_v4.jsonl) as a replayed CUDA
graph (device time), with the payload checksum; from the latest run of codec_gpu.jsonl
the previous versions (v3, also called from Python with host overhead included, and v2),
the naive split kernel and the device copy (input bytes / copy time).
DietGPU and nvCOMP points come from the ``codec_gpu_baseline`` records of
codec_gpu_baselines.jsonl (one H200, not re-run by bench_codec.py). The project's own
run of the peers beside the v5 library is codec_peers.jsonl, drawn by fig_codec_peers.py.
Dashed: the targets (2,000 GB/s at >= 256 MiB, 1,000 GB/s at 16 MiB). Reads saved
records only.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (variant for encode, variant for decode, mode, label, colour, line style); v4 is the
# library; v3's decoder was measured with launch bounds (128, 8) as variant v3-lb8
SERIES = (("v4", "v4", "graph", "zipccl kernels v4 (library, graph replay)", "tab:blue", "-"),
          ("v4-cs", "v4-cs", "graph", "v4 + payload checksum (graph)", "tab:cyan", "-"),
          ("v3", "v3-lb8", "graph", "v3 (previous, graph replay)", "tab:orange", "-"),
          ("v3", "v3", "eager", "v3 encode_into/decode_into from Python", "tab:orange", ":"),
          ("v2", "v2", "graph", "v2: int64 arithmetic (graph)", "tab:purple", "-"),
          ("naive", None, "graph", "naive split kernel (graph)", "tab:gray", "-"),
          ("cupy", "cupy", "eager", "device copy (input bytes / time)", "black", "--"))


def _read(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _latest(rows: list[dict]) -> list[dict]:
    latest = max(r["run_id"] for r in rows)
    return [r for r in rows if r["run_id"] == latest]


def main(out: str, path: str, v4_path: str, baselines: str | None = None) -> None:
    rows = _latest(_read(path))
    rows += [r for r in _latest(_read(v4_path)) if r["variant"].startswith("v4")]
    base = _read(baselines) if baselines else []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, op in ((axes[0], "encode"), (axes[1], "decode")):
        for enc_var, dec_var, mode, label, color, ls in SERIES:
            variant = enc_var if op == "encode" else dec_var
            ops = ("copy",) if variant == "cupy" else (op,)
            pts = sorted((r["size_mib"], r["gbps"]) for r in rows
                         if r["variant"] == variant and r["mode"] == mode and r["op"] in ops)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, ls=ls, color=color, label=label)
        for codec, marker in (("DietGPU", "s"), ("nvCOMP 6.0 ANS", "^"), ("nvCOMP 6.0 Bitcomp", "v")):
            pts = sorted((b["size_mib"], b[f"{op}_gbps"]) for b in base if b["codec"].startswith(codec))
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=marker, ls="-", lw=0.8, color="tab:red",
                        alpha=0.6, label=f"{codec} (baseline record, not re-run)")
        ax.plot([256, 2048], [2000, 2000], ls="--", c="tab:green", lw=1)
        ax.plot([16], [1000], marker="_", ms=14, c="tab:green", label="targets")
        ax.set(xscale="log", yscale="log", xlabel="BF16 buffer (MiB)", title=op)
        ax.grid(True, which="both", lw=0.3)
    axes[0].set_ylabel("GB/s of BF16 input")
    axes[0].legend(fontsize=6, loc="lower right")
    axes[1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"GPU codec, N(0, 0.02) BF16, {rows[0]['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main(*sys.argv[1:])
