"""FP32 and FP16 frames on the host: reference and CPU codecs, bit for bit, and the public API.

Every FP16 bit pattern and a structured FP32 corpus (every exponent with edge mantissas,
NaN payloads, subnormals, +-0, +-inf) round-trip in both codecs, whose frames are
byte-identical; malformed frames of each type raise the same ValueError in both;
hypothesis fuzzes both types (a short deterministic profile here, a long one under
``-m slow``). The GPU's share of the same checks is in ``test_gpu_dtypes.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import zipccl
from zipccl import format as fmt
from zipccl.codebook import Codebook
from zipccl.codec import cpu, reference

FP32, FP16 = fmt.DTYPE_FP32, fmt.DTYPE_FP16
CODECS = [reference, cpu]
SIZES = [0, 1, 7, 31, 33, 4095, 4096, 4097, 12289]


def all_fp16_patterns() -> np.ndarray:
    """Every one of the 65,536 FP16 bit patterns, in order."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def fp16_corpus_with_filler(cb: Codebook, seed: int = 0) -> np.ndarray:
    """Every FP16 pattern, shuffled among 3 x 65,536 values whose exponents are in ``cb``,
    so the frame is compressed (not RAW) and every pattern goes through the code."""
    rng = np.random.default_rng(seed)
    m = 3 << 16
    exps = np.array(cb.exponents, np.uint16)[rng.integers(0, 7, m)]
    filler = (rng.integers(0, 2, m, dtype=np.uint16) << 15) | (exps << 10) \
        | rng.integers(0, 1 << 10, m, dtype=np.uint16)
    out = np.concatenate([all_fp16_patterns(), filler.astype(np.uint16)])
    return out[rng.permutation(out.size)]


def fp32_corpus(seed: int = 0) -> np.ndarray:
    """FP32 edge patterns: every exponent x edge mantissas x both signs, NaN payloads,
    subnormals, +-0, +-inf, then N(0, 0.02^2) values so that the frame is compressed."""
    mants = [0, 1, 2, 0x7FFFFF, 0x400000, 0x3FFFFF, 0x00FFFF, 0x010000, 0xFF0000, 0x7F0001, 0x555555]
    edge = [(s << 31) | (e << 23) | m for s in (0, 1) for e in range(256) for m in mants]
    nans = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA5A5A5,
            0xFF800001, 0x7FC0FFFF]
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF,
               0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000]
    rng = np.random.default_rng(seed)
    gauss = (rng.normal(0, 0.02, 200_000).astype(np.float32)).view(np.uint32)
    out = np.concatenate([np.array(edge + nans + special, np.uint32), gauss])
    return out[rng.permutation(out.size)]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def check_all(bits: np.ndarray, cb: Codebook, dtype: int, checksum: bool = True) -> np.ndarray:
    """Both encoders write the same frame; both decoders return ``bits`` from it."""
    frames = [c.encode(bits, cb, bits.shape, checksum, dtype=dtype) for c in CODECS]
    assert same(frames[0], frames[1])
    for c in CODECS:
        out, h = c.decode(frames[0])
        assert h.dtype == dtype and same(out, bits)
    return frames[0]


# ---------------------------------------------------------------- exhaustive and structured


@pytest.mark.parametrize("cb", [Codebook((0, 1, 2, 3, 4, 5, 6)), Codebook((31, 30, 29, 15, 14, 13, 12)),
                                Codebook((9, 10, 11, 12, 13, 14, 15))])
def test_every_fp16_pattern_round_trips(cb):
    bits = all_fp16_patterns()
    check_all(bits, cb, FP16)  # alone: RAW (most exponents escape)
    mixed = fp16_corpus_with_filler(cb)
    frame = check_all(mixed, cb, FP16, checksum=False)
    h = fmt.parse_header(frame)
    assert not h.raw and h.n_escapes == (32 - 7) * 2048  # every pattern outside cb escapes


@pytest.mark.parametrize("cb,raw", [(Codebook.from_sigma(0.02), False),
                                    (Codebook((0, 255, 254, 1, 127, 128, 126)), True)])
