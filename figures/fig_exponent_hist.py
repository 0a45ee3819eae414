"""Exponent histograms of real tensors with the sigma window (and the default codebook) marked.

Usage: python fig_exponent_hist.py OUT.png training_capture.jsonl training_capture_checkpoint.jsonl

Three panels: a pretrained checkpoint's word embeddings (Gaussian-like), a weight gradient of the
trained decoder (heavy-tailed), and its attention probabilities (half exact zeros: the default
codebook falls back to the sample's top-7). Reads saved records only.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from zipccl.codebook import Codebook, exponent_probabilities  # noqa: E402


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def pick(train, ckpt):
    last = max(r["step"] for r in train)
    by = {r["name"]: r for r in train if r["step"] == last}
    grads = sorted((r for r in by.values() if r["kind"] == "gradient" and r["role"] == "mlp_in"),
                   key=lambda r: r["name"])
    probs = sorted((r for r in by.values() if r["role"] == "attn_probs"), key=lambda r: r["name"])
    emb = next(r for r in ckpt if r["name"] == "embeddings.word_embeddings.weight")
    return [("all-MiniLM-L6-v2: word embeddings", emb),
            (f"decoder step {last}: {grads[0]['name']}", grads[0]),
            (f"decoder step {last}: {probs[0]['name']}", probs[0])]


def main(out, train_path, ckpt_path):
    panels = pick(load(train_path), load(ckpt_path))
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for ax, (title, r) in zip(axes, panels, strict=True):
        hist = np.zeros(256)
        for e, c in r["hist"].items():
            hist[int(e)] = c
        frac = hist / r["n"]
        win = Codebook.from_sigma(r["sigma"]).exponents
        nz = np.flatnonzero(hist)
        lo, hi = max(0, min(win[0], nz.min()) - 2), min(255, max(win[-1], nz.max()) + 2)
        if lo == 0 and hi - lo > 40:  # exact zeros far from the rest: show them and the bulk
            lo = max(0, min(win[0], np.flatnonzero(hist[1:]).min() + 1) - 2)
        xs = np.arange(lo, hi + 1)
        ax.bar(xs, frac[xs], color="tab:blue", alpha=0.7, label="measured")
        law = exponent_probabilities(r["sigma"], xs)
        ax.plot(xs, law, "k.-", lw=1, ms=3, label="Gaussian law at sigma")
        ax.axvspan(win[0] - 0.5, win[-1] + 0.5, color="tab:green", alpha=0.15,
                   label=f"sigma window: {r['coverage_sigma']:.1%}")
        if r["fallback"]:
            ax.text(0.02, 0.03, f"exact zeros: {r['zero_fraction']:.0%} (exponent 0, off scale)\n"
                                f"default codebook falls back: {r['coverage_default']:.1%}",
                    transform=ax.transAxes, va="bottom", fontsize=8,
                    bbox=dict(facecolor="white", alpha=0.85, lw=0))
        ax.set(yscale="log", ylim=(1e-6, 1), xlabel="biased exponent", ylabel="fraction of values",
               title=f"{title}\nsigma {r['sigma']:.3g}, histogram top-7 {r['coverage_hist']:.1%}")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main(*sys.argv[1:4])
