"""Metrics, defined once: bandwidths, compression ratio, speed-up, per-tensor codec statistics.

Experiments, figures, notebooks and the policy all use these definitions so that a
number means the same thing everywhere:

- ``algbw`` and ``busbw`` follow NVIDIA/nccl-tests. Bytes are always the
  **uncompressed** bytes the collective delivers, so a compressed collective that
  finishes sooner shows a higher bus bandwidth, never an inflated byte count.
- ``compression_ratio`` is compressed bytes / original bytes (smaller is better).
- ``speedup`` is baseline time / new time (> 1 means faster).
- ``tensor_stats`` measures one BF16 tensor the way the theory notebooks compare
  it with the Gaussian prediction (sigma, coverages, exact frame ratios, entropy limit).

Sizes are in bytes, times in seconds, bandwidths in GB/s (10^9 bytes per second).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from . import format as fmt
from .codebook import (
    Codebook,
    choose_codebook,
    exponent_entropy,
    exponent_histogram,
    gaussian_coverage,
    top_exponents,
)

#: the collectives zipccl compresses, defined once (the cost model, calibration and figures use it)
OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")

# the collectives nccl-tests defines a bus bandwidth for: the four zipccl compresses and
# three it passes through
NCCL_TESTS_OPS = (*OPS, "broadcast", "reduce", "send_recv")


def busbw_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``op`` on ``nranks`` ranks.

    all_reduce: 2(p-1)/p; all_gather, reduce_scatter, all_to_all: (p-1)/p;
    broadcast, reduce, send_recv: 1.

    >>> busbw_factor("all_reduce", 4), busbw_factor("all_gather", 2)
    (1.5, 0.5)
    """
    if op not in NCCL_TESTS_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {NCCL_TESTS_OPS}")
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    p = nranks
    if op == "all_reduce":
        return 2.0 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0


