"""Compression ratio by tensor kind against the entropy limit.

Usage: python fig_ratio_by_kind.py OUT.png training_capture.jsonl training_capture_checkpoint.jsonl

Bars, element-weighted over tensors of at least 4096 values: the real frame ratio with the
default codebook (sigma window or its fallback), with the sigma window alone, the best
7-entry codebook (histogram), and the entropy limit (8 + H)/16, for the pretrained checkpoint
and for the trained decoder's weights, gradients and activations (all captured steps).
Reads saved records only.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

BARS = (("ratio_sigma", "sigma window", "tab:green"), ("ratio_default", "default codebook", "tab:blue"),
        ("ratio_hist", "histogram top-7", "tab:gray"), ("ratio_entropy", "entropy limit (8+H)/16", "k"))


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def weighted(rows, key):
    n = sum(r["n"] for r in rows)
    return sum(r[key] * r["n"] for r in rows) / n


def main(out, train_path, ckpt_path):
    train, ckpt = load(train_path), load(ckpt_path)
    groups = [("checkpoint\nweights", [r for r in ckpt if r["n"] >= 4096])]
    for kind in ("weight", "gradient", "activation"):
        groups.append((f"decoder\n{kind}s", [r for r in train if r["kind"] == kind and r["n"] >= 4096]))
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(groups))
    w = 0.2
    for i, (key, label, color) in enumerate(BARS):
        vals = [weighted(rows, key) for _, rows in groups]
        bars = ax.bar(x + (i - 1.5) * w, vals, w, label=label, color=color,
                      alpha=0.8 if color != "k" else 0.5)
        for b, v in zip(bars, vals, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, v + 0.003, f"{v:.3f}", ha="center", fontsize=6,
                    rotation=90)
    ax.axhline(0.705, ls=":", c="tab:red", lw=1, label="design target 0.705")
    ax.set_xticks(x, [g for g, _ in groups])
    ax.set(ylabel="compressed / original bytes", ylim=(0.6, 0.85),
           title="Ratio by tensor kind (BF16, per-tensor frames of >= 4096 values)")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main(*sys.argv[1:4])
