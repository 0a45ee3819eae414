"""The reference codec: pure NumPy, slow and obvious. It is the specification.

Every fast path (``codec/cpu.py``, ``codec/gpu.py``) must write exactly the bytes
``encode`` writes and accept exactly the frames ``decode`` accepts. The steps
follow the paper's exponent coding:

1. split each BF16 value into a sign-mantissa byte and an exponent byte;
2. code each exponent as 1 + its codebook index, or 0 (escape) if absent;
3. store the 3-bit codes as three 1-bit planes of uint32 words;
4. store, per block of ``format.BLOCK`` values, the number of escapes, and
   then the escaped exponent bytes in element order;
5. if that is longer than the raw data, store the raw data instead.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from ..codebook import Codebook


def split(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sign-mantissa bytes, exponent bytes) of uint16 BF16 bit patterns."""
    sm = (((bits >> 8) & 0x80) | (bits & 0x7F)).astype(np.uint8)
    exp = ((bits >> 7) & 0xFF).astype(np.uint8)
    return sm, exp


def join(sm: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """Inverse of ``split``."""
    sm16 = sm.astype(np.uint16)
    return ((sm16 & 0x80) << 8) | (exp.astype(np.uint16) << 7) | (sm16 & 0x7F)


def pack_plane(bitvals: np.ndarray, words: int) -> np.ndarray:
    """0/1 values -> uint32 words, bit j of word w = value 32w + j (zero-padded)."""
    padded = np.zeros(words * 32, dtype=np.uint8)
    padded[: bitvals.size] = bitvals
    return np.packbits(padded, bitorder="little").view("<u4")


def unpack_plane(words: np.ndarray, n: int) -> np.ndarray:
    """Inverse of ``pack_plane``: the first ``n`` bits as uint8 0/1 values."""
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n]


def encode(bits: np.ndarray, codebook: Codebook, shape: tuple[int, ...] | None = None,
           checksum: bool = True) -> np.ndarray:
    """Compress uint16 BF16 bit patterns into one frame (a uint8 array).

    ``shape`` is recorded in the header (default: 1-D of ``bits.size``).
    """
    bits = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1)
    n = bits.size
    shape = (n,) if shape is None else tuple(int(d) for d in shape)
    lay = fmt.Layout.for_count(n)

    sm, exp = split(bits)
    codes = codebook.lut()[exp]
    escaped = codes == 0
    n_esc = int(np.count_nonzero(escaped))

    if lay.is_raw(n_esc):
        frame = np.zeros(lay.raw_size, dtype=np.uint8)
        frame[fmt.HEADER_SIZE:] = bits.astype("<u2").view(np.uint8)
        flags, n_esc = fmt.FLAG_RAW, 0
    else:
        frame = np.zeros(lay.compressed_len(n_esc), dtype=np.uint8)
        frame[lay.sm_offset:lay.sm_offset + n] = sm
        for k in range(3):
            plane = pack_plane((codes >> k) & 1, lay.plane_words)
            off = lay.plane_offset(k)
            frame[off:off + 4 * lay.plane_words] = plane.view(np.uint8)
        counts = np.add.reduceat(escaped.astype(np.uint32), np.arange(0, n, fmt.BLOCK)) \
            if n else np.zeros(0, np.uint32)
        frame[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks] = \
            counts.astype("<u4").view(np.uint8)
        frame[lay.escapes_offset:] = exp[escaped]
        flags = 0

    if checksum:
        flags |= fmt.FLAG_CHECKSUM
    header = fmt.Header(n=n, n_escapes=n_esc, frame_len=frame.size, flags=flags,
                        codebook=codebook.exponents, shape=shape,
                        checksum=fmt.payload_checksum(frame, frame.size) if checksum else 0)
    frame[:fmt.HEADER_SIZE] = fmt.pack_header(header)
    return frame


def decode(frame) -> tuple[np.ndarray, fmt.Header]:
    """Decompress a frame into (uint16 bit patterns of its shape, header).

    Raises ValueError for anything that is not a valid, complete frame: bad
    header, wrong length, escape counts that disagree with the code planes, or
    a payload checksum mismatch.
    """
    buf = np.frombuffer(frame, dtype=np.uint8) if not isinstance(frame, np.ndarray) \
        else frame.reshape(-1).view(np.uint8)
    h = fmt.parse_header(buf)
    if h.has_checksum and fmt.payload_checksum(buf, h.frame_len) != h.checksum:
        raise ValueError("corrupted zipccl frame: payload checksum mismatch")
    n = h.n
    lay = fmt.Layout.for_count(n)
    if h.raw:
        bits = buf[fmt.HEADER_SIZE:fmt.HEADER_SIZE + 2 * n].copy().view("<u2").astype(np.uint16)
        return bits.reshape(h.shape), h

    sm = buf[lay.sm_offset:lay.sm_offset + n]
    codes = np.zeros(n, dtype=np.uint8)
    for k in range(3):
        off = lay.plane_offset(k)
        words = buf[off:off + 4 * lay.plane_words].copy().view("<u4")
        codes |= unpack_plane(words, n) << k
    counts = buf[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].copy().view("<u4")
    escaped = codes == 0
    seen = np.add.reduceat(escaped.astype(np.int64), np.arange(0, n, fmt.BLOCK)) \
        if n else np.zeros(0, np.int64)
    fmt.check_escape_counts(seen, counts, h.n_escapes)
    table = np.concatenate([[0], np.array(h.codebook, dtype=np.uint8)]).astype(np.uint8)
    exp = table[codes]
    exp[escaped] = buf[lay.escapes_offset:lay.escapes_offset + h.n_escapes]
    return join(sm, exp).reshape(h.shape), h
