"""The GPU codec on a real GPU: frames byte-identical to the reference, both ways.

``pytest -m gpu``. Same checks as test_kernels_sim.py at full size: odd sizes,
the edge corpus, all 65,536 bit patterns (as a RAW frame and, interleaved with
Gaussian values, through the coded path), random data, corrupted frames (error
bits, ValueError, no write outside the output), 1 GiB of data, CUDA graph
replay of the no-sync entry points, and CuPy / torch / Numba arrays.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import edge_corpus, gaussian_bits

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("needs a real GPU, not the simulator")
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    return cupy


def _mods():
    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, reference
    return fmt, Codebook, gpu, reference


def _gpu_frame(cp, bits_host, cb, checksum=True):
    fmt, _, gpu, _ = _mods()
    n = bits_host.size
    buf = cp.full(fmt.max_compressed_size(n) + 256, 0xAB, dtype=cp.uint8)
    gpu.encode_into(cp.asarray(bits_host), buf, cb, checksum=checksum)
    flen = int(cp.asnumpy(buf[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8]).view("<i8")[0])
    host = cp.asnumpy(buf)
    assert np.all(host[flen:] == 0xAB), "encoder wrote past its frame"
    return host[:flen]


def _gpu_decode(cp, frame_host, n):
    _, _, gpu, _ = _mods()
    guard = cp.full(n + 64, 0x5A5A, dtype=cp.uint16)
    ws = gpu.Workspace(max(n, 1))
    gpu.decode_into(cp.asarray(frame_host), guard[32:32 + n], workspace=ws)
    err = ws.last_error()
    g = cp.asnumpy(guard)
    assert np.all(g[:32] == 0x5A5A) and np.all(g[32 + n:] == 0x5A5A), "decoder wrote outside its output"
    return g[32:32 + n], err


def _roundtrip(cp, bits, cb, checksum=True):
    fmt, _, _, reference = _mods()
    ref = reference.encode(bits, cb, checksum=checksum)
    got = _gpu_frame(cp, bits, cb, checksum)
    assert got.size == ref.size and np.array_equal(got, ref)
    dec, err = _gpu_decode(cp, ref, bits.size)
    assert err == 0 and np.array_equal(dec, bits)
    back, _ = reference.decode(got)
    assert np.array_equal(back.reshape(-1), bits)
    return fmt.parse_header(ref)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 31, 33, 100, 1000, 4095, 4096, 4097, 65537, 1_000_003])
def test_sizes_match_reference(cp, n):
    _, Codebook, _, _ = _mods()
    _roundtrip(cp, gaussian_bits(n, seed=n), Codebook.from_sigma(0.02), checksum=n % 2 == 1)


def test_edge_corpus(cp):
    _, Codebook, _, _ = _mods()
    c = edge_corpus()
    assert not _roundtrip(cp, c, Codebook.from_histogram(c, dtype="bfloat16")).raw
    assert _roundtrip(cp, c, Codebook.from_sigma(0.02)).raw


def test_all_65536_bit_patterns(cp):
    _, Codebook, _, _ = _mods()
    pats = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert _roundtrip(cp, pats, Codebook.from_sigma(0.02)).raw  # 97% escapes: RAW
    mix = np.empty(2 * pats.size, np.uint16)  # every pattern through the coded path
    mix[0::2] = pats
    mix[1::2] = gaussian_bits(pats.size, seed=1)
    for cb in (Codebook.from_sigma(0.02), Codebook.from_histogram(mix, dtype="bfloat16")):
        h = _roundtrip(cp, mix, cb)
        assert not h.raw and h.n_escapes > 60000


def test_random_bits_raw(cp):
    _, Codebook, _, _ = _mods()
    bits = np.random.default_rng(3).integers(0, 1 << 16, 1 << 20, dtype=np.uint16)
    assert _roundtrip(cp, bits, Codebook.from_sigma(0.02)).raw


def test_corrupted_frames(cp):
    fmt, Codebook, gpu, reference = _mods()
    from zipccl.kernels import _common as c

    bits = gaussian_bits(100_000, seed=5)
    frame = reference.encode(bits, Codebook.from_sigma(0.02))
    lay = fmt.Layout.for_count(bits.size)
    cases = [(0, c.ERR_HEADER), (60, c.ERR_HEADER_CRC), (lay.plane_offset(2) + 77, c.ERR_CHECKSUM),
             (lay.escapes_offset + 9, c.ERR_CHECKSUM), (lay.sm_offset + 1234, c.ERR_CHECKSUM)]
    for pos, bit in cases:
        f = frame.copy()
        f[pos] ^= 0x04
        with pytest.raises(ValueError):
            reference.decode(f)
        _, err = _gpu_decode(cp, f, bits.size)
        assert err & bit, (pos, err)
        with pytest.raises(ValueError, match="corrupted|not a zipccl"):
            gpu.decompress(cp.asarray(f))
    f = frame.copy()
    f[lay.counts_offset + 4:lay.counts_offset + 8] = 255  # an impossible count
    _, err = _gpu_decode(cp, f, bits.size)
    assert err & c.ERR_COUNTS
    _, err = _gpu_decode(cp, frame[:-1], bits.size)  # truncated
    assert err & c.ERR_HEADER
    with pytest.raises(ValueError, match="truncated"):
        gpu.decompress(cp.asarray(frame[:-1]))


def test_one_gib(cp):
    fmt, Codebook, gpu, _ = _mods()
    from zipccl.codec import cpu

    n = 1 << 29  # 1 GiB of BF16
    rs = cp.random.RandomState(7)
    u = (rs.standard_normal(n, dtype=cp.float32) * cp.float32(0.02)).view(cp.uint32)
    bits = ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)
    del u
    cb = Codebook.from_sigma(0.02)
    frame = cp.empty(fmt.max_compressed_size(n), cp.uint8)
    ws = gpu.Workspace(n)
    gpu.encode_into(bits, frame, cb, checksum=True, workspace=ws)
    flen = ws.last_frame_len()
    host_bits = cp.asnumpy(bits)
    assert np.array_equal(cp.asnumpy(frame[:flen]), cpu.encode(host_bits, cb, None, True))
    out = cp.zeros(n, cp.uint16)
    gpu.decode_into(frame, out, workspace=ws)
    assert ws.last_error() == 0
    assert int(cp.count_nonzero(out != bits)) == 0


def test_graph_replay_with_new_data(cp):
    """The no-sync entry points inside a CUDA graph: the workspace state lives on the device."""
    fmt, Codebook, gpu, reference = _mods()
    n = 300_001
    cb = Codebook.from_sigma(0.02)
    src = cp.zeros(n, cp.uint16)
    frame = cp.zeros(fmt.max_compressed_size(n), cp.uint8)
    out = cp.zeros(n, cp.uint16)
    ws = gpu.Workspace(n)
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


def test_convenience_api_cupy_torch_numba(cp):
    import zipccl
    fmt, Codebook, gpu, reference = _mods()
    bits = gaussian_bits(7 * 17_637, seed=9)
    x = cp.asarray(bits).reshape(7, -1)
    frame = zipccl.compress(x, dtype="bfloat16")
    assert np.array_equal(cp.asnumpy(frame), reference.encode(bits, Codebook.from_sample(bits),
                                                                 tuple(x.shape)))
    y = zipccl.decompress(frame)
    assert isinstance(y, cp.ndarray) and np.array_equal(cp.asnumpy(y).reshape(-1), bits)
    with pytest.raises(TypeError):
        zipccl.compress(x)  # uint16 without dtype="bfloat16"
    with pytest.raises(ValueError, match="aligned"):
        gpu.encode_into(cp.asarray(bits)[1:], cp.zeros(fmt.max_compressed_size(bits.size), cp.uint8),
                        Codebook.from_sigma(0.02))
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


def test_device_statistics_match_host(cp):
    _, Codebook, gpu, _ = _mods()
    from zipccl.codebook import estimate_sigma

    bits = gaussian_bits(3_000_017, sigma=0.007, seed=2)
    assert gpu.estimate_sigma(cp.asarray(bits)) == pytest.approx(estimate_sigma(bits), rel=1e-12)
    assert gpu.sample_codebook(cp.asarray(bits)) == Codebook.from_sample(bits)
    c = edge_corpus()
    assert gpu.histogram_codebook(cp.asarray(c)) == Codebook.from_histogram(c, dtype="bfloat16")


def test_default_codebook_chosen_on_the_device_equals_the_hosts(cp):
    _, Codebook, gpu, reference = _mods()
    from zipccl.kernels._common import WS_CODEBOOK

    rng = np.random.default_rng(11)
    cases = [gaussian_bits(1_000_003, sigma=s, seed=i) for i, s in
             enumerate(np.exp2(rng.uniform(-30, 10, 24)))]
    half_zero = gaussian_bits(200_000, seed=9)
    half_zero[1::2] = 0
    cases += [half_zero, edge_corpus(), np.full(999, 0x7FC0, np.uint16), rng.integers(0, 1 << 16, 70_001,
                                                                                      dtype=np.uint16)]
    for bits in cases:
        x = cp.asarray(bits)
        ws = gpu.Workspace(bits.size)
        gpu._choose_on_device(x, bits.size, ws, None)
        cb = int(ws._slots()[WS_CODEBOOK])
        assert tuple((cb >> (8 * i)) & 0xFF for i in range(7)) == Codebook.from_sample(bits).exponents
        frame = gpu.compress(x, dtype="bfloat16")
        assert np.array_equal(cp.asnumpy(frame), reference.encode(bits, Codebook.from_sample(bits)))
