"""The CPU fast path: the reference codec's bytes, written by Numba ``@njit`` loops.

Host buffers (CPU clusters, host-staged MPI) are coded here. ``encode`` and
``decode`` have the signatures and the semantics of ``codec/reference.py``,
which stays the specification: the frames are byte-identical (RAW fallback,
zero padding, payload checksum included) and the decoder accepts and rejects
exactly the frames the reference accepts and rejects.

Work is cut along the format's escape blocks (``format.BLOCK`` elements), which
start on a plane-word boundary, so every block writes its own disjoint slice of
the sign-mantissa plane, of the three code planes and of the counts, and the
blocks run in parallel (``prange``). Escape bytes need the exclusive prefix sum
of the block counts: the encoder first writes each block's escapes at the start
of a block-sized scratch slot inside the (over-allocated) frame, then slides
them down to their final place in block order; the decoder reads them through
the prefix sum of the stored counts, guarded so that a corrupt frame can never
make it read outside the escape section.

The Python side (header, layout, validation order) is shared with the
reference; only the bulk loops are compiled. ``cache=True`` keeps the
compilation (a few seconds) to the first call on a machine.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import format as fmt
from ..codebook import Codebook

_BLOCK = fmt.BLOCK
_WORDS_PER_BLOCK = fmt.BLOCK // 32
_CHUNK_WORDS = 1 << 16  # checksum words per parallel chunk
# SWAR: (8 bytes, each 0 or 1) * _GATHER >> 56 packs byte i into bit i. Every partial
# product lands on its own bit position, so nothing carries into the top byte.
_GATHER = np.uint64(0x0102040810204080)
_ONES = np.uint64(0x0101010101010101)

assert fmt.BLOCK % 32 == 0
assert np.little_endian, "the CPU codec reads and writes little-endian words directly"


@njit(cache=True, parallel=True, nogil=True)
def _checksum(words, tail):  # pragma: no cover - compiled
    """``format.payload_checksum`` of the payload ``words`` + ``tail``: sum w_i (2i + 1) mod 2**64.

    Chunks of _CHUNK_WORDS words are summed in parallel with a chunk-local weight
    2j + 1 (which, with a 32-bit word, gives products well inside 64 bits), then
    shifted to the global weight: sum_j w_j (2(base + j) + 1) = local + 2 base sum_j w_j.
    All arithmetic is uint64, so it wraps exactly as the reference's does.
    """
    nwords = words.size
    nchunks = (nwords + _CHUNK_WORDS - 1) // _CHUNK_WORDS
    partial = np.zeros(nchunks, dtype=np.uint64)
    for c in prange(nchunks):
        lo = c * _CHUNK_WORDS
        hi = min(lo + _CHUNK_WORDS, nwords)
        local = np.uint64(0)
        plain = np.uint64(0)
        for j in range(hi - lo):
            w = np.uint64(words[lo + j])
            local += w * np.uint64(2 * j + 1)
            plain += w
        partial[c] = local + np.uint64(2) * np.uint64(lo) * plain
    total = np.uint64(0)
    for c in range(nchunks):
        total += partial[c]
    if tail.size:
        # The last, partial word, zero-padded (little-endian).
        w = np.uint64(0)
        for k in range(tail.size):
            w |= np.uint64(tail[k]) << np.uint64(8 * k)
        total += w * np.uint64(2 * nwords + 1)
    return total


@njit(cache=True, parallel=True, nogil=True)
def _encode_blocks(bits, lut, frame, planes, cwords, sm_off, planes_off, plane_stride,
                   plane_words, counts_end, esc_off):  # pragma: no cover - compiled
    """Write sm plane, code planes, counts and each block's escapes into its scratch slot.

    Block b's escapes go to frame[esc_off + b*BLOCK : ...], in element order. Also
    zeroes every padding byte of the static part. Returns the per-block counts.
    """
    n = bits.size
    n_blocks = (n + _BLOCK - 1) // _BLOCK
    counts = np.zeros(n_blocks, dtype=np.int64)
    stride_words = plane_stride // 4
    for b in prange(n_blocks):
        lo = b * _BLOCK
        hi = min(lo + _BLOCK, n)
        m = hi - lo
        # Sign-mantissa bytes: a straight, vectorizable loop.
        for i in range(m):
            v = bits[lo + i]
            frame[sm_off + lo + i] = np.uint8(((v >> 8) & 0x80) | (v & 0x7F))
        # Codes of the block, padded with zeros (code 0 = "no value") to whole words.
        codes = np.zeros(_BLOCK, dtype=np.uint8)
        for i in range(m):
            codes[i] = lut[(bits[lo + i] >> 7) & 0xFF]
        nw = (m + 31) // 32
        c64 = codes.view(np.uint64)
        w0 = lo // 32
        for w in range(nw):
            p0 = np.uint32(0)
            p1 = np.uint32(0)
            p2 = np.uint32(0)
            for q in range(4):
                x = c64[4 * w + q]
                sh = np.uint32(8 * q)
                p0 |= np.uint32(((x & _ONES) * _GATHER) >> np.uint64(56)) << sh
                p1 |= np.uint32((((x >> np.uint64(1)) & _ONES) * _GATHER) >> np.uint64(56)) << sh
                p2 |= np.uint32((((x >> np.uint64(2)) & _ONES) * _GATHER) >> np.uint64(56)) << sh
            planes[w0 + w] = p0
            planes[stride_words + w0 + w] = p1
            planes[2 * stride_words + w0 + w] = p2
        # Escapes: the exponent byte of every code-0 element, in order.
        e = 0
        slot = esc_off + lo
        for i in range(m):
            if codes[i] == 0:
                frame[slot + e] = np.uint8((bits[lo + i] >> 7) & 0xFF)
                e += 1
        counts[b] = e
        cwords[b] = np.uint32(e)
    # Zero padding of the static part (the only bytes no block writes).
    for i in range(sm_off + n, planes_off):
        frame[i] = 0
    for k in range(3):
        for i in range(planes_off + k * plane_stride + 4 * plane_words,
                       planes_off + (k + 1) * plane_stride):
            frame[i] = 0
    for i in range(counts_end, esc_off):
        frame[i] = 0
    return counts


@njit(cache=True, nogil=True)
def _compact_escapes(frame, esc_off, counts):  # pragma: no cover - compiled
    """Slide each block's escapes from its scratch slot to its final place.

    Block b moves down from esc_off + b*BLOCK to esc_off + (escapes of blocks < b).
    The destination never lies after the source, so one forward pass in block
    order never overwrites bytes it has still to move. Returns the total.
    """
    dst = esc_off
    for b in range(counts.size):
        src = esc_off + b * _BLOCK
        c = counts[b]
        if dst != src:
            for i in range(c):
                frame[dst + i] = frame[src + i]
        dst += c
    return dst - esc_off


@njit(cache=True, parallel=True, nogil=True)
def _decode_blocks(frame, planes, stored, n, table, sm_off, plane_stride, esc_off,
                   n_esc, out):  # pragma: no cover - compiled
    """Rebuild the bit patterns of every block; return the escape codes seen per block.

    Block b reads its escapes from esc_off + (sum of the stored counts before b),
    and only while it is inside both its own stored count and the header's total:
    a corrupt frame yields garbage values (which the caller discards after the
    count check fails) but never an out-of-bounds read.
    """
    n_blocks = (n + _BLOCK - 1) // _BLOCK
    stride_words = plane_stride // 4
    start = np.zeros(n_blocks, dtype=np.int64)
    acc = np.int64(0)
    for b in range(n_blocks):
        start[b] = acc
        acc += np.int64(stored[b])
    seen = np.zeros(n_blocks, dtype=np.int64)
    for b in prange(n_blocks):
        lo = b * _BLOCK
        hi = min(lo + _BLOCK, n)
        m = hi - lo
        nw = (m + 31) // 32
        w0 = lo // 32
        codes = np.zeros(_BLOCK, dtype=np.uint8)
        for w in range(nw):
            p0 = planes[w0 + w]
            p1 = planes[stride_words + w0 + w]
            p2 = planes[2 * stride_words + w0 + w]
            for j in range(32):
                codes[32 * w + j] = np.uint8(((p0 >> j) & 1) | (((p1 >> j) & 1) << 1)
                                             | (((p2 >> j) & 1) << 2))
        limit = min(np.int64(stored[b]), n_esc - start[b])
        e = 0
        for i in range(m):
            sm = np.uint16(frame[sm_off + lo + i])
            c = codes[i]
            if c == 0:
                ex = np.uint16(0)
                if e < limit:
                    ex = np.uint16(frame[esc_off + start[b] + e])
                e += 1
            else:
                ex = np.uint16(table[c])
            out[lo + i] = ((sm & 0x80) << 8) | (ex << 7) | (sm & 0x7F)
        seen[b] = e
    return seen


# The uint32 views are made here, in NumPy, and passed in: a ``.view`` taken inside a
# ``parallel=True`` function is not known to alias its base, and Numba 0.68 drops
# stores made through it (they never reach the frame).
def _plane_words(frame: np.ndarray, lay: fmt.Layout) -> np.ndarray:
    """The three code planes (with their padding words) as little-endian uint32."""
    return frame[lay.planes_offset:lay.planes_offset + 3 * lay.plane_stride].view("<u4")


def _count_words(frame: np.ndarray, lay: fmt.Layout) -> np.ndarray:
    """The per-block escape counts as little-endian uint32."""
    return frame[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].view("<u4")


def _as_frame_bytes(frame) -> np.ndarray:
    # Exactly the reference's view of its argument.
    return np.frombuffer(frame, dtype=np.uint8) if not isinstance(frame, np.ndarray) \
        else frame.reshape(-1).view(np.uint8)


def payload_checksum(frame: np.ndarray, frame_len: int) -> int:
    """``format.payload_checksum`` computed in parallel (same value)."""
    buf = np.ascontiguousarray(np.asarray(frame, dtype=np.uint8).reshape(-1))
    if frame_len <= fmt.HEADER_SIZE:
        return 0
    nwords = (frame_len - fmt.HEADER_SIZE) // 4
    split = fmt.HEADER_SIZE + 4 * nwords
    return int(_checksum(buf[fmt.HEADER_SIZE:split].view("<u4"), buf[split:frame_len]))


def encode(bits: np.ndarray, codebook: Codebook, shape: tuple[int, ...] | None = None,
           checksum: bool = True) -> np.ndarray:
    """Compress uint16 BF16 bit patterns into one frame (same bytes as the reference).

    >>> import numpy as np
    >>> from zipccl.codec import reference
    >>> bits = np.arange(0, 65536, 7, dtype=np.uint16)
    >>> cb = Codebook.from_sigma(0.02)
    >>> bool(np.array_equal(encode(bits, cb), reference.encode(bits, cb)))
    True
    """
    bits = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1)
    n = bits.size
    shape = (n,) if shape is None else tuple(int(d) for d in shape)
    lay = fmt.Layout.for_count(n)

    # Sized for the worst compressed case (every element escapes); block b's scratch
    # slot for escapes is [escapes_offset + b*BLOCK, +BLOCK). Trimmed below.
    frame = np.empty(lay.escapes_offset + n, dtype=np.uint8)
    counts = _encode_blocks(bits, codebook.lut(), frame, _plane_words(frame, lay),
                            _count_words(frame, lay), lay.sm_offset, lay.planes_offset,
                            lay.plane_stride, lay.plane_words,
                            lay.counts_offset + 4 * lay.n_blocks, lay.escapes_offset)
    n_esc = int(counts.sum())

    if lay.is_raw(n_esc):
        frame = np.empty(lay.raw_size, dtype=np.uint8)
        frame[fmt.HEADER_SIZE:] = bits.astype("<u2", copy=False).view(np.uint8)
        flags, n_esc = fmt.FLAG_RAW, 0
    else:
        _compact_escapes(frame, lay.escapes_offset, counts)
        # Give the unused scratch tail back (shrinking realloc; nothing else refers
        # to this buffer yet).
        frame.resize(lay.compressed_len(n_esc), refcheck=False)
        flags = 0

    if checksum:
        flags |= fmt.FLAG_CHECKSUM
    header = fmt.Header(n=n, n_escapes=n_esc, frame_len=frame.size, flags=flags,
                        codebook=codebook.exponents, shape=shape,
                        checksum=payload_checksum(frame, frame.size) if checksum else 0)
    frame[:fmt.HEADER_SIZE] = fmt.pack_header(header)
    return frame


def decode(frame) -> tuple[np.ndarray, fmt.Header]:
    """Decompress a frame into (uint16 bit patterns of its shape, header).

    Accepts and rejects exactly what ``reference.decode`` does, with the same
    ValueError messages: bad header, wrong length, escape counts that disagree
    with the code planes, or a payload checksum mismatch.
    """
    buf = _as_frame_bytes(frame)
    h = fmt.parse_header(buf)
    buf = np.ascontiguousarray(buf)
    if h.has_checksum and payload_checksum(buf, h.frame_len) != h.checksum:
        raise ValueError("corrupted zipccl frame: payload checksum mismatch")
    n = h.n
    lay = fmt.Layout.for_count(n)
    if h.raw:
        bits = buf[fmt.HEADER_SIZE:fmt.HEADER_SIZE + 2 * n].view("<u2").astype(np.uint16)
        return bits.reshape(h.shape), h

    table = np.zeros(8, dtype=np.uint8)
    table[1:] = h.codebook
    out = np.empty(n, dtype=np.uint16)
    counts = _count_words(buf, lay)
    seen = _decode_blocks(buf, _plane_words(buf, lay), counts, n, table, lay.sm_offset,
                          lay.plane_stride, lay.escapes_offset, h.n_escapes, out)
    if not np.array_equal(seen, counts.astype(np.int64)):
        bad = int(np.flatnonzero(seen != counts)[0])
        raise ValueError(f"corrupted zipccl frame: block {bad} has {int(seen[bad])} escape "
                         f"codes but its count says {int(counts[bad])}")
    if int(seen.sum()) != h.n_escapes:
        raise ValueError("corrupted zipccl frame: escape counts do not add up to the header's")
    return out.reshape(h.shape), h
