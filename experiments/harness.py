"""What every benchmark shares: one clock, one data generator, one reduction oracle, one record writer.

Timing (``time_calls``): ``calls`` calls of a function back to back, per call.

* on a CUDA stream: CUDA events recorded on it around the calls (device time), the
  stream synchronised first so that the calls start on an idle queue;
* on the host: ``time.perf_counter`` around the calls;
* across MPI ranks (``comm``): every rank starts after a barrier and the slowest
  rank's time counts (``MPI.Wtime`` on the host, the events' time on a stream).

Every timing also says how long the host took to issue the calls (``host_s``).
``median_of`` repeats a timing k times and keeps the median.

Data (``gaussian_bits``): BF16 bit patterns of N(0, sigma^2) values rounded to
nearest even, on the host (NumPy's ``default_rng``) or on the device (CuPy's
``RandomState``, on the caller's stream), a function of (n, sigma, seed) alone;
``checkpoint_bits``: the bundled real checkpoint's floating tensors as BF16.

Oracle (``stated_sum_bf16``): the reduction zipccl promises for BF16 sums
(``zipccl.comm.reduction.reduce_sum_bf16``: FP32 accumulation in rank order
starting from rank 0's value, one rounding to nearest even, NaN as 0x7FC0),
written here with NumPy alone so that a benchmark checks the library against it
rather than against itself.

Records (``append_records``): JSON lines appended to a results file, from rank 0.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CANONICAL_NAN = 0x7FC0


# -- timing ------------------------------------------------------------------------------------

@dataclass
class Timing:
    """One timing of ``calls`` calls, per call."""

    seconds: float  # device time between the events (stream) or wall time (host)
    host_s: float  # the host's time to issue the calls (on the host: = seconds)


def time_calls(fn: Callable[[], object], calls: int = 1, *, stream=None, comm=None) -> Timing:
    """Time ``calls`` calls of ``fn`` back to back (see the module docstring)."""
    cp = None
    if stream is not None:
        import cupy as cp

        stream.synchronize()
    if comm is not None:
        comm.Barrier()
    if cp is not None:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
    clock = _wtime if comm is not None else time.perf_counter
    t0 = clock()
    for _ in range(calls):
        fn()
    host = clock() - t0
    if cp is not None:
        end.record(stream)
        end.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, end) / 1e3
    else:
        seconds = host
    if comm is not None:
        from mpi4py import MPI

        seconds, host = comm.allreduce(seconds, op=MPI.MAX), comm.allreduce(host, op=MPI.MAX)
    return Timing(seconds / calls, host / calls)


def _wtime() -> float:
    from mpi4py import MPI

    return MPI.Wtime()


def median_of(k: int, fn: Callable[[], object], calls: int = 1, **where) -> tuple[float, list[float]]:
    """(median, all k) of ``time_calls(fn, calls, **where).seconds``."""
    ts = [time_calls(fn, calls, **where).seconds for _ in range(k)]
    return statistics.median(ts), ts


# -- data --------------------------------------------------------------------------------------

def round_bf16(u, xp=np):
    """FP32 bit patterns (uint32) to BF16 bit patterns, nearest even (finite values)."""
    return ((u + xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1))) >> 16).astype(xp.uint16)


def gaussian_bits(n: int, sigma: float = 0.02, seed: int = 0, xp=np, stream=None):
    """uint16 BF16 bits of n values drawn from N(0, sigma^2), rounded to nearest even.

    ``xp=numpy``: ``default_rng(seed).normal``; ``xp=cupy``: ``RandomState(seed)`` on the
    device, enqueued on ``stream`` (None: CuPy's current one).

    >>> gaussian_bits(4, seed=1)
    array([15330, 15495, 15321, 48342], dtype=uint16)
    """
    if xp is np:
        x = np.random.default_rng(seed).normal(0.0, sigma, n).astype(np.float32)
        return round_bf16(x.view(np.uint32))
    with (stream if stream is not None else contextlib.nullcontext()):
        x = xp.random.RandomState(seed).standard_normal(n, dtype=xp.float32) * xp.float32(sigma)
        return round_bf16(x.view(xp.uint32), xp)


def checkpoint_bits() -> tuple[str, np.ndarray] | None:
    """(description, bits) of the bundled real checkpoint's floating tensors as BF16, or None."""
    from zipccl.arrays import to_bf16
    from zipccl.checkpoints import default_checkpoint, is_floating, iter_tensors

    path = default_checkpoint()
    if path is None:
        return None
    parts = [to_bf16(a).view(np.uint16).reshape(-1) for _, a in iter_tensors(path) if is_floating(a)]
    return f"checkpoint {path.parent.parent.name} (all floating tensors, BF16)", np.concatenate(parts)


# -- the reduction oracle ----------------------------------------------------------------------

def stated_sum_bf16(shards) -> np.ndarray:
    """The BF16 sum zipccl states, of uint16 BF16 bit patterns, one row per rank in rank order.

    FP32 accumulation starting from rank 0's value (so -0 stays -0), ranks added in
    order, one rounding to nearest even, NaN as 0x7FC0.

    >>> stated_sum_bf16([np.array([0x3F80, 0x8000, 0x7F80], np.uint16),
    ...                  np.array([0x3B80, 0x8000, 0xFF80], np.uint16)])  # 1 + 2^-8, -0 + -0, inf - inf
    array([16256, 32768, 32704], dtype=uint16)
    """
    rows = [(np.asarray(s, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32) for s in shards]
    with np.errstate(over="ignore", invalid="ignore"):
        acc = rows[0].copy()
        for r in rows[1:]:
            acc += r
    out = round_bf16(acc.view(np.uint32))
    out[np.isnan(acc)] = CANONICAL_NAN
    return out


def stated_sum(shards) -> np.ndarray:
    """The sum zipccl states, for rows of any of its types (one row per rank, rank order): BF16
    as uint16 bit patterns (``stated_sum_bf16``), float32 (FP32 additions in rank order, NaN
    as 0x7FC00000) or float16 (FP32 additions, one rounding, NaN as 0x7E00); returns bit
    patterns (uint16 / uint32).

    >>> stated_sum([np.array([1.0, np.inf], np.float16), np.array([2.0 ** -11, -np.inf], np.float16)])
    array([15360, 32256], dtype=uint16)
    """
    first = np.asarray(shards[0])
    if first.dtype == np.uint16:
        return stated_sum_bf16(shards)
    with np.errstate(over="ignore", invalid="ignore"):
        acc = first.astype(np.float32)
        for r in shards[1:]:
            acc += np.asarray(r, dtype=np.float32)
        if first.dtype == np.float16:
            out = acc.astype(np.float16).view(np.uint16)
            out[np.isnan(acc)] = 0x7E00
            return out
    out = acc.view(np.uint32).copy()
    out[np.isnan(acc)] = 0x7FC00000
    return out


# -- records -----------------------------------------------------------------------------------

def append_records(path: Path | str, records: list[dict], comm=None, every_rank: bool = False) -> int:
    """Append ``records`` as JSON lines to ``path`` (its folder made if needed); returns how many.

    With ``comm`` only rank 0 writes: its own records, or with ``every_rank`` every
    rank's, gathered (collective: every rank calls it). A benchmark that appends each
    record as soon as it is measured keeps what it measured when a run is cut short.
    """
    if comm is not None:
        if every_rank:
            records = [r for mine in comm.gather(list(records)) or [] for r in mine]
        if comm.Get_rank() != 0:
            return 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    return len(records)
