"""Figure: end-to-end FSDP2 training, native against zipccl: loss per step, and step time per link
with the speed-up split into what zipccl's path buys and what compression buys.

Reads ``experiments/results/train_e2e.jsonl`` (``experiments/train_e2e.py``). Left: the loss of
every mode of the newest deterministic run of each (link, model), overlaid (identical bits draw
one curve). Right: the speed-up of each mode over native (median step times; the bars say
the seconds per step), one group per (link, model);
where a run measured the ``raw`` mode (zipccl's exchange with the codec off) the group is
labelled with the path speed-up (native / raw) and the compression speed-up (raw / always), whose
product is the total; runs without it (the older NCCL runs) show the total alone. Each bar says
whether the run's losses and final parameters had native's bits. Times nothing, imports no CUDA
or MPI module; draws whatever runs the file holds.

    python fig_train_e2e.py out/train_e2e.png ../experiments/results/train_e2e.jsonl
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = {"native": ("k", "-", "native (torch.distributed)"),
         "raw": ("0.55", "-.", 'zipccl "raw" (its path, codec off)'),
         "always": ("C3", "--", 'zipccl "always"'), "auto": ("C0", ":", 'zipccl "auto"')}
LINK_NAMES = {"default": "NVLink (default)"}  # older records named NCCL's default link so


def link_of(r: dict) -> str:
    return LINK_NAMES.get(r["link"], r["link"])


def newest_runs(recs: list[dict]) -> dict[tuple, str]:
    """(link, params) -> the run drawn for it: deterministic kernels first, then the most
    modes, then the newest."""
    modes: dict[tuple, set] = {}
    det: dict[str, bool] = {}
    for r in recs:
        if r.get("kind") == "summary":
            modes.setdefault((link_of(r), r["params"], r["run"]), set()).add(r["mode"])
            det[r["run"]] = bool(r.get("deterministic"))
    best: dict[tuple, tuple] = {}
    for (link, params, run), ms in modes.items():
        key = (det[run], len(ms), run)
        if (link, params) not in best or key > best[(link, params)]:
            best[(link, params)] = key
    return {k: v[2] for k, v in best.items()}


def size(params: int) -> str:
    return f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.2f} M"


def summaries(recs: list[dict], link: str, params: int, run: str) -> dict[str, dict]:
    return {r["mode"]: r for r in recs if r.get("kind") == "summary" and r["run"] == run
            and link_of(r) == link and r["params"] == params}


def attribution(s: dict[str, dict]) -> str:
    """The group's label: path and compression speed-ups where raw was measured, else the total."""
    t = {m: r["median_step_s"] for m, r in s.items()}
    if "native" not in t:
        return ""
    parts = []
    if "raw" in t:
        parts.append(f"path {t['native'] / t['raw']:.2f}x")
    for m in ("always", "auto"):
        if m in t:
            comp = f" = path x compr. {t['raw'] / t[m]:.2f}x" if "raw" in t else ""
            parts.append(f"{m} {t['native'] / t[m]:.2f}x{comp}")
    return "\n".join(parts)


def main(out: str, path: str) -> None:
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    runs = newest_runs(recs)
    groups = sorted(runs, key=lambda k: ("gloo" in k[0], k[0], -k[1]))
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.6), gridspec_kw={"width_ratios": [1, 1.6]})
    ax = axes[0]
    for i, (link, params) in enumerate(groups):
        for mode, (color, style, label) in MODES.items():
            steps = sorted((r["step"], r["loss"]) for r in recs if r.get("kind") == "step"
                           and r["run"] == runs[(link, params)] and r["mode"] == mode
                           and link_of(r) == link)
            if steps:
                ax.plot([s for s, _ in steps], [v for _, v in steps], color=color, ls=style,
                        alpha=max(0.3, 0.9 - 0.15 * i), label=f"{label}, {link}, {size(params)}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (rank 0)")
    ax.set_title("loss per step (overlaid; equal bits draw one curve)")
    ax.legend(fontsize=6)
    ax = axes[1]
    width = 0.8 / len(MODES)
    drawn = set()
    top = 1.0
    for i, (link, params) in enumerate(groups):
        s = summaries(recs, link, params, runs[(link, params)])
        native = s.get("native", {}).get("median_step_s")
        high = 1.0
        for j, (mode, (color, _, label)) in enumerate(MODES.items()):
            if mode not in s or not native:
                continue
            t = s[mode]["median_step_s"]
            rel = native / t
            high = max(high, rel)
            b = ax.bar(i + (j - 1.5) * width, rel, width, color=color, label=None if mode in drawn else label)
            drawn.add(mode)
            eq = s[mode].get("bits_equal_native", s[mode].get("loss_bits_equal_native"))
            ax.annotate(f"{t:.2f} s\n{'=' if eq else 'bits differ'}", (b[0].get_x() + width / 2, rel),
                        ha="center", va="bottom", fontsize=6)
        ax.annotate(attribution(s), (i, 1.12 * high), ha="center", va="bottom", fontsize=7)
        top = max(top, high)
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_xticks(range(len(groups)), [f"{link}\n{size(params)}, {runs[(link, params)]}"
                                       for link, params in groups], fontsize=7)
    ax.set_ylim(0, 1.6 * top)
    ax.set_ylabel("speed-up over native (median step time; labels: s per step)")
    ax.set_title("step time; speed-up = path (native / raw) x compression (raw / compressed)")
    ax.legend(fontsize=7, loc="upper left")
    machines = sorted({r.get("machine") or f"{r['world']} x {r['gpu']}" for r in recs
                       if r.get("kind") == "summary" and runs.get((link_of(r), r["params"])) == r["run"]})
    fig.suptitle("FSDP2 training of a Llama-style decoder, BF16 parameters and reductions; "
                 + "; ".join(machines), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
