"""Expert parallelism: an MoE layer whose dispatch and combine go through zipccl's all-to-all.

Why run it: in mixture-of-experts layers tokens travel to experts on other GPUs, the per-peer
counts change every step and are skewed, and a rank that waits for its peer wastes its time.
zipccl's all-to-all is the slot exchange (slot sizes every rank computes from the counts, so
the transfer is posted at once, no frame length waited for); this script measures it against
the native call and against the plain exact-length exchange. It runs one MoE layer forward and
backward on 2 ranks (expert parallelism 2) with its routing skewed on purpose, once per variant
of the all-to-all:

  native  -- ``torch.distributed.all_to_all_single`` with split sizes;
  raw     -- ``zipccl.torch.all_to_all_single(..., policy="raw")``: the slot exchange below with
             the codec off (every frame RAW, in a slot that holds it whole): the same path, the
             native bytes plus headers, so native / raw is what the path alone buys and
             raw / slots what compression buys (a ``ratios`` record per configuration);
  slots   -- ``zipccl.torch.all_to_all_single(..., policy="always")``: the library's slot
             exchange (fixed-size slots, a frame that does not fit spills its tail);
  exact   -- ``exact_length.all_to_all_single`` (this folder): every frame encoded, its length
             read on the host, the lengths exchanged, then one transfer of exact sizes.

Records of earlier runs name two more variants, measured before the slot exchange, when zipccl
itself held two exact-length exchanges: ``one_phase`` (``phases=1``: lengths, then the frames,
as ``exact`` does) and ``two_phase`` (``phases=2``: the static part of every frame at once, then
the escapes). ``--table`` and ``figures/fig_moe.py`` read both sets.

Each configuration is checked before it is timed: the layer's output and every gradient (input,
router, experts) of every compressed variant is compared with the native run's bit for bit, in
the same run, and the count of differing bits is recorded (it must be 0).

Layer (default: Mixtral-8x7B's sizes at depth 1): hidden 4096, 8 experts of SwiGLU width 14336,
top-2 routing (softmax over the two chosen logits), BF16 weights and activations; experts 0-3 on
rank 0, 4-7 on rank 1. Routing skew: a fixed bias ``-alpha * log(1 + e)`` on expert e's router
logit (Zipf-like); alpha is solved so that rank 0's experts receive ``skew`` times the token
slots of rank 1's (the value reached is recorded). Dispatch: the slots sorted by expert, one
all-to-all with split sizes (the per-expert counts travel first, in a small native all-to-all);
combine: the reverse all-to-all; the backward pass runs both again on the gradients.

Per configuration (tokens per rank x skew x variant) and rank, medians over ``--iters``: layer
time (forward + backward, wall clock between a barrier and a device synchronisation), all-to-all
time (CUDA events around the four all-to-all calls: two forward, two backward; on the CPU the
wall clock), the faster rank's idle time (the rank with less expert work spends longer inside
the all-to-alls, waiting for its peer: its all-to-all time minus the other rank's), and bytes
sent (raw, and on the wire). ``a2a_s`` is the longer of the two ranks' all-to-all times (under
skew it holds the faster rank's wait for the busier rank's experts); ``a2a_busier_s`` is the
busier rank's own, which arrives last at the combine and at the backward dispatch and so
measures the transfers and their codec work without that wait.

    # 2 x H200, NVLink, then the shared-memory link
    PYTHONPATH=$PWD torchrun --standalone --nproc-per-node 2 experiments/moe_ep.py
    NCCL_P2P_DISABLE=1 PYTHONPATH=$PWD torchrun --standalone --nproc-per-node 2 experiments/moe_ep.py
    # one GPU, both ranks on it over gloo (host-staged TCP)
    PYTHONPATH=$PWD torchrun --standalone --nproc-per-node 2 experiments/moe_ep.py --backend gloo \
        --variants native,raw,slots --tokens 8192,32768 --skews 1.0,4.2
    # CPU smoke test (gloo, toy sizes; the bits check of every variant included)
    PYTHONPATH=$PWD torchrun --standalone --nproc-per-node 2 experiments/moe_ep.py --toy --out /tmp/moe.jsonl
    # the table of the newest run per link
    python experiments/moe_ep.py --table experiments/results/moe_ep.jsonl

Records (JSON lines, rank 0 appends to ``--out``, default ``experiments/results/moe_ep.jsonl``),
each with the machine, backend, link and NCCL link settings (``procgroup.link_record``): one
``config`` record per run, one ``measure`` record per configuration and variant, one ``ratios``
record per configuration that measured native, raw and slots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import append_records
from procgroup import link_record, start

VARIANTS = ("native", "raw", "slots", "exact")  # what a run can measure; the first is the reference
OLD_VARIANTS = ("native", "one_phase", "two_phase")  # what runs before the slot exchange measured


@dataclass(frozen=True)
class Config:
    """Everything that determines a run; saved whole with every record."""

    hidden: int = 4096  # Mixtral-8x7B
    experts: int = 8
    ffn: int = 14336
    top_k: int = 2
    layers: int = 1  # reduced depth
    tokens: tuple = (4096, 16384, 32768, 65536)  # per rank
    skews: tuple = (1.0, 1.5, 2.5, 4.2)  # target: rank 0's token slots / rank 1's
    iters: int = 5
    warmup: int = 1
    seed: int = 0
    model: str = "Mixtral-8x7B (hidden 4096, 8 experts, SwiGLU 14336, top-2)"

    def __post_init__(self):
        if self.top_k != 2:
            raise ValueError("this layer routes top-2")
        if min(self.hidden, self.experts, self.ffn, self.layers, self.iters) < 1 or self.warmup < 0:
            raise ValueError("sizes and iters must be >= 1, warmup >= 0")
        if min(self.tokens) < 1 or min(self.skews) < 1:
            raise ValueError("tokens >= 1 and skews >= 1 (rank 0 receives more)")


TOY = dict(hidden=64, experts=8, ffn=96, tokens=(256, 1024), skews=(1.0, 4.2), iters=2, warmup=1,
           model="toy (hidden 64, 8 experts, SwiGLU 96, top-2)")


# -- routing skew ----------------------------------------------------------------------------------

def zipf_bias(alpha: float, experts: int) -> np.ndarray:
    """The router bias of skew ``alpha``: -alpha * log(1 + e) for expert e (0: balanced)."""
    return -alpha * np.log1p(np.arange(experts, dtype=np.float64))


def rank0_ratio(alpha: float, experts: int, samples: int = 1 << 14, seed: int = 1234) -> float:
    """Token slots routed to the first half of the experts over those to the second half,
    for top-2 routing of N(0, 1) logits plus ``zipf_bias(alpha)`` (a fixed seeded sample, so
    every rank computes the same number)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((samples, experts)) + zipf_bias(alpha, experts)
    top = np.argpartition(-logits, 2, axis=1)[:, :2]
    first = int((top < experts // 2).sum())
    return first / max(1, 2 * samples - first)


def solve_alpha(skew: float, experts: int) -> float:
    """The smallest alpha whose ``rank0_ratio`` reaches ``skew`` (bisection; 0 for skew 1)."""
    if skew <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    while rank0_ratio(hi, experts) < skew:
        hi *= 2
        if hi > 64:
            raise ValueError(f"skew {skew} is out of reach with {experts} experts")
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rank0_ratio(mid, experts) < skew else (lo, mid)
    return hi


# -- the layer ---------------------------------------------------------------------------------------

class Permute(torch.autograd.Function):
    """y = x[perm]; the gradient is g[inv] (a gather both ways: deterministic, no atomics)."""

    @staticmethod
    def forward(ctx, x, perm, inv):
        ctx.save_for_backward(inv)
        return x[perm]

    @staticmethod
    def backward(ctx, g):
        (inv,) = ctx.saved_tensors
        return g[inv], None, None


class AllToAll(torch.autograd.Function):
    """Rows of ``x`` to the ranks by ``in_splits``; ``out_splits`` rows come back. The gradient
    goes the reverse way through the same function."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, a2a):
        ctx.meta = (out_splits, in_splits, a2a)
        out = x.new_empty((sum(out_splits), x.shape[1]))
        a2a(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits, a2a = ctx.meta
        gx = g.new_empty((sum(in_splits), g.shape[1]))
        a2a(gx, g.contiguous(), in_splits, out_splits)
        return gx, None, None, None


def make_params(cfg: Config, rank: int, world: int, device) -> list[dict]:
    """Per layer: the router (replicated: the same on every rank) and this rank's experts."""
    local = cfg.experts // world
    layers = []
    for layer in range(cfg.layers):
        g = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + layer)
        router = torch.randn(cfg.hidden, cfg.experts, generator=g, device=device) / math.sqrt(cfg.hidden)
        experts = []
        for e in range(rank * local, (rank + 1) * local):
            ge = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + 100 + layer * cfg.experts + e)
            shapes = ((cfg.hidden, cfg.ffn), (cfg.hidden, cfg.ffn), (cfg.ffn, cfg.hidden))
            experts.append([(torch.randn(*sh, generator=ge, device=device) / math.sqrt(sh[0]))
                            .to(torch.bfloat16).requires_grad_() for sh in shapes])  # w1, w3, w2
        layers.append({"router": router.to(torch.bfloat16).requires_grad_(), "experts": experts})
    return layers


