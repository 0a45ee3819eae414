"""The collectives on 1-D arrays: what each one moves, over the one compressed exchange.

Every compressed collective is a slot exchange (``exchange.slot_exchange``): each
message is encoded into a fixed-size *slot* whose byte count every rank computes from the
element counts and the capacity rule (``slots``, ``capacity``), one transfer moves the
slots, a frame longer than its slot sends its tail beside the collective (``spill``), and
the receiver decodes straight from the slots. This module says what each collective
moves through it:

- ``all_gather_values``: this rank's shard, encoded once, to every peer;
- ``all_to_all_values``: block j to rank j (equal blocks, or per-peer counts);
- ``reduce_scatter_values``: block j to rank j into a (p, m) staging array, then
  ``reduce_sum`` of each round's columns as soon as they are decoded;
- ``all_reduce_values``: a reduce-scatter of near-equal shards, then an all-gather.

Native (uncompressed) calls go straight to the transport (``raw_exchange`` or the
transport's own all-gather).

**Element types.** The collectives move any type the codec codes (``format``'s
BF16, FP32, FP16), as 1-D arrays of the engine's kind: BF16 as uint16 bit
patterns, FP16 as float16, FP32 as float32 (``value_code`` tells which). Each
frame names its type, and a frame of another type is a corrupted one.

Reductions (reduce-scatter, all-reduce) are an exchange of shards followed by a
local reduction, ``reduce_sum``: FP32 accumulation in rank order
``((x_0 + x_1) + x_2) + ... + x_{p-1}``, each addition rounded to nearest even in
FP32, then for BF16 and FP16 one round-to-nearest-even to the type (exactly
ml_dtypes' float32 -> bfloat16, NumPy's float32 -> float16), and every NaN
result written as the type's canonical quiet NaN (0x7FC0, 0x7FC00000, 0x7E00:
FP32 hardware disagrees on NaN payloads, so they are not propagated). MPI has no
BF16 sum and its own order for the others, so the native host path for these
reductions is the same exchange uncompressed followed by the same reduction:
compressed and native agree bit for bit there. NCCL's native reduction is
NCCL's own (its order and rounding).

The data lives in an *engine* (``engine.Engine``, which also states each
method's stream order): ``host.HostEngine`` (NumPy + the CPU codec) or
``pipeline.DeviceEngine`` (CuPy + the GPU codec); the algorithms do not care
which.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import format as fmt
from .args import byte_view
from .base import (
    ExchangeStats,
    offsets,
    split_counts,
    value_code,
)
from .exchange import slot_exchange

CANONICAL_NAN = 0x7FC0  # BF16's; FP32's and FP16's are CANONICAL_NAN_FP32 / _FP16
CANONICAL_NAN_FP32 = 0x7FC00000
CANONICAL_NAN_FP16 = 0x7E00
REDUCE_CHUNK = 1 << 20  # elements per pass of the host reduction (bounds temporaries)


# --------------------------------------------------------------------------------------------
# The reduction, defined once
# --------------------------------------------------------------------------------------------

def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns to float32 values, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to BF16 bit patterns: nearest-even as ml_dtypes does, NaN -> 0x7FC0.

    >>> f32_to_bf16_bits(np.array([1.0, 1.00390625, 1.01171875, np.inf], np.float32))
    array([16256, 16256, 16258, 32640], dtype=uint16)
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    rounded[np.isnan(x)] = CANONICAL_NAN
    return rounded


def reduce_sum_bf16(stack: np.ndarray, out: np.ndarray) -> None:
    """out = BF16(sum over rows of ``stack`` in FP32, row 0 first); rows are ranks.

    ``stack`` is (p, m) uint16 bit patterns, ``out`` (m,) uint16. The sum starts
    from row 0 itself (not from +0, which would turn -0 into +0).
    """
    p, m = stack.shape
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN results are part of the definition
        for s in range(0, m, REDUCE_CHUNK):
            e = min(m, s + REDUCE_CHUNK)
            acc = bf16_bits_to_f32(stack[0, s:e])
            for r in range(1, p):
                acc += bf16_bits_to_f32(stack[r, s:e])
            out[s:e] = f32_to_bf16_bits(acc)


def reduce_sum_fp32(stack: np.ndarray, out: np.ndarray) -> None:
    """out = sum over rows of ``stack`` in FP32, row 0 first, each addition rounded; rows are
    ranks. ``stack`` is (p, m) float32, ``out`` (m,) float32; NaN -> 0x7FC00000.

    >>> out = np.empty(2, np.float32)
    >>> reduce_sum_fp32(np.array([[1.0, np.inf], [2.0 ** -24, -np.inf]], np.float32), out)
    >>> out.tolist(), hex(int(out.view(np.uint32)[1]))
    ([1.0, nan], '0x7fc00000')
    """
    p, m = stack.shape
    bits = out.view(np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, m, REDUCE_CHUNK):
            e = min(m, s + REDUCE_CHUNK)
            acc = stack[0, s:e].astype(np.float32)  # a copy: row 0 itself, so -0 stays -0
            for r in range(1, p):
                acc += stack[r, s:e]
            out[s:e] = acc
            bits[s:e][np.isnan(acc)] = CANONICAL_NAN_FP32


def reduce_sum_fp16(stack: np.ndarray, out: np.ndarray) -> None:
    """out = FP16(sum over rows of ``stack`` in FP32, row 0 first), one rounding; rows are
    ranks. ``stack`` is (p, m) float16, ``out`` (m,) float16; NaN -> 0x7E00.

    >>> out = np.empty(1, np.float16)
    >>> reduce_sum_fp16(np.array([[2048.0], [1.0], [1.0]], np.float16), out)  # FP16 alone: 2048
    >>> out.tolist()
    [2050.0]
    """
    p, m = stack.shape
    bits = out.view(np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, m, REDUCE_CHUNK):
            e = min(m, s + REDUCE_CHUNK)
            acc = stack[0, s:e].astype(np.float32)
            for r in range(1, p):
                acc += stack[r, s:e].astype(np.float32)
            out[s:e] = acc.astype(np.float16)
            bits[s:e][np.isnan(acc)] = CANONICAL_NAN_FP16


_REDUCE_SUM = {fmt.DTYPE_BF16: reduce_sum_bf16, fmt.DTYPE_FP32: reduce_sum_fp32,
               fmt.DTYPE_FP16: reduce_sum_fp16}


def reduce_sum(stack: np.ndarray, out: np.ndarray) -> None:
    """The stated sum (module docstring) of the rows of ``stack`` (p, m) into ``out`` (m,), for
    the element type of ``out`` (``value_code``): ``reduce_sum_bf16`` / ``_fp32`` / ``_fp16``."""
    _REDUCE_SUM[value_code(out)](stack, out)


# --------------------------------------------------------------------------------------------
# The building block
# --------------------------------------------------------------------------------------------

def raw_exchange(tr, send_bytes, sends: Sequence[tuple[int, int]], recv_bytes,
                 recvs: Sequence[tuple[int, int]], stream=None) -> None:
    """The uncompressed all-to-all of the same messages (byte offsets and counts)."""
    tr.alltoallv(send_bytes, [c for _, c in sends], [o for o, _ in sends],
                 recv_bytes, [c for _, c in recvs], [o for o, _ in recvs], stream)


# --------------------------------------------------------------------------------------------
# The collectives on 1-D arrays of the engine's kind: BF16 bits (uint16), float32, float16
# --------------------------------------------------------------------------------------------


def all_gather_values(eng, tr, send, recv, counts: Sequence[int], *, compress: bool,
                      channel=None, stream=None, chunk: int = 0) -> ExchangeStats:
    """recv[offsets(counts)[j]:][:counts[j]] = rank j's send, for every j.

    ``compress``: through the slot exchange over ``channel`` (an ``exchange.SlotChannel``),
    in rounds of ``chunk`` elements (0: one round); otherwise the transport's own.
    """
    me = tr.rank
    isz = fmt.ITEMSIZE[value_code(send)]
    recvs = list(zip(offsets(counts), counts, strict=True))
    if compress:
        return _slots(eng, tr, channel, send, [(0, counts[me])] * tr.size, recv, recvs,
                      op="all_gather", uniform=len(set(counts)) == 1, chunk=chunk,
                      max_count=max(counts), shared=True, stream=stream)
    if len(set(counts)) == 1:
        tr.allgather(byte_view(send), byte_view(recv), stream)
    else:
        raw_exchange(tr, byte_view(send), [(0, isz * counts[me])] * tr.size, byte_view(recv),
                     [(isz * o, isz * c) for o, c in recvs], stream)
    raw = isz * counts[me] * (tr.size - 1)
    return ExchangeStats(raw, raw)


def all_to_all_values(eng, tr, send, recv, send_counts: Sequence[int], recv_counts: Sequence[int],
                      *, compress: bool, channel=None, stream=None, chunk: int = 0,
                      max_count: int | None = None, uniform: bool = False) -> ExchangeStats:
    """Packed all-to-all: message to j is send[offsets(send_counts)[j]:][:send_counts[j]].

    ``max_count``: with ``chunk`` > 0, the largest message between two different ranks
    anywhere (every rank passes the same: it fixes the number of rounds); with ``chunk`` = 0
    it may be left out. ``uniform``: every message has the same count on every rank (equal
    blocks, as the caller knows), so the capacity rule may follow the call site.
    """
    sends = list(zip(offsets(send_counts), send_counts, strict=True))
    recvs = list(zip(offsets(recv_counts), recv_counts, strict=True))
    if compress:
        if chunk > 0 and max_count is None and tr.size > 2 and not uniform:
            raise ValueError("all_to_all_values needs max_count to pipeline uneven blocks on "
                             "more than 2 ranks")
        if chunk > 0 and max_count is None:
            max_count = max([c for j, c in enumerate(send_counts) if j != tr.rank]
                            + [c for j, c in enumerate(recv_counts) if j != tr.rank] + [0])
        return _slots(eng, tr, channel, send, sends, recv, recvs, op="all_to_all",
                      uniform=uniform, chunk=chunk, max_count=max_count, stream=stream)
    isz = fmt.ITEMSIZE[value_code(send)]
    raw_exchange(tr, byte_view(send), [(isz * o, isz * c) for o, c in sends], byte_view(recv),
                 [(isz * o, isz * c) for o, c in recvs], stream)
    raw = isz * (sum(send_counts) - send_counts[tr.rank])
    return ExchangeStats(raw, raw)


def reduce_scatter_values(eng, tr, send, recv, counts: Sequence[int], *, compress: bool,
                          channel=None, stream=None, chunk: int = 0) -> ExchangeStats:
    """recv = reduce_sum over ranks of each rank's shard ``me`` of ``send`` (packed by counts).

    Both paths gather the p shards into a (p, counts[me]) staging array, then reduce; the
    compressed one reduces each round's columns as soon as they are decoded.
    """
    p, me = tr.size, tr.rank
    m = counts[me]
    isz = fmt.ITEMSIZE[value_code(send)]
    stage = eng.values_workspace("stage", p * m, send.dtype)
    sends = list(zip(offsets(counts), counts, strict=True))
    recvs = [(j * m, m) for j in range(p)]
    if compress:
        def reduce_cols(lo: int, hi: int) -> None:
            eng.reduce_cols(stage, p, m, lo, hi, recv)

        return _slots(eng, tr, channel, send, sends, stage, recvs, op="reduce_scatter",
                      uniform=len(set(counts)) == 1, chunk=chunk, max_count=max(counts),
                      stream=stream, on_chunk=reduce_cols)
    raw_exchange(tr, byte_view(send), [(isz * o, isz * c) for o, c in sends], byte_view(stage),
                 [(isz * o, isz * c) for o, c in recvs], stream)
    eng.reduce_sum(stage.reshape(p, m), recv)
    raw = isz * (sum(counts) - m)
    return ExchangeStats(raw, raw)


def all_reduce_values(eng, tr, buf, *, compress: bool, channel=None, stream=None,
                      chunk: int = 0) -> ExchangeStats:
    """In place: reduce-scatter of near-equal shards, then all-gather of the reduced shards."""
    counts = split_counts(buf.size, tr.size)
    shard = eng.values_workspace("shard", counts[tr.rank], buf.dtype)
    stats = reduce_scatter_values(eng, tr, buf, shard, counts, compress=compress, channel=channel,
                                  stream=stream, chunk=chunk)
    stats.add(all_gather_values(eng, tr, shard, buf, counts, compress=compress, channel=channel,
                                stream=stream, chunk=chunk))
    return stats


def _slots(eng, tr, channel, *args, **kwargs) -> ExchangeStats:
    if channel is None:
        raise ValueError("a compressed collective needs the communicator's slot channel")
    return slot_exchange(eng, tr, channel, *args, **kwargs)
