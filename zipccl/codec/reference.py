"""The reference codec: pure NumPy, slow and obvious. It is the specification.

Every fast path (``codec/cpu.py``, ``codec/gpu.py``) must write exactly the bytes ``encode``
writes and accept exactly the frames ``decode`` accepts. The steps follow the paper's exponent
coding: split each BF16 value into a sign-mantissa byte and an exponent byte; code each exponent
as 1 + its codebook index, or 0 (escape); store the 3-bit codes as three bit planes; store per
block the escape count, then the escaped exponents in element order; if that is longer than
the raw data, store the raw data. FP32 and FP16 reuse every step (docs/FORMAT.md, "FP32 and
FP16").
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


FP16_RAW_BITS = (8, 9, 15)  # the FP16 bits stored in bit planes 3, 4, 5


def element_dtype(bits: np.ndarray, dtype=None) -> int:
    """The frame's element-type code for ``bits``: ``dtype`` when given (a code or a name),
    else FP32 for 32-bit patterns and BF16 for 16-bit ones. Checks that they agree."""
    code = fmt.dtype_code(dtype) if dtype is not None else \
        (fmt.DTYPE_FP32 if np.asarray(bits).dtype.itemsize == 4 else fmt.DTYPE_BF16)
    if np.asarray(bits).dtype.itemsize != fmt.ITEMSIZE[code]:
        raise TypeError(f"{fmt.DTYPE_NAMES[code]} bit patterns are {8 * fmt.ITEMSIZE[code]}-bit "
                        f"integers, got {np.asarray(bits).dtype}")
    return code


def split_any(bits: np.ndarray, dtype: int) -> tuple[np.ndarray, np.ndarray, list, np.ndarray]:
    """(byte plane, exponents, raw bit planes as 0/1 arrays, low halves) of any element type.

    BF16: ``split``; FP32: ``split`` of the upper halves, and the lower halves (uint16);
    FP16: the low bytes, the 5-bit exponents and bits 8, 9, 15 (``FP16_RAW_BITS``).
    """
    if dtype == fmt.DTYPE_FP16:
        lows = (bits & 0xFF).astype(np.uint8)
        exp = ((bits >> 10) & 0x1F).astype(np.uint8)
        extra = [((bits >> b) & 1).astype(np.uint8) for b in FP16_RAW_BITS]
        return lows, exp, extra, np.zeros(0, np.uint16)
    if dtype == fmt.DTYPE_FP32:
        sm, exp = split((bits >> 16).astype(np.uint16))
        return sm, exp, [], (bits & 0xFFFF).astype(np.uint16)
    sm, exp = split(bits)
    return sm, exp, [], np.zeros(0, np.uint16)


def join_any(byte: np.ndarray, exp: np.ndarray, extra: list, lo: np.ndarray,
             dtype: int) -> np.ndarray:
    """Inverse of ``split_any``."""
    if dtype == fmt.DTYPE_FP16:
        out = byte.astype(np.uint16) | (exp.astype(np.uint16) << 10)
        for b, plane in zip(FP16_RAW_BITS, extra, strict=True):
            out |= plane.astype(np.uint16) << b
        return out
    hi = join(byte, exp)
    if dtype == fmt.DTYPE_FP32:
        return (hi.astype(np.uint32) << 16) | lo.astype(np.uint32)
    return hi


def encode(bits: np.ndarray, codebook: Codebook, shape: tuple[int, ...] | None = None,
           checksum: bool = True, dtype=None) -> np.ndarray:
    """Compress bit patterns into one frame (a uint8 array).

    ``bits``: uint16 BF16 (the default) or FP16 (``dtype="float16"``) patterns, or
    uint32 FP32 patterns. ``shape`` is recorded in the header (default: 1-D of
    ``bits.size``). A codebook of an FP16 frame holds exponents 0..31.
    """
    code = element_dtype(bits, dtype)
    bits = np.ascontiguousarray(bits).reshape(-1)
    bits = bits.view(np.uint32 if code == fmt.DTYPE_FP32 else np.uint16)
    fmt.check_codebook(codebook.exponents, code)
    n = bits.size
    shape = (n,) if shape is None else tuple(int(d) for d in shape)
    lay = fmt.Layout.for_count(n, code)

    sm, exp, extra, lo = split_any(bits, code)
    codes = codebook.lut()[exp]
    escaped = codes == 0
    n_esc = int(np.count_nonzero(escaped))

    if lay.is_raw(n_esc):
        frame = np.zeros(lay.raw_size, dtype=np.uint8)
        frame[fmt.HEADER_SIZE:] = bits.astype(bits.dtype.newbyteorder("<")).view(np.uint8)
        flags, n_esc = fmt.FLAG_RAW, 0
    else:
        frame = np.zeros(lay.compressed_len(n_esc), dtype=np.uint8)
        frame[lay.sm_offset:lay.sm_offset + n] = sm
        planes = [(codes >> k) & 1 for k in range(3)] + extra
        for k, bitvals in enumerate(planes):
            plane = pack_plane(bitvals, lay.plane_words)
            off = lay.plane_offset(k)
            frame[off:off + 4 * lay.plane_words] = plane.view(np.uint8)
        frame[lay.lo_offset:lay.lo_offset + lay.lo_size] = lo.astype("<u2").view(np.uint8)
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
                        checksum=fmt.payload_checksum(frame, frame.size) if checksum else 0,
                        dtype=code)
    frame[:fmt.HEADER_SIZE] = fmt.pack_header(header)
    return frame


def decode(frame) -> tuple[np.ndarray, fmt.Header]:
    """Decompress a frame into (bit patterns of its shape, header).

    The bit patterns are uint16 for BF16 and FP16 frames, uint32 for FP32 frames
    (``header.dtype`` says which). Raises ValueError for anything that is not a
    valid, complete frame: bad header, wrong length, a payload checksum mismatch,
    escape counts that disagree with the code planes, or (FP16) an escape byte
    that is no 5-bit exponent, checked in that order.
    """
    buf = np.frombuffer(frame, dtype=np.uint8) if not isinstance(frame, np.ndarray) \
        else frame.reshape(-1).view(np.uint8)
    h = fmt.parse_header(buf)
    if h.has_checksum and fmt.payload_checksum(buf, h.frame_len) != h.checksum:
        raise ValueError("corrupted zipccl frame: payload checksum mismatch")
    n = h.n
    lay = fmt.Layout.for_count(n, h.dtype)
    if h.raw:
        item = fmt.ITEMSIZE[h.dtype]
        le, native = ("<u4", np.uint32) if item == 4 else ("<u2", np.uint16)
        bits = buf[fmt.HEADER_SIZE:fmt.HEADER_SIZE + item * n].copy().view(le).astype(native)
        return bits.reshape(h.shape), h

    sm = buf[lay.sm_offset:lay.sm_offset + n]
    planes = []
    for k in range(lay.n_planes):
        off = lay.plane_offset(k)
        words = buf[off:off + 4 * lay.plane_words].copy().view("<u4")
        planes.append(unpack_plane(words, n))
    codes = planes[0] | (planes[1] << 1) | (planes[2] << 2) if n else np.zeros(0, np.uint8)
    counts = buf[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].copy().view("<u4")
    escaped = codes == 0
    seen = np.add.reduceat(escaped.astype(np.int64), np.arange(0, n, fmt.BLOCK)) \
        if n else np.zeros(0, np.int64)
    fmt.check_escape_counts(seen, counts, h.n_escapes)
    table = np.concatenate([[0], np.array(h.codebook, dtype=np.uint8)]).astype(np.uint8)
    exp = table[codes]
    escapes = buf[lay.escapes_offset:lay.escapes_offset + h.n_escapes]
    fmt.check_escape_values(escapes, h.dtype)
    exp[escaped] = escapes
    lo = buf[lay.lo_offset:lay.lo_offset + lay.lo_size].copy().view("<u2")
    return join_any(sm, exp, planes[3:], lo, h.dtype).reshape(h.shape), h
