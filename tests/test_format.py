"""The wire format: section layout, sizes, header packing and header validation.

``zipccl.format`` is the only module that knows offsets; these tests pin the
properties every codec and every collective relies on (128-byte alignment, a
static part that depends on n alone, the RAW rule, the worst-case size) and
check that ``parse_header`` rejects each kind of bad header with a clear
ValueError.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np
import pytest

from zipccl import format as fmt

COUNTS = [0, 1, 2, 31, 32, 33, 127, 128, 129, 4095, 4096, 4097, 8191, 8192, 8193,
          100_000, 1 << 20, (1 << 20) + 1]


@pytest.mark.parametrize("n", COUNTS)
def test_layout_sections_are_aligned_ordered_and_large_enough(n):
    lay = fmt.Layout.for_count(n)
    offsets = [lay.sm_offset, lay.planes_offset, lay.plane_offset(1), lay.plane_offset(2),
               lay.counts_offset, lay.escapes_offset]
    assert all(o % fmt.ALIGN == 0 for o in offsets)
    assert lay.sm_offset == fmt.HEADER_SIZE
    assert lay.planes_offset >= lay.sm_offset + n
    assert lay.planes_offset - (lay.sm_offset + n) < fmt.ALIGN  # no more padding than needed
    assert lay.plane_words == -(-n // 32)
    assert 4 * lay.plane_words <= lay.plane_stride < 4 * lay.plane_words + fmt.ALIGN
    assert lay.counts_offset == lay.plane_offset(2) + lay.plane_stride
    assert lay.n_blocks == -(-n // fmt.BLOCK)
    assert lay.counts_offset + 4 * lay.n_blocks <= lay.escapes_offset
    assert lay.escapes_offset - (lay.counts_offset + 4 * lay.n_blocks) < fmt.ALIGN
    assert lay.static_size == lay.escapes_offset == fmt.static_size(n)
    assert lay.raw_size == fmt.HEADER_SIZE + 2 * n == fmt.max_compressed_size(n)


@pytest.mark.parametrize("n", COUNTS)
def test_raw_rule_and_frame_length(n):
    lay = fmt.Layout.for_count(n)
    for e in sorted({0, n // 50, n // 2, n}):
        assert lay.compressed_len(e) == lay.static_size + e
        assert lay.is_raw(e) == (lay.compressed_len(e) > lay.raw_size)
        assert lay.frame_len(e) == min(lay.compressed_len(e), lay.raw_size)
        assert lay.frame_len(e) <= fmt.max_compressed_size(n)


def test_raw_threshold_is_exact():
    lay = fmt.Layout.for_count(4096)
    tie = lay.raw_size - lay.static_size  # escapes at which both forms are equally long
    assert tie == 2432
    assert not lay.is_raw(tie) and lay.frame_len(tie) == lay.raw_size
    assert lay.is_raw(tie + 1)


def test_sizes_grow_with_n_and_static_part_depends_on_n_only():
    sizes = [fmt.static_size(n) for n in range(0, 20000, 97)]
    assert sizes == sorted(sizes)
    assert fmt.static_size(12345) == fmt.Layout.for_count(12345).static_size
    # Gaussian-like data (few escapes) compresses: the static part is ~11/16 of raw.
    n = 1 << 20
    assert fmt.static_size(n) / fmt.max_compressed_size(n) < 0.69


def test_layout_rejects_negative_counts():
    with pytest.raises(ValueError, match=">= 0"):
        fmt.Layout.for_count(-1)


def test_plane_offset_steps_by_the_stride():
    lay = fmt.Layout.for_count(1000)
    assert [lay.plane_offset(k) for k in range(3)] == \
        [lay.planes_offset + k * lay.plane_stride for k in range(3)]


# ---------------------------------------------------------------- header


def _header(**kw) -> fmt.Header:
    base = dict(n=4096, n_escapes=3, frame_len=fmt.Layout.for_count(4096).compressed_len(3),
                flags=fmt.FLAG_CHECKSUM, codebook=(116, 117, 118, 119, 120, 121, 122),
                shape=(64, 64), checksum=12345)
    base.update(kw)
    return fmt.Header(**base)


def _frame_for(h: fmt.Header, extra: int = 0) -> np.ndarray:
    buf = np.zeros(max(h.frame_len, fmt.HEADER_SIZE) + extra, dtype=np.uint8)
    buf[:fmt.HEADER_SIZE] = fmt.pack_header(h)
    return buf


def _raw_header(**fields) -> bytes:
    """Header bytes with arbitrary field values and a valid CRC (to reach later checks)."""
    h = _header()
    values = dict(magic=fmt.MAGIC, version=fmt.VERSION, dtype=fmt.DTYPE_BF16, flags=h.flags,
                  n=h.n, n_escapes=h.n_escapes, frame_len=h.frame_len, checksum=h.checksum,
                  codebook=bytes(h.codebook), ndim=2, block=fmt.BLOCK, reserved=0,
                  shape=(64, 64, 0, 0, 0, 0, 0, 0), reserved2=0)
    values.update(fields)
    body = struct.pack("<4sBBHQQQQ7sBII8QI", values["magic"], values["version"], values["dtype"],
                       values["flags"], values["n"], values["n_escapes"], values["frame_len"],
                       values["checksum"], values["codebook"], values["ndim"], values["block"],
                       values["reserved"], *values["shape"], values["reserved2"])
    return body + struct.pack("<I", zlib.crc32(body))


def _buffer(header: bytes, frame_len: int) -> np.ndarray:
    buf = np.zeros(max(frame_len, fmt.HEADER_SIZE), dtype=np.uint8)
    buf[:fmt.HEADER_SIZE] = np.frombuffer(header, dtype=np.uint8)
    return buf


def test_header_is_128_bytes_and_round_trips():
    h = _header()
    packed = h.pack()
    assert len(packed) == fmt.HEADER_SIZE
    assert packed[:4] == fmt.MAGIC
    assert fmt.parse_header(_frame_for(h)) == h
    # The helper that crafts headers writes exactly what Header.pack writes.
    assert _raw_header() == packed


@pytest.mark.parametrize("shape", [(), (7,), (0,), (2, 0, 3), (1,) * fmt.MAX_NDIM])
def test_header_shapes_round_trip(shape):
    n = int(np.prod(shape))
    lay = fmt.Layout.for_count(n)
    # Small tensors only ever travel as RAW frames (the static part alone is longer).
    flags = fmt.FLAG_RAW if lay.is_raw(0) else 0
    h = _header(n=n, n_escapes=0, frame_len=lay.frame_len(0), shape=shape, flags=flags,
                checksum=0)
    assert fmt.parse_header(_frame_for(h)).shape == shape


def test_header_accepts_bytes_bytearray_and_longer_buffers():
    h = _header()
    buf = _frame_for(h, extra=17)
    assert fmt.parse_header(bytes(buf)) == h
    assert fmt.parse_header(bytearray(buf)) == h
    assert fmt.parse_header(memoryview(buf.tobytes())) == h


def test_pack_rejects_too_many_dimensions():
    with pytest.raises(ValueError, match="at most 8 dimensions"):
        _header(n=1, shape=(1,) * 9).pack()


@pytest.mark.parametrize("fields, message", [
    (dict(magic=b"ZSTD"), "magic"),
    (dict(version=2), "version 2"),
    (dict(dtype=7), "dtype code 7"),
    (dict(flags=0x80), "unknown flag bits 0x80"),
    (dict(block=1024), "block size 1024"),
    (dict(ndim=9), "bad shape fields"),
    (dict(reserved=1), "bad shape fields"),
    (dict(reserved2=1), "bad shape fields"),
    (dict(shape=(64, 64, 3, 0, 0, 0, 0, 0)), "bad shape fields"),
    (dict(shape=(64, 65, 0, 0, 0, 0, 0, 0)), "does not hold 4096 elements"),
    (dict(ndim=0, shape=(0,) * 8), "0-d frame must hold 1 element"),
    (dict(codebook=bytes([1, 2, 3, 4, 5, 6, 6])), "repeated entries"),
    (dict(flags=fmt.FLAG_RAW), "RAW frame lists escapes"),
    (dict(n_escapes=4097), "4097 escapes for 4096 elements"),
    (dict(frame_len=999), "header says 999 bytes"),
    (dict(flags=0), "checksum present without its flag"),
])
def test_parse_header_rejections(fields, message):
    raw = _raw_header(**fields)
    with pytest.raises(ValueError, match=message):
        fmt.parse_header(_buffer(raw, 3 * 4096))


def test_parse_header_rejects_compressed_frames_longer_than_raw():
    lay = fmt.Layout.for_count(4096)
    n_esc = lay.raw_size - lay.static_size + 1
    raw = _raw_header(n=4096, n_escapes=n_esc, frame_len=lay.compressed_len(n_esc),
                      shape=(4096,) + (0,) * 7, ndim=1)
    with pytest.raises(ValueError, match="longer than RAW"):
        fmt.parse_header(_buffer(raw, lay.compressed_len(n_esc)))


@pytest.mark.parametrize("length", [0, 1, 64, 127])
def test_parse_header_rejects_short_buffers(length):
    with pytest.raises(ValueError, match=f"{length} bytes is shorter"):
        fmt.parse_header(np.zeros(length, np.uint8))


def test_parse_header_rejects_truncation_and_header_bit_flips():
    h = _header()
    buf = _frame_for(h)
    with pytest.raises(ValueError, match="truncated zipccl frame"):
        fmt.parse_header(buf[:h.frame_len - 1])
    for byte in range(fmt.HEADER_SIZE):
        for bit in (0, 5):
            bad = buf.copy()
            bad[byte] ^= 1 << bit
            with pytest.raises(ValueError, match="zipccl frame"):
                fmt.parse_header(bad)


def test_header_replace_keeps_validation():
    h = dataclasses.replace(_header(), checksum=0, flags=0)
    assert fmt.parse_header(_frame_for(h)).checksum == 0


# ---------------------------------------------------------------- checksum


def _checksum_by_definition(payload: bytes) -> int:
    padded = payload + b"\0" * (-len(payload) % 4)
    words = struct.unpack(f"<{len(padded) // 4}I", padded)
    return sum(w * (2 * i + 1) for i, w in enumerate(words)) % (1 << 64)


@pytest.mark.parametrize("length", [128, 129, 130, 131, 132, 133, 1000, 4099])
def test_payload_checksum_matches_its_definition(length):
    buf = np.random.default_rng(length).integers(0, 256, length + 50, dtype=np.uint8)
    assert fmt.payload_checksum(buf, length) == _checksum_by_definition(buf[128:length].tobytes())


def test_payload_checksum_sees_every_single_bit_flip():
    buf = np.random.default_rng(5).integers(0, 256, 128 + 77, dtype=np.uint8)
    ref = fmt.payload_checksum(buf, buf.size)
    for byte in range(128, buf.size):
        for bit in range(8):
            bad = buf.copy()
            bad[byte] ^= 1 << bit
            assert fmt.payload_checksum(bad, bad.size) != ref


# ---------------------------------------------------------------- FP32 and FP16 frames


@pytest.mark.parametrize("dtype", [fmt.DTYPE_FP32, fmt.DTYPE_FP16])
@pytest.mark.parametrize("n", COUNTS)
def test_wide_layouts_are_aligned_ordered_and_static(dtype, n):
    lay = fmt.Layout.for_count(n, dtype)
    bf = fmt.Layout.for_count(n)
    offsets = [lay.sm_offset, lay.planes_offset, *(lay.plane_offset(k) for k in range(lay.n_planes)),
               lay.counts_offset, lay.lo_offset, lay.escapes_offset]
    assert all(o % fmt.ALIGN == 0 for o in offsets) and offsets == sorted(offsets)
    assert (lay.sm_offset, lay.planes_offset, lay.plane_stride) == \
        (bf.sm_offset, bf.planes_offset, bf.plane_stride)
    assert lay.counts_offset == lay.plane_offset(lay.n_planes - 1) + lay.plane_stride
    assert lay.static_size == lay.escapes_offset == fmt.static_size(n, dtype)
    item = 4 if dtype == fmt.DTYPE_FP32 else 2
    assert lay.raw_size == fmt.HEADER_SIZE + item * n == fmt.max_compressed_size(n, dtype)
    if dtype == fmt.DTYPE_FP32:
        # the BF16 sections of the upper halves sit where a BF16 frame has them
        assert lay.counts_offset == bf.counts_offset and lay.lo_offset == bf.escapes_offset
        assert lay.lo_size == 2 * n and lay.escapes_offset == fmt.align(lay.lo_offset + 2 * n)
    else:
        assert lay.n_planes == 6 and lay.lo_size == 0 and lay.lo_offset == lay.escapes_offset
    for e in sorted({0, n // 50, n}):
        assert lay.frame_len(e) == min(lay.compressed_len(e), lay.raw_size)


def test_bf16_layout_is_unchanged_by_the_dtype_argument():
    for n in COUNTS:
        assert fmt.Layout.for_count(n) == fmt.Layout.for_count(n, "bfloat16")
        assert fmt.Layout.for_count(n).lo_offset == fmt.Layout.for_count(n).escapes_offset


@pytest.mark.parametrize("name,code", [("bfloat16", 1), ("bf16", 1), ("float32", 2), ("fp32", 2),
                                       ("float16", 3), ("half", 3), (np.float32, 2),
                                       (np.dtype(np.float16), 3), (2, 2)])
def test_dtype_codes(name, code):
    assert fmt.dtype_code(name) == code


@pytest.mark.parametrize("bad", ["float64", np.int32, "int8"])
def test_dtype_code_rejects_other_types(bad):
    with pytest.raises(TypeError, match="bfloat16, float32 and float16"):
        fmt.dtype_code(bad)
    with pytest.raises(ValueError, match="code 9"):
        fmt.dtype_code(9)


@pytest.mark.parametrize("dtype", [fmt.DTYPE_FP32, fmt.DTYPE_FP16])
def test_wide_headers_round_trip_and_sizes_follow_the_dtype(dtype):
    n = 5000
    lay = fmt.Layout.for_count(n, dtype)
    h = fmt.Header(n=n, n_escapes=3, frame_len=lay.compressed_len(3), flags=0,
                   codebook=(1, 2, 3, 4, 5, 6, 7), shape=(n,), dtype=dtype)
    buf = np.zeros(h.frame_len, np.uint8)
    buf[:fmt.HEADER_SIZE] = fmt.pack_header(h)
    assert fmt.parse_header(buf) == h
    # the BF16 layout's length is wrong for this dtype
    bad = dataclasses.replace(h, frame_len=fmt.Layout.for_count(n).compressed_len(3))
    buf[:fmt.HEADER_SIZE] = fmt.pack_header(bad)
    with pytest.raises(ValueError, match="layout needs"):
        fmt.parse_header(buf)


def test_fp16_header_rejects_codebook_entries_above_31():
    n = 5000
    lay = fmt.Layout.for_count(n, fmt.DTYPE_FP16)
    h = fmt.Header(n=n, n_escapes=0, frame_len=lay.compressed_len(0), flags=0,
                   codebook=(10, 11, 12, 13, 14, 15, 32), shape=(n,), dtype=fmt.DTYPE_FP16)
    buf = np.zeros(h.frame_len, np.uint8)
    buf[:fmt.HEADER_SIZE] = fmt.pack_header(h)
    with pytest.raises(ValueError, match="above 31"):
        fmt.parse_header(buf)
    with pytest.raises(ValueError, match="0..31"):
        fmt.check_codebook(h.codebook, fmt.DTYPE_FP16)
    fmt.check_codebook(h.codebook, fmt.DTYPE_FP32)  # 8-bit exponents: fine


def test_escape_values_rule():
    fmt.check_escape_values(np.array([0, 31, 7], np.uint8), fmt.DTYPE_FP16)
    fmt.check_escape_values(np.array([255], np.uint8), fmt.DTYPE_FP32)
    with pytest.raises(ValueError, match="escape byte 32 is not a float16 exponent"):
        fmt.check_escape_values(np.array([3, 32, 40], np.uint8), fmt.DTYPE_FP16)
