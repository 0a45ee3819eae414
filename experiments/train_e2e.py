"""End to end: FSDP2 training of a Llama-style decoder, native collectives against zipccl's.

Why run it: it answers the question a user has before adopting zipccl -- does my
sharded BF16 training step get faster, and does the loss change? It trains the
same model from the same seed on the same tokens once per mode and records, per
step, the loss (its FP32 bits on every rank), the step time, the time the
parameter all-gathers and gradient reduce-scatters took on their streams (the
communication fraction) and the bytes this rank sent (raw vs on the wire). The
one line that switches zipccl on is ``zipccl.torch.compress_fsdp(model, policy=...)``.

Modes (``--modes``, run one after the other in the same job, native first):
  native  -- torch.distributed's own all-gather / reduce-scatter (zipccl's ``policy="never"``
             comm objects, which call them unchanged; they only count and time the calls);
  raw     -- zipccl's exchange with the codec off (``policy="raw"``): the same slots, pipeline
             and transport call (an all-to-all) as "always", every frame RAW, so it moves the
             native bytes plus two 128-byte headers per frame;
  always  -- every BF16 collective compressed;
  auto    -- compressed where zipccl's policy says it pays.
The three time ratios a run reports (``ratios`` record) separate what the path buys from what
compression buys: path = native / raw, compression = raw / always (or auto), total = their
product = native / always.

Model (default, ~1.03 B parameters): d_model 2048, 20 blocks, 16 heads, SwiGLU 5632,
RMSNorm, rotary attention, untied embeddings; byte-level tokens (vocabulary 256) of
real text (the Python standard library's source, read from this machine's Python),
sequence 2048. FSDP2: each block and the root ``fully_shard``-ed with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``, FP32 master weights,
AdamW. Tokens per step = batch x sequence x world size.

    # 2 x H200, NVLink, then the shared-memory link
    torchrun --standalone --nproc-per-node 2 experiments/train_e2e.py --steps 120
    NCCL_P2P_DISABLE=1 torchrun --standalone --nproc-per-node 2 experiments/train_e2e.py --steps 120
    # one GPU, two ranks on it over gloo (host-staged TCP); the one-GPU matrix of both models:
    torchrun --standalone --nproc-per-node 2 experiments/train_e2e.py --backend gloo \
        --modes native,raw,always,auto --steps 12 --warmup 2
    bash experiments/run_train_one_gpu.sh
    # CPU smoke test (gloo, toy model; what the test suite runs)
    torchrun --standalone --nproc-per-node 2 experiments/train_e2e.py --toy --steps 3 --out /tmp/e2e.jsonl

Records (JSON lines, rank 0 writes, appended to ``--out``, default
``experiments/results/train_e2e.jsonl``), each with the machine, GPU, backend, link and the
NCCL link settings set (``procgroup.link_record``): one ``config`` record per mode, one ``step``
record per step (bytes per collective: ``by_op``), one ``summary`` per mode (the first step's
time apart -- kernel compilation, "auto"'s calibration --, the median step time and comm
fraction over the steps after ``--warmup``, bytes and wire ratio per collective: all-gather
of parameters, reduce-scatter of gradients, whether every loss and the final parameters are
the same bits as the native run's), and one ``ratios`` record per job with the three ratios.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_records  # noqa: E402
from procgroup import link_record, start  # noqa: E402

# mode -> zipccl policy of the comm objects
POLICIES = {"native": "never", "raw": "raw", "always": "always", "auto": "auto"}
OPS = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Config:
    """Everything that determines a run; saved whole with every record."""

    d_model: int = 2048
    n_layers: int = 20
    n_heads: int = 16
    ffn: int = 5632
    vocab: int = 256
    seq: int = 2048
    batch: int = 1  # sequences per rank per step
    steps: int = 120
    warmup: int = 5  # steps left out of the summary's timings
    lr: float = 3e-4
    seed: int = 0
    chunk_bytes: int = 0  # zipccl pipeline chunk (0: one round per call)

    def __post_init__(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("d_model must split into n_heads heads of even size")
        if min(self.steps, self.seq, self.batch, self.n_layers) < 1:
            raise ValueError("steps, seq, batch and n_layers must be >= 1")


TOY = dict(d_model=64, n_layers=2, n_heads=4, ffn=172, seq=64, batch=2, warmup=0, lr=1e-3)


# -- data: real text, byte-level -------------------------------------------------------------

def text_tokens(limit: int = 64 << 20) -> np.ndarray:
    """Bytes of the Python standard library's .py files (sorted paths), up to ``limit`` bytes."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    chunks, total = [], 0
    for f in files:
        with open(f, "rb") as fh:
            b = fh.read()
        chunks.append(b)
        total += len(b)
        if total >= limit:
            break
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    if data.size < 1 << 16:
        raise RuntimeError(f"only {data.size} bytes of text found under the standard library")
    return data


