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

Reductions (reduce-scatter, all-reduce) are an exchange of shards followed by a
local reduction defined by ``reduce_sum_bf16``: FP32 accumulation in rank order
``((x_0 + x_1) + x_2) + ... + x_{p-1}``, one round-to-nearest-even to BF16
(exactly ml_dtypes' float32 -> bfloat16), and every NaN result written as the
canonical quiet NaN 0x7FC0 (FP32 hardware disagrees on NaN payloads, so they
are not propagated). MPI has no BF16 sum, so the native host path for BF16
reductions is the same exchange uncompressed followed by the same reduction:
compressed and native agree bit for bit there. NCCL's native BF16 reduction is
NCCL's own (its order and rounding).

The data lives in an *engine*: ``HostEngine`` (NumPy + the CPU codec) or a
device engine (CuPy + the GPU codec); the algorithms do not care which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import format as fmt
from ..codebook import Codebook

CANONICAL_NAN = 0x7FC0
REDUCE_CHUNK = 1 << 20  # elements per pass of the host reduction (bounds temporaries)


class CollectiveError(ValueError):
    """A collective call failed; raised on every rank of the communicator with the same message."""


Agree = Callable[[str | None], None]  # raises CollectiveError on every rank if any rank passes a message


def slot_size(n: int) -> int:
    """Bytes reserved for one frame of ``n`` elements on either side of an exchange (0: no frame).

    >>> slot_size(0), slot_size(1), slot_size(4096)
    (0, 768, 8320)
    """
    if n == 0:
        return 0
    # 128-aligned, so every slot packed after another starts where the GPU codec may write
    return fmt.align(max(fmt.static_size(n), fmt.max_compressed_size(n)))


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


# --------------------------------------------------------------------------------------------
# Engines: where the data lives and which codec runs on it
# --------------------------------------------------------------------------------------------

class HostEngine:
    """NumPy buffers and the CPU codec (``zipccl.codec.cpu``)."""

    device = False

    def __init__(self, checksum: bool = False):
        from ..codec import cpu

        self.codec = cpu
        self.checksum = bool(checksum)
        self._work: dict[str, np.ndarray] = {}

    def workspace(self, role: str, nbytes: int) -> np.ndarray:
        """A reusable uint8 scratch buffer of ``nbytes`` (grown, never shrunk)."""
        buf = self._work.get(role)
        if buf is None or buf.size < nbytes:
            buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
            self._work[role] = buf
        return buf[:nbytes]

    def bits_workspace(self, role: str, n: int) -> np.ndarray:
        return self.workspace(role, 2 * n).view(np.uint16)

    def codebook(self, bits: np.ndarray) -> Codebook:
        return Codebook.from_sample(bits)

    def encode(self, bits: np.ndarray, out: np.ndarray, codebook: Codebook) -> int:
        """Encode ``bits`` into the start of ``out``; returns the frame length."""
        frame = self.codec.encode(bits, codebook, (bits.size,), self.checksum)
        out[:frame.size] = frame
        return int(frame.size)

    def read_headers(self, items) -> list:
        """Parse the frame header at each (buffer, offset, capacity); a str for an invalid one."""
        out = []
        for buf, offset, capacity in items:
            try:
                out.append(fmt.parse_header(buf[offset:offset + capacity]))
            except ValueError as e:
                out.append(str(e))
        return out

    def decode(self, frame: np.ndarray, out: np.ndarray, slot: int = 0) -> None:
        """Decode one frame into ``out`` (uint16, exactly the frame's element count)."""
        bits, header = self.codec.decode(frame)
        if bits.size != out.size:
            raise ValueError(f"frame holds {bits.size} elements, expected {out.size}")
        out[:] = bits.reshape(-1)

    def decode_errors(self) -> str | None:
        """Errors of decodes that report late (device); host decodes raise at once."""
        return None

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        dst[...] = src

    def reduce_sum(self, stack: np.ndarray, out: np.ndarray) -> None:
        reduce_sum_bf16(stack, out)

    def set_stream(self, stream) -> None:
        pass

    def sync(self) -> None:
        pass


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


def compressed_exchange(eng, tr, agree: Agree, send: np.ndarray,
                        sends: Sequence[tuple[int, int]], recv: np.ndarray,
                        recvs: Sequence[tuple[int, int]], *, shared: bool = False,
                        stream=None, codebook: Codebook | None = None) -> ExchangeStats:
    """Two-phase all-to-all of BF16 messages as frames (see the module docstring).

    ``send``/``recv`` are 1-D uint16 bit arrays of the engine's kind. Peer j's
    outgoing message is ``send[o:o+c]`` for ``(o, c) = sends[j]``; its incoming one
    lands in ``recv[o:o+c]`` for ``(o, c) = recvs[j]``. With ``shared`` every peer
    gets the same message (an all-gather: encoded once). The message to self is
    copied, never coded. Returns this rank's byte counts.
    """
    p, me = tr.size, tr.rank
    stats = ExchangeStats()
    if codebook is None:
        codebook = eng.codebook(send)

    # -- encode ------------------------------------------------------------------------------
    # An engine's encode may return None (a device codec that does not synchronise): the
    # length is then read from the frame's own header, together with the received headers.
    s_off, s_stat, s_len, caps = [0] * p, [0] * p, [None] * p, [0] * p
    if shared:
        n = sends[me][1]
        sbuf = eng.workspace("send", slot_size(n))
        flen = None
        if n and p > 1:
            o = sends[me][0]
            flen = eng.encode(send[o:o + n], sbuf, codebook)
            s_stat = [fmt.static_size(n) if j != me else 0 for j in range(p)]
        caps[me if p > 1 else 0] = slot_size(n)
        s_len = [flen if s_stat[j] else 0 for j in range(p)]
    else:
        caps = [slot_size(c) if j != me else 0 for j, (_, c) in enumerate(sends)]
        s_off = offsets(caps)
        sbuf = eng.workspace("send", sum(caps))
        for j, (o, c) in enumerate(sends):
            if j != me and c:
                s_len[j] = eng.encode(send[o:o + c], sbuf[s_off[j]:s_off[j] + caps[j]], codebook)
                s_stat[j] = fmt.static_size(c)
            else:
                s_len[j] = 0

    # -- static phase: sizes known from the element counts alone ------------------------------
    r_caps = [slot_size(c) if j != me else 0 for j, (_, c) in enumerate(recvs)]
    r_off = offsets(r_caps)
    r_stat = [fmt.static_size(c) if (j != me and c) else 0 for j, (_, c) in enumerate(recvs)]
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
            stats.raw_bytes += 2 * sends[j][1]
    r_len, r_esc, err = [0] * p, [0] * p, None
    for j, h in zip(peers, headers[len(own):], strict=True):
        c = recvs[j][1]
        if isinstance(h, str):
            err = err or f"frame from rank {j}: {h}"
        elif h.n != c:
            err = err or f"frame from rank {j}: corrupted: it holds {h.n} elements, {c} expected"
        else:
            r_len[j] = h.frame_len
            r_esc[j] = max(0, h.frame_len - r_stat[j])
    agree(err)

    # -- dynamic phase: the escapes ------------------------------------------------------------
    tr.alltoallv(sbuf, s_esc, [s_off[j] + s_stat[j] for j in range(p)],
                 rbuf, r_esc, [r_off[j] + r_stat[j] for j in range(p)], stream)

    # -- decode, self copy -----------------------------------------------------------------------
    err = None
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
    agree(err)
    return stats


def raw_exchange(tr, send_bytes, sends: Sequence[tuple[int, int]], recv_bytes,
                 recvs: Sequence[tuple[int, int]], stream=None) -> None:
    """The uncompressed all-to-all of the same messages (byte offsets and counts)."""
    tr.alltoallv(send_bytes, [c for _, c in sends], [o for o, _ in sends],
                 recv_bytes, [c for _, c in recvs], [o for o, _ in recvs], stream)


# --------------------------------------------------------------------------------------------
# The collectives on BF16 bit arrays (1-D uint16, engine's kind)
# --------------------------------------------------------------------------------------------

def all_gather_bf16(eng, tr, agree: Agree, send, recv, counts: Sequence[int], *,
                    compress: bool, stream=None) -> ExchangeStats:
    """recv[offsets(counts)[j]:][:counts[j]] = rank j's send, for every j."""
    me = tr.rank
    r_off = offsets(counts)
    if compress:
        sends = [(0, counts[me])] * tr.size
        return compressed_exchange(eng, tr, agree, send, sends, recv,
                                   list(zip(r_off, counts, strict=True)), shared=True, stream=stream)
    if len(set(counts)) == 1:
        tr.allgather(_bytes(send), _bytes(recv), stream)
    else:
        raw_exchange(tr, _bytes(send), [(0, 2 * counts[me])] * tr.size, _bytes(recv),
                     [(2 * o, 2 * c) for o, c in zip(r_off, counts, strict=True)], stream)
    raw = 2 * counts[me] * (tr.size - 1)
    return ExchangeStats(raw, raw)


def all_to_all_bf16(eng, tr, agree: Agree, send, recv, send_counts: Sequence[int],
                    recv_counts: Sequence[int], *, compress: bool, stream=None) -> ExchangeStats:
    """Packed all-to-all: message to j is send[offsets(send_counts)[j]:][:send_counts[j]]."""
    sends = list(zip(offsets(send_counts), send_counts, strict=True))
    recvs = list(zip(offsets(recv_counts), recv_counts, strict=True))
    if compress:
        return compressed_exchange(eng, tr, agree, send, sends, recv, recvs, stream=stream)
    raw_exchange(tr, _bytes(send), [(2 * o, 2 * c) for o, c in sends], _bytes(recv),
                 [(2 * o, 2 * c) for o, c in recvs], stream)
    raw = 2 * (sum(send_counts) - send_counts[tr.rank])
    return ExchangeStats(raw, raw)


def reduce_scatter_bf16(eng, tr, agree: Agree, send, recv, counts: Sequence[int], *,
                        compress: bool, stream=None) -> ExchangeStats:
    """recv = reduce_sum_bf16 over ranks of each rank's shard ``me`` of ``send`` (packed by counts).

    Both paths gather the p shards into a (p, counts[me]) staging array, then reduce.
    """
    p, me = tr.size, tr.rank
    m = counts[me]
    stage = eng.bits_workspace("stage", p * m)
    sends = list(zip(offsets(counts), counts, strict=True))
    recvs = [(j * m, m) for j in range(p)]
    if compress:
        stats = compressed_exchange(eng, tr, agree, send, sends, stage, recvs, stream=stream)
    else:
        raw_exchange(tr, _bytes(send), [(2 * o, 2 * c) for o, c in sends], _bytes(stage),
                     [(2 * o, 2 * c) for o, c in recvs], stream)
        raw = 2 * (sum(counts) - m)
        stats = ExchangeStats(raw, raw)
    eng.reduce_sum(stage.reshape(p, m), recv)
    return stats


def all_reduce_bf16(eng, tr, agree: Agree, buf, *, compress: bool, stream=None) -> ExchangeStats:
    """In place: reduce-scatter of near-equal shards, then all-gather of the reduced shards."""
    counts = split_counts(buf.size, tr.size)
    shard = eng.bits_workspace("shard", counts[tr.rank])
    stats = reduce_scatter_bf16(eng, tr, agree, buf, shard, counts, compress=compress, stream=stream)
    stats.add(all_gather_bf16(eng, tr, agree, shard, buf, counts, compress=compress, stream=stream))
    return stats


def _bytes(a):
    """A uint8 view of a 1-D array of either kind."""
    return a.view(np.uint8) if isinstance(a, np.ndarray) else a.view("uint8")
