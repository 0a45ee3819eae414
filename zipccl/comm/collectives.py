"""The collective algorithms: compressed all-to-all as the one building block, in named phases.

Every compressed collective is built from ``compressed_exchange``, a
static/dynamic two-phase all-to-all of frames:

1. **encode** each outgoing message (one frame per destination; an all-gather
   encodes its shard once and sends the same frame to every peer);
2. **static phase**: every rank moves exactly ``format.static_size(n)`` bytes
   per message. The receiver knows n from the element counts, so no sizes are
   exchanged first. A slot holds ``max(static_size(n), max_compressed_size(n))``
   bytes, so a RAW frame or a tiny one (which can be shorter or longer than
   the static part) always fits;
3. **headers**: each receiver validates the headers it got (magic, CRC, element
   count) and reads the frame lengths; the ranks agree that all headers are
   good before anyone moves on, so a corrupted header is an error on every
   rank, not a hang;
4. **dynamic phase**: ``max(0, frame_len - static_size(n))`` bytes per message
   (the escapes), sizes known to both ends from the headers;
5. **decode** into the caller's output (only the named element ranges are
   written), then agree again on errors (a bad escape count or checksum).

``one_phase_exchange`` is the plain alternative for an all-to-all, kept as an
option (``phases=1``) to measure what the static phase buys: encode, wait for
every frame length, exchange the lengths, then move the whole frames in one
transfer of exact sizes.

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
which. This module holds the algorithms only. Small
host exchanges (frame lengths, flags) go through the transport
(``Transport.exchange_lengths``), never through MPI directly.

**Control.** A compressed collective may be handed ``control``, the
communicator's cross-rank agreement on the call (``Communicator`` module
docstring): a function that takes this rank's few ints, exchanges them with
every rank together with the call's signature, and returns every rank's ints
or raises the same ``CollectiveError`` on every rank. It replaces the first
exchange the algorithm makes anyway: the first round's frame lengths of the
pipelined exchange or of the one-phase exchange, so an agreed call costs no extra
round trip; the two-phase exchange has no length exchange, so it calls ``control``
once before its static phase. Anything the algorithm did before it (the first round's encoding, the
copy of the message to self into ``recv``) is local.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import format as fmt
from ..codebook import Codebook
from .engine import Engine

CANONICAL_NAN = 0x7FC0  # BF16's; FP32's and FP16's are CANONICAL_NAN_FP32 / _FP16
CANONICAL_NAN_FP32 = 0x7FC00000
CANONICAL_NAN_FP16 = 0x7E00
REDUCE_CHUNK = 1 << 20  # elements per pass of the host reduction (bounds temporaries)


class CollectiveError(ValueError):
    """A collective call failed; raised on every rank of the communicator with the same message."""


Agree = Callable[[str | None], None]  # raises CollectiveError on every rank if any rank passes a message
# control(ints) -> (size, k) int64, row i = rank i's ints, after checking the call's signature on
# every rank (raises the same CollectiveError on every rank on a mismatch or error)
Control = Callable[[Sequence[int]], np.ndarray]


def value_code(a) -> int:
    """The frame element type (``format.DTYPE_*``) of a collective's 1-D array (NumPy or
    CuPy): uint16 BF16 bit patterns, float16 FP16, float32 FP32.

    >>> value_code(np.zeros(1, np.uint16)), value_code(np.zeros(1, np.float32))
    (1, 2)
    """
    dt = np.dtype(a.dtype)
    if dt == np.uint16:
        return fmt.DTYPE_BF16
    if dt == np.float32:
        return fmt.DTYPE_FP32
    if dt == np.float16:
        return fmt.DTYPE_FP16
    raise TypeError(f"zipccl collectives move uint16 (BF16 bits), float32 or float16 arrays; "
                    f"got {dt}")


def value_patterns(values):
    """The bit patterns of a collective's array, as the codecs read them: float32 as uint32,
    float16 as uint16 (BF16 arrives as uint16 already). A view, NumPy or CuPy."""
    if values.dtype == np.float32:
        return values.view(np.uint32)
    if values.dtype == np.float16:
        return values.view(np.uint16)
    return values


def chunk_elements(chunk: int, itemsize: int) -> int:
    """Elements per pipeline round for values of ``itemsize`` bytes, given ``chunk`` BF16
    elements per round (the same bytes, whole escape blocks, at least one); 0 stays 0 (the
    two-phase exchange).

    >>> chunk_elements(8192, 2), chunk_elements(8192, 4), chunk_elements(4096, 4), chunk_elements(0, 4)
    (8192, 4096, 4096, 0)
    """
    if not chunk or itemsize == 2:
        return chunk
    return max(fmt.BLOCK, 2 * chunk // itemsize // fmt.BLOCK * fmt.BLOCK)


def slot_size(n: int, code: int = fmt.DTYPE_BF16) -> int:
    """Bytes reserved for one frame of ``n`` elements of type ``code`` (``format.DTYPE_*``) on
    either side of an exchange (0: no frame).

    >>> slot_size(0), slot_size(1), slot_size(4096), slot_size(4096, fmt.DTYPE_FP32)
    (0, 768, 8320, 16512)
    """
    if n == 0:
        return 0
    # 128-aligned, so every slot packed after another starts where the GPU codec may write
    return fmt.align(max(fmt.static_size(n, code), fmt.max_compressed_size(n, code)))


def split_counts(n: int, p: int) -> list[int]:
    """Element counts of ``p`` near-equal shards of ``n`` (the first n % p get one more).

    >>> split_counts(10, 4)
    [3, 3, 2, 2]
    """
    return [n // p + (1 if r < n % p else 0) for r in range(p)]


def offsets(counts: Sequence[int]) -> list[int]:
    """Exclusive prefix sum: where each of ``counts`` starts when packed."""
    out, pos = [], 0
    for c in counts:
        out.append(pos)
        pos += int(c)
    return out


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

@dataclass
class ExchangeStats:
    """Bytes one rank sent in an exchange: on the wire vs what the raw messages hold."""

    wire_bytes: int = 0
    raw_bytes: int = 0

    def add(self, other: ExchangeStats) -> None:
        self.wire_bytes += other.wire_bytes
        self.raw_bytes += other.raw_bytes


def compressed_exchange(eng: Engine, tr, agree: Agree, send: np.ndarray,
                        sends: Sequence[tuple[int, int]], recv: np.ndarray,
                        recvs: Sequence[tuple[int, int]], *, shared: bool = False,
                        stream=None, codebook: Codebook | None = None,
                        control: Control | None = None) -> ExchangeStats:
    """Two-phase all-to-all of BF16 messages as frames (see the module docstring).

    ``send``/``recv`` are 1-D uint16 bit arrays of the engine's kind. Peer j's
    outgoing message is ``send[o:o+c]`` for ``(o, c) = sends[j]``; its incoming one
    lands in ``recv[o:o+c]`` for ``(o, c) = recvs[j]``. With ``shared`` every peer
    gets the same message (an all-gather: encoded once). The message to self is
    copied, never coded. ``control`` runs first (nothing to fold it into: the
    static phase needs no sizes). Returns this rank's byte counts.
    """
    p, me = tr.size, tr.rank
    code = value_code(send)
    isz = fmt.ITEMSIZE[code]
    stats = ExchangeStats()
    if control is not None:
        control(())
    if codebook is None:
        codebook = eng.codebook(send)

    # -- encode ------------------------------------------------------------------------------
    # An engine's encode may return None (a device codec that does not synchronise): the
    # length is then read from the frame's own header, together with the received headers.
    s_off, s_stat, s_len, caps = [0] * p, [0] * p, [None] * p, [0] * p
    if shared:
        n = sends[me][1]
        sbuf = eng.workspace("send", slot_size(n, code))
        flen = None
        if n and p > 1:
            o = sends[me][0]
            flen = eng.encode(send[o:o + n], sbuf, codebook)
            s_stat = [fmt.static_size(n, code) if j != me else 0 for j in range(p)]
        caps[me if p > 1 else 0] = slot_size(n, code)
        s_len = [flen if s_stat[j] else 0 for j in range(p)]
    else:
        caps = [slot_size(c, code) if j != me else 0 for j, (_, c) in enumerate(sends)]
        s_off = offsets(caps)
        sbuf = eng.workspace("send", sum(caps))
        for j, (o, c) in enumerate(sends):
            if j != me and c:
                s_len[j] = eng.encode(send[o:o + c], sbuf[s_off[j]:s_off[j] + caps[j]], codebook)
                s_stat[j] = fmt.static_size(c, code)
            else:
                s_len[j] = 0

    # -- static phase: sizes known from the element counts alone ------------------------------
    r_caps = [slot_size(c, code) if j != me else 0 for j, (_, c) in enumerate(recvs)]
    r_off = offsets(r_caps)
    r_stat = [fmt.static_size(c, code) if (j != me and c) else 0 for j, (_, c) in enumerate(recvs)]
    rbuf = eng.workspace("recv", sum(r_caps))
    tr.alltoallv(sbuf, s_stat, s_off, rbuf, r_stat, r_off, stream)

    # -- headers: frame lengths (own and received, one read), agreed valid on every rank -------
    own = sorted({0 if shared else j for j in range(p) if s_len[j] is None})
    peers = [j for j, (_, c) in enumerate(recvs) if j != me and c]
    items = [(sbuf, s_off[j], caps[me] if shared else caps[j]) for j in own]
    items += [(rbuf, r_off[j], r_caps[j]) for j in peers]
    headers = eng.read_headers(items)
    for j, h in zip(own, headers[:len(own)], strict=True):
        if isinstance(h, str):  # our own encoder wrote it: a bug, not a transfer error
            raise RuntimeError(f"zipccl: the local encoder wrote an invalid frame: {h}")
        for k in (range(p) if shared else [j]):
            if s_stat[k]:
                s_len[k] = h.frame_len
    s_esc = [max(0, s_len[j] - s_stat[j]) if s_stat[j] else 0 for j in range(p)]
    for j in range(p):
        if j != me:
            stats.wire_bytes += s_stat[j] + s_esc[j]
            stats.raw_bytes += isz * sends[j][1]
    r_len, r_esc, err = [0] * p, [0] * p, None
    for j, h in zip(peers, headers[len(own):], strict=True):
        c = recvs[j][1]
        if isinstance(h, str):
            err = err or f"frame from rank {j}: {h}"
        elif h.n != c or h.dtype != code:
            err = err or (f"frame from rank {j}: corrupted: it holds {h.n} "
                          f"{fmt.DTYPE_NAMES[h.dtype]} elements, {c} {fmt.DTYPE_NAMES[code]} expected")
        else:
            r_len[j] = h.frame_len
            r_esc[j] = max(0, h.frame_len - r_stat[j])
    agree(err)

    # -- dynamic phase: the escapes ------------------------------------------------------------
    tr.alltoallv(sbuf, s_esc, [s_off[j] + s_stat[j] for j in range(p)],
                 rbuf, r_esc, [r_off[j] + r_stat[j] for j in range(p)], stream)

    agree(_decode_frames(eng, rbuf, r_off, r_len, recv, recvs, send, sends, me))
    return stats


def _decode_frames(eng: Engine, rbuf, r_off: Sequence[int], r_len: Sequence[int], recv,
                   recvs: Sequence[tuple[int, int]], send, sends: Sequence[tuple[int, int]],
                   me: int, err: str | None = None) -> str | None:
    """Decode every received frame (peer j's at ``rbuf[r_off[j]:][:r_len[j]]``) into its range
    of ``recv`` and copy the message to self; returns the first error (``err`` if given)."""
    for j, (o, c) in enumerate(recvs):
        if j == me or not c:
            continue
        try:
            eng.decode(rbuf[r_off[j]:r_off[j] + r_len[j]], recv[o:o + c], j)
        except ValueError as e:
            err = err or f"frame from rank {j}: {e}"
    err = err or eng.decode_errors()
    o, c = recvs[me]
    if c:
        so, sc = sends[me]
        if sc != c:
            err = err or f"rank {me} sends itself {sc} elements but expects {c}"
        else:
            eng.copy(recv[o:o + c], send[so:so + sc])
    return err


def one_phase_exchange(eng: Engine, tr, agree: Agree, send: np.ndarray,
                       sends: Sequence[tuple[int, int]], recv: np.ndarray,
                       recvs: Sequence[tuple[int, int]], *, stream=None,
                       codebook: Codebook | None = None,
                       control: Control | None = None) -> ExchangeStats:
    """The same all-to-all as ``compressed_exchange``, in one phase: lengths first, then frames.

    Every frame is encoded, the host waits for its length (one read of this rank's
    own headers), the ranks exchange the lengths of the frames they are about to send
    (one small host exchange, with an error flag), and then the whole frames move in
    one transfer of exact sizes. This is the plain way to send variable-size frames;
    the two-phase exchange instead starts moving the static part before any length is
    known. ``control`` carries the lengths (no extra round trip). Not for all-gathers
    (``shared``): they take the two-phase or the pipelined exchange.
    """
    p, me = tr.size, tr.rank
    code = value_code(send)
    stats = ExchangeStats()
    if codebook is None:
        codebook = eng.codebook(send)

    # -- encode, then read this rank's frame lengths (the host wait of this exchange) ---------
    caps = [slot_size(c, code) if j != me else 0 for j, (_, c) in enumerate(sends)]
    s_off = offsets(caps)
    sbuf = eng.workspace("send", sum(caps))
    s_len = [0] * p
    for j, (o, c) in enumerate(sends):
        if j != me and c:
            s_len[j] = eng.encode(send[o:o + c], sbuf[s_off[j]:s_off[j] + caps[j]], codebook)
    unknown = [j for j in range(p) if s_len[j] is None]
    for j, h in zip(unknown, eng.read_headers([(sbuf, s_off[j], caps[j]) for j in unknown]),
                    strict=True):
        if isinstance(h, str):  # our own encoder wrote it: a bug, not a transfer error
            raise RuntimeError(f"zipccl: the local encoder wrote an invalid frame: {h}")
        s_len[j] = h.frame_len
    bad = any(s_len[j] and not fmt.HEADER_SIZE <= s_len[j] <= caps[j] for j in range(p))

    # -- the lengths: row j = [length of the frame for rank j, flag]; back: what j sends here --
    if control is not None:
        got = control([*s_len, 1 if bad else 0])
        r_len = [int(x) for x in got[:, me]]
        failed = bool(got[:, p].any())
    else:
        got = tr.exchange_lengths([[s_len[j], 1 if bad else 0] for j in range(p)], reduce=False)
        r_len = [int(x) for x in got[:, 0]]
        failed = bool(got[:, 1].any())
    if failed:  # every rank saw every flag: all raise here together, before anything moves
        agree("the local encoder wrote a frame longer than its slot (a codec bug)")
    # a length that does not fit its element count (ranks disagreeing on the counts) is still
    # received, so that the transfer stays matched on every rank, and reported after it
    err = None
    for j, (_, c) in enumerate(recvs):
        if j != me and (r_len[j] > slot_size(c, code) or (r_len[j] == 0) != (c == 0)):
            err = err or f"frame from rank {j}: {r_len[j]} bytes announced for {c} elements"
    r_caps = [max(slot_size(c, code), fmt.align(r_len[j])) if j != me else 0
              for j, (_, c) in enumerate(recvs)]
    r_off = offsets(r_caps)

    # -- one transfer of exact sizes, then decode and the copy to self -------------------------
    rbuf = eng.workspace("recv", sum(r_caps))
    tr.alltoallv(sbuf, s_len, s_off, rbuf, r_len, r_off, stream)
    for j in range(p):
        if j != me:
            stats.wire_bytes += s_len[j]
            stats.raw_bytes += fmt.ITEMSIZE[code] * sends[j][1]
    agree(err or _decode_frames(eng, rbuf, r_off, r_len, recv, recvs, send, sends, me))
    return stats


# --------------------------------------------------------------------------------------------
# The pipelined exchange (large messages): chunks, one frame per piece, streams overlapping
# --------------------------------------------------------------------------------------------

_FRAME_LEN_AT = fmt.FRAME_LEN_AT  # int64 LE in the header


def chunk_count(max_count: int, chunk: int) -> int:
    """Number of pipeline rounds for messages of at most ``max_count`` elements (>= 1).

    >>> chunk_count(0, 4096), chunk_count(4096, 4096), chunk_count(4097, 4096)
    (1, 1, 2)
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0 elements, got {chunk}")
    return max(1, -(-int(max_count) // int(chunk)))


def _piece(count: int, chunk: int, k: int) -> tuple[int, int]:
    """(first element, element count) of round ``k``'s piece of a message of ``count`` elements."""
    lo = k * chunk
    return lo, max(0, min(chunk, count - lo))


def chunked_exchange(eng: Engine, tr, agree: Agree, send, sends: Sequence[tuple[int, int]], recv,
                     recvs: Sequence[tuple[int, int]], *, chunk: int, max_count: int,
                     shared: bool = False, stream=None, codebook: Codebook | None = None,
                     on_chunk: Callable[[int, int], None] | None = None,
                     control: Control | None = None) -> ExchangeStats:
    """The same exchange as ``compressed_exchange``, cut into rounds of ``chunk`` elements.

    Every message is cut into pieces of ``chunk`` elements; round k moves piece k of
    every message as its own frame. The rounds overlap on the device engine's three
    streams: while round k is on the wire (transfer stream), round k+1 is encoded
    (caller's stream) and round k-1 decoded (decode stream), ordered by events.

    NCCL and MPI need each message's byte count on the host before it is posted, so
    each round starts with the host reading the lengths of the frames this rank just
    encoded (waiting on that round's encode event, which runs one round ahead of the
    wire) and one small MPI exchange of those lengths; then the whole frames move in
    one step. With ``shared`` (all-gather) or on two ranks every rank contributes one
    frame per round, so the round is an all-gather of frames padded to the longest
    (NCCL's collective bandwidth, not send/recv's); otherwise it is a grouped
    send/recv of exact lengths. ``max_count`` is the largest message any rank sends
    in this exchange (all ranks pass the same value, so all run the same rounds).
    ``on_chunk(lo, hi)`` runs on the decode stream once round k's pieces (element
    range [lo, hi) of every message) are decoded; reductions use it.

    Errors never break the lock-step: a failed round is skipped on every rank and
    the first error is raised on every rank at the end (``agree``). ``control``
    (see the module docstring) carries round 0's lengths and flags.
    """
    p, me = tr.size, tr.rank
    code = value_code(send)
    stats = ExchangeStats()
    if codebook is None:
        codebook = eng.codebook(send)
    gather = shared or p == 2
    peer = 1 - me if p == 2 else None
    # what this rank contributes to a gathered round, and its piece sizes
    own = sends[me] if shared else (sends[peer] if gather and p == 2 else None)
    raw_to = [0 if j == me else (c if not shared else sends[me][1]) for j, (_, c) in enumerate(sends)]

    # -- buffers: fixed offsets from the element counts alone (planned once per signature) -----
    rounds, caps, s_cap, r_cap, s_off, r_off, s_base, r_base, s_total, r_total = _round_layout(
        tuple(c for _, c in sends), tuple(c for _, c in recvs), chunk, max_count, gather, me, p,
        code)
    sbuf = eng.workspace("send", s_total)
    rbuf = eng.workspace("recv", r_total)

    eng.pipeline_begin(rounds, p)

    def encode_round(k: int) -> None:
        if gather:
            o, c = own
            lo, n = _piece(c, chunk, k)
            if n:
                eng.encode_frame(send[o + lo:o + lo + n], sbuf[s_base[k]:s_base[k] + caps[k]],
                                 codebook, k * p)
        else:
            for j, (o, c) in enumerate(sends):
                lo, n = _piece(c, chunk, k)
                if j != me and n:
                    at = s_base[k] + s_off[k][j]
                    eng.encode_frame(send[o + lo:o + lo + n], sbuf[at:at + s_cap[k][j]], codebook,
                                     k * p + j)
        eng.encoded(k)

    if p == 1 and control is not None:
        control(())  # nothing to exchange, but the call is still checked
    # the message to self is copied, never coded (before round 0: ordered before every event)
    o, c = recvs[me]
    err = None
    if c:
        so, sc = sends[me]
        if sc != c:
            err = f"rank {me} sends itself {sc} elements but expects {c}"
        else:
            eng.copy(recv[o:o + c], send[so:so + sc])
    if p == 1 and on_chunk is not None and c:
        on_chunk(0, c)
    if p > 1:
        encode_round(0)
    failed = False
    for k in range(rounds if p > 1 else 0):
        lens = eng.frame_lengths(k)  # this round's frame lengths, indexed k * p + j
        lo = k * chunk
        if gather:
            n = _piece(own[1], chunk, k)[1]
            mine = int(lens[k * p]) if n else 0
            bad = n and not fmt.HEADER_SIZE <= mine <= caps[k]
            if k == 0 and control is not None:  # the call's agreement rides on round 0
                got = _controlled(eng, control, [mine, 1 if bad else 0])
                got = [got[:, 0].max(), got[:, 1].max()]
            else:
                got = tr.exchange_lengths([mine, 1 if bad else 0], reduce=True)
            length, failed = fmt.align(int(got[0])), failed or bool(got[1])
        else:
            mine = [int(lens[k * p + j]) if (j != me and _piece(c, chunk, k)[1]) else 0
                    for j, (_, c) in enumerate(sends)]
            bad = any(m_ and not fmt.HEADER_SIZE <= m_ <= s_cap[k][j] for j, m_ in enumerate(mine))
            if k == 0 and control is not None:
                got = _controlled(eng, control, [*mine, 1 if bad else 0])
                r_len = [int(x) for x in got[:, me]]
                failed = failed or bool(got[:, p].any())
            else:
                got = tr.exchange_lengths([[m_, 1 if bad else 0] for m_ in mine], reduce=False)
                r_len = [int(x) for x in got[:, 0]]
                failed = failed or bool(got[:, 1].any())
        if failed:  # every rank saw the same flags: all stop moving data here
            err = err or "the local encoder wrote a frame longer than its slot (a codec bug)"
            break
        tstream = eng.transfer_stream(k)
        if gather:
            if length:
                tr.allgather(sbuf[s_base[k]:s_base[k] + length],
                             rbuf[r_base[k]:r_base[k] + p * length], tstream)
                wire = (p - 1) * length if shared else length
                stats.wire_bytes += wire
        else:
            tr.alltoallv(sbuf, mine, [s_base[k] + x for x in s_off[k]], rbuf, r_len,
                         [r_base[k] + x for x in r_off[k]], tstream)
            stats.wire_bytes += sum(mine)
        stats.raw_bytes += sum(fmt.ITEMSIZE[code] * _piece(c, chunk, k)[1] for c in raw_to)
        eng.received(k)
        if k + 1 < rounds:
            encode_round(k + 1)  # on the caller's stream while round k is on the wire
        hi = lo
        for j, (ro, rc) in enumerate(recvs):
            plo, n = _piece(rc, chunk, k)
            hi = max(hi, plo + n)
            if j == me or not n:
                continue
            if gather:
                at, flen = r_base[k] + j * length, length
            else:
                at, flen = r_base[k] + r_off[k][j], r_len[j]
            e = eng.decode_frame(rbuf[at:at + flen], recv[ro + plo:ro + plo + n], k)
            if e and err is None:
                err = f"frame from rank {j}: {e}"
        if on_chunk is not None and hi > lo:
            on_chunk(lo, hi)
    e = eng.pipeline_end()  # device decodes report here, for all their frames at once
    if e and err is None:
        err = f"frame from rank {peer}: {e}" if p == 2 else f"a frame from a peer: {e}"
    agree(err)
    return stats


def _controlled(eng: Engine, control: Control, ints: Sequence[int]) -> np.ndarray:
    """``control(ints)`` inside a pipelined exchange: on failure the pipeline is closed first."""
    try:
        return control(ints)
    except CollectiveError:
        eng.pipeline_end()  # nothing moved; leave the engine's streams ordered for the next call
        raise


@lru_cache(maxsize=256)
def _round_layout(send_counts: tuple, recv_counts: tuple, chunk: int, max_count: int, gather: bool,
                  me: int, p: int, code: int = fmt.DTYPE_BF16):
    """Where every round's frames go in the send and receive workspaces: a pure function of
    the element counts, computed once per signature.

    Returns (rounds, caps, s_cap, r_cap, s_off, r_off, s_base, r_base, send bytes, recv bytes):
    gathered rounds use ``caps`` (one slot per round, the same on every rank, received p
    times); the others ``s_cap[k][j]`` / ``r_cap[k][j]`` per peer at ``s_off[k][j]`` /
    ``r_off[k][j]`` from round k's base.

    >>> _round_layout((0, 5000), (0, 5000), 4096, 5000, True, 0, 2)[:2]
    (2, [8320, 2048])
    """
    rounds = chunk_count(max_count, chunk)
    if gather:
        caps = [slot_size(_piece(max_count, chunk, k)[1], code) for k in range(rounds)]
        s_base = offsets(caps)
        return (rounds, caps, None, None, None, None, s_base, [p * o for o in s_base], sum(caps),
                p * sum(caps))
    s_cap = [[slot_size(_piece(c, chunk, k)[1], code) if j != me else 0
              for j, c in enumerate(send_counts)] for k in range(rounds)]
    r_cap = [[slot_size(_piece(c, chunk, k)[1], code) if j != me else 0
              for j, c in enumerate(recv_counts)] for k in range(rounds)]
    s_base, r_base = offsets([sum(row) for row in s_cap]), offsets([sum(row) for row in r_cap])
    return (rounds, None, s_cap, r_cap, [offsets(row) for row in s_cap],
            [offsets(row) for row in r_cap], s_base, r_base, sum(map(sum, s_cap)),
            sum(map(sum, r_cap)))


def raw_exchange(tr, send_bytes, sends: Sequence[tuple[int, int]], recv_bytes,
                 recvs: Sequence[tuple[int, int]], stream=None) -> None:
    """The uncompressed all-to-all of the same messages (byte offsets and counts)."""
    tr.alltoallv(send_bytes, [c for _, c in sends], [o for o, _ in sends],
                 recv_bytes, [c for _, c in recvs], [o for o, _ in recvs], stream)


# --------------------------------------------------------------------------------------------
# The collectives on 1-D arrays of the engine's kind: BF16 bits (uint16), float32, float16
# --------------------------------------------------------------------------------------------

def _exchange(eng: Engine, tr, agree, send, sends, recv, recvs, *, chunk: int, max_count: int,
              shared: bool = False, stream=None, on_chunk=None,
              control: Control | None = None, phases: int = 2) -> ExchangeStats:
    """The pipelined exchange for ``chunk`` > 0 elements; for ``chunk`` = 0 the two-phase one
    (``phases`` = 2) or the one-phase one (``phases`` = 1: lengths first, then the frames)."""
    check_phases(phases, chunk)
    if chunk > 0:
        return chunked_exchange(eng, tr, agree, send, sends, recv, recvs, chunk=chunk,
                                max_count=max_count, shared=shared, stream=stream, on_chunk=on_chunk,
                                control=control)
    if phases == 1 and not shared:
        stats = one_phase_exchange(eng, tr, agree, send, sends, recv, recvs, stream=stream,
                                   control=control)
    else:
        stats = compressed_exchange(eng, tr, agree, send, sends, recv, recvs, shared=shared,
                                    stream=stream, control=control)
    if on_chunk is not None:
        on_chunk(0, max(c for _, c in recvs))
    return stats


PHASES = (1, 2)  # the one-round all-to-all: lengths then frames (1), or static then dynamic (2)


def check_phases(phases: int, chunk: int) -> None:
    """Raise ValueError unless ``phases`` names an exchange that exists for pipeline ``chunk``.

    >>> check_phases(1, 0), check_phases(2, 4096)
    (None, None)
    """
    if phases not in PHASES:
        raise ValueError(f"phases must be 1 (lengths, then frames) or 2 (static, then dynamic), "
                         f"got {phases!r}")
    if phases == 1 and chunk > 0:
        raise ValueError("phases=1 is the one-round exchange: it needs chunk 0 (chunk_bytes=0); "
                         "the pipelined exchange already sends each round's lengths first")


def all_gather_values(eng: Engine, tr, agree: Agree, send, recv, counts: Sequence[int], *,
                    compress: bool, stream=None, chunk: int = 0,
                    control: Control | None = None, channel=None) -> ExchangeStats:
    """recv[offsets(counts)[j]:][:counts[j]] = rank j's send, for every j.

    ``chunk``: elements per pipeline round of the compressed path (0: the two-phase
    exchange in one round). ``control``: the call's agreement, compressed path only
    (see the module docstring).
    """
    me = tr.rank
    isz = fmt.ITEMSIZE[value_code(send)]
    r_off = offsets(counts)
    if compress and channel is not None:
        from .exchange import slot_exchange

        return slot_exchange(eng, tr, channel, send, [(0, counts[me])] * tr.size, recv,
                             list(zip(r_off, counts, strict=True)), op="all_gather",
                             uniform=len(set(counts)) == 1, chunk=chunk, max_count=max(counts),
                             shared=True, stream=stream)
    if compress:
        sends = [(0, counts[me])] * tr.size
        return _exchange(eng, tr, agree, send, sends, recv, list(zip(r_off, counts, strict=True)),
                         chunk=chunk, max_count=max(counts), shared=True, stream=stream,
                         control=control)
    if len(set(counts)) == 1:
        tr.allgather(_bytes(send), _bytes(recv), stream)
    else:
        raw_exchange(tr, _bytes(send), [(0, isz * counts[me])] * tr.size, _bytes(recv),
                     [(isz * o, isz * c) for o, c in zip(r_off, counts, strict=True)], stream)
    raw = isz * counts[me] * (tr.size - 1)
    return ExchangeStats(raw, raw)


def all_to_all_values(eng: Engine, tr, agree: Agree, send, recv, send_counts: Sequence[int],
                    recv_counts: Sequence[int], *, compress: bool, stream=None, chunk: int = 0,
                    max_count: int | None = None, control: Control | None = None,
                    phases: int = 2, channel=None, uniform: bool = False) -> ExchangeStats:
    """Packed all-to-all: message to j is send[offsets(send_counts)[j]:][:send_counts[j]].

    ``max_count``: the largest message between two different ranks anywhere (all ranks
    pass the same; needed with ``chunk`` > 0 on more than two ranks). ``channel``: a
    ``exchange.SlotChannel``: the slot exchange (device engines); ``uniform``: every
    message has the same count on every rank (equal blocks, as the caller knows). ``phases`` (with
    ``chunk`` = 0, compressed): 2 = static then dynamic phase (``compressed_exchange``),
    1 = every frame length first, then one transfer (``one_phase_exchange``).
    """
    check_phases(phases, chunk if compress else 0)
    sends = list(zip(offsets(send_counts), send_counts, strict=True))
    recvs = list(zip(offsets(recv_counts), recv_counts, strict=True))
    if compress and channel is not None:
        from .exchange import slot_exchange

        return slot_exchange(eng, tr, channel, send, sends, recv, recvs, op="all_to_all",
                             uniform=uniform, chunk=chunk, max_count=max_count, stream=stream)
    if compress:
        if max_count is None:
            if tr.size > 2 and chunk > 0:
                raise ValueError("all_to_all_values needs max_count to pipeline on more than 2 ranks")
            max_count = max([c for j, c in enumerate(send_counts) if j != tr.rank]
                            + [c for j, c in enumerate(recv_counts) if j != tr.rank] + [0])
        return _exchange(eng, tr, agree, send, sends, recv, recvs, chunk=chunk,
                         max_count=max_count, stream=stream, control=control, phases=phases)
    isz = fmt.ITEMSIZE[value_code(send)]
    raw_exchange(tr, _bytes(send), [(isz * o, isz * c) for o, c in sends], _bytes(recv),
                 [(isz * o, isz * c) for o, c in recvs], stream)
    raw = isz * (sum(send_counts) - send_counts[tr.rank])
    return ExchangeStats(raw, raw)


def reduce_scatter_values(eng: Engine, tr, agree: Agree, send, recv, counts: Sequence[int], *,
                        compress: bool, stream=None, chunk: int = 0,
                        control: Control | None = None, channel=None) -> ExchangeStats:
    """recv = reduce_sum over ranks of each rank's shard ``me`` of ``send`` (packed by counts).

    Both paths gather the p shards into a (p, counts[me]) staging array, then reduce;
    the pipelined path reduces each round's columns as soon as they are decoded.
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

        if channel is not None:
            from .exchange import slot_exchange

            return slot_exchange(eng, tr, channel, send, sends, stage, recvs, op="reduce_scatter",
                                 uniform=len(set(counts)) == 1, chunk=chunk, max_count=max(counts),
                                 stream=stream, on_chunk=reduce_cols)
        return _exchange(eng, tr, agree, send, sends, stage, recvs, chunk=chunk,
                         max_count=max(counts), stream=stream, on_chunk=reduce_cols,
                         control=control)
    raw_exchange(tr, _bytes(send), [(isz * o, isz * c) for o, c in sends], _bytes(stage),
                 [(isz * o, isz * c) for o, c in recvs], stream)
    eng.reduce_sum(stage.reshape(p, m), recv)
    raw = isz * (sum(counts) - m)
    return ExchangeStats(raw, raw)


def all_reduce_values(eng: Engine, tr, agree: Agree, buf, *, compress: bool, stream=None,
                    chunk: int = 0, control: Control | None = None, channel=None) -> ExchangeStats:
    """In place: reduce-scatter of near-equal shards, then all-gather of the reduced shards.

    ``control`` rides on the reduce-scatter (the all-gather is then part of an agreed call).
    """
    counts = split_counts(buf.size, tr.size)
    shard = eng.values_workspace("shard", counts[tr.rank], buf.dtype)
    stats = reduce_scatter_values(eng, tr, agree, buf, shard, counts, compress=compress, stream=stream,
                                chunk=chunk, control=control, channel=channel)
    stats.add(all_gather_values(eng, tr, agree, shard, buf, counts, compress=compress, stream=stream,
                              chunk=chunk, channel=channel))
    return stats


def _bytes(a):
    """A uint8 view of a 1-D array of either kind."""
    return a.view(np.uint8) if isinstance(a, np.ndarray) else a.view("uint8")