def parameters(params: list[dict]) -> list[torch.Tensor]:
    return [t for layer in params for t in [layer["router"], *[w for ex in layer["experts"] for w in ex]]]


def moe_layer(x: torch.Tensor, layer: dict, bias: torch.Tensor, a2a, rank: int, world: int,
              counts: dict | None = None) -> torch.Tensor:
    """One expert-parallel MoE layer: route top-2, dispatch, experts, combine. ``counts`` (if
    given) receives the rows this rank's experts processed and the split sizes."""
    T, _ = x.shape
    E = bias.numel()
    local = E // world
    logits = (x @ layer["router"]).float() + bias
    top_v, top_i = logits.topk(2, dim=-1)
    weights = F.softmax(top_v, dim=-1).to(x.dtype)  # [T, 2]
    flat = top_i.reshape(-1)  # slot s = 2 t + k
    order = torch.argsort(flat, stable=True)  # slots sorted by expert
    inv_order = torch.argsort(order)  # a permutation's inverse (sorting: deterministic)
    per_expert = torch.bincount(flat, minlength=E)
    # the per-expert counts first (small, native): from source j, rows for each local expert
    got = torch.empty_like(per_expert)
    dist.all_to_all_single(got, per_expert)
    send_e = per_expert.view(world, local).cpu()
    recv_e = got.view(world, local).cpu()  # [source, local expert]
    in_splits = send_e.sum(1).tolist()
    out_splits = recv_e.sum(1).tolist()

    x_slots = x.unsqueeze(1).expand(T, 2, x.shape[1]).reshape(2 * T, x.shape[1])
    xs = Permute.apply(x_slots, order, inv_order)
    xr = AllToAll.apply(xs, out_splits, in_splits, a2a)  # blocks by source, each sorted by expert
    # group the received rows by local expert (then source)
    start = np.concatenate([[0], np.cumsum(recv_e.reshape(-1).numpy())])
    rows = [np.arange(start[j * local + e], start[j * local + e + 1])
            for e in range(local) for j in range(world)]
    perm = torch.from_numpy(np.concatenate(rows).astype(np.int64)).to(x.device)
    inv = torch.argsort(perm)
    xg = Permute.apply(xr, perm, inv)
    outs, pos = [], 0
    for e, (w1, w3, w2) in enumerate(layer["experts"]):
        n = int(recv_e[:, e].sum())
        xe = xg[pos:pos + n]
        outs.append((F.silu(xe @ w1) * (xe @ w3)) @ w2)
        pos += n
    yg = torch.cat(outs) if outs else xg[:0]
    yr = Permute.apply(yg, inv, perm)
    ys = AllToAll.apply(yr, in_splits, out_splits, a2a)  # back to the senders, expert order
    y = Permute.apply(ys, inv_order, order).view(T, 2, -1)
    if counts is not None:
        counts.update(rows=int(pos), in_splits=in_splits, out_splits=out_splits)
    return (y * weights.unsqueeze(-1)).sum(1)