def nccl_tests_size(op: str, per_rank_bytes: int, nranks: int) -> int:
    """The "size" nccl-tests divides by the time, from the per-rank message size.

    ``per_rank_bytes`` is each rank's contribution: the send buffer of all_gather,
    the receive buffer of reduce_scatter, the whole buffer of all_reduce, the whole
    send buffer of all_to_all. nccl-tests' size is the full gathered (all_gather) or
    pre-reduction (reduce_scatter) buffer, i.e. ``per_rank_bytes * nranks`` for those
    two, and ``per_rank_bytes`` otherwise.

    >>> nccl_tests_size("all_gather", 1 << 20, 2), nccl_tests_size("all_reduce", 1 << 20, 2)
    (2097152, 1048576)
    """
    if op not in NCCL_TESTS_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {NCCL_TESTS_OPS}")
    return int(per_rank_bytes) * (nranks if op in ("all_gather", "reduce_scatter") else 1)


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: uncompressed ``nbytes`` (nccl-tests' size) / time.

    >>> algbw(2e9, 1.0)
    2.0
    """
    if seconds <= 0:
        raise ValueError(f"time must be > 0, got {seconds}")
    return nbytes / seconds / 1e9


def busbw(op: str, nbytes: float, seconds: float, nranks: int) -> float:
    """Bus bandwidth in GB/s: ``algbw * busbw_factor(op, nranks)``, on uncompressed bytes.

    >>> busbw("all_gather", 2e9, 1.0, 2)
    1.0
    """
    return algbw(nbytes, seconds) * busbw_factor(op, nranks)


def compression_ratio(compressed_bytes: float, original_bytes: float) -> float:
    """Compressed / original bytes (1.0 for empty input).

    >>> compression_ratio(70, 100)
    0.7
    """
    return float(compressed_bytes) / float(original_bytes) if original_bytes else 1.0


def speedup(baseline_seconds: float, new_seconds: float) -> float:
    """Baseline time / new time; above 1 the new path is faster.

    >>> speedup(3.0, 2.0)
    1.5
    """
    if new_seconds <= 0:
        raise ValueError(f"time must be > 0, got {new_seconds}")
    return baseline_seconds / new_seconds


def frame_ratio(n: int, n_escapes: int) -> float:
    """Exact ratio of the frame of ``n`` BF16 values with ``n_escapes`` escapes.

    Includes every overhead of the format (header, 128-byte alignment, escape
    counts) and the RAW fallback, through ``format.Layout``; equals
    ``len(zipccl.compress(x)) / x.nbytes`` for a tensor whose codebook escapes
    ``n_escapes`` values.

    >>> round(frame_ratio(1 << 20, 0), 4)  # 11 bits per value, plus the header and counts
    0.688
    """
    if n == 0:
        return 1.0
    return fmt.Layout.for_count(int(n)).frame_len(int(n_escapes)) / (2.0 * n)


def entropy_ratio(entropy_bits: float) -> float:
    """The entropy limit as a ratio: (8 raw sign-mantissa bits + H(exponent)) / 16."""
    return (8.0 + entropy_bits) / 16.0


@dataclass(frozen=True)
class TensorStats:
    """One BF16 tensor measured against the Gaussian theory (see ``tensor_stats``)."""

    n: int
    mean: float
    std: float
    sigma: float  # RMS of the strided sample: what the default codebook uses
    frac_log2_sigma: float  # the only thing the Gaussian exponent law depends on
    zero_fraction: float  # exact zeros (+0 and -0)
    coverage_predicted: float  # gaussian_coverage(sigma): the closed form
    coverage_sigma: float  # sigma window, measured on the whole tensor
    coverage_default: float  # Codebook.from_sample (sigma window or its fallback)
    coverage_hist: float  # exact top-7 of the whole tensor: the best any 7-codebook can do
    fallback: bool  # the default codebook is the sample's top-7, not the sigma window
    entropy_bits: float  # H(exponent)
    ratio_sigma: float
    ratio_default: float
    ratio_hist: float
    ratio_entropy: float  # (8 + H) / 16
    hist: dict[int, int]  # exponent -> count, non-zero bins only

    def as_record(self) -> dict:
        """A JSON-ready dict (histogram keys as strings)."""
        d = asdict(self)
        d["hist"] = {str(k): v for k, v in self.hist.items()}
        return d


def tensor_stats(bits: np.ndarray, frame_bytes: int | None = None) -> TensorStats:
    """Coverage, ratio and entropy of one tensor of BF16 bit patterns (uint16).

    Ratios come from ``frame_ratio`` (exact frame sizes); pass ``frame_bytes``,
    the length of a real ``zipccl.compress`` frame made with the default codebook,
    to have it checked against that prediction (a mismatch raises).

    >>> import ml_dtypes, numpy as np
    >>> x = np.random.default_rng(0).normal(0, 0.02, 1 << 16).astype(ml_dtypes.bfloat16)
    >>> s = tensor_stats(x.view(np.uint16))
    >>> abs(s.coverage_sigma - s.coverage_predicted) < 0.01, s.fallback
    (True, False)
    """
    flat = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1)
    n = int(flat.size)
    hist = exponent_histogram(flat)
    choice = choose_codebook(flat)
    sigma = choice.sigma
    by_sigma = Codebook(choice.sigma_window)
    top = top_exponents(hist)

    def covered(exps) -> int:
        return int(hist[list(exps)].sum())

    c_sigma, c_default, c_top = covered(by_sigma.exponents), covered(choice.codebook.exponents), \
        covered(top)
    ratio_default = frame_ratio(n, n - c_default)
    if frame_bytes is not None and n and frame_bytes != round(ratio_default * 2 * n):
        raise ValueError(f"frame of {frame_bytes} bytes, but the layout predicts "
                         f"{round(ratio_default * 2 * n)} for {n - c_default} escapes")
    v = (flat.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    finite = v[np.isfinite(v)]
    h = exponent_entropy(hist)
    frac = math.log2(sigma) % 1.0 if sigma > 0 else float("nan")
    div = max(n, 1)
    return TensorStats(
        n=n, mean=float(finite.mean()) if finite.size else 0.0,
        std=float(finite.std()) if finite.size else 0.0, sigma=sigma, frac_log2_sigma=frac,
        zero_fraction=float(np.count_nonzero((flat & 0x7FFF) == 0) / div),
        coverage_predicted=gaussian_coverage(sigma) if sigma > 0 else 1.0,
        coverage_sigma=c_sigma / div, coverage_default=c_default / div, coverage_hist=c_top / div,
        fallback=choice.fallback, entropy_bits=h, ratio_sigma=frame_ratio(n, n - c_sigma),
        ratio_default=ratio_default, ratio_hist=frame_ratio(n, n - c_top),
        ratio_entropy=entropy_ratio(h),
        hist={int(e): int(c) for e, c in enumerate(hist) if c})
