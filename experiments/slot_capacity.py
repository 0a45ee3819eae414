"""Slot capacity: slot ratio and spill rate of candidate capacity rules on recorded traffic.

A slot reserves ``capacity`` escape bytes beyond a frame's static part; a frame with more
escapes spills (``zipccl/comm/capacity.py``). This script replays sequences of calls through
candidate rules (``CapacityRule`` + ``replay``: the rule and the bookkeeping live in the
library) and writes one record per (traffic, codebook, rule):

* ``captured``: the captured training tensors (``results/training_capture.jsonl``, tensors of
  >= 4,096 values), each tensor name a call site, the capture steps its successive occurrences
  (far apart: 0, 10, 30, 100, ... so drift between occurrences is larger than between steps);
* ``fsdp``: FSDP2-shaped traffic built from the same records on 2 ranks: per step the root
  unit (embedding, final norm, head) and each block all-gathered forward, the blocks again
  backward (in reverse), and every unit's gradients reduce-scattered; one frame per call of
  half a unit (both ranks' halves taken alike), its escapes those of the unit's concatenated
  tensors (summed histograms) under one codebook for the frame;
* ``fsdp_tensor``: the same calls with every tensor of >= 4,096 values in a frame of its own
  (its own codebook and site), as if the collectives framed each parameter apart;
* ``checkpoint``: the bundled checkpoint's tensors (``training_capture_checkpoint.jsonl``):
  one occurrence each, so every frame is sized by the cold-start default;
* ``moe``: an expert-parallel MoE layer (``experiments/moe_ep.py``, small sizes) run forward and
  backward on 2 gloo CPU ranks; the frames of its four all-to-alls per iteration (toward the
  other rank), escapes counted with the default codebook and checked against the CPU codec's
  frame header; the call's position in the iteration is its site.

Escapes per frame: ``default`` -- the codebook the collectives choose (``Codebook.from_sample``),
exact for ``captured``/``checkpoint`` (the records' ``coverage_default``) and ``moe``; ``top7``
-- the histogram's 7 most frequent exponents (the best any codebook does); ``sigma`` -- the
window of the data's RMS (``Codebook.from_sigma``), the device's choice when it does not fall
back. ``fsdp`` has ``top7`` and ``sigma`` only (the default's fallback test reads a sample the
histograms do not keep: it lies between the two).

    python experiments/slot_capacity.py                 # all traffic; ~1 min on 2 cores
    python experiments/slot_capacity.py --table         # the newest run's table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from collections import defaultdict
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import append_records  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.codebook import Codebook, top_exponents  # noqa: E402
from zipccl.comm.capacity import Call, CapacityConfig, CapacityRule, replay  # noqa: E402

RESULTS = HERE / "results"
OUT = RESULTS / "slot_capacity.jsonl"
MIN_N = 4096

RULES = {  # name -> the rule's configuration; "adaptive" is the library default
    "fixed 4%": CapacityConfig(fraction=0.04),
    "fixed 6.25%": CapacityConfig(fraction=0.0625),
    "fixed 8%": CapacityConfig(fraction=0.08),
    "fixed 10%": CapacityConfig(fraction=0.10),
    "fixed 12.5%": CapacityConfig(fraction=0.125),
    "adaptive": CapacityConfig(),
    "adaptive k1 m1.25": CapacityConfig(window=1),
    "adaptive k8 m1.25": CapacityConfig(window=8),
    "adaptive k4 m1.1 pad1": CapacityConfig(margin=1.1),
    "adaptive k4 m1.5": CapacityConfig(margin=1.5),
    "adaptive k4 m2": CapacityConfig(margin=2.0),
    "adaptive k4 m1.25 pad0": CapacityConfig(pad=0),
    "adaptive k4 m1.25 pad2": CapacityConfig(pad=2),
    "adaptive k4 decay1": CapacityConfig(decay=1.0),
    "adaptive grid32": CapacityConfig(grid=32, pad=0),
    "adaptive k1 m1.5 pad2": CapacityConfig(window=1, margin=1.5, pad=2),
    "adaptive grid512 m1.1 pad2": CapacityConfig(grid=512, margin=1.1, pad=2),
    "adaptive cold 25%": CapacityConfig(cold=0.25),
    "adaptive cold 6.25%": CapacityConfig(cold=0.0625),
}


def machine() -> dict:
    return {"machine": f"{os.cpu_count()}-core CPU dev box", "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}


# -- traffic from the capture records -----------------------------------------------------------

def load(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _hist(rec: dict) -> np.ndarray:
    h = np.zeros(256, np.int64)
    for e, c in rec["hist"].items():
        h[int(e)] = c
    return h


def _rms(recs: list[dict]) -> float:
    """RMS of the concatenated tensors, from each one's mean and std (both over all values)."""
    n = sum(r["n"] for r in recs)
    return math.sqrt(sum(r["n"] * (r["std"] ** 2 + r["mean"] ** 2) for r in recs) / n)