def batch_for(data: np.ndarray, cfg: Config, step: int, rank: int, device) -> tuple:
    """(inputs, targets) of this rank at ``step``: windows at seeded offsets, the same in every mode."""
    rng = np.random.default_rng([cfg.seed, step, rank])
    starts = rng.integers(0, data.size - cfg.seq - 1, cfg.batch)
    win = np.stack([data[s:s + cfg.seq + 1] for s in starts]).astype(np.int64)
    t = torch.from_numpy(win).to(device)
    return t[:, :-1], t[:, 1:]


# -- the model: Llama-style decoder ------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d, self.h = cfg.d_model, cfg.n_heads
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.h, d // self.h).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        g, u = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        hd = cfg.d_model // cfg.n_heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd // 2, dtype=torch.float32) * 2 / hd))
        ang = torch.outer(torch.arange(cfg.seq, dtype=torch.float32), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx):
        x = self.embed(idx)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.head(self.norm(x))


def build(cfg: Config, device) -> Decoder:
    torch.manual_seed(cfg.seed)
    with torch.device(device):
        model = Decoder(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            out_proj = name.endswith(("proj.weight", "down.weight"))  # scaled by depth, as GPT-2 does
            std = 0.02 / math.sqrt(2 * cfg.n_layers) if out_proj else 0.02
            nn.init.normal_(p, 0.0, std)
    return model


# -- timing the collectives on their own streams ----------------------------------------------

class Timed:
    """Wraps an FSDP2 comm object; adds each call's duration (on the stream it runs on) to a list."""

    def __init__(self, comm, device):
        self.comm, self.cuda = comm, device.type == "cuda"
        self.pending: list = []  # (start, end) CUDA events, or seconds on the CPU

    def allocate(self, *args, **kwargs):
        return self.comm.allocate(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if not self.cuda:
            t0 = time.perf_counter()
            out = self.comm(*args, **kwargs)
            self.pending.append(time.perf_counter() - t0)
            return out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.comm(*args, **kwargs)
        end.record()
        self.pending.append((start, end))
        return out

    def collect(self) -> float:
        """Seconds of the calls since the last collect (after the step synchronised)."""
        s = sum(x if isinstance(x, float) else x[0].elapsed_time(x[1]) / 1e3 for x in self.pending)
        self.pending = []
        return s


# -- one mode ------------------------------------------------------------------------------------

def run_mode(mode: str, cfg: Config, data, device, rank: int, world: int, write, native_ref: dict):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import zipccl.torch as zt

    model = build(cfg, device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    hooks = zt.compress_fsdp(model, policy=POLICIES[mode], chunk_bytes=cfg.chunk_bytes)  # the one line
    ag, rs = Timed(hooks.all_gather, device), Timed(hooks.reduce_scatter, device)
    for m in hooks.modules:  # the same objects, timed (what FSDP calls)
        m.set_custom_all_gather(ag)
        m.set_custom_reduce_scatter(rs)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    n_params = sum(p.numel() for p in model.parameters())
    write({"kind": "config", "mode": mode, "params": n_params,
           "tokens_per_step": cfg.batch * cfg.seq * world})

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    steps, losses = [], []
    for step in range(cfg.steps):
        x, y = batch_for(data, cfg, step, rank, device)
        before, before_op = hooks.stats.as_dict(), per_op(hooks.stats)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        step_s = time.perf_counter() - t0
        ag_s, rs_s = ag.collect(), rs.collect()
        after, after_op = hooks.stats.as_dict(), per_op(hooks.stats)
        lb = loss.detach().float().reshape(1)
        everyone = [torch.zeros_like(lb) for _ in range(world)]
        dist.all_gather(everyone, lb)
        bits = [int(np.frombuffer(t.cpu().numpy().tobytes(), dtype=np.uint32)[0]) for t in everyone]
        rec = {"kind": "step", "mode": mode, "step": step, "loss": float(lb.item()), "loss_bits": bits,
               "step_s": step_s, "all_gather_s": ag_s, "reduce_scatter_s": rs_s,
               "comm_fraction": (ag_s + rs_s) / step_s if step_s > 0 else None,
               **{k: after[k] - before[k] for k in after},
               "by_op": {op: {k: after_op[op][k] - before_op[op][k] for k in after_op[op]} for op in OPS}}
        write(rec)
        steps.append(rec)
        losses.append(bits)
        if rank == 0 and (step % 10 == 0 or step == cfg.steps - 1):
            print(f"[{mode}] step {step:4d} loss {rec['loss']:.4f} {1e3 * step_s:7.1f} ms "
                  f"comm {100 * (rec['comm_fraction'] or 0):5.1f}% wire/raw "
                  f"{rec['wire_bytes'] / max(rec['raw_bytes'], 1):.3f}", flush=True)

    # final parameters: a digest of this rank's shards; equal to native's on every rank?
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().to_local().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    digest = h.hexdigest()
    if mode == "native":
        native_ref.update(losses=losses, digest=digest)
    same_params = None
    if native_ref:
        flag = torch.tensor([0 if digest == native_ref["digest"] else 1], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        same_params = not bool(flag.item())
    timed = [r for r in steps if r["step"] >= cfg.warmup] or steps
    total = hooks.stats.as_dict()
    by_op = per_op(hooks.stats)
    loss_equal = (losses == native_ref["losses"]) if native_ref else None
    summary = {"kind": "summary", "mode": mode, "policy": POLICIES[mode], "params": n_params,
               "steps": cfg.steps, "timed_steps": len(timed),
               # step 0 holds the kernels' compilation and "auto"'s calibration: apart, never timed
               "first_step_s": steps[0]["step_s"],
               "warmup_steps_s": [r["step_s"] for r in steps if r["step"] < cfg.warmup],
               "median_step_s": float(np.median([r["step_s"] for r in timed])),
               "mean_step_s": float(np.mean([r["step_s"] for r in timed])),
               "median_comm_fraction": float(np.median([r["comm_fraction"] or 0 for r in timed])),
               **{f"median_{op}_s": float(np.median([r[f"{op}_s"] for r in timed])) for op in OPS},
               **total, "wire_ratio": total["wire_bytes"] / max(total["raw_bytes"], 1),
               "by_op": {op: {**v, "wire_ratio": v["wire_bytes"] / max(v["raw_bytes"], 1)}
                         for op, v in by_op.items()},
               # bytes this rank sent in one step (the last), per collective: what the link carried
               "step_bytes": {op: {k: steps[-1]["by_op"][op][k] for k in ("raw_bytes", "wire_bytes")}
                              for op in OPS},
               "loss_bits_equal_native": loss_equal, "params_bits_equal_native": same_params,
               "bits_equal_native": (loss_equal and same_params) if native_ref else None,
               "final_loss": steps[-1]["loss"]}
    write(summary)
    del model, opt, hooks
    return summary


def per_op(stats) -> dict:
    """This rank's counts per FSDP collective (zeros for one not called yet)."""
    keys = ("calls", "compressed_calls", "raw_bytes", "wire_bytes")
    return {op: {k: getattr(stats.of(op), k) for k in keys} for op in OPS}


def ratios(summaries: dict) -> dict:
    """The three ratios of median step times, as speed-ups (> 1: faster): path = native / raw
    (zipccl's exchange with the codec off against torch.distributed's collectives), compression
    = raw / mode, total = native / mode = path x compression (mode: always, auto).

    >>> r = ratios({"native": {"median_step_s": 6.0}, "raw": {"median_step_s": 3.0},
    ...             "always": {"median_step_s": 2.0}})
    >>> r["path_speedup"], r["always"]
    (2.0, {'compression_speedup': 1.5, 'total_speedup': 3.0})
    """
    t = {m: s["median_step_s"] for m, s in summaries.items()}
    out: dict = {"median_step_s": t}
    if "native" in t and "raw" in t:
        out["path_speedup"] = t["native"] / t["raw"]
    for m in ("always", "auto"):
        if m in t:
            out[m] = {}
            if "raw" in t:
                out[m]["compression_speedup"] = t["raw"] / t[m]
            if "native" in t:
                out[m]["total_speedup"] = t["native"] / t[m]
    return out


def table(path: str) -> str:
    """The newest run per (link, model size) with a ``ratios`` record: one line per mode.

    Columns: the first step (compilation, calibration), the median step and comm fraction
    over the timed steps, the wire ratio of the all-gathers and the reduce-scatters, the
    speed-up over native and whether every loss and the final parameters matched native's bits.
    """
    import json

    recs = [json.loads(line) for line in open(path) if line.strip()]
    newest: dict = {}
    for r in recs:
        if r.get("kind") == "ratios":
            key = (r["link"], r["params"])
            newest[key] = max(newest.get(key, ""), r["run"])
    lines = []
    for (link, params), run_id in sorted(newest.items()):
        mine = [r for r in recs
                if r.get("run") == run_id and r.get("link") == link and r.get("params") == params]
        rat = next(r for r in mine if r["kind"] == "ratios")
        size = f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.2f} M"
        head = (f"{size}, {rat['machine']}, {link} ({run_id}): "
                f"path {rat.get('path_speedup', 0):.2f}x")
        for m in ("always", "auto"):
            if m in rat:
                head += (f"; {m} compression {rat[m].get('compression_speedup', 0):.2f}x"
                         f" total {rat[m].get('total_speedup', 0):.2f}x")
        lines += [head, "  mode     first s  median s  comm   AG wire  RS wire  vs native  bits"]
        native = rat["median_step_s"].get("native")
        for r in (r for r in mine if r["kind"] == "summary"):
            sp = f"{native / r['median_step_s']:8.2f}x" if native else "        -"
            ag, rs = (r["by_op"][op]["wire_ratio"] for op in OPS)
            lines.append(f"  {r['mode']:7s} {r['first_step_s']:8.2f} {r['median_step_s']:9.3f} "
                         f"{100 * r['median_comm_fraction']:4.0f}%  {ag:7.3f}  {rs:7.3f}  {sp}  "
                         f"{'equal' if r['bits_equal_native'] else 'DIFFER'}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="native,raw,always,auto",
                    help=f"comma-separated, of {', '.join(POLICIES)}")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                    help="the process group: nccl (one GPU per rank; the default on GPUs) or gloo "
                         "(CUDA tensors staged through the host, ranks mapped onto the GPUs present, "
                         "several per GPU; the default on CPUs)")
    ap.add_argument("--steps", type=int, default=Config.steps)
    ap.add_argument("--warmup", type=int, default=None, help="steps left out of the summary's timings")
    ap.add_argument("--batch", type=int, default=None, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--chunk-bytes", type=int, default=0)
    ap.add_argument("--toy", action="store_true", help="a tiny model on the CPU (gloo): a smoke test")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU even if a GPU is present")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="allow torch's nondeterministic kernels (by default deterministic algorithms and "
                         "the math attention backend, so that two runs of one mode give the same bits)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "train_e2e.jsonl"))
    ap.add_argument("--table", metavar="JSONL", help="print the table of the newest runs and exit")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in POLICIES for m in modes):
        ap.error(f"unknown mode in {modes}")
    if "native" in modes:
        modes = ["native"] + [m for m in modes if m != "native"]  # the reference runs first
    kw = dict(TOY) if args.toy else {}
    kw.update(steps=args.steps, chunk_bytes=args.chunk_bytes)
    if args.batch:
        kw["batch"] = args.batch
    if args.seq:
        kw["seq"] = args.seq
    if args.layers:
        kw["n_layers"] = args.layers
    if args.warmup is not None:
        kw["warmup"] = args.warmup
    cfg = Config(**kw)

    use_cuda = torch.cuda.is_available() and not (args.cpu or args.toy)
    if not args.nondeterministic:
        # without this, two native runs already differ from step 1 on (seen on 2 x H200: the
        # attention and embedding backward kernels accumulate with atomics), and no comparison
        # of losses between modes can mean anything
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        if use_cuda:
            torch.backends.cuda.enable_flash_sdp(False)
            torch.backends.cuda.enable_mem_efficient_sdp(False)
            torch.backends.cuda.enable_cudnn_sdp(False)
            torch.backends.cuda.enable_math_sdp(True)
    device = start(args.backend, cpu=not use_cuda)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = text_tokens(1 << 20 if args.toy else 64 << 20)  # the toy reads 1 MiB: seconds, not minutes

    import zipccl

    meta = {"config": asdict(cfg), "world": world, "device": str(device), **link_record(device),
            "torch": torch.__version__, "zipccl": zipccl.__version__,
            "deterministic": not args.nondeterministic,
            "text_bytes": int(data.size), "run": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def write(rec: dict) -> None:  # at once, from rank 0: a run cut short keeps its steps
        if rank == 0:
            append_records(args.out, [{**rec, **meta}])

    native_ref: dict = {}
    summaries: dict = {}
    try:
        for mode in modes:
            summaries[mode] = run_mode(mode, cfg, data, device, rank, world, write, native_ref)
            if use_cuda:
                torch.cuda.empty_cache()
        r = ratios(summaries)
        write({"kind": "ratios", "params": summaries[modes[0]]["params"],
               "bits_equal_native": {m: s["bits_equal_native"] for m, s in summaries.items()}, **r})
        if rank == 0:
            print(f"[{meta['link']}] median s/step " + ", ".join(
                f"{m} {t:.3f}" for m, t in r["median_step_s"].items())
                + (f"; path {r['path_speedup']:.2f}x" if "path_speedup" in r else "")
                + "".join(f"; {m}: " + ", ".join(f"{k.split('_')[0]} {v:.2f}x" for k, v in r[m].items())
                          for m in ("always", "auto") if r.get(m)), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
