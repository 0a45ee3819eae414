"""The GPU codec kernels: frames byte-identical to the reference, both ways, on every input.

Each check is written once and runs in two places (the ``dev`` fixture):

- ``simulator``: Numba's CUDA simulator, NumPy arrays, small sizes (every simulated
  CUDA block costs 128 Python threads). The simulator must be on before numba.cuda is
  first imported, so these cases run in a pytest process of their own
  (``NUMBA_ENABLE_CUDASIM=1``): ``make test`` runs the quick ones, ``make test-sim``
  every one (those taking longer there are marked slow: ``conftest.long_under_simulator``),
  and the plain pytest run skips them.
- ``gpu``: a real GPU, CuPy arrays, full sizes (all 65,536 bit patterns, a million
  values). ``pytest -m gpu tests/test_gpu_codec.py``.

Below them, GPU-only checks that have no simulator counterpart: 1 GiB of data, CUDA
graph replay of the no-sync entry points, and torch / Numba / CuPy arrays through the
top-level API.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import SIMULATOR, edge_corpus, gaussian_bits, long_under_simulator, simulator_only

if SIMULATOR:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NumPy int64 wrap-around

from zipccl import format as fmt
from zipccl.codebook import Codebook, estimate_sigma
from zipccl.codec import gpu, gpu_codebook, gpu_route, gpu_workspace, reference
from zipccl.format import errors
from zipccl.kernels import _common

CANARY = 0xAB
GUARD = 0x5A5A


def _cupy_with_a_device():
    """CuPy, or a skip when this process cannot use a real GPU."""
    if SIMULATOR:
        pytest.skip("needs a real GPU, not the simulator")
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    return cupy


class Device:
    """Where a check runs: its array module and how large its inputs are."""

    def __init__(self, name: str):
        self.name = name
        self.simulated = name == "simulator"
        self.xp = np if self.simulated else _cupy_with_a_device()

    def size(self, small: int, full: int) -> int:
        """``small`` under the simulator, ``full`` on a GPU."""
        return small if self.simulated else full

    def asarray(self, host: np.ndarray):
        """A device copy of a host array (the simulator's device arrays are NumPy arrays)."""
        return np.array(host, copy=True) if self.simulated else self.xp.asarray(host)

    def to_host(self, a) -> np.ndarray:
        return np.array(a, copy=True) if self.simulated else self.xp.asnumpy(a)

    def full(self, n: int, value: int, dtype):
        return self.xp.full(n, value, dtype=dtype)


@pytest.fixture(params=[pytest.param("simulator", marks=simulator_only),
                        pytest.param("gpu", marks=pytest.mark.gpu)])
def dev(request) -> Device:
    return Device(request.param)


# ---------------------------------------------------------------- encode, decode, compare


def _encode(dev: Device, bits: np.ndarray, cb, checksum=True) -> np.ndarray:
    """Device frame of bits (on the host), written into a poisoned buffer larger than needed."""
    buf = dev.full(fmt.max_compressed_size(bits.size) + 256, CANARY, np.uint8)
    gpu.encode_into(dev.asarray(bits), buf, cb, checksum=checksum)
    host = dev.to_host(buf)
    flen = int(host[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8].view("<i8")[0])
    assert np.all(host[flen:] == CANARY), "encoder wrote past the end of its frame"
    return host[:flen]


def _decode(dev: Device, frame: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """(values, error bits) of a device decode of a host frame into a guarded output."""
    guard = dev.full(n + 64, GUARD, np.uint16)
    ws = gpu_workspace.Workspace(max(n, 1))
    gpu.decode_into(dev.asarray(frame), guard[32:32 + n], workspace=ws)
    err = ws.last_error()
    g = dev.to_host(guard)
    assert np.all(g[:32] == GUARD) and np.all(g[32 + n:] == GUARD), "decoder wrote outside its output"
    return g[32:32 + n], err


def _roundtrip(dev: Device, bits: np.ndarray, cb, checksum=True):
    """Device frame == reference frame; reference frame -> device decoder and device frame ->
    reference decoder both give back the same bits. Returns the frame's header."""
    ref = reference.encode(bits, cb, checksum=checksum)
    got = _encode(dev, bits, cb, checksum)
    assert got.size == ref.size and np.array_equal(got, ref)
    dec, err = _decode(dev, ref, bits.size)
    assert err == 0 and np.array_equal(dec.view(np.uint16), bits.view(np.uint16))
    back, _ = reference.decode(got)
    assert np.array_equal(back.reshape(-1).view(np.uint16), bits.view(np.uint16))
    h = fmt.parse_header(ref)
    assert h.has_checksum == checksum
    return h


# ---------------------------------------------------------------- one check, two places

SIM_SIZES = [0, 1, 9, 100, 1000, 4097]
GPU_SIZES = [0, 1, 7, 8, 9, 31, 33, 100, 1000, 4095, 4096, 4097, 65537, 1_000_003]


@pytest.mark.parametrize("checksum", [True, False])
@pytest.mark.parametrize("dev, n", [pytest.param("simulator", n, id=f"simulator-{n}", marks=simulator_only)
                                    for n in SIM_SIZES]
                         + [pytest.param("gpu", n, id=f"gpu-{n}", marks=pytest.mark.gpu)
                            for n in GPU_SIZES], indirect=["dev"])
def test_sizes_match_reference(dev, n, checksum):
    h = _roundtrip(dev, gaussian_bits(n, seed=n), Codebook.from_sigma(0.02), checksum)
    if n >= 1000:
        assert not h.raw and h.n_escapes > 0  # the coded path, escapes included


def test_edge_corpus(dev):
    c = edge_corpus()
    assert not _roundtrip(dev, c, Codebook.from_histogram(c, dtype="bfloat16")).raw  # coded, escapes
    assert _roundtrip(dev, c, Codebook.from_sigma(0.02)).raw  # nearly all escape: the RAW fallback


def _corner_patterns() -> np.ndarray:
    """All 256 exponents x 16 sign-mantissa bytes (the simulator's share of all 65,536)."""
    sm = np.array([0x00, 0x01, 0x3F, 0x40, 0x7E, 0x7F, 0x55, 0x2A], np.uint16)
    sm = np.concatenate([sm, sm | 0x80])
    e = np.arange(256, dtype=np.uint16)
    return (((sm[None, :] & 0x80) << 8) | (e[:, None] << 7) | (sm[None, :] & 0x7F)).reshape(-1)


@long_under_simulator
def test_bit_patterns_raw_and_coded(dev):
    """Every exponent with several sign-mantissa bytes (on a GPU: every bit pattern), alone
    (97% escapes: RAW) and between Gaussian values (the coded path, with both codebooks)."""
    pats = _corner_patterns() if dev.simulated else np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert _roundtrip(dev, pats, Codebook.from_sigma(0.02)).raw
    mix = np.empty(2 * pats.size, np.uint16)
    mix[0::2] = pats
    mix[1::2] = gaussian_bits(pats.size, seed=1)
    for cb in (Codebook.from_sigma(0.02), Codebook.from_histogram(mix, dtype="bfloat16")):
        h = _roundtrip(dev, mix, cb)
        # 249 of every 256 exponents are outside any 7-entry codebook
        assert not h.raw and h.n_escapes >= pats.size * 249 // 256


def test_random_bits_take_the_raw_fallback(dev):
    bits = np.random.default_rng(3).integers(0, 1 << 16, dev.size(3001, 1 << 20), dtype=np.uint16)
    assert _roundtrip(dev, bits, Codebook.from_sigma(0.02)).raw


@long_under_simulator
def test_workspace_is_reused_across_calls(dev):
    ws = gpu_workspace.Workspace(8192)
    cb = Codebook.from_sigma(0.02)
    for seed in range(3):  # each call must see only its own status words
        bits = gaussian_bits(4096 + 1000 * seed, seed=seed)
        buf = dev.full(fmt.max_compressed_size(bits.size), 0, np.uint8)
        gpu.encode_into(dev.asarray(bits), buf, cb, workspace=ws)
        frame = dev.to_host(buf)[:ws.last_frame_len()]
        assert np.array_equal(frame, reference.encode(bits, cb, checksum=False))
    slots = ws._slots()
    assert slots[_common.WS_EPOCH] == 3 and slots[_common.WS_TICKET] == 0


def _expect_rejected(dev: Device, frame: np.ndarray, n: int, bit: int,
                     says: str = "corrupted|not a zipccl") -> None:
    """The reference, the device decoder (error bit, no stray write) and decompress all refuse."""
    with pytest.raises(ValueError):
        reference.decode(frame)
    _, err = _decode(dev, frame, n)
    assert err & bit, f"error bits {err:#x}, expected {bit:#x}"
    with pytest.raises(ValueError, match=says):
        gpu.decompress(dev.asarray(frame))


@long_under_simulator
def test_corrupted_frames_are_rejected_without_stray_writes(dev):
    n = dev.size(1000, 100_000)
    bits = gaussian_bits(n, seed=dev.size(11, 5))
    frame = reference.encode(bits, Codebook.from_sigma(0.02))
    h = fmt.parse_header(frame)
    assert not h.raw and h.n_escapes > 9
    lay = fmt.Layout.for_count(n)
    cases = [(0, 0x01, errors.ERR_HEADER), (0, 0x04, errors.ERR_HEADER),  # magic
             (60, 0x01, errors.ERR_HEADER_CRC),  # a shape byte: only the CRC
             (60, 0x04, errors.ERR_HEADER_CRC),
             (lay.plane_offset(1) + 5, 0x10, errors.ERR_CHECKSUM),  # one code bit
             (lay.plane_offset(2) + 77, 0x04, errors.ERR_CHECKSUM),
             (lay.escapes_offset + 3, 0x01, errors.ERR_CHECKSUM),  # one escaped exponent
             (lay.escapes_offset + 9, 0x04, errors.ERR_CHECKSUM),
             (lay.sm_offset + 1234 % n, 0x04, errors.ERR_CHECKSUM)]  # a sign-mantissa byte
    for pos, mask, bit in cases:
        f = frame.copy()
        f[pos] ^= mask
        _expect_rejected(dev, f, n, bit)
    f = frame.copy()
    f[lay.counts_offset] = 200  # block 0 claims 200 escapes
    _expect_rejected(dev, f, n, errors.ERR_COUNTS)
    f = frame.copy()
    second = lay.counts_offset + 4 * min(1, lay.n_blocks - 1)
    f[second:second + 4] = 255  # an impossible count
    _expect_rejected(dev, f, n, errors.ERR_COUNTS)
    _expect_rejected(dev, frame[:-1].copy(), n, errors.ERR_HEADER, says="truncated")
    _, err = _decode(dev, frame, n + 1)  # output of the wrong size
    assert err & errors.ERR_HEADER


def _decode_by(dev: Device, frame: np.ndarray, n: int, dtype: str, warps: bool) -> tuple[np.ndarray, int]:
    """(output bits, error bits) of the block decoder (``warps`` False) or the warp-a-tile decoder
    (``kernels.decode_warps``) forced, through the kernels' own launch functions."""
    from zipccl.kernels import decode, decode_fp16, runtime

    code = fmt.DTYPE_FP32 if dtype == "float32" else fmt.DTYPE_BF16
    lay = fmt.Layout.for_count(n, code)
    fb = dev.asarray(frame)
    out = dev.full(n, 0, np.uint32 if code == fmt.DTYPE_FP32 else np.uint16)
    ws = gpu_workspace.Workspace(max(n, 1))
    nb = frame.size
    v = runtime.view
    f = (v(fb, nb, np.uint8), v(fb, nb // 4, np.uint32), v(fb, nb // 8, np.int64))
    if code == fmt.DTYPE_FP32:
        decode_fp16.launch(f[0], v(fb, nb // 2, np.uint16), f[1], f[2], v(out, n, np.uint32),
                           v(out, 2 * n, np.uint16), ws.array, lay, _common.CRC_ZERO, runtime.crc_table(), 0,
                           warps=warps)
    else:
        decode.launch(*f, v(out, (n & ~7) // 2, np.uint32), v(out, n, np.uint16), ws.array, lay,
                      _common.CRC_ZERO, runtime.crc_table(), 0, warps=warps)
    return dev.to_host(out), ws.last_error()


_SLOW_HERE = [pytest.mark.slow] if SIMULATOR else []  # long_under_simulator, for one parameter set


@pytest.mark.parametrize("dtype, tiles", [("bfloat16", 3), pytest.param("float32", 3, marks=_SLOW_HERE),
                                          pytest.param("bfloat16", 9, marks=_SLOW_HERE)])
def test_block_and_warp_decoders_agree(dev, dtype, tiles):
    """The warp-a-tile decoder (large frames) and the block decoder (small ones) give the values
    back bit for bit from several-tile frames (a partial last tile, escapes in every tile, with
    and without a checksum, a RAW frame), and the same error bits on corrupted frames. Under the
    simulator (2 blocks, 8 warps) 9 tiles take the ticket counter after the first wave."""
    code = fmt.DTYPE_FP32 if dtype == "float32" else fmt.DTYPE_BF16
    n = dev.size((tiles - 1) * fmt.BLOCK + 77, tiles * 1_000_003)
    rng = np.random.default_rng(17)
    x = rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32)
    x[::997] = 0x7F800000  # escapes in every tile
    bits = x if code == fmt.DTYPE_FP32 else (x >> 16).astype(np.uint16)
    cb = Codebook.from_sigma(0.02)
    frames = [reference.encode(bits, cb, None, cs, dtype=code) for cs in (True, False)]
    noise = rng.integers(0, 1 << 16, n).astype(bits.dtype)
    frames.append(reference.encode(noise, cb, None, True, dtype=code))
    assert fmt.parse_header(frames[-1]).raw and not fmt.parse_header(frames[0]).raw
    for frame in frames:
        want, _ = reference.decode(frame)
        for warps in (False, True):
            got, err = _decode_by(dev, frame, n, dtype, warps)
            assert err == 0 and np.array_equal(got, want.reshape(-1)), f"warps={warps}"
    lay = fmt.Layout.for_count(n, code)
    for at, value in ((lay.counts_offset + 4, 0x33), (lay.counts_offset + 5, 0x20),
                      (fmt.HEADER_SIZE + 7, 0x01)):
        f = frames[0].copy()
        f[at] ^= value
        errs = [_decode_by(dev, f, n, dtype, warps)[1] for warps in (False, True)]
        assert errs[0] != 0 and errs[0] == errs[1], f"byte {at}: error bits {errs}"


@simulator_only
def test_warp_decoder_scan_over_several_chunks():
    """The warp decoder's scan of the stored counts, built with 4 counts a thread (chunks of 512
    tiles) over 3 chunks and a part, with one tile's count above its values: every tile's prefix
    (its chunk's prefix + its status word) is NumPy's cumulative sum of the clamped counts, and
    the finished-blocks counter is back at 0 for the next call."""
    from zipccl.kernels import decode_warps as dw
    from zipccl.kernels import runtime
    from zipccl.kernels.layout import layout_tuple

    n = 3 * 512 * fmt.BLOCK + 5 * fmt.BLOCK + 77
    x = gaussian_bits(n, seed=23)
    x[::1013] = 0x7F80
    frame = reference.encode(x, Codebook.from_sigma(0.02), None, False)
    lay = fmt.Layout.for_count(n)
    counts = frame[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].view("<u4").astype(np.int64)
    frame[lay.counts_offset + 4 * 600:lay.counts_offset + 4 * 601] = np.frombuffer(
        np.uint32(9999).tobytes(), np.uint8)  # tile 600 claims more escapes than it has values
    counts[600] = fmt.BLOCK
    want = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ws = gpu_workspace.Workspace(n)
    nb = frame.size
    v = runtime.view
    chunks = -(-lay.n_blocks // 512)
    dw._scan_kernel(False, 4)[chunks, _common.TPB](v(frame, nb, np.uint8), v(frame, nb // 4, np.uint32),
                                                   v(frame, nb // 8, np.int64), ws.array, layout_tuple(lay))
    a = ws.array
    t = np.arange(lay.n_blocks)
    got = a[_common.WS_CHUNK_PREFIXES + (t >> 9)] + a[_common.WS_STATUS + t]
    assert chunks == 4 and np.array_equal(got, want) and a[_common.WS_CHUNKS] == 0


def test_checksum_free_frame_with_bad_counts(dev):
    """Without a checksum the escape counts still catch a flipped code bit."""
    n = 1000
    bits = gaussian_bits(n, seed=11)
    frame = reference.encode(bits, Codebook.from_sigma(0.02), checksum=False)
    lay = fmt.Layout.for_count(n)
    planes = [reference.unpack_plane(frame[lay.plane_offset(k):lay.plane_offset(k) + 4 *
                                     lay.plane_words].copy().view("<u4"), n) for k in range(3)]
    assert all(p.size == n for p in planes)
    # find an escape (code 0) and give it code 1: its block count no longer matches
    i = int(np.flatnonzero((planes[0] | planes[1] | planes[2]) == 0)[0])
    f = frame.copy()
    f[lay.plane_offset(0) + i // 8] |= 1 << (i % 8)
    with pytest.raises(ValueError):
        reference.decode(f)
    _, err = _decode(dev, f, n)
    assert err & errors.ERR_COUNTS, f"error bits {err:#x}"


@long_under_simulator
def test_compress_and_decompress(dev):
    rows = dev.size(50, 7)
    bits = gaussian_bits(rows * dev.size(100, 17_637), seed=dev.size(2, 9))
    x = dev.asarray(bits).reshape(rows, -1)
    frame = gpu.compress(x, dtype="bfloat16")
    ref = reference.encode(bits, Codebook.from_sample(bits), tuple(x.shape))
    assert np.array_equal(dev.to_host(frame), ref)
    y = gpu.decompress(frame)
    assert tuple(y.shape) == tuple(x.shape)
    assert np.array_equal(dev.to_host(y).reshape(-1), bits)
    bad = dev.to_host(frame)
    bad[fmt.Layout.for_count(bits.size).escapes_offset] ^= 4
    with pytest.raises(ValueError, match="checksum"):
        gpu.decompress(dev.asarray(bad))
    with pytest.raises(ValueError, match="magic"):
        gpu.decompress(dev.asarray(np.zeros(256, np.uint8)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_public_round_trip_of_each_type(dev, dtype):
    """``compress`` / ``decompress`` of a small array of each type, the codebook chosen on
    the device (the quick share of the longer ``test_compress_and_decompress`` cases):
    the reference's frame, and the bits back."""
    n = dev.size(1100, 100_003)
    if dtype == "bfloat16":
        bits = gaussian_bits(n, seed=31)
        x, kw = dev.asarray(bits), {"dtype": "bfloat16"}
    else:
        values = np.random.default_rng(31).normal(0, 0.01, n).astype(dtype)
        bits = values.view(np.uint32 if dtype == "float32" else np.uint16)
        x, kw = dev.asarray(values), {}
    frame = gpu.compress(x, **kw)
    cb = Codebook.from_sample(bits, dtype=dtype)
    assert np.array_equal(dev.to_host(frame), reference.encode(bits, cb, (n,), dtype=dtype))
    y = gpu.decompress(frame)
    assert tuple(y.shape) == (n,) and np.array_equal(dev.to_host(y).reshape(-1).view(bits.dtype), bits)



def _plan_route_input(dtype: str, n: int) -> np.ndarray:
    """Bit patterns of n Gaussian values of ``dtype`` with an escape (an exponent no codebook
    of N(0, 0.02) holds: inf, NaN, a large or a subnormal value) every 613 values: escapes in
    every tile."""
    rng = np.random.default_rng(61)
    values = rng.normal(0, 0.02, n).astype(np.float32 if dtype == "bfloat16" else dtype)
    if dtype == "bfloat16":
        bits = (values.view(np.uint32) >> 16).astype(np.uint16)
        specials = np.array([0x7F80, 0xFFC1, 0x4780, 0x0001], np.uint16)
    elif dtype == "float32":
        bits = values.view(np.uint32).copy()
        specials = np.array([0x7F800000, 0xFFC00001, 0x47800000, 0x00000001], np.uint32)
    else:
        bits = values.view(np.uint16).copy()
        specials = np.array([0x7C00, 0xFE01, 0x7BFF, 0x0001], np.uint16)
    bits[::613] = np.resize(specials, bits[::613].size)
    return bits


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_plan_route_matches_reference(dev, dtype):
    """The GPU's launch route (``encode.Plan`` / ``WidePlan``, ``decode.Plan`` /
    ``decode_fp16.Plan``: packed parameters, one launch per step; under the simulator with
    ``kernels/simlaunch.py`` in place of the driver's launch): tiles with escapes in each,
    encoded (BF16: twice, into other buffers: the cached plan, retargeted) and decoded from the
    reference's frame, bit for bit."""
    from contextlib import nullcontext

    code = {"bfloat16": fmt.DTYPE_BF16, "float32": fmt.DTYPE_FP32, "float16": fmt.DTYPE_FP16}[dtype]
    n = fmt.BLOCK + 1003 if dev.simulated else 3 * (1 << 20) + 1003  # 2 tiles; on a GPU 769
    bits = _plan_route_input(dtype, n)
    cb = Codebook.from_histogram(bits, dtype=dtype)
    ref = reference.encode(bits, cb, dtype=dtype)
    assert fmt.parse_header(ref).n_escapes >= n // 613 and not fmt.parse_header(ref).raw
    view = {"bfloat16": np.uint16, "float32": np.float32, "float16": np.float16}[dtype]
    kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    ws = gpu_workspace.Workspace(n)
    with gpu_route.plans_under_simulator() if dev.simulated else nullcontext():
        before = len(gpu_workspace._PLANS)
        for k in range(2 if dtype == "bfloat16" else 1):  # BF16: the plan again, retargeted
            x = dev.asarray(bits.view(view))
            buf = dev.full(fmt.max_compressed_size(n, code) + 256, CANARY, np.uint8)
            gpu.encode_into(x, buf, cb, checksum=True, workspace=ws, **kw)
            host = dev.to_host(buf)
            assert np.array_equal(host[:ref.size], ref), f"encode {k}"
            assert np.all(host[ref.size:] == CANARY), "encoder wrote past the end of its frame"
        out = dev.full(n * bits.itemsize, 0, np.uint8)
        gpu.decode_into(dev.asarray(ref), out.view(view), workspace=ws, **kw)
        assert ws.last_error() == 0
        assert np.array_equal(dev.to_host(out).view(bits.dtype), bits)
        # one encode plan, one decode plan
        assert len(gpu_workspace._PLANS) == before + 2 or not dev.simulated

@long_under_simulator
def test_decompress_of_frames_that_change_under_it(dev):
    """``decompress`` decodes at once with the header it saw last on the frame buffer or the
    stream, then checks: every way the next frame can differ (count, shape, element type,
    a corrupted payload, a bad header, the same buffer rewritten) gives the right values or
    the right error, with one buffer reused and with new ones."""
    a = gaussian_bits(dev.size(3000, 300_003), seed=21)  # rows = 3 divides it
    b = gaussian_bits(dev.size(1000, 100_003), seed=22)
    f32 = np.random.default_rng(23).normal(0, 1e-3, dev.size(700, 70_001)).astype(np.float32)

    def frame(bits, shape=None, code=fmt.DTYPE_BF16):
        bits = bits.view(np.uint32) if code == fmt.DTYPE_FP32 else bits
        return reference.encode(bits, Codebook.from_sample(bits, dtype=code), shape, True, dtype=code)

    def check(host_frame, want, shape, buf=None):
        if buf is None:
            buf = dev.asarray(host_frame)
        else:  # the same buffer, rewritten
            buf[:host_frame.size] = dev.asarray(host_frame)
        y = gpu.decompress(buf if buf.size == host_frame.size else buf[:host_frame.size])
        assert tuple(y.shape) == shape
        got = dev.to_host(y).reshape(-1)
        assert np.array_equal(got.view(want.dtype), want.reshape(-1))

    rows = 3
    for _ in range(2):  # the second round meets guesses left by the first
        check(frame(a), a, (a.size,))
        check(frame(a), a, (a.size,))
        check(frame(a, (rows, a.size // rows)), a, (rows, a.size // rows))
        check(frame(b), b, (b.size,))
        check(frame(f32, code=fmt.DTYPE_FP32), f32.view(np.uint32), (f32.size,))
        check(frame(a), a, (a.size,))
    shared = dev.full(fmt.max_compressed_size(a.size), 0, np.uint8)
    for bits in (a, b, a, a):
        check(frame(bits), bits, (bits.size,), shared)
    bad = frame(a).copy()
    bad[fmt.Layout.for_count(a.size).escapes_offset] ^= 4
    check(frame(a), a, (a.size,))
    with pytest.raises(ValueError, match="checksum"):
        gpu.decompress(dev.asarray(bad))
    bad = frame(a).copy()
    bad[0] ^= 1
    with pytest.raises(ValueError, match="magic"):
        gpu.decompress(dev.asarray(bad))
    check(frame(a), a, (a.size,))


def test_sigma_and_histogram_on_the_device(dev):
    bits = gaussian_bits(dev.size(20000, 3_000_017), sigma=dev.size(0.013, 0.007), seed=dev.size(4, 2))
    assert gpu_codebook.estimate_sigma(dev.asarray(bits)) == pytest.approx(estimate_sigma(bits), rel=1e-12)
    assert gpu_codebook.sample_codebook(dev.asarray(bits)) == Codebook.from_sample(bits)
    c = edge_corpus()
    assert gpu_codebook.estimate_sigma(dev.asarray(c)) == pytest.approx(estimate_sigma(c), rel=1e-12)
    assert gpu_codebook.histogram_codebook(dev.asarray(c)) == Codebook.from_histogram(c, dtype="bfloat16")
    half_zero = gaussian_bits(dev.size(30000, 200_000), seed=9)
    half_zero[1::2] = 0  # not Gaussian: from_sample falls back to the sample's top-7
    assert gpu_codebook.sample_codebook(dev.asarray(half_zero)) == Codebook.from_sample(half_zero)


@long_under_simulator
def test_default_codebook_is_chosen_on_the_device_as_on_the_host(dev):
    rng = np.random.default_rng(11)
    if dev.simulated:
        gaussians = [gaussian_bits(20000, sigma=0.013, seed=4)]
    else:  # sigmas over 40 octaves
        gaussians = [gaussian_bits(1_000_003, sigma=s, seed=i)
                     for i, s in enumerate(np.exp2(rng.uniform(-30, 10, 24)))]
    g = gaussians[0]
    half_zero = gaussian_bits(dev.size(9000, 200_000), seed=9)
    half_zero[1::2] = 0  # the sample's top-7 replaces the sigma window
    nan_only = np.full(dev.size(300, 999), 0x7FC0, np.uint16)  # no finite value: sigma 0, window at 0
    heavy = (g.astype(np.uint32) + (np.arange(g.size) % 5 == 0) * (40 << 7)).astype(np.uint16)
    random_bits = rng.integers(0, 1 << 16, dev.size(3001, 70_001), dtype=np.uint16)
    for bits in [*gaussians, half_zero, nan_only, heavy, edge_corpus(), random_bits,
                 gaussian_bits(7, seed=1), np.zeros(0, np.uint16)]:
        x = dev.asarray(bits)
        ws = gpu_workspace.Workspace(max(bits.size, 1))
        gpu_codebook._choose_on_device(x, bits.size, ws, None)
        cb = int(ws._slots()[_common.WS_CODEBOOK])
        got = tuple((cb >> (8 * i)) & 0xFF for i in range(7))
        assert got == Codebook.from_sample(bits).exponents, bits[:8]
        if not dev.simulated:  # (a simulated compress takes seconds; one follows the loop)
            frame = gpu.compress(x, dtype="bfloat16")
            assert np.array_equal(dev.to_host(frame),
                                  reference.encode(bits, Codebook.from_sample(bits)))
    frame = gpu.compress(dev.asarray(half_zero), dtype="bfloat16", checksum=False)
    assert np.array_equal(dev.to_host(frame),
                          reference.encode(half_zero, Codebook.from_sample(half_zero), None, False))


def test_misaligned_buffers_and_untyped_values_are_refused(dev):
    bits = gaussian_bits(1000, seed=9)
    frame = dev.full(fmt.max_compressed_size(bits.size), 0, np.uint8)
    with pytest.raises(ValueError, match="aligned"):
        gpu.encode_into(dev.asarray(bits)[1:], frame, Codebook.from_sigma(0.02))
    with pytest.raises(TypeError):
        gpu.compress(dev.asarray(bits))  # uint16 without dtype="bfloat16"


# ---------------------------------------------------------------- host-only tables


def test_header_crc_table_reproduces_zlib():
    import zlib

    rng = np.random.default_rng(0)
    for _ in range(20):
        msg = rng.integers(0, 256, 124, dtype=np.uint8)
        bits = np.unpackbits(msg, bitorder="little").astype(bool)
        crc = _common.CRC_ZERO
        for t in _common.CRC_TABLE[bits]:
            crc ^= int(t)
        assert crc == zlib.crc32(msg.tobytes())


# ---------------------------------------------------------------- a real GPU only


@pytest.fixture(scope="module")
def cp():
    return _cupy_with_a_device()


@pytest.mark.gpu
def test_one_gib(cp):
    from zipccl.codec import cpu

    n = 1 << 29  # 1 GiB of BF16
    rs = cp.random.RandomState(7)
    u = (rs.standard_normal(n, dtype=cp.float32) * cp.float32(0.02)).view(cp.uint32)
    bits = ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)
    del u
    cb = Codebook.from_sigma(0.02)
    frame = cp.empty(fmt.max_compressed_size(n), cp.uint8)
    ws = gpu_workspace.Workspace(n)
    gpu.encode_into(bits, frame, cb, checksum=True, workspace=ws)
    flen = ws.last_frame_len()
    host_bits = cp.asnumpy(bits)
    assert np.array_equal(cp.asnumpy(frame[:flen]), cpu.encode(host_bits, cb, None, True))
    out = cp.zeros(n, cp.uint16)
    gpu.decode_into(frame, out, workspace=ws)
    assert ws.last_error() == 0
    assert int(cp.count_nonzero(out != bits)) == 0


@pytest.mark.gpu
def test_graph_replay_with_new_data(cp):
    """The no-sync entry points inside a CUDA graph: the workspace state lives on the device."""
    n = 300_001
    cb = Codebook.from_sigma(0.02)
    src = cp.zeros(n, cp.uint16)
    frame = cp.zeros(fmt.max_compressed_size(n), cp.uint8)
    out = cp.zeros(n, cp.uint16)
    ws = gpu_workspace.Workspace(n)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        src.set(gaussian_bits(n, seed=0))
        gpu.encode_into(src, frame, cb, s, checksum=True, workspace=ws)  # compile outside capture
        gpu.decode_into(frame, out, s, workspace=ws)
        s.synchronize()
        s.begin_capture()
        gpu.encode_into(src, frame, cb, s, checksum=True, workspace=ws)
        gpu.decode_into(frame, out, s, workspace=ws)
        g = s.end_capture()
        for seed in (1, 2, 3):
            bits = gaussian_bits(n, sigma=0.02 * seed, seed=seed)
            src.set(bits)
            g.launch(s)
            s.synchronize()
            ref = reference.encode(bits, cb)
            assert np.array_equal(cp.asnumpy(frame[:ref.size]), ref)
            assert np.array_equal(cp.asnumpy(out), bits) and ws.last_error(s) == 0


@pytest.mark.gpu
def test_top_level_api_on_cupy_torch_numba(cp):
    import zipccl

    bits = gaussian_bits(7 * 17_637, seed=9)
    x = cp.asarray(bits).reshape(7, -1)
    frame = zipccl.compress(x, dtype="bfloat16")
    assert np.array_equal(cp.asnumpy(frame), reference.encode(bits, Codebook.from_sample(bits),
                                                                 tuple(x.shape)))
    y = zipccl.decompress(frame)
    assert isinstance(y, cp.ndarray) and np.array_equal(cp.asnumpy(y).reshape(-1), bits)
    with pytest.raises(TypeError):
        zipccl.compress(x)  # uint16 without dtype="bfloat16"
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).cuda()
    ft = zipccl.compress(t)
    assert isinstance(ft, torch.Tensor) and ft.is_cuda and ft.dtype == torch.uint8
    yt = zipccl.decompress(ft)
    assert yt.dtype == torch.bfloat16 and torch.equal(yt.view(torch.int16), t.view(torch.int16))
    from numba import cuda

    xn = cuda.to_device(bits)
    fn = gpu.compress(xn, sigma=0.02, dtype="bfloat16")
    assert np.array_equal(fn.copy_to_host(), reference.encode(bits, Codebook.from_sigma(0.02)))
