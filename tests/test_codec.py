"""The host codecs, bit for bit: the NumPy reference (the specification) and the Numba CPU path.

Every test compares uint16 bit patterns or frame bytes with ``np.array_equal``.
Where a test applies to one codec it is parametrized over both; where it
compares them it asserts byte-identical frames and cross-decoding both ways.
Corrupt and foreign buffers must raise ValueError (never crash, never return
silently from a checksummed frame).
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from conftest import edge_corpus, gaussian_bits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import zipccl
from zipccl import format as fmt
from zipccl.codebook import Codebook
from zipccl.codec import cpu, cpu_loops, reference

CODECS = [pytest.param(reference, id="reference"), pytest.param(cpu, id="cpu")]
SIGMA_CB = Codebook.from_sigma(0.02)  # exponents 116..122
CODEBOOKS = [
    SIGMA_CB,
    Codebook((0, 1, 2, 3, 4, 5, 6)),  # zeros / subnormals / tiny normals
    Codebook((255, 254, 0, 127, 128, 1, 60)),  # unordered, with inf/NaN's exponent 255
]
SIZES = [0, 1, 31, 32, 33, 127, 129, 4095, 4096, 4097, 3 * 4096 + 5]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.asarray(a).view(np.uint16),
                                                 np.asarray(b).view(np.uint16))


def both_frames(bits, cb=SIGMA_CB, shape=None, checksum=True) -> np.ndarray:
    """The reference frame, after checking the CPU codec writes the very same bytes."""
    f_ref = reference.encode(bits, cb, shape, checksum)
    f_cpu = cpu.encode(bits, cb, shape, checksum)
    assert f_ref.dtype == f_cpu.dtype == np.uint8
    assert np.array_equal(f_ref, f_cpu), "CPU frame differs from the reference frame"
    return f_ref


def check_everything(bits, cb=SIGMA_CB, shape=None, checksum=True) -> np.ndarray:
    """Identical frames, both decoders recover the bits of both frames, size bound holds."""
    frame = both_frames(bits, cb, shape, checksum)
    expect = np.asarray(bits, dtype=np.uint16).reshape(shape if shape is not None else -1)
    assert len(frame) <= zipccl.max_compressed_size(bits.size)
    for codec in (reference, cpu):
        out, header = codec.decode(frame)
        assert out.dtype == np.uint16
        assert same_bits(out, expect)
        assert header.n == bits.size and header.frame_len == len(frame)
    return frame


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("cb", CODEBOOKS, ids=["sigma", "low", "unordered"])
def test_all_65536_bit_patterns(cb):
    bits = np.arange(1 << 16, dtype=np.uint16)
    check_everything(bits, cb)
    check_everything(np.random.default_rng(0).permutation(bits), cb)


def test_all_bit_patterns_each_alone_in_a_block_of_gaussians():
    # Every pattern once, spread over Gaussian blocks: compressed (not RAW) frames
    # that still contain every sign, exponent and mantissa.
    bits = gaussian_bits(1 << 20, seed=3)
    bits[::16] = np.arange(1 << 16, dtype=np.uint16)
    frame = check_everything(bits)
    assert not fmt.parse_header(frame).raw


def test_edge_corpus():
    corpus = edge_corpus()
    for cb in CODEBOOKS + [Codebook.from_histogram(corpus, dtype="bfloat16")]:
        check_everything(corpus, cb)
        # The same values as escapes in an otherwise compressible tensor.
        mixed = np.concatenate([gaussian_bits(40000, seed=1), corpus, gaussian_bits(333, seed=2)])
        check_everything(mixed, cb)


@pytest.mark.parametrize("n", SIZES + [(1 << 21) + 17])
def test_sizes(n):
    check_everything(gaussian_bits(n, seed=n))
    check_everything(np.random.default_rng(n).integers(0, 1 << 16, n, dtype=np.uint16))


@pytest.mark.parametrize("checksum", [True, False])
@pytest.mark.parametrize("n", [0, 1, 4096, 100_000])
def test_checksum_flag_and_value(n, checksum):
    frame = check_everything(gaussian_bits(n), checksum=checksum)
    h = fmt.parse_header(frame)
    assert h.has_checksum == checksum
    assert h.checksum == (fmt.payload_checksum(frame, len(frame)) if checksum else 0)


@pytest.mark.parametrize("length", [128, 129, 130, 131, 132, 1000, 4 * 65536 + 128,
                                    4 * 65536 + 131, 3 * 4 * 65536 + 1 + 128])
def test_parallel_checksum_equals_the_reference_definition(length):
    buf = np.random.default_rng(length).integers(0, 256, length + 9, dtype=np.uint8)
    assert cpu.payload_checksum(buf, length) == fmt.payload_checksum(buf, length)
    assert cpu.payload_checksum(np.full(length, 255, np.uint8), length) == \
        fmt.payload_checksum(np.full(length, 255, np.uint8), length)


@pytest.mark.parametrize("shape", [(), (1,), (0,), (3, 0), (2, 3, 4), (5, 1, 7, 1), (64, 64, 3)])
def test_shapes_are_recorded(shape):
    n = int(np.prod(shape))
    bits = gaussian_bits(n, seed=7).reshape(shape)
    frame = check_everything(bits, shape=shape)
    assert fmt.parse_header(frame).shape == shape


def test_codebook_only_changes_the_ratio():
    bits = gaussian_bits(50_000, sigma=0.02)
    lens = {}
    for cb in CODEBOOKS:
        lens[cb.exponents] = len(check_everything(bits, cb))
    assert lens[SIGMA_CB.exponents] < min(v for k, v in lens.items() if k != SIGMA_CB.exponents)


# ---------------------------------------------------------------- hypothesis

_HYP = settings(derandomize=True, max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_HYP
@given(hnp.arrays(np.uint16, st.integers(0, 9000), elements=st.integers(0, (1 << 16) - 1)))
def test_hypothesis_random_bits(bits):
    check_everything(bits)


@_HYP
@given(n=st.integers(0, 20000), seed=st.integers(0, 2**32 - 1),
       sigma=st.sampled_from([1e-4, 0.02, 0.5, 3.0, 1e4]),
       escape_rate=st.sampled_from([0.0, 0.01, 0.3, 1.0]),
       start=st.integers(0, 248), checksum=st.booleans())
def test_hypothesis_gaussian_with_planted_escapes(n, seed, sigma, escape_rate, start, checksum):
    rng = np.random.default_rng(seed)
    bits = gaussian_bits(n, sigma=sigma, seed=seed)
    plant = rng.random(n) < escape_rate
    bits[plant] = rng.integers(0, 1 << 16, int(plant.sum()), dtype=np.uint16)
    check_everything(bits, Codebook(tuple(range(start, start + 7))), checksum=checksum)


# ---------------------------------------------------------------- RAW fallback, size bound


def _frame_with_escapes(n_blocks: int, n_esc: int) -> np.ndarray:
    """n_blocks * BLOCK Gaussian values of which exactly n_esc escape SIGMA_CB."""
    bits = gaussian_bits(n_blocks * fmt.BLOCK, seed=11)
    exps = (bits >> 7) & 0xFF
    bits = np.where((exps < 116) | (exps > 122), np.uint16(0x3C00), bits).astype(np.uint16)
    pos = np.random.default_rng(12).choice(bits.size, n_esc, replace=False)
    bits[pos] = (bits[pos] & 0x807F) | (200 << 7)  # exponent 200: never in the codebook
    return bits


@pytest.mark.parametrize("n_blocks", [1, 3])
def test_raw_fallback_exactly_at_the_threshold(n_blocks):
    lay = fmt.Layout.for_count(n_blocks * fmt.BLOCK)
    tie = lay.raw_size - lay.static_size
    at = check_everything(_frame_with_escapes(n_blocks, tie))
    h = fmt.parse_header(at)
    assert not h.raw and h.n_escapes == tie and len(at) == lay.raw_size
    over = check_everything(_frame_with_escapes(n_blocks, tie + 1))
    h = fmt.parse_header(over)
    assert h.raw and h.n_escapes == 0 and len(over) == lay.raw_size


def test_escape_heavy_blocks_next_to_light_ones():
    # The CPU encoder keeps up to cpu_loops.SLOT escapes per block in scratch and re-reads
    # the input of blocks with more; mix both kinds (and the exact boundary) in one
    # compressed frame.
    bits = _frame_with_escapes(6, 0)
    rng = np.random.default_rng(13)
    for b, k in enumerate([cpu_loops.SLOT - 1, cpu_loops.SLOT, cpu_loops.SLOT + 1, 0, 3 * cpu_loops.SLOT, 7]):
        pos = b * fmt.BLOCK + rng.choice(fmt.BLOCK, k, replace=False)
        bits[pos] = (bits[pos] & 0x807F) | (rng.integers(0, 116, k).astype(np.uint16) << 7)
    h = fmt.parse_header(check_everything(bits))
    assert not h.raw and h.n_escapes == 6 * cpu_loops.SLOT + 7


def test_small_tensors_travel_raw():
    for n in (1, 31, 200):
        h = fmt.parse_header(check_everything(gaussian_bits(n)))
        assert h.raw  # the static part alone is longer than 2n bytes


def _adversarial(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    sm = rng.integers(0, 1 << 16, n, dtype=np.uint16) & np.uint16(0x807F)
    outside = np.array([e for e in range(256) if e not in SIGMA_CB.exponents], np.uint16)
    return {
        "random bits": rng.integers(0, 1 << 16, n, dtype=np.uint16),
        "all escape": sm | np.uint16(254 << 7),
        "every outside exponent": sm | (outside[np.arange(n) % outside.size] << 7),
        "half escape": np.where(np.arange(n) % 2 == 0, sm | np.uint16(3 << 7),
                                gaussian_bits(n, seed=n)).astype(np.uint16),
    }


@pytest.mark.parametrize("n", [1, 33, 4095, 4097, 50_000])
def test_frames_never_exceed_max_compressed_size(n):
    for name, bits in _adversarial(n).items():
        frame = check_everything(bits)
        assert len(frame) <= zipccl.max_compressed_size(n) == fmt.HEADER_SIZE + 2 * n, name


# ---------------------------------------------------------------- corrupt and foreign buffers


@pytest.fixture(scope="module")
def frames() -> dict[str, np.ndarray]:
    """Small valid frames of each kind: compressed, RAW, with and without checksum."""
    mixed = np.concatenate([gaussian_bits(2 * fmt.BLOCK + 100, seed=4), edge_corpus()[:40]])
    return {
        "compressed": both_frames(mixed),
        "compressed-nock": both_frames(mixed, checksum=False),
        "raw": both_frames(edge_corpus()[4000:4300]),
        "raw-nock": both_frames(edge_corpus()[4000:4300], checksum=False),
        "empty": both_frames(np.zeros(0, np.uint16)),
    }


def _outcome(codec, buf):
    """('ok', bits) or ('error', message): what decoding ``buf`` gives."""
    try:
        out, _ = codec.decode(buf)
    except ValueError as e:
        return "error", str(e)
    return "ok", out


def _same_outcome(buf):
    """Both decoders give the same result, and it is the same kind of result."""
    a, b = _outcome(reference, buf), _outcome(cpu, buf)
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        assert same_bits(a[1], b[1])
    else:
        assert a[1] == b[1]
        assert "zipccl frame" in a[1]
    return a


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kind", ["compressed", "raw", "empty"])
def test_every_truncation_is_rejected(frames, codec, kind):
    frame = frames[kind]
    for length in range(len(frame)):
        with pytest.raises(ValueError, match="zipccl frame"):
            codec.decode(frame[:length])


def test_decoding_from_exactly_the_reported_size_and_from_longer_buffers(frames):
    for frame in frames.values():
        h = fmt.parse_header(frame)
        exact = frame[:h.frame_len].copy()
        longer = np.concatenate([frame, np.full(37, 0xAB, np.uint8)])
        for codec in (reference, cpu):
            assert same_bits(codec.decode(exact)[0], reference.decode(frame)[0])
            assert same_bits(codec.decode(longer)[0], reference.decode(frame)[0])


@pytest.mark.parametrize("codec", CODECS)
def test_header_bit_flips_are_rejected(frames, codec):
    frame = frames["compressed"]
    for byte in range(fmt.HEADER_SIZE):
        bad = frame.copy()
        bad[byte] ^= 1 << (byte % 8)
        with pytest.raises(ValueError, match="zipccl frame"):
            codec.decode(bad)


@pytest.mark.parametrize("kind", ["compressed", "raw"])
def test_payload_bit_flips_with_checksum_are_rejected(frames, kind):
    frame = frames[kind]
    rng = np.random.default_rng(9)
    positions = np.concatenate([np.arange(fmt.HEADER_SIZE, fmt.HEADER_SIZE + 16),
                                rng.integers(fmt.HEADER_SIZE, len(frame), 100),
                                np.arange(len(frame) - 16, len(frame))])
    for pos in positions:
        bad = frame.copy()
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        for codec in (reference, cpu):
            with pytest.raises(ValueError, match="payload checksum mismatch"):
                codec.decode(bad)


@pytest.mark.parametrize("kind", ["compressed-nock", "raw-nock"])
def test_payload_bit_flips_without_checksum_agree(frames, kind):
    """Without a checksum a flip may go unnoticed, but both decoders must agree on it.

    Flipping a code bit turns a value into an escape or back, which the per-block
    escape counts catch; flips in counts are caught the same way. Nothing may read
    or write out of bounds (the CPU decoder guards its escape reads).
    """
    frame = frames[kind]
    lay = fmt.Layout.for_count(fmt.parse_header(frame).n)
    errors = 0
    # Every byte of the code planes and counts, a sample of the rest.
    dense = np.arange(lay.planes_offset, lay.static_size) if kind == "compressed-nock" else []
    sparse = np.arange(fmt.HEADER_SIZE, len(frame), 23)
    for pos in np.unique(np.concatenate([dense, sparse]).astype(np.int64)):
        bad = frame.copy()
        bad[pos] ^= 1 << (pos % 8)
        errors += _same_outcome(bad)[0] == "error"
    if kind == "compressed-nock":
        assert errors > 0
        # Counts that disagree with the planes name the block.
        bad = frame.copy()
        bad[lay.counts_offset] ^= 1
        assert "block 0 has" in _same_outcome(bad)[1]


def _reseal(frame: np.ndarray, header: fmt.Header | None = None, **changes) -> np.ndarray:
    """A copy of ``frame`` with a fresh payload checksum and header CRC (forged but intact)."""
    out = frame.copy()
    h = dataclasses.replace(header or fmt.parse_header(frame), **changes)
    if h.has_checksum:
        h = dataclasses.replace(h, checksum=fmt.payload_checksum(out, h.frame_len))
    out[:fmt.HEADER_SIZE] = fmt.pack_header(h)
    return out


def test_forged_escape_counts_are_rejected_without_reading_out_of_bounds(frames):
    frame = frames["compressed"]
    h = fmt.parse_header(frame)
    lay = fmt.Layout.for_count(h.n)
    counts = frame[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].view("<u4")
    forgeries = {
        "huge count": [0xFFFFFFFF] + list(counts[1:]),
        "moved between blocks": [counts[0] + 5, counts[1] - 5] + list(counts[2:]),
        "all in block 0": [int(counts.sum())] + [0] * (lay.n_blocks - 1),
        "all zero": [0] * lay.n_blocks,
    }
    for name, values in forgeries.items():
        bad = frame.copy()
        bad[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks] = \
            np.array(values, "<u4").view(np.uint8)
        err = _same_outcome(_reseal(bad))
        assert err[0] == "error" and "escape codes but its count says" in err[1], name


def test_forged_code_planes_are_rejected(frames):
    frame = frames["compressed"]
    lay = fmt.Layout.for_count(fmt.parse_header(frame).n)
    bad = frame.copy()
    bad[lay.plane_offset(0):lay.plane_offset(0) + 4 * lay.plane_words] = 0
    bad[lay.plane_offset(1):lay.plane_offset(1) + 4 * lay.plane_words] = 0
    bad[lay.plane_offset(2):lay.plane_offset(2) + 4 * lay.plane_words] = 0  # every value escapes
    err = _same_outcome(_reseal(bad))
    assert err[0] == "error" and "block 0 has 4096 escape codes" in err[1]


def test_forged_total_is_rejected():
    # Every block's count matches its codes, but the header's total is smaller:
    # caught by the total check (no out-of-bounds read of the escape section).
    bits = _frame_with_escapes(2, 30)
    frame = both_frames(bits)
    h = fmt.parse_header(frame)
    lay = fmt.Layout.for_count(h.n)
    forged = _reseal(frame[:lay.compressed_len(10)], h, n_escapes=10,
                     frame_len=lay.compressed_len(10))
    err = _same_outcome(forged)
    assert err[0] == "error" and "do not add up" in err[1]


FOREIGN = {
    "empty bytes": b"",
    "one byte": b"\x00",
    "random 100": np.random.default_rng(1).integers(0, 256, 100, dtype=np.uint8).tobytes(),
    "random 10000": np.random.default_rng(2).integers(0, 256, 10000, dtype=np.uint8).tobytes(),
    "other magic": b"\x28\xb5\x2f\xfd" + bytes(300),  # a zstd frame's magic
    "zeros": bytes(4096),
    "text": b"ZCCL is not a frame, only its magic" * 10,
}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", list(FOREIGN))
def test_foreign_buffers_are_rejected(codec, name):
    with pytest.raises(ValueError, match="zipccl frame"):
        codec.decode(FOREIGN[name])


@pytest.mark.parametrize("name", list(FOREIGN))
@pytest.mark.parametrize("backend", ["auto", "cpu", "reference"])
def test_decompress_rejects_foreign_and_truncated_buffers(name, backend, frames):
    with pytest.raises(ValueError, match="zipccl frame"):
        zipccl.decompress(FOREIGN[name], backend=backend)
    with pytest.raises(ValueError, match="truncated zipccl frame"):
        zipccl.decompress(frames["compressed"][:-1], backend=backend)
    bad = frames["compressed"].copy()
    bad[-1] ^= 4
    with pytest.raises(ValueError, match="payload checksum mismatch"):
        zipccl.decompress(bad, backend=backend)


def test_decompress_rejects_non_byte_frames(frames):
    with pytest.raises(TypeError, match="uint8"):
        zipccl.decompress(frames["compressed"].view(np.uint16))


@pytest.mark.parametrize("codec", CODECS)
def test_decoders_accept_bytes_bytearray_memoryview_and_unaligned_arrays(frames, codec):
    frame = frames["compressed"]
    expect = reference.decode(frame)[0]
    shifted = np.zeros(len(frame) + 1, np.uint8)
    shifted[1:] = frame
    for buf in (frame.tobytes(), bytearray(frame.tobytes()), memoryview(frame.tobytes()),
                shifted[1:]):
        assert same_bits(codec.decode(buf)[0], expect)


# ---------------------------------------------------------------- the public API


@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint8, np.int8, np.complex64])
def test_unsupported_input_raises_type_error_naming_the_dtype(dtype):
    x = np.ones(10, dtype=dtype)
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        zipccl.compress(x)


def test_uint16_needs_dtype_bfloat16():
    bits = gaussian_bits(5000)
    with pytest.raises(TypeError, match="uint16"):
        zipccl.compress(bits)
    y = zipccl.decompress(zipccl.compress(bits, dtype="bfloat16"))
    assert y.dtype == ml_dtypes.bfloat16 and same_bits(y, bits)
    with pytest.raises(TypeError, match="float32"):
        zipccl.compress(bits, dtype="float32")


@pytest.mark.parametrize("backend", ["auto", "cpu", "reference"])
def test_compress_backends_write_the_same_frame(backend):
    x = gaussian_bits(30000, seed=5).view(ml_dtypes.bfloat16).reshape(100, 300)
    frame = zipccl.compress(x, backend=backend)
    assert np.array_equal(frame, zipccl.compress(x, backend="reference"))
    y = zipccl.decompress(frame, backend=backend)
    assert y.shape == (100, 300) and same_bits(y, x)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="backend"):
        zipccl.compress(gaussian_bits(10).view(ml_dtypes.bfloat16), backend="gpu-ish")


@pytest.mark.parametrize("make", [
    lambda a: a[::3],
    lambda a: a.reshape(60, 500).T,
    lambda a: a.reshape(60, 500)[5:50:2, ::-7],
    lambda a: a.reshape(30, 20, 50).transpose(2, 0, 1)[:, 1:, ::2],
], ids=["strided", "transposed", "sliced-2d", "permuted-3d"])
def test_non_contiguous_input_keeps_shape_and_bits(make):
    x = make(gaussian_bits(30000, seed=8).view(ml_dtypes.bfloat16))
    assert not x.flags.c_contiguous
    frame = zipccl.compress(x)
    assert np.array_equal(frame, zipccl.compress(np.ascontiguousarray(x)))
    y = zipccl.decompress(frame)
    assert y.shape == x.shape and same_bits(y, np.ascontiguousarray(x))


@pytest.mark.parametrize("shape", [(), (0,), (1,), (4, 5, 6), (2, 3, 4, 5, 6, 1, 2, 1)])
def test_api_round_trips_shapes(shape):
    x = gaussian_bits(int(np.prod(shape)), seed=2).view(ml_dtypes.bfloat16).reshape(shape)
    y = zipccl.decompress(zipccl.compress(x))
    assert y.shape == shape and y.dtype == ml_dtypes.bfloat16 and same_bits(y, x)


def test_compress_into_out_buffer():
    x = gaussian_bits(20000, seed=3).view(ml_dtypes.bfloat16)
    out = np.full(zipccl.max_compressed_size(x.size) + 10, 0xEE, np.uint8)
    frame = zipccl.compress(x, out=out)
    assert np.shares_memory(frame, out) and frame.ctypes.data == out.ctypes.data
    assert np.array_equal(frame, zipccl.compress(x))
    assert np.all(out[len(frame):] == 0xEE)  # nothing written past the frame
    with pytest.raises(ValueError, match="out= holds"):
        zipccl.compress(x, out=np.zeros(len(frame) - 1, np.uint8))


def test_decompress_into_out_buffer():
    x = gaussian_bits(20000, seed=3).view(ml_dtypes.bfloat16).reshape(40, 500)
    frame = zipccl.compress(x)
    out = np.zeros((40, 500), ml_dtypes.bfloat16)
    assert zipccl.decompress(frame, out=out) is out and same_bits(out, x)
    out16 = np.zeros(20000, np.uint16)
    zipccl.decompress(frame, out=out16)
    assert np.array_equal(out16, x.view(np.uint16).reshape(-1))
    with pytest.raises(ValueError, match="elements"):
        zipccl.decompress(frame, out=np.zeros(19999, ml_dtypes.bfloat16))


@pytest.mark.parametrize("shape, dtype, cut", [
    ((16,), ml_dtypes.bfloat16, lambda a: a[::2]),  # 1-D strided
    ((8, 2), ml_dtypes.bfloat16, lambda a: a[:, 0]),  # a column
    ((4, 6), ml_dtypes.bfloat16, lambda a: a.T[1:4]),  # 2-D, neither C nor F order
    ((8, 3), np.uint16, lambda a: a[:, 1]),  # uint16 bit patterns, strided
], ids=["step2", "column", "transposed", "uint16-strided"])
def test_decompress_into_non_contiguous_out(shape, dtype, cut):
    # Every value lands in out itself, in C order, and nothing between its elements changes.
    base = np.full(shape, 0x5A5A, np.uint16).view(dtype)
    out = cut(base)
    x = gaussian_bits(out.size, seed=11).view(ml_dtypes.bfloat16).reshape(out.shape)
    assert zipccl.decompress(zipccl.compress(x), out=out) is out
    expected = np.full(shape, 0x5A5A, np.uint16)
    cut(expected)[...] = x.view(np.uint16)
    assert np.array_equal(base.view(np.uint16), expected)


def test_decompress_rejects_outs_it_cannot_write():
    frame = zipccl.compress(gaussian_bits(8, seed=1).view(ml_dtypes.bfloat16))
    read_only = np.zeros(8, ml_dtypes.bfloat16)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        zipccl.decompress(frame, out=read_only)
    with pytest.raises(TypeError, match="NumPy array"):
        zipccl.decompress(frame, out=bytearray(16))


@pytest.mark.parametrize("make_out", [
    lambda n: np.zeros(2 * n, np.uint8)[::2],  # 1-D strided: the frame would not be one run
    lambda n: np.zeros((n, 2), np.uint8)[:, 0],
    lambda n: np.zeros((2, n), np.uint8, order="F"),  # 2-D, not C-contiguous: reshape copies
], ids=["step2", "column", "fortran"])
def test_compress_rejects_non_contiguous_out(make_out):
    x = gaussian_bits(1000, seed=4).view(ml_dtypes.bfloat16)
    out = make_out(zipccl.max_compressed_size(x.size))
    with pytest.raises(ValueError, match="C-contiguous"):
        zipccl.compress(x, out=out)
    assert not np.any(out)  # and nothing was written


def test_compress_into_a_2d_or_read_only_out():
    x = gaussian_bits(1000, seed=4).view(ml_dtypes.bfloat16)
    n = zipccl.max_compressed_size(x.size)
    out = np.zeros((2, n), np.uint8)  # C-contiguous 2-D: the frame lands in its memory
    frame = zipccl.compress(x, out=out)
    assert np.shares_memory(frame, out) and np.array_equal(frame, zipccl.compress(x))
    assert np.array_equal(out.reshape(-1)[:frame.size], frame)
    read_only = np.zeros(n, np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        zipccl.compress(x, out=read_only)


def test_api_codebook_and_sigma_arguments():
    x = gaussian_bits(20000, seed=6).view(ml_dtypes.bfloat16)
    by_sigma = zipccl.compress(x, sigma=0.02)
    assert np.array_equal(by_sigma, zipccl.compress(x, codebook=SIGMA_CB))
    assert fmt.parse_header(by_sigma).codebook == SIGMA_CB.exponents
    with pytest.raises(ValueError, match="not both"):
        zipccl.compress(x, codebook=SIGMA_CB, sigma=0.02)
    with pytest.raises(TypeError, match="Codebook"):
        zipccl.compress(x, codebook=(116, 117, 118, 119, 120, 121, 122))


@pytest.mark.parametrize("exponents, message", [
    ((1, 2, 3, 4, 5, 6), "7 distinct"),
    ((1, 2, 3, 4, 5, 6, 7, 8), "7 distinct"),
    ((1, 2, 3, 4, 5, 6, 6), "7 distinct"),
    ((1, 2, 3, 4, 5, 6, 256), "0..255"),
    ((-1, 2, 3, 4, 5, 6, 7), "0..255"),
])
def test_codebook_validation(exponents, message):
    with pytest.raises(ValueError, match=message):
        Codebook(exponents)


def test_max_compressed_size():
    assert zipccl.max_compressed_size(0) == fmt.HEADER_SIZE
    assert zipccl.max_compressed_size(1 << 20) == fmt.HEADER_SIZE + (2 << 20)
    with pytest.raises(ValueError, match=">= 0"):
        zipccl.max_compressed_size(-1)


@pytest.mark.parametrize("n", [1.9, 12.0, "12", True, None])
def test_max_compressed_size_rejects_counts_that_are_not_integers(n):
    for f in (zipccl.max_compressed_size, fmt.max_compressed_size):
        with pytest.raises(TypeError, match="integer"):
            f(n)
    assert zipccl.max_compressed_size(np.int64(12)) == zipccl.max_compressed_size(12)


@pytest.mark.parametrize("codec", CODECS)
def test_signalling_nans_round_trip_without_warnings(codec):
    """sNaN bit patterns (quiet bit clear) are data like any other: exact, and no RuntimeWarning."""
    import warnings

    snan = [0x7F81, 0xFF81, 0x7FBF, 0xFFBF, 0x7F80, 0xFF80, 0x7FC1]
    bits = np.array(snan * 700 + [0x3F80, 0x3C00, 0x0001] * 50, dtype=np.uint16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = zipccl.compress(bits, dtype="bfloat16", backend=codec.__name__.rsplit(".", 1)[-1])
        assert same_bits(zipccl.decompress(frame), bits)
        assert Codebook.from_sample(bits).exponents  # the sigma estimate ignores them quietly
        assert same_bits(codec.decode(codec.encode(bits, SIGMA_CB, bits.shape, True))[0], bits)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_decompress_reads_strided_frames(frames, backend):
    """A frame held in a strided buffer (every other byte) decodes to the same tensor."""
    frame = frames["compressed"]
    expect = reference.decode(frame)[0]
    spread = np.repeat(frame, 2)
    for buf in (spread[::2], memoryview(spread)[::2], memoryview(spread.tobytes())[::2]):
        assert same_bits(zipccl.decompress(buf, backend=backend), expect)


@pytest.mark.parametrize("data", [b"\x80?\x00@", bytearray(4), "ab"])
def test_compress_of_bytes_says_what_it_got_and_what_to_do(data):
    with pytest.raises(TypeError, match=f"got {type(data).__name__} of length") as e:
        zipccl.compress(data)
    assert "np.frombuffer" in str(e.value) and "|S" not in str(e.value)