def test_structured_fp32_corpus_round_trips(cb, raw):
    bits = fp32_corpus()
    for checksum in (True, False):
        frame = check_all(bits, cb, FP32, checksum)
    assert fmt.parse_header(frame).raw == raw
    check_all(bits[:2 * 256 * 11], cb, FP32)  # the edge patterns alone


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [FP32, FP16])
def test_sizes_off_every_block(n, dtype):
    rng = np.random.default_rng(n)
    x = rng.normal(0, 1e-3, n).astype(np.float32 if dtype == FP32 else np.float16)
    bits = x.view(np.uint32 if dtype == FP32 else np.uint16)
    cb = Codebook.from_sample(bits, dtype=dtype)
    for checksum in (True, False):
        check_all(bits, cb, dtype, checksum)


def test_fp32_frame_holds_the_bf16_frame_of_its_upper_halves():
    bits = fp32_corpus()
    cb = Codebook.from_sigma(0.02)
    f32 = reference.encode(bits, cb, checksum=False)
    f16 = reference.encode((bits >> 16).astype(np.uint16), cb, checksum=False)
    lay, lay16 = fmt.Layout.for_count(bits.size, FP32), fmt.Layout.for_count(bits.size)
    assert np.array_equal(f32[fmt.HEADER_SIZE:lay.lo_offset], f16[fmt.HEADER_SIZE:lay16.escapes_offset])
    assert np.array_equal(f32[lay.escapes_offset:], f16[lay16.escapes_offset:])
    lo = f32[lay.lo_offset:lay.lo_offset + 2 * bits.size].view("<u2")
    assert np.array_equal(lo, bits & 0xFFFF)


def test_fp32_ratio_on_gaussian_is_near_its_bound():
    bits = np.random.default_rng(3).normal(0, 0.02, 1 << 18).astype(np.float32).view(np.uint32)
    frame = check_all(bits, Codebook.from_sample(bits, dtype=FP32), FP32)
    assert 27 / 32 < frame.size / bits.nbytes < 0.86


def test_fp16_codebook_from_sigma_follows_the_fp16_exponent():
    for sigma in (1e-3, 0.02, 1.0, 300.0):
        cb = Codebook.from_sigma(sigma, dtype="float16")
        e = 15 + int(np.floor(np.log2(sigma)))  # the exponent of sigma itself
        assert max(cb.exponents) <= 30 and cb.exponents[0] <= e <= cb.exponents[-1]
    assert Codebook.from_sigma(1e-9, dtype="float16").exponents[0] == 0  # zeros and subnormals
    assert max(Codebook.from_sigma(1e9, dtype="float16").exponents) == 30  # never inf / NaN


def test_fp16_default_codebook_covers_gaussian_data():
    x = np.random.default_rng(4).normal(0, 0.02, 50_000).astype(np.float16)
    cb = Codebook.from_sample(x.view(np.uint16), dtype="float16")
    assert cb.coverage(x) > 0.96 and max(cb.exponents) <= 31


def test_an_fp16_codebook_above_31_is_refused_by_both_encoders():
    bits = all_fp16_patterns()[:100]
    for c in CODECS:
        with pytest.raises(ValueError, match="0..31"):
            c.encode(bits, Codebook.from_sigma(0.02), dtype=FP16)


# ---------------------------------------------------------------- malformed frames


def _compressed(dtype: int, checksum: bool) -> tuple[np.ndarray, np.ndarray]:
    if dtype == FP32:
        bits = fp32_corpus()[:20000]
        cb = Codebook.from_sigma(0.02)
    else:
        cb = Codebook((9, 10, 11, 12, 13, 14, 15))
        bits = fp16_corpus_with_filler(cb)[:20000]
    frame = reference.encode(bits, cb, checksum=checksum, dtype=dtype)
    assert not fmt.parse_header(frame).raw and fmt.parse_header(frame).n_escapes > 0
    return bits, frame


def _errors(frame) -> list[str]:
    msgs = []
    for c in CODECS:
        with pytest.raises(ValueError) as e:
            c.decode(frame)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    return msgs


