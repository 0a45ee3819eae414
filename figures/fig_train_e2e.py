"""Figure: end-to-end FSDP2 training, native against zipccl: loss per step and step time per link.

Reads ``experiments/results/train_e2e.jsonl`` (``experiments/train_e2e.py``). Left: the
loss of every mode of the newest deterministic run on each link, overlaid (identical bits
draw one curve; the summary says whether every step's loss bits matched native). Right:
the median step time per mode and link of those runs. Times nothing, imports no CUDA or
MPI module.

    python fig_train_e2e.py out/train_e2e.png ../experiments/results/train_e2e.jsonl
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = {"native": ("k", "-", "native (torch.distributed)"), "always": ("C3", "--", 'zipccl "always"'),
         "auto": ("C0", ":", 'zipccl "auto"')}


def newest_runs(recs: list[dict]) -> dict[str, str]:
    """link -> the run drawn for it: deterministic kernels first, then the most modes, then newest."""
    modes: dict[tuple[str, str], set] = {}
    det: dict[str, bool] = {}
    for r in recs:
        if r.get("kind") == "summary":
            modes.setdefault((r["link"], r["run"]), set()).add(r["mode"])
            det[r["run"]] = bool(r.get("deterministic"))
    best: dict[str, tuple] = {}
    for (link, run), ms in modes.items():
        key = (det[run], len(ms), run)
        if link not in best or key > best[link]:
            best[link] = key
    return {link: key[2] for link, key in best.items()}


def main(out: str, path: str) -> None:
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    runs = newest_runs(recs)
    links = sorted(runs)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    for i, link in enumerate(links):
        for mode, (color, style, label) in MODES.items():
            steps = sorted((r["step"], r["loss"]) for r in recs
                           if r.get("kind") == "step" and r["run"] == runs[link] and r["mode"] == mode)
            if steps:
                ax.plot([s for s, _ in steps], [v for _, v in steps], color=color, ls=style,
                        alpha=0.9 - 0.3 * i, label=f"{label}, {link}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (rank 0)")
    ax.set_title("loss per step (overlaid)")
    ax.legend(fontsize=7)
    ax = axes[1]
    width = 0.8 / len(MODES)
    for j, (mode, (color, _, label)) in enumerate(MODES.items()):
        xs, ys, same = [], [], []
        for i, link in enumerate(links):
            s = [r for r in recs
                 if r.get("kind") == "summary" and r["run"] == runs[link] and r["mode"] == mode]
            if s:
                xs.append(i + (j - 1) * width)
                ys.append(1e3 * s[0]["median_step_s"])
                same.append(s[0]["loss_bits_equal_native"])
        bars = ax.bar(xs, ys, width, color=color, label=label)
        for b, eq in zip(bars, same, strict=True):
            ax.annotate("bits = native" if eq else "bits differ",
                        (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(links)), [f"{link}\nrun {runs[link]}" for link in links], fontsize=8)
    ax.set_ylabel("median step time (ms)")
    ax.set_title("step time")
    ax.legend(fontsize=8)
    cfg = next(r for r in recs if r.get("kind") == "summary")
    fig.suptitle(f"FSDP2, {cfg['params'] / 1e9:.2f} B-parameter decoder, {cfg['world']} x {cfg['gpu']}, "
                 "BF16 parameters and reductions")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
