"""The CPU codec: the reference codec's frames, written by Numba loops, for host buffers.

``encode``, ``decode`` and ``payload_checksum`` have the signatures and the semantics of
``codec/reference.py``, which stays the specification: the frames are byte-identical (RAW
fallback, zero padding, payload checksum included) and the decoder accepts and rejects
exactly the frames the reference does, with the same messages, in the same order. Header,
layout and validation stay in Python (``zipccl.format``); the bulk loops are
``codec.cpu_loops``, run on the threads ``codec.cpu_threads`` gives each call. Calls from
several threads at once give the same bytes. The design: docs/CPU_CODEC.md.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from ..codebook import Codebook
from .cpu_loops import (
    SLOT,
    decode_blocks,
    encode_blocks,
    fp16_join,
    fp16_split,
    join32,
    place_escapes,
    split32,
    tail_term,
    words_sum,
    words_sum_parallel,
)
from .cpu_threads import call_threads

_PARALLEL_WORDS = 1 << 19  # sections longer than this (2 MiB) are summed in parallel
_HDR = fmt.HEADER_SIZE

assert fmt.HEADER_SIZE % 4 == 0 and fmt.ALIGN % 4 == 0


def _words(frame: np.ndarray, start: int, stop: int) -> np.ndarray:
    """frame[start:stop] (a multiple of 4 bytes) as little-endian uint32 words."""
    return frame[start:stop].view("<u4")


def _section_sum(frame: np.ndarray, start: int, stop: int) -> int:
    """Checksum terms of frame bytes [start, stop); start is word-aligned in the payload.

    Bytes past the last whole word are the frame's last bytes (zero-padded).
    """
    if stop <= start:
        return 0
    split = start + (stop - start) // 4 * 4
    words, base = _words(frame, start, split), (start - _HDR) // 4
    # A parallel region costs more than it saves on short sections.
    total = int(words_sum_parallel(words, base) if words.size > _PARALLEL_WORDS
                else words_sum(words, base))
    if split < stop:
        total += int(tail_term(frame[split:stop], base + words.size))
    return total


def payload_checksum(frame: np.ndarray, frame_len: int) -> int:
    """``format.payload_checksum``, computed in parallel (the same value).

    >>> import numpy as np
    >>> from zipccl import format as fmt
    >>> buf = np.arange(300, dtype=np.uint16).view(np.uint8)
    >>> payload_checksum(buf, 555) == fmt.payload_checksum(buf, 555)
    True
    """
    buf = np.ascontiguousarray(np.asarray(frame).reshape(-1).view(np.uint8))
    with call_threads(frame_len // 2):
        return _section_sum(buf, _HDR, frame_len) & 0xFFFFFFFFFFFFFFFF


def _static_rest_sum(frame: np.ndarray, lay: fmt.Layout) -> int:
    """Checksum terms of the static part that no block covers: the last partial sm
    word and the padding after the sm plane, each code plane's padding words, FP16's
    raw bit planes, the counts and their padding, FP32's low halves and their padding."""
    total = _section_sum(frame, _HDR + lay.n // 4 * 4, lay.planes_offset)
    for k in range(3):
        total += _section_sum(frame, lay.plane_offset(k) + 4 * lay.plane_words,
                              lay.plane_offset(k) + lay.plane_stride)
    total += _section_sum(frame, lay.plane_offset(3), lay.counts_offset)
    return total + _section_sum(frame, lay.counts_offset, lay.escapes_offset)


def _sm_words(frame: np.ndarray, n: int) -> np.ndarray:
    return _words(frame, _HDR, _HDR + n // 4 * 4)


def _planes(frame: np.ndarray, lay: fmt.Layout) -> np.ndarray:
    return _words(frame, lay.planes_offset, lay.planes_offset + 3 * lay.plane_stride)


def _as_frame_bytes(frame) -> np.ndarray:
    # Exactly the reference's view of its argument.
    return np.frombuffer(frame, dtype=np.uint8) if not isinstance(frame, np.ndarray) \
        else frame.reshape(-1).view(np.uint8)


def encode(bits: np.ndarray, codebook: Codebook, shape: tuple[int, ...] | None = None,
           checksum: bool = True, dtype=None) -> np.ndarray:
    """Compress bit patterns into one frame: the reference's bytes, faster.

    ``bits`` and ``dtype`` as in ``reference.encode``: uint16 BF16 (default) or FP16
    (``dtype="float16"``) patterns, uint32 FP32 patterns.

    >>> import numpy as np
    >>> from zipccl.codec import reference
    >>> bits = np.arange(0, 65536, 7, dtype=np.uint16)
    >>> cb = Codebook.from_sigma(0.02)
    >>> bool(np.array_equal(encode(bits, cb), reference.encode(bits, cb)))
    True
    """
    from .reference import element_dtype

    code = element_dtype(bits, dtype)
    fmt.check_codebook(codebook.exponents, code)
    bits = np.ascontiguousarray(bits).reshape(-1)
    bits = bits.view(np.uint32 if code == fmt.DTYPE_FP32 else np.uint16)
    shape = (bits.size,) if shape is None else tuple(int(d) for d in shape)
    with call_threads(bits.size):
        return _encode(bits, codebook, shape, checksum, code)


def _encode(bits: np.ndarray, codebook: Codebook, shape: tuple[int, ...],
            checksum: bool, code: int = fmt.DTYPE_BF16) -> np.ndarray:
    n = bits.size
    lay = fmt.Layout.for_count(n, code)
    cb = codebook.as_array()

    # Sized for the longest compressed frame, trimmed once the escapes are counted;
    # pages of the tail that are never written are never touched.
    frame = np.empty(lay.compressed_len(n), dtype=np.uint8)
    coded = bits  # the 16-bit patterns the BF16 block loops code
    if code == fmt.DTYPE_FP32:
        coded = np.empty(n, dtype=np.uint16)
        split32(bits, coded, frame[lay.lo_offset:lay.lo_offset + 2 * n].view(np.uint16))
    elif code == fmt.DTYPE_FP16:
        coded = np.empty(n, dtype=np.uint16)
        fp16_split(bits, coded, _words(frame, lay.plane_offset(3), lay.counts_offset),
                   lay.plane_stride // 4)
    counts = np.empty(lay.n_blocks, dtype=np.int64)
    partial = np.empty(lay.n_blocks, dtype=np.uint64)
    scratch = np.empty(lay.n_blocks * SLOT, dtype=np.uint8)
    encode_blocks(coded, cb, frame[lay.sm_offset:lay.sm_offset + n], _sm_words(frame, n),
                  _planes(frame, lay), lay.plane_stride // 4,
                  (lay.planes_offset - _HDR) // 4, scratch, counts, partial)
    n_esc = int(counts.sum())

    if lay.is_raw(n_esc):
        frame = np.empty(lay.raw_size, dtype=np.uint8)
        frame[_HDR:] = bits.view(np.uint8)
        flags, n_esc = fmt.FLAG_RAW, 0
        total = payload_checksum(frame, frame.size) if checksum else 0
    else:
        # Zero every padding byte of the static part, then the counts.
        frame[_HDR + n:lay.planes_offset] = 0
        for k in range(lay.n_planes):
            frame[lay.plane_offset(k) + 4 * lay.plane_words:
                  lay.plane_offset(k) + lay.plane_stride] = 0
        frame[lay.counts_offset:lay.lo_offset] = 0
        frame[lay.lo_offset + lay.lo_size:lay.escapes_offset] = 0
        _words(frame, lay.counts_offset, lay.counts_offset + 4 * lay.n_blocks)[:] = counts
        start = np.zeros(lay.n_blocks, dtype=np.int64)
        np.cumsum(counts[:-1], out=start[1:])
        end = lay.compressed_len(n_esc)
        place_escapes(coded, cb, scratch, counts, start, frame[lay.escapes_offset:end])
        # Give the unused tail back (a shrinking realloc; nothing else refers to this
        # buffer yet).
        frame.resize(end, refcheck=False)
        flags = 0
        total = 0
        if checksum:
            total = (int(partial.sum(dtype=np.uint64)) + _static_rest_sum(frame, lay)
                     + _section_sum(frame, lay.escapes_offset, end)) & 0xFFFFFFFFFFFFFFFF

    if checksum:
        flags |= fmt.FLAG_CHECKSUM
    header = fmt.Header(n=n, n_escapes=n_esc, frame_len=frame.size, flags=flags,
                        codebook=codebook.exponents, shape=shape, checksum=total, dtype=code)
    frame[:_HDR] = fmt.pack_header(header)
    return frame


def decode(frame) -> tuple[np.ndarray, fmt.Header]:
    """Decompress a frame into (bit patterns of its shape, header): uint16 for BF16 and
    FP16 frames, uint32 for FP32 frames.

    Accepts and rejects exactly what ``reference.decode`` does, with the same
    ValueError messages, in the same order: bad header or length (``parse_header``),
    payload checksum mismatch, a block whose escape count disagrees with its codes,
    counts that do not add up to the header's total, an FP16 escape above 31.
    """
    buf = _as_frame_bytes(frame)
    h = fmt.parse_header(buf)
    with call_threads(h.n):
        return _decode(buf, h)


def _decode(buf: np.ndarray, h: fmt.Header) -> tuple[np.ndarray, fmt.Header]:
    # Always a read-only view: one compiled specialization serves writable arrays,
    # bytes and other read-only buffers alike (each one costs seconds of compilation).
    buf = np.ascontiguousarray(buf).view()
    buf.flags.writeable = False
    n = h.n
    lay = fmt.Layout.for_count(n, h.dtype)
    if h.raw:
        if h.has_checksum and payload_checksum(buf, h.frame_len) != h.checksum:
            raise ValueError("corrupted zipccl frame: payload checksum mismatch")
        if h.dtype == fmt.DTYPE_FP32:
            bits = buf[_HDR:_HDR + 4 * n].view("<u4").astype(np.uint32)
        else:
            bits = buf[_HDR:_HDR + 2 * n].view("<u2").astype(np.uint16)
        return bits.reshape(h.shape), h

    table = np.zeros(8, dtype=np.uint8)
    table[1:] = h.codebook
    out = np.empty(n, dtype=np.uint16)
    counts = _words(buf, lay.counts_offset, lay.counts_offset + 4 * lay.n_blocks)
    seen = np.empty(lay.n_blocks, dtype=np.int64)
    partial = np.empty(lay.n_blocks, dtype=np.uint64)
    decode_blocks(buf[lay.sm_offset:lay.sm_offset + n], _sm_words(buf, n), _planes(buf, lay),
                  lay.plane_stride // 4, (lay.planes_offset - _HDR) // 4, counts, table,
                  buf[lay.escapes_offset:h.frame_len], out, h.has_checksum, seen, partial)
    if h.has_checksum:
        total = (int(partial.sum(dtype=np.uint64)) + _static_rest_sum(buf, lay)
                 + _section_sum(buf, lay.escapes_offset, h.frame_len)) & 0xFFFFFFFFFFFFFFFF
        if total != h.checksum:
            raise ValueError("corrupted zipccl frame: payload checksum mismatch")
    fmt.check_escape_counts(seen, counts, h.n_escapes)
    if h.dtype == fmt.DTYPE_FP32:
        full = np.empty(n, dtype=np.uint32)
        join32(full, out, buf[lay.lo_offset:lay.lo_offset + 2 * n].view(np.uint16))
        out = full
    elif h.dtype == fmt.DTYPE_FP16:
        fmt.check_escape_values(buf[lay.escapes_offset:h.frame_len], h.dtype)
        fp16 = np.empty(n, dtype=np.uint16)
        fp16_join(fp16, out, _words(buf, lay.plane_offset(3), lay.counts_offset),
                  lay.plane_stride // 4)
        out = fp16
    return out.reshape(h.shape), h