@pytest.mark.parametrize("dtype", [FP32, FP16])
def test_malformed_frames_raise_value_error(dtype):
    _, frame = _compressed(dtype, checksum=True)
    lay = fmt.Layout.for_count(fmt.parse_header(frame).n, dtype)
    assert "truncated" in _errors(frame[:-1])[0]
    assert "header checksum" in _errors(np.concatenate([frame[:5], [frame[5] ^ 3], frame[6:]])
                                        .astype(np.uint8))[0]
    for at in (lay.sm_offset + 5, lay.plane_offset(lay.n_planes - 1) + 9, lay.counts_offset,
               lay.lo_offset + 3 if dtype == FP32 else lay.counts_offset + 1, frame.size - 1):
        bad = frame.copy()
        bad[at] ^= 0x10
        assert "payload checksum" in _errors(bad)[0]
    # the wrong element type in an otherwise valid header
    h = fmt.parse_header(frame)
    other = FP16 if dtype == FP32 else FP32
    bad = frame.copy()
    bad[:fmt.HEADER_SIZE] = fmt.pack_header(dataclasses.replace(h, dtype=other))
    _errors(bad)


@pytest.mark.parametrize("dtype", [FP32, FP16])
def test_escape_counts_are_checked_without_a_checksum(dtype):
    bits, frame = _compressed(dtype, checksum=False)
    h = fmt.parse_header(frame)
    lay = fmt.Layout.for_count(h.n, dtype)
    from zipccl.codebook import exponents_of
    i = int(np.flatnonzero(Codebook(h.codebook).lut()[exponents_of(bits, dtype)] == 0)[0])
    bad = frame.copy()
    bad[lay.plane_offset(0) + i // 8] ^= 1 << (i % 8)  # an escaped element gets code 1
    assert "escape codes but its count says" in _errors(bad)[0]


def test_fp16_escape_byte_above_31_is_rejected():
    bits, frame = _compressed(FP16, checksum=False)
    lay = fmt.Layout.for_count(bits.size, FP16)
    bad = frame.copy()
    bad[lay.escapes_offset + 2] = 40
    assert "escape byte 40 is not a float16 exponent" in _errors(bad)[0]
    # with a checksum, the checksum is checked first
    _, framec = _compressed(FP16, checksum=True)
    badc = framec.copy()
    badc[lay.escapes_offset] = 200
    assert "payload checksum" in _errors(badc)[0]


# ---------------------------------------------------------------- hypothesis

_HYP = settings(derandomize=True, max_examples=25, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_SLOW = settings(_HYP, max_examples=400)


def _fuzz(bits, start, plant_seed, code):
    """Random patterns, and the same mixed 70:30 with values whose exponents a codebook of 7
    consecutive exponents from ``start`` covers: every codec gives the reference's frame."""
    rng = np.random.default_rng(plant_seed)
    fp32 = code == FP32
    g = rng.normal(0, 2.0 ** (start - (127 if fp32 else 15) + 3), bits.size)
    g = g.astype(np.float32 if fp32 else np.float16).view(bits.dtype)
    mix = np.where(rng.random(bits.size) < 0.7, g, bits).astype(bits.dtype)
    cb = Codebook(tuple(range(start, start + 7)))
    check_all(mix, cb, code, checksum=bool(plant_seed & 1))
    check_all(bits, cb, code)


def _fuzz_fp32(bits, start, plant_seed):
    _fuzz(bits, start, plant_seed, FP32)


def _fuzz_fp16(bits, start, plant_seed):
    _fuzz(bits, start, plant_seed, FP16)


_FP32_ARGS = dict(bits=hnp.arrays(np.uint32, st.integers(0, 9000), elements=st.integers(0, 2**32 - 1)),
                  start=st.integers(0, 249), plant_seed=st.integers(0, 2**31))
_FP16_ARGS = dict(bits=hnp.arrays(np.uint16, st.integers(0, 9000), elements=st.integers(0, 2**16 - 1)),
                  start=st.integers(0, 25), plant_seed=st.integers(0, 2**31))


@_HYP
@given(**_FP32_ARGS)
def test_hypothesis_fp32(bits, start, plant_seed):
    _fuzz_fp32(bits, start, plant_seed)


@_HYP
@given(**_FP16_ARGS)
def test_hypothesis_fp16(bits, start, plant_seed):
    _fuzz_fp16(bits, start, plant_seed)


@pytest.mark.slow
@_SLOW
@given(**_FP32_ARGS)
def test_hypothesis_fp32_long(bits, start, plant_seed):
    _fuzz_fp32(bits, start, plant_seed)


@pytest.mark.slow
@_SLOW
@given(**_FP16_ARGS)
def test_hypothesis_fp16_long(bits, start, plant_seed):
    _fuzz_fp16(bits, start, plant_seed)


# ---------------------------------------------------------------- public API


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("backend", ["auto", "cpu", "reference"])
def test_api_round_trips_numpy(np_dtype, backend):
    x = np.random.default_rng(5).normal(0, 0.05, (200, 300)).astype(np_dtype)
    frame = zipccl.compress(x, backend=backend)
    y = zipccl.decompress(frame, backend=backend)
    assert y.dtype == np_dtype and y.shape == x.shape and same(y.view(np.uint8), x.view(np.uint8))
    assert frame.size < x.nbytes
    assert fmt.parse_header(frame).dtype == fmt.dtype_code(np_dtype)
    out = np.zeros(x.shape, np_dtype)[:, ::-1]  # any layout
    assert zipccl.decompress(frame, out=out) is out and same(out.view(np.uint8) if out.flags.c_contiguous
                                                             else np.ascontiguousarray(out).view(np.uint8),
                                                             x.view(np.uint8))
    buf = np.zeros(zipccl.max_compressed_size(x.size, np_dtype), np.uint8)
    assert same(zipccl.compress(x, out=buf, backend=backend), frame)


def test_api_bit_patterns_with_dtype_and_sigma():
    x = np.random.default_rng(6).normal(0, 1e-3, 5000).astype(np.float32)
    a = zipccl.compress(x.view(np.uint32), dtype="float32", sigma=1e-3)
    assert same(a, zipccl.compress(x, codebook=Codebook.from_sigma(1e-3, "float32")))
    h = x.astype(np.float16)
    b = zipccl.compress(h.view(np.uint16), dtype="float16", sigma=1e-3)
    assert same(b, zipccl.compress(h, codebook=Codebook.from_sigma(1e-3, "float16")))
    assert zipccl.decompress(b).dtype == np.float16


def test_api_torch_tensors():
    torch = pytest.importorskip("torch")
    for dt in (torch.float32, torch.float16):
        t = torch.randn(3000, generator=torch.Generator().manual_seed(0)).to(dt) * 0.01
        frame = zipccl.compress(t)
        y = zipccl.decompress(frame)  # torch in, torch out (tests/test_array_kinds.py)
        assert isinstance(y, torch.Tensor) and y.dtype == dt and torch.equal(y, t)
        out = torch.zeros_like(t)
        zipccl.decompress(frame, out=out)
        assert torch.equal(out.view(torch.int16 if dt == torch.float16 else torch.int32),
                           t.view(torch.int16 if dt == torch.float16 else torch.int32))


@pytest.mark.parametrize("bad", [np.float64, np.int32, np.uint8])
def test_api_other_dtypes_raise_type_error(bad):
    with pytest.raises(TypeError, match=np.dtype(bad).name):
        zipccl.compress(np.ones(10, bad))


def test_api_mismatched_dtype_and_out_raise():
    x = np.ones(10, np.float32)
    with pytest.raises(TypeError, match="float16"):
        zipccl.compress(x, dtype="float16")
    with pytest.raises(TypeError, match="32-bit"):
        zipccl.compress(np.ones(10, np.uint16), dtype="float32")
    frame = zipccl.compress(x)
    with pytest.raises(TypeError, match="float32"):
        zipccl.decompress(frame, out=np.zeros(10, np.float16))
