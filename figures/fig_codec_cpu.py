"""CPU codec throughput against buffer size: the Numba fast path beside the NumPy reference.

Usage: python fig_codec_cpu.py OUT.png codec_cpu.jsonl

Encode and decode GB/s of BF16 input (median of the timed runs) for the Gaussian
buffers of one run of the results file, with the checksum on and off, and the
reference where it was timed; the dashed line is the 1.5 GB/s target. The run drawn
is the one least disturbed by other processes (lowest mean ``others_cpu_share``),
named in the title. Reads saved records only.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = (("cpu", True, "Numba CPU codec", "tab:blue", "-"),
          ("cpu", False, "Numba CPU codec, no checksum", "tab:blue", ":"),
          ("reference", True, "NumPy reference", "tab:gray", "-"))


def main(out: str, path: str) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    runs = {}
    for r in rows:
        runs.setdefault(r["run"], []).append(
            (r["others_cpu_share_encode"] + r["others_cpu_share_decode"]) / 2)
    quiet = min(runs, key=lambda k: (sum(runs[k]) / len(runs[k]), k))
    rows = [r for r in rows if r["run"] == quiet and r["data"].startswith("gaussian")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, key, title in ((axes[0], "encode_GBps", "encode"), (axes[1], "decode_GBps", "decode")):
        for codec, checksum, label, color, ls in SERIES:
            pts = sorted((r["bf16_bytes"] / 2**20, r[key]) for r in rows
                         if r["codec"] == codec and r["checksum"] == checksum)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ls=ls, color=color, label=label)
        ax.axhline(1.5, ls="--", c="tab:red", lw=1, label="target 1.5 GB/s")
        ax.set(xscale="log", yscale="log", xlabel="BF16 buffer (MiB)", title=title)
    axes[0].set_ylabel("GB/s of BF16 input")
    axes[0].legend(fontsize=7)
    machine = f"{rows[0]['machine']} ({rows[0]['cpu_model']}, {rows[0]['numba_threads']} threads)"
    fig.suptitle(f"CPU codec, N(0, 0.02) data, {machine}, run {quiet}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main(*sys.argv[1:])
