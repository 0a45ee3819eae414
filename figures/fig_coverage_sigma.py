"""Coverage of the sigma window vs frac(log2 sigma): the Gaussian theory curve, real tensors overlaid.

Usage: python fig_coverage_sigma.py OUT.png training_capture.jsonl training_capture_checkpoint.jsonl

The curve is zipccl.codebook.gaussian_coverage over one binade (it repeats in every binade);
the points are measured coverages of the sigma window of real tensors with at least 4096 values:
the pretrained checkpoint and the trained decoder's weights, gradients and activations (last
captured step). Reads saved records only.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from zipccl.codebook import gaussian_coverage  # noqa: E402


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(out, train_path, ckpt_path):
    train, ckpt = load(train_path), load(ckpt_path)
    last = max(r["step"] for r in train)
    f = np.linspace(0, 1, 400, endpoint=False)
    cov = [gaussian_coverage(2.0 ** (-6 + x)) for x in f]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(f, np.array(cov) * 100, "k-", lw=2, label="Gaussian theory (optimal 7-window)")
    groups = [("checkpoint weights", [r for r in ckpt if r["n"] >= 4096], "o", "tab:purple")]
    for kind, color in (("weight", "tab:blue"), ("gradient", "tab:red"), ("activation", "tab:orange")):
        groups.append((f"decoder {kind}s (step {last})",
                       [r for r in train if r["step"] == last and r["kind"] == kind and r["n"] >= 4096],
                       {"weight": "s", "gradient": "v", "activation": "^"}[kind], color))
    for label, rows, marker, color in groups:
        ax.scatter([r["frac_log2_sigma"] for r in rows], [100 * r["coverage_sigma"] for r in rows],
                   marker=marker, s=18, color=color, alpha=0.75, label=f"{label}: sigma window")
        fb = [r for r in rows if r["fallback"]]
        if fb:
            ax.scatter([r["frac_log2_sigma"] for r in fb], [100 * r["coverage_default"] for r in fb],
                       marker=marker, s=30, facecolors="none", edgecolors=color,
                       label=f"{label}: after fallback ({len(fb)})")
    below = sum(1 for _, rows, _, _ in groups for r in rows if r["coverage_sigma"] < 0.85)
    if below:
        ax.text(0.99, 0.02, f"{below} sigma-window points below 85% (exact zeros) not shown",
                transform=ax.transAxes, ha="right", fontsize=7)
    ax.set(xlabel="frac(log2 sigma)", ylabel="coverage (%)", ylim=(85, 100.5),
           title="Coverage of the 7-exponent sigma window: theory and real tensors")
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main(*sys.argv[1:4])