def forward_backward(x, dy, params, biases, a2a, rank, world, counts=None):
    """The layers forward, then backward from ``dy``; returns the output."""
    h = x
    for layer, bias in zip(params, biases, strict=True):
        h = moe_layer(h, layer, bias, a2a, rank, world, counts)
    h.backward(dy)
    return h


# -- the all-to-all variants, timed ------------------------------------------------------------------

class Timed:
    """One variant's all-to-all (torch.distributed's signature with split sizes), each call timed."""

    def __init__(self, variant: str, cuda: bool):
        import exact_length

        import zipccl.torch as zt

        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.variant, self.cuda, self.zt, self.exact = variant, cuda, zt, exact_length
        self.stats = exact_length.Stats() if variant == "exact" else zt.Stats()
        self.pending: list = []
        self.raw = 0

    def __call__(self, out, inp, out_splits, in_splits):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        if self.variant == "native":
            dist.all_to_all_single(out, inp, out_splits, in_splits)
            me = dist.get_rank()
            self.raw += (sum(in_splits) - in_splits[me]) * inp.shape[1] * inp.element_size()
        elif self.variant in ("slots", "raw"):
            self.zt.all_to_all_single(out, inp, out_splits, in_splits,
                                      policy="always" if self.variant == "slots" else "raw", stats=self.stats)
        else:
            self.exact.all_to_all_single(out, inp, out_splits, in_splits, stats=self.stats)
        if self.cuda:
            end.record()
            self.pending.append((start, end))
        else:
            self.pending.append(time.perf_counter() - t0)

    def collect(self) -> tuple[float, int, int]:
        """(seconds in the calls, raw bytes, wire bytes) since the last collect (after a sync)."""
        s = sum(x if isinstance(x, float) else x[0].elapsed_time(x[1]) / 1e3 for x in self.pending)
        self.pending = []
        if self.variant == "native":
            raw, wire = self.raw, self.raw
        else:
            raw, wire = self.stats.raw_bytes, self.stats.wire_bytes
            self.stats.reset()
        self.raw = 0
        return s, raw, wire


