"""FP32 and FP16 frames on the device: ``encode.WidePlan`` / ``decode_fp16`` (FP32 on the BF16 tile
kernels' FP32 builds; FP16 on the encoder's FP16 build and its own decoder).

Each check runs under Numba's CUDA simulator on small sizes (``make test`` the quick
ones, ``make test-sim`` all: see ``test_gpu_codec.py``) and on a real GPU at full size
(``pytest -m gpu``): device frames are byte-identical to the reference's, device
decoding of reference frames gives the input back bit for bit, malformed frames set
error bits (and ``decompress`` raises ValueError), and the public API takes float32 /
float16 CuPy and torch arrays.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import SIMULATOR, long_under_simulator, simulator_only

if SIMULATOR:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NumPy int64 wrap-around

from test_dtypes import all_fp16_patterns, fp16_corpus_with_filler, fp32_corpus
from test_gpu_codec import Device  # NumPy under the simulator, CuPy on a GPU; small sizes simulated

from zipccl import format as fmt
from zipccl.codebook import Codebook
from zipccl.codec import gpu, gpu_codebook, gpu_workspace, reference
from zipccl.format import errors

FP32, FP16 = fmt.DTYPE_FP32, fmt.DTYPE_FP16
CANARY = 0xAB
GUARD = 0x5A


@pytest.fixture(params=[pytest.param("simulator", marks=simulator_only),
                        pytest.param("gpu", marks=pytest.mark.gpu)])
def dev(request) -> Device:
    return Device(request.param)


def _values(bits: np.ndarray, code: int) -> np.ndarray:
    return bits.view(np.float32 if code == FP32 else np.float16)


def _encode(dev: Device, bits: np.ndarray, cb: Codebook, code: int, checksum=True) -> np.ndarray:
    buf = dev.full(fmt.max_compressed_size(bits.size, code) + 256, CANARY, np.uint8)
    gpu.encode_into(dev.asarray(_values(bits, code)), buf, cb, checksum=checksum)
    host = dev.to_host(buf)
    flen = int(host[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8].view("<i8")[0])
    assert np.all(host[flen:] == CANARY), "encoder wrote past the end of its frame"
    return host[:flen]


def _decode(dev: Device, frame: np.ndarray, n: int, code: int) -> tuple[np.ndarray, int]:
    item = fmt.ITEMSIZE[code]
    guard = dev.full((n + 64) * item, GUARD, np.uint8)
    out = guard[32 * item:(32 + n) * item].view(np.float32 if code == FP32 else np.float16)
    ws = gpu_workspace.Workspace(max(n, 1))
    gpu.decode_into(dev.asarray(frame), out, workspace=ws)
    err = ws.last_error()
    g = dev.to_host(guard)
    assert np.all(g[:32 * item] == GUARD) and np.all(g[(32 + n) * item:] == GUARD), \
        "decoder wrote outside its output"
    return g[32 * item:(32 + n) * item].view(np.uint32 if code == FP32 else np.uint16), err


def _roundtrip(dev: Device, bits: np.ndarray, cb: Codebook, code: int, checksum=True) -> fmt.Header:
    ref = reference.encode(bits, cb, checksum=checksum, dtype=code)
    got = _encode(dev, bits, cb, code, checksum)
    assert got.size == ref.size and np.array_equal(got, ref)
    dec, err = _decode(dev, ref, bits.size, code)
    assert err == 0 and np.array_equal(dec, bits)
    return fmt.parse_header(ref)


def _gauss(n: int, code: int, sigma=0.02, seed=0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0, sigma, n).astype(np.float32 if code == FP32 else np.float16)
    return x.view(np.uint32 if code == FP32 else np.uint16)


SIM_SIZES = [0, 1, 4097]
BLOCK = fmt.BLOCK
GPU_SIZES = [0, 1, 33, 1000, 4095, 4097, 65537, 1_000_003]


@pytest.mark.parametrize("code", [FP32, FP16])
@pytest.mark.parametrize("checksum", [True, False])
# several escape blocks take 3-14 s a case in the simulator: make test-slow (and CI) runs them
@pytest.mark.parametrize("dev, n", [pytest.param("simulator", n, id=f"simulator-{n}",
                                                 marks=[simulator_only, *[pytest.mark.slow] * (n > BLOCK)])
                                    for n in SIM_SIZES]
                         + [pytest.param("gpu", n, id=f"gpu-{n}", marks=pytest.mark.gpu) for n in GPU_SIZES],
                         indirect=["dev"])
def test_sizes_match_reference(dev, n, checksum, code):
    bits = _gauss(n, code, seed=n)
    h = _roundtrip(dev, bits, Codebook.from_sample(bits, dtype=code), code, checksum)
    if code == FP32:  # FP16 frames of a few thousand values can stay RAW (padding)
        assert h.raw == (0 < n < 1000)


@long_under_simulator
def test_every_fp16_pattern(dev):
    cb = Codebook((9, 10, 11, 12, 13, 14, 15))
    if dev.simulated:  # every exponent and sign with edge mantissas, 2 blocks
        pats = all_fp16_patterns()
        pats = pats[np.isin(pats & 0x3FF, [0, 1, 0x200, 0x100, 0x3FF])]
        mix = np.concatenate([pats, fp16_corpus_with_filler(cb)[:8192 - pats.size]])
    else:
        mix = fp16_corpus_with_filler(cb)
        assert _roundtrip(dev, all_fp16_patterns(), cb, FP16).raw
    h = _roundtrip(dev, mix, cb, FP16)
    assert not h.raw and h.n_escapes > 0


@long_under_simulator  # 6-7 s a case in the simulator: make test-slow (and CI)
def test_structured_fp32_corpus(dev):
    bits = fp32_corpus()
    if dev.simulated:  # every exponent and sign with 3 edge mantissas, specials, Gaussian fill
        bits = bits[:6000]
        edge = np.array([(s << 31) | (e << 23) | m for s in (0, 1) for e in range(256)
                         for m in (0, 1, 0x7FFFFF)], np.uint32)
        bits = np.concatenate([edge, bits])[:6000]
        specials = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0, 0x80000000, 1,
                             0x807FFFFF], np.uint32)
        bits[:specials.size] = specials
    for checksum in (True, False):
        h = _roundtrip(dev, bits, Codebook.from_sigma(0.02), FP32, checksum)
    assert not h.raw and h.n_escapes > 0


@long_under_simulator  # 4-5 s a type in the simulator: make test-slow (and CI)
@pytest.mark.parametrize("code", [FP32, FP16])
def test_hypothesis_fuzz(dev, code):
    """Random bit patterns (any size, some blocks dense in escapes) mixed with values whose
    exponents a random codebook covers: device frames equal the reference's, byte for byte,
    and device decoding of the reference's frames gives the patterns back. Few, small
    examples under the simulator; more and larger on a GPU."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    uint = np.uint32 if code == FP32 else np.uint16
    top, bias = (249, 127) if code == FP32 else (25, 15)

    @settings(derandomize=True, deadline=None, database=None,
              max_examples=dev.size(4, 40),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(bits=hnp.arrays(uint, st.integers(0, dev.size(2500, 300_000)),
                           elements=st.integers(0, np.iinfo(uint).max)),
           start=st.integers(0, top), seed=st.integers(0, 2**31))
    def check(bits, start, seed):
        rng = np.random.default_rng(seed)
        g = rng.normal(0, 2.0 ** (start - bias + 3), bits.size)
        g = g.astype(np.float32 if code == FP32 else np.float16).view(uint)
        mix = np.where(rng.random(bits.size) < 0.7, g, bits).astype(uint)
        _roundtrip(dev, mix, Codebook(tuple(range(start, start + 7))), code, checksum=bool(seed & 1))

    check()


@long_under_simulator
@pytest.mark.parametrize("code", [FP32, FP16])
def test_malformed_frames_set_error_bits(dev, code):
    n = dev.size(5000, 300_000)
    bits = _gauss(n, code, seed=5)
    planted = np.random.default_rng(6).choice(n, n // 50, replace=False)
    bits[planted] ^= np.array(0x40000000 if code == FP32 else 0x4000, bits.dtype)  # escapes
    cb = Codebook.from_sample(bits, dtype=code)
    frame = reference.encode(bits, cb, dtype=code)
    h = fmt.parse_header(frame)
    lay = fmt.Layout.for_count(n, code)
    assert not h.raw and h.n_escapes > 0
    cases = {"payload": lay.sm_offset + 7, "plane": lay.plane_offset(lay.n_planes - 1) + 3,
             "counts": lay.counts_offset, "escapes": lay.escapes_offset + 1, "header": 5}
    if code == FP32:
        cases["low halves"] = lay.lo_offset + 11
    for what, at in cases.items():
        bad = frame.copy()
        bad[at] ^= 0x04
        _, err = _decode(dev, bad, n, code)
        assert err != 0, what
    _, err = _decode(dev, frame[:-1], n, code)  # truncated
    assert err != 0
    _, err = _decode(dev, frame, n - 1, code)  # the wrong count
    assert err != 0
    other_code = FP16 if code == FP32 else FP32
    other = reference.encode(bits.view(np.uint16) if code == FP32 else bits[: n // 2].view(np.uint32),
                             Codebook.from_sigma(0.02, other_code), dtype=other_code)
    _, err = _decode(dev, other, n, code)  # a frame of the other type
    assert err != 0
    with pytest.raises(ValueError, match="corrupted zipccl frame"):
        bad = frame.copy()
        bad[lay.sm_offset + 1] ^= 1
        gpu.decompress(dev.asarray(bad))


@long_under_simulator
def test_fp16_escape_above_31_without_checksum(dev):
    cb = Codebook((9, 10, 11, 12, 13, 14, 15))
    bits = fp16_corpus_with_filler(cb)[: dev.size(6000, 1 << 18)]
    frame = reference.encode(bits, cb, checksum=False, dtype=FP16)
    lay = fmt.Layout.for_count(bits.size, FP16)
    bad = frame.copy()
    bad[lay.escapes_offset + 3] = 77
    _, err = _decode(dev, bad, bits.size, FP16)

    assert err == errors.ERR_ESCAPE_VALUE
    with pytest.raises(ValueError, match="not a float16 exponent"):
        gpu.decompress(dev.asarray(bad))


def _implied_error_bits(frame: np.ndarray, n: int) -> int:
    """The device decoder's error bits for an FP16 ``frame`` whose header is intact, from the
    checks ``reference.decode`` makes: the payload checksum, each block's stored escape count
    against the escape codes in its planes, the counts' sum against the header's total, and
    every escape byte the decoder reads (a block's escapes at its stored counts' prefix: one
    outside the escape section is a range error, one above 31 not an FP16 exponent)."""

    h = fmt.parse_header(frame)
    lay = fmt.Layout.for_count(n, FP16)
    err = 0
    if h.has_checksum and fmt.payload_checksum(frame, h.frame_len) != h.checksum:
        err |= errors.ERR_CHECKSUM
    planes = [reference.unpack_plane(frame[lay.plane_offset(k):lay.plane_offset(k) + 4 * lay.plane_words], n)
              for k in range(3)]
    escaped = (planes[0] | planes[1] | planes[2]) == 0
    seen = np.add.reduceat(escaped.astype(np.int64), np.arange(0, n, BLOCK))
    counts = frame[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].view("<u4").astype(np.int64)
    assert np.all(counts <= BLOCK), "a case for counts the decoder clamps"
    if not np.array_equal(seen, counts):
        err |= errors.ERR_COUNTS
    if counts.sum() != h.n_escapes:
        err |= errors.ERR_TOTAL
    starts = np.cumsum(counts) - counts
    pos = np.concatenate([starts[b] + np.arange(seen[b]) for b in range(lay.n_blocks)])
    if np.any(pos >= h.n_escapes):
        err |= errors.ERR_ESCAPE_RANGE
    read = frame[lay.escapes_offset + pos[pos < h.n_escapes]]
    if np.any(read > fmt.EXPONENT_MAX[FP16]):
        err |= errors.ERR_ESCAPE_VALUE
    return err


@long_under_simulator
def test_fp16_corrupted_frames_error_bits(dev):
    """Each corruption sets exactly the error bits the reference's checks imply; a frame that
    stays valid (no checksum to catch a changed payload byte) decodes as the reference decodes
    it. Two blocks or more (full ones and a tail), escapes in each; without a checksum every
    case, with one those that add its bit."""

    n = dev.size(5000, 300_001)
    bits = _gauss(n, FP16, seed=11)
    bits[np.random.default_rng(12).choice(n, n // 30, replace=False)] ^= np.uint16(0x4000)
    cb = Codebook.from_sample(bits, dtype=FP16)
    lay = fmt.Layout.for_count(n, FP16)
    last = lay.counts_offset + 4 * (lay.n_blocks - 1)
    sm, raw_plane, esc = lay.sm_offset + 7, lay.plane_offset(5) + 9, lay.escapes_offset
    for checksum in (False, True):
        frame = reference.encode(bits, cb, checksum=checksum, dtype=FP16)
        h = fmt.parse_header(frame)
        counts = frame[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].view("<u4")
        assert not h.raw and lay.n_blocks >= 2 and np.all(counts > 0)
        cases = {"clean": (), "escape byte above 31": (esc, 40),
                 "first count + 1": (lay.counts_offset, frame[lay.counts_offset] + 1),
                 "payload bit": (sm, frame[sm] ^ 1)}
        if not checksum:
            cases.update({"last escape byte above 31": (esc + h.n_escapes - 1, 200),
                          "first count - 1": (lay.counts_offset, frame[lay.counts_offset] - 1),
                          "last count + 1": (last, frame[last] + 1),
                          "raw plane bit": (raw_plane, frame[raw_plane] ^ 4),
                          "escape byte, still an exponent": (esc + 2, (frame[esc + 2] + 1) & 31)})
        implied = 0
        for what, edit in cases.items():
            bad = frame.copy()
            if edit:
                bad[edit[0]] = edit[1]
            want = _implied_error_bits(bad, n)
            implied |= want
            got, err = _decode(dev, bad, n, FP16)
            assert err == want, (checksum, what, err, want)
            if want == 0:
                assert np.array_equal(got, reference.decode(bad)[0]), (checksum, what)
        assert implied == (errors.ERR_COUNTS | errors.ERR_TOTAL | errors.ERR_ESCAPE_RANGE
                           | errors.ERR_ESCAPE_VALUE | (errors.ERR_CHECKSUM if checksum else 0))


@long_under_simulator
@pytest.mark.parametrize("code", [FP32, FP16])
def test_compress_and_decompress(dev, code):
    n = dev.size(4500, 2_000_003)
    bits = _gauss(n, code, sigma=3e-3, seed=8)
    x = dev.asarray(_values(bits, code)).reshape(-1, 3) if n % 3 == 0 else dev.asarray(_values(bits, code))
    frame = gpu.compress(x)
    assert np.array_equal(dev.to_host(frame),
                          reference.encode(bits, Codebook.from_sample(bits, dtype=code), x.shape, dtype=code))
    assert gpu_codebook.sample_codebook(x) == Codebook.from_sample(bits, dtype=code)
    y = gpu.decompress(frame)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert np.array_equal(dev.to_host(y).reshape(-1).view(bits.dtype), bits)
    frame2 = gpu.compress(x, sigma=3e-3, checksum=False)
    assert np.array_equal(dev.to_host(frame2), reference.encode(
        bits, Codebook.from_sigma(3e-3, code), x.shape, False, dtype=code))
    out = dev.full(n * fmt.ITEMSIZE[code], 0, np.uint8).view(x.dtype)
    assert gpu.decompress(frame2, out=out) is out
    assert np.array_equal(dev.to_host(out).view(bits.dtype), bits)


def test_other_dtypes_are_refused(dev):
    with pytest.raises(TypeError, match="float64"):
        gpu.compress(dev.asarray(np.ones(100, np.float64)))
    with pytest.raises(TypeError):
        gpu.encode_into(dev.asarray(np.ones(100, np.int8)), dev.full(1000, 0, np.uint8),
                        Codebook.from_sigma(0.02))
    with pytest.raises(ValueError, match="0..31"):  # a BF16 codebook for FP16 values
        gpu.encode_into(dev.asarray(np.ones(100, np.float16)), dev.full(1000, 0, np.uint8),
                        Codebook.from_sigma(0.02))


@pytest.mark.gpu
def test_top_level_api_on_cupy_and_torch():
    import zipccl

    cp = pytest.importorskip("cupy")
    for dt in (np.float32, np.float16):
        x = cp.asarray(np.random.default_rng(1).normal(0, 0.01, (300, 1001)).astype(dt))
        frame = zipccl.compress(x)
        y = zipccl.decompress(frame)
        assert y.dtype == dt and bool(cp.array_equal(y.view(cp.uint8), x.view(cp.uint8)))
        h = zipccl.decompress(cp.asnumpy(frame))  # a device frame read by the host codec
        assert np.array_equal(h.view(np.uint8), cp.asnumpy(x).view(np.uint8))
    torch = pytest.importorskip("torch")
    for dt in (torch.float32, torch.float16):
        t = (torch.randn(500_001, device="cuda") * 0.02).to(dt)
        ft = zipccl.compress(t)
        assert isinstance(ft, torch.Tensor) and ft.is_cuda and ft.dtype == torch.uint8
        yt = zipccl.decompress(ft)
        assert yt.dtype == dt and torch.equal(yt, t)