def escapes(recs: list[dict], codebook: str) -> int:
    """Escapes of the frame holding ``recs``' tensors one after another, under one codebook."""
    n = sum(r["n"] for r in recs)
    if codebook == "default":
        if len(recs) != 1:
            raise ValueError("the default codebook's escapes are recorded per tensor only")
        return n - round(recs[0]["coverage_default"] * n)
    hist = sum(_hist(r) for r in recs)
    exps = top_exponents(hist) if codebook == "top7" else Codebook.from_sigma(_rms(recs)).exponents
    return n - int(hist[list(exps)].sum())


def captured_calls(recs: list[dict], codebook: str, steps=None) -> list[Call]:
    """Every tensor of >= MIN_N values a call site; steps in order, tensors in capture order."""
    by_step = defaultdict(list)
    for r in recs:
        if r["n"] >= MIN_N and (steps is None or r["step"] in steps):
            by_step[r.get("step", 0)].append(r)
    return [Call(r["name"], [(r["n"], escapes([r], codebook))])
            for s in sorted(by_step) for r in by_step[s]]


def _unit(name: str) -> str:
    return ".".join(name.split(".")[:2]) if name.startswith("blocks.") else "root"


def fsdp_calls(recs: list[dict], codebook: str, ranks: int = 2, steps=None,
               per_tensor: bool = False) -> list[Call]:
    """FSDP2's calls per step (see the module docstring): AG forward (root, blocks), AG backward
    (blocks reversed), RS (blocks reversed, root); a frame = one rank's 1/ranks of a unit, or with
    ``per_tensor`` of each of the unit's tensors (its own codebook and site)."""
    units: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # step, kind, unit
    for r in recs:
        if r["kind"] == "weight" or r["name"].startswith("grad:"):
            if steps is None or r["step"] in steps:
                units[r["step"]][r["kind"]][_unit(r["name"].removeprefix("grad:"))].append(r)
    calls = []
    for step in sorted(units):
        w, g = units[step]["weight"], units[step]["gradient"]
        blocks = sorted((u for u in w if u != "root"), key=lambda u: int(u.split(".")[1]))

        def call(site, parts):
            groups = [[r] for r in parts if r["n"] >= MIN_N] if per_tensor else [parts]
            out = []
            for grp in groups:
                n, e = sum(r["n"] for r in grp), escapes(grp, codebook)
                out.append(Call((*site, grp[0]["name"]) if per_tensor else site,
                                [(-(-n // ranks), -(-e // ranks))]))
            return out

        for site, parts in ([(("all_gather", "fwd", u), w[u]) for u in ["root", *blocks]]
                            + [(("all_gather", "bwd", u), w[u]) for u in reversed(blocks)]
                            + [(("reduce_scatter", u), g[u]) for u in [*reversed(blocks), "root"]]):
            calls += call(site, parts)
    return calls


# -- the MoE layer's tokens ------------------------------------------------------------------------

MOE = dict(hidden=256, experts=8, ffn=896, tokens=(512,), skews=(1.0, 4.2), iters=4, warmup=0,
           model="small (hidden 256, 8 experts, SwiGLU 896, top-2)")


def _moe_rank(rank: int, world: int, port: int, out: str, iters: int) -> None:
    import moe_ep
    import torch
    import torch.distributed as dist

    import zipccl
    from zipccl.codebook import exponent_histogram

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = moe_ep.Config(**MOE)
    params = moe_ep.make_params(cfg, rank, world, torch.device("cpu"))
    frames: list = []  # (call index, peer, n, escapes)
    calls: list = []  # one entry per all-to-all made so far

    def a2a(out_t, inp, out_splits, in_splits):
        dist.all_to_all_single(out_t, inp, out_splits, in_splits)
        rows = inp.reshape(inp.shape[0], -1)
        lo = 0
        for peer, k in enumerate(in_splits):
            if peer != rank and k:
                bits = rows[lo:lo + k].contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1)
                cb = Codebook.from_sample(bits)
                esc = bits.size - int(exponent_histogram(bits)[list(cb.exponents)].sum())
                head = fmt.parse_header(zipccl.compress(bits, codebook=cb, dtype="bfloat16", backend="cpu"))
                if not head.flags & fmt.FLAG_RAW and head.n_escapes != esc:
                    raise SystemExit(f"escape count {esc} != the CPU codec's {head.n_escapes}")
                frames.append((len(calls), peer, int(bits.size), esc))
            lo += k
        calls.append(None)

    for skew in cfg.skews:
        bias = [torch.tensor(moe_ep.zipf_bias(moe_ep.solve_alpha(skew, cfg.experts), cfg.experts),
                             dtype=torch.float32)]
        for it in range(iters):
            g = torch.Generator().manual_seed(cfg.seed * 7919 + it * 31 + rank + int(skew * 1000))
            x = torch.randn(cfg.tokens[0], cfg.hidden, generator=g).to(torch.bfloat16).requires_grad_()
            dy = (torch.randn(cfg.tokens[0], cfg.hidden, generator=g) * 1e-2).to(torch.bfloat16)
            moe_ep.forward_backward(x, dy, params, bias, a2a, rank, world)
            for p in moe_ep.parameters(params):
                p.grad = None
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(frames, gathered, dst=0)
    if rank == 0:
        Path(out).write_text(json.dumps([f + (src,) for src, fs in enumerate(gathered) for f in fs]))
    dist.destroy_process_group()


def moe_calls(iters: int) -> list[Call]:
    """The MoE layer's all-to-all frames (2 gloo ranks); the site is the call's place in its
    iteration (dispatch, combine, combine's and dispatch's gradients) and skew."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "frames.json")
        mp.spawn(_moe_rank, args=(2, port, out, iters), nprocs=2)
        frames = json.loads(Path(out).read_text())
    per_call = defaultdict(list)
    for index, _peer, n, e, _src in frames:
        per_call[index].append((n, e))
    per_skew = 4 * iters
    return [Call((index // per_skew, index % 4), per_call[index]) for index in sorted(per_call)]


# -- the sweep -------------------------------------------------------------------------------------

def traffic(names, moe_iters: int, steps=None) -> dict:
    """(traffic, codebook) -> calls."""
    out = {}
    if "captured" in names or "fsdp" in names:
        recs = load(RESULTS / "training_capture.jsonl")
        for cb in ("default", "top7", "sigma"):
            if "captured" in names:
                out["captured", cb] = captured_calls(recs, cb, steps)
            if "fsdp" in names and cb != "default":
                out["fsdp", cb] = fsdp_calls(recs, cb, steps=steps)
            if "fsdp" in names:
                out["fsdp_tensor", cb] = fsdp_calls(recs, cb, steps=steps, per_tensor=True)
    if "checkpoint" in names:
        recs = load(RESULTS / "training_capture_checkpoint.jsonl")
        for cb in ("default", "top7"):
            out["checkpoint", cb] = captured_calls(recs, cb)
    if "moe" in names:
        out["moe", "default"] = moe_calls(moe_iters)
    return out


def sweep(calls_by: dict, rules: dict) -> list[dict]:
    run = datetime.now().isoformat(timespec="seconds")
    recs = []
    for (name, cb), calls in calls_by.items():
        for rule_name, cfg in rules.items():
            summary = replay(CapacityRule(cfg), calls).summary()
            recs.append({"experiment": "slot_capacity", "run": run, **machine(), "traffic": name,
                         "codebook": cb, "rule": rule_name, "rule_config": asdict(cfg),
                         "calls": len(calls), **summary})
    return recs


def _num(x) -> str:
    return "  -   " if x is None else f"{x:.4f}"


def table(recs: list[dict]) -> str:
    run = max(r["run"] for r in recs)
    lines = ["traffic     codebook rule                       slot   wire   frame  spills/frames  "
             "spilled  steady slot / spills"]
    for r in (r for r in recs if r["run"] == run):
        lines.append(f"{r['traffic']:11s} {r['codebook']:8s} {r['rule']:26s} {r['slot_ratio']:.4f} "
                     f"{r['wire_ratio']:.4f} {r['frame_ratio']:.4f} {r['spills']:5d}/{r['frames']:<6d} "
                     f"{r['spilled_bytes_fraction']:7.2%}  {_num(r['steady_slot_ratio'])} / "
                     f"{_num(r['steady_spill_rate'])}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traffic", default="captured,fsdp,checkpoint,moe",
                    help="comma-separated: captured, fsdp, checkpoint, moe")
    ap.add_argument("--steps", default=None, help="capture steps to use (comma-separated; default all)")
    ap.add_argument("--rules", default=None, help="comma-separated rule names (default: all)")
    ap.add_argument("--moe-iters", type=int, default=4, help="MoE iterations per skew")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--table", action="store_true", help="print the newest run's table of --out")
    args = ap.parse_args(argv)
    if args.table:
        print(table(load(Path(args.out))))
        return []
    names = set(args.traffic.split(","))
    if not names <= {"captured", "fsdp", "checkpoint", "moe"}:
        raise SystemExit(f"unknown traffic in {args.traffic!r}")
    rules = RULES if args.rules is None else {k: RULES[k] for k in args.rules.split(",")}
    steps = None if args.steps is None else {int(s) for s in args.steps.split(",")}
    recs = sweep(traffic(names, args.moe_iters, steps), rules)
    append_records(args.out, recs)
    print(table(recs))
    return recs


if __name__ == "__main__":
    main()