# -- bits ----------------------------------------------------------------------------------------------

_POP: dict = {}


def differing_bits(a: torch.Tensor, b: torch.Tensor) -> int:
    """Bits in which two BF16 tensors differ (0: identical bit patterns)."""
    ia, ib = a.detach().reshape(-1).view(torch.int16), b.detach().reshape(-1).view(torch.int16)
    if torch.equal(ia, ib):
        return 0
    pop = _POP.get(a.device)
    if pop is None:
        pop = _POP[a.device] = torch.tensor([bin(i).count("1") for i in range(1 << 16)],
                                            dtype=torch.int64, device=a.device)
    return int(pop[(ia ^ ib).to(torch.int64) & 0xFFFF].sum())


def results_of(out, x, params) -> list[torch.Tensor]:
    """What must be identical across variants: the output and every gradient."""
    return [out.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in parameters(params)]]


# -- the sweep -----------------------------------------------------------------------------------------

def run(cfg: Config, device, rank: int, world: int, write, variants=VARIANTS, log=print) -> list[dict]:
    """Every configuration: check the variants' bits against native, then time them."""
    cuda = device.type == "cuda"
    params = make_params(cfg, rank, world, device)
    alphas = {s: solve_alpha(s, cfg.experts) for s in cfg.skews}
    timers = {v: Timed(v, cuda) for v in variants}

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    records = []
    for tokens in cfg.tokens:
        g = torch.Generator(device=device).manual_seed(cfg.seed * 7919 + tokens * 31 + rank)
        x = torch.randn(tokens, cfg.hidden, generator=g, device=device).to(torch.bfloat16).requires_grad_()
        dy = (torch.randn(tokens, cfg.hidden, generator=g, device=device) * 1e-2).to(torch.bfloat16)
        for skew in cfg.skews:
            bias = torch.from_numpy(zipf_bias(alphas[skew], cfg.experts)).float().to(device)
            biases = [bias] * cfg.layers
            ref = None
            mine_recs: dict = {}
            for v in variants:
                a2a = timers[v]
                times, counts = [], {}
                for it in range(cfg.warmup + cfg.iters):
                    x.grad = None
                    for p in parameters(params):
                        p.grad = None
                    sync()
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    out = forward_backward(x, dy, params, biases, a2a, rank, world, counts)
                    sync()
                    layer_s = time.perf_counter() - t0
                    a2a_s, raw, wire = a2a.collect()
                    if it >= cfg.warmup:
                        times.append((layer_s, a2a_s, raw, wire))
                res = results_of(out, x, params)
                is_ref = ref is None  # the first variant (native) is the reference
                if is_ref:
                    ref = res
                diff = [differing_bits(a, b) for a, b in zip(res, ref, strict=True)]
                del out, res
                mine = [statistics.median(t[i] for t in times) for i in range(4)] + [counts["rows"]]
                table = torch.tensor([mine], dtype=torch.float64, device=device)
                both = [torch.zeros_like(table) for _ in range(world)]
                dist.all_gather(both, table)
                both = [t.cpu().numpy()[0].tolist() for t in both]
                layer_s = [b[0] for b in both]
                a2a_s = [b[1] for b in both]
                rows = [int(b[4]) for b in both]
                compute = [layer_s[r] - a2a_s[r] for r in range(world)]
                fast = int(np.argmin(compute))
                slow = int(np.argmax(compute))
                diff_t = torch.tensor([sum(diff)], device=device)
                dist.all_reduce(diff_t, op=dist.ReduceOp.MAX)
                rec = {"kind": "measure", "tokens_per_rank": tokens, "skew_target": skew,
                       "alpha": alphas[skew], "variant": v, "rows_per_rank": rows,
                       "recv_ratio": rows[0] / max(1, rows[1]),
                       "layer_s": max(layer_s), "layer_s_per_rank": layer_s,
                       "a2a_s": max(a2a_s), "a2a_s_per_rank": a2a_s, "a2a_busier_s": a2a_s[slow],
                       "idle_faster_s": max(0.0, a2a_s[fast] - a2a_s[slow]), "faster_rank": fast,
                       "raw_bytes": sum(b[2] for b in both), "wire_bytes": sum(b[3] for b in both),
                       "differing_bits": int(diff_t.item()),
                       "differing_bits_per_tensor_rank0": diff, "reference": is_ref,
                       "bit_identical": int(diff_t.item()) == 0}
                rec["wire_ratio"] = rec["wire_bytes"] / max(1, rec["raw_bytes"])
                write(rec)
                records.append(rec)
                mine_recs[v] = rec
                if rank == 0:
                    log(f"tokens {tokens:6d} skew {rows[0] / max(1, rows[1]):4.2f} {v:9s} "
                        f"layer {1e3 * rec['layer_s']:8.2f} ms a2a {1e3 * rec['a2a_s']:8.2f} ms "
                        f"idle {1e3 * rec['idle_faster_s']:7.2f} ms wire/raw {rec['wire_ratio']:.3f} "
                        f"diff bits {rec['differing_bits']}", flush=True)
            if all(v in mine_recs for v in ("native", "raw", "slots")):
                write({"kind": "ratios", "tokens_per_rank": tokens, "skew_target": skew,
                       **speedups({v: r["a2a_busier_s"] for v, r in mine_recs.items()}, "a2a_"),
                       **speedups({v: r["layer_s"] for v, r in mine_recs.items()}, "layer_")})
            del ref
            if cuda:
                torch.cuda.empty_cache()
        del x, dy
    return records


def speedups(t: dict, prefix: str = "") -> dict:
    """Path (native / raw), compression (raw / slots) and total (native / slots) speed-ups
    from times per variant.

    >>> speedups({"native": 4.0, "raw": 2.0, "slots": 1.0})
    {'path_speedup': 2.0, 'compression_speedup': 2.0, 'total_speedup': 4.0}
    """
    return {f"{prefix}path_speedup": t["native"] / t["raw"],
            f"{prefix}compression_speedup": t["raw"] / t["slots"],
            f"{prefix}total_speedup": t["native"] / t["slots"]}


def table(path: str) -> str:
    """The newest run per link: all-to-all ms per variant and speed-ups (printed last on the GPU).

    A run holds either this script's variants (native, slots, exact) or those of runs before
    the slot exchange (native, one_phase, two_phase); each is shown with its own.
    """
    recs = [json.loads(line) for line in open(path) if line.strip()]
    newest: dict = {}
    for r in recs:
        if r.get("kind") == "measure":
            newest[r["link"]] = max(newest.get(r["link"], ""), r["run"])
    lines = []
    for link, run_id in sorted(newest.items()):
        rows: dict = {}
        for r in recs:
            if r.get("kind") == "measure" and r["link"] == link and r["run"] == run_id:
                rows.setdefault((r["tokens_per_rank"], r["skew_target"]), {})[r["variant"]] = r
        # the library's exchange last, so that "last vs middle" is its speed-up over the other
        names = next((vs for vs in (("native", "exact", "slots"), ("native", "raw", "slots"), OLD_VARIANTS)
                      if any(all(k in v for k in vs) for v in rows.values())), None)
        if names is None:
            continue
        _, b, c = names
        lines.append(f"{link} ({run_id}): busier rank's a2a ms {' / '.join(names)}; speed-ups "
                     f"vs native; {c} vs {b}; longer rank's a2a ms; layer ms; diff bits")
        for (tok, _), v in sorted(rows.items()):
            if not all(k in v for k in names):
                continue
            n, o, t = (v[k]["a2a_busier_s"] * 1e3 for k in names)
            lines.append(
                f"  {tok:6d} tok ratio {v['native']['recv_ratio']:4.2f}: {n:7.2f} / {o:7.2f} / {t:7.2f}"
                f"  {n / o:4.2f}x {n / t:4.2f}x  {o / t:4.2f}x  a2a "
                + " / ".join(f"{v[k]['a2a_s'] * 1e3:.1f}" for k in names) + "  layer "
                + " / ".join(f"{v[k]['layer_s'] * 1e3:.1f}" for k in names)
                + f"  bits {max(v[k]['differing_bits'] for k in names)}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default=None, help="comma-separated tokens per rank")
    ap.add_argument("--skews", default=None, help="comma-separated target ratios (>= 1)")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)} (native always runs, first)")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                    help="nccl (one GPU per rank; the default on GPUs) or gloo (CUDA tensors staged "
                         "through the host, both ranks may share one GPU; the default on CPUs)")
    ap.add_argument("--toy", action="store_true", help="toy sizes on the CPU (gloo): a smoke test")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU even if a GPU is present")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="allow torch's nondeterministic kernels (default: deterministic algorithms)")
    ap.add_argument("--table", metavar="JSONL", help="print the table of the newest run per link and exit")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "moe_ep.jsonl"))
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    given = {"tokens": args.tokens and tuple(int(t) for t in args.tokens.split(",")),
             "skews": args.skews and tuple(float(s) for s in args.skews.split(",")),
             "iters": args.iters, "layers": args.layers}
    cfg = Config(**{**(TOY if args.toy else {}), **{k: v for k, v in given.items() if v}})

    use_cuda = torch.cuda.is_available() and not (args.cpu or args.toy)
    if not args.nondeterministic:
        # as in train_e2e.py: deterministic kernels, so that a difference can only come from
        # the all-to-all (cuBLAS picks reduction orders per workspace otherwise)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    variants = ["native"] + [v for v in args.variants.split(",") if v and v != "native"]
    if any(v not in VARIANTS for v in variants):
        ap.error(f"unknown variant in {variants}; expected {VARIANTS}")
    device = start(args.backend, cpu=not use_cuda)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2 or cfg.experts % world:
        raise SystemExit("moe_ep.py runs expert parallelism 2: 2 ranks, an even expert count")

    import zipccl

    meta = {"config": asdict(cfg), "world": world, **link_record(device),
            "torch": torch.__version__, "zipccl": zipccl.__version__,
            "deterministic": not args.nondeterministic, "run": time.strftime("%Y-%m-%dT%H:%M:%S")}
    def write(rec: dict) -> None:  # rank 0 appends each record as soon as it is measured
        if rank == 0:
            append_records(args.out, [{**rec, **meta}])

    try:
        write({"kind": "config", "alphas": {str(s): solve_alpha(s, cfg.experts) for s in cfg.skews}})
        run(cfg, device, rank, world, write, variants)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
