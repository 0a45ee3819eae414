"""The GPU codec kernels under Numba's CUDA simulator: the same bytes as the reference.

Runs in ``make test`` on machines without a GPU. The simulator must be switched on
before numba.cuda is first imported, so unless this process already runs with
NUMBA_ENABLE_CUDASIM=1, one test re-runs this module in a subprocess with it set
and the tests proper are skipped here (the rest of the suite never sees the
simulator). Sizes are small: every simulated CUDA block costs 128 Python threads.
The GPU versions of these checks, at full size and with all 65,536 bit patterns,
are in test_gpu_codec.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import edge_corpus, gaussian_bits

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
sim = pytest.mark.skipif(not SIM, reason="runs in the simulator subprocess (test_under_simulator)")


@pytest.mark.skipif(SIM, reason="already under the simulator")
def test_under_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-W", "ignore::RuntimeWarning", str(Path(__file__).resolve())],
                       env=env, cwd=root, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "skipped" in r.stdout  # the wrapper itself is skipped there


if SIM:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NumPy int64 wrap-around
    from zipccl import format as fmt
    from zipccl.codebook import Codebook, estimate_sigma
    from zipccl.codec import gpu, reference

CANARY = 0xAB


def _encode(bits, cb, checksum=True, shape=None):
    """GPU frame of bits, written into a poisoned buffer larger than needed."""
    n = bits.size
    buf = np.full(fmt.max_compressed_size(n) + 256, CANARY, np.uint8)
    gpu.encode_into(bits, buf, cb, checksum=checksum, shape=shape)
    flen = int(buf[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8].view("<i8")[0])
    assert np.all(buf[flen:] == CANARY), "encoder wrote past the end of its frame"
    return buf[:flen].copy()


def _decode(frame, n, ws=None):
    """(values, error bits) of a GPU decode into a canary-guarded output."""
    ws = ws or gpu.Workspace(max(n, 1))
    guard = np.full(n + 64, 0x5A5A, np.uint16)
    out = guard[32:32 + n]
    gpu.decode_into(frame, out, workspace=ws)
    assert np.all(guard[:32] == 0x5A5A) and np.all(guard[32 + n:] == 0x5A5A), \
        "decoder wrote outside its output"
    return out.copy(), ws.last_error()


def _check_roundtrip(bits, cb, checksum=True):
    ref = reference.encode(bits, cb, checksum=checksum)
    frame = _encode(bits, cb, checksum)
    assert frame.size == ref.size and np.array_equal(frame, ref)
    got, err = _decode(ref, bits.size)  # reference frame -> GPU decoder
    assert err == 0 and np.array_equal(got.view(np.uint16), bits.view(np.uint16))
    back, _ = reference.decode(frame)  # GPU frame -> reference decoder
    assert np.array_equal(back.reshape(-1), bits)
    return fmt.parse_header(ref)


@sim
@pytest.mark.parametrize("n", [0, 1, 9, 100, 1000, 4097])
def test_gaussian_frames_match_reference(n):
    h = _check_roundtrip(gaussian_bits(n, seed=n), Codebook.from_sigma(0.02))
    if n >= 1000:
        assert not h.raw and h.n_escapes > 0  # the coded path, escapes included


@sim
def test_without_checksum():
    h = _check_roundtrip(gaussian_bits(3000, seed=7), Codebook.from_sigma(0.02), checksum=False)
    assert not h.has_checksum


@sim
def test_edge_corpus():
    c = edge_corpus()
    h = _check_roundtrip(c, Codebook.from_histogram(c, dtype="bfloat16"))
    assert not h.raw  # histogram codebook: coded, with thousands of escapes
    h = _check_roundtrip(c, Codebook.from_sigma(0.02))
    assert h.raw  # nearly everything escapes: the RAW fallback


@sim
def test_every_exponent_and_sign_mantissa_corner():
    """All 256 exponents x 16 sign-mantissa bytes, between Gaussian values (coded path)."""
    sm = np.array([0x00, 0x01, 0x3F, 0x40, 0x7E, 0x7F, 0x55, 0x2A], np.uint16)
    sm = np.concatenate([sm, sm | 0x80])
    e = np.arange(256, dtype=np.uint16)
    pats = (((sm[None, :] & 0x80) << 8) | (e[:, None] << 7) | (sm[None, :] & 0x7F)).reshape(-1)
    mix = np.empty(2 * pats.size, np.uint16)
    mix[0::2] = pats
    mix[1::2] = gaussian_bits(pats.size, seed=3)
    h = _check_roundtrip(mix, Codebook.from_sigma(0.02))
    assert not h.raw


@sim
def test_random_bits_take_the_raw_fallback():
    bits = np.random.default_rng(5).integers(0, 1 << 16, 3001, dtype=np.uint16)
    assert _check_roundtrip(bits, Codebook.from_sigma(0.02)).raw


@sim
def test_workspace_is_reused_across_calls():
    from zipccl.kernels import _common

    ws = gpu.Workspace(8192)
    cb = Codebook.from_sigma(0.02)
    for seed in range(3):  # each call must see only its own status words
        bits = gaussian_bits(4096 + 1000 * seed, seed=seed)
        buf = np.zeros(fmt.max_compressed_size(bits.size), np.uint8)
        gpu.encode_into(bits, buf, cb, workspace=ws)
        assert np.array_equal(buf[:ws.last_frame_len()], reference.encode(bits, cb, checksum=False))
    slots = np.asarray(ws.array._ary)
    assert slots[_common.WS_EPOCH] == 3 and slots[_common.WS_TICKET] == 0


def _valid_frame(n=1000):
    bits = gaussian_bits(n, seed=11)
    frame = reference.encode(bits, Codebook.from_sigma(0.02))
    assert not fmt.parse_header(frame).raw
    return bits, frame


def _expect_rejected(frame, n, bit):
    with pytest.raises(ValueError):
        reference.decode(frame)
    _, err = _decode(frame, n)
    assert err & bit, f"error bits {err:#x}, expected {bit:#x}"


@sim
def test_corrupted_frames_are_rejected_without_stray_writes():
    from zipccl.kernels import _common as c

    bits, frame = _valid_frame()
    lay = fmt.Layout.for_count(bits.size)
    f = frame.copy()
    f[0] ^= 1  # magic
    _expect_rejected(f, bits.size, c.ERR_HEADER)
    f = frame.copy()
    f[60] ^= 1  # a shape byte: only the header CRC notices
    _expect_rejected(f, bits.size, c.ERR_HEADER_CRC)
    f = frame.copy()
    f[lay.plane_offset(1) + 5] ^= 0x10  # one code bit
    _expect_rejected(f, bits.size, c.ERR_CHECKSUM)
    f = frame.copy()
    f[lay.escapes_offset + 3] ^= 0x01  # one escaped exponent
    _expect_rejected(f, bits.size, c.ERR_CHECKSUM)
    f = frame.copy()
    f[lay.counts_offset] = 200  # an impossible escape count
    _expect_rejected(f, bits.size, c.ERR_COUNTS)
    _expect_rejected(frame[:-1], bits.size, c.ERR_HEADER)  # truncated
    _, err = _decode(frame, bits.size + 1)  # output of the wrong size
    assert err & c.ERR_HEADER


@sim
def test_checksum_free_frame_with_bad_counts():
    """Without a checksum the escape counts still catch a flipped code bit."""
    from zipccl.kernels import _common as c

    bits = gaussian_bits(1000, seed=11)
    frame = reference.encode(bits, Codebook.from_sigma(0.02), checksum=False)
    lay = fmt.Layout.for_count(bits.size)
    code0 = reference.unpack_plane(frame[lay.plane_offset(0):].view("<u4")[:lay.plane_words], 1000)
    # find an escape (code 0) and give it code 1: its block count no longer matches
    planes = [reference.unpack_plane(frame[lay.plane_offset(k):lay.plane_offset(k) + 4 *
                                     lay.plane_words].copy().view("<u4"), 1000) for k in range(3)]
    i = int(np.flatnonzero((planes[0] | planes[1] | planes[2]) == 0)[0])
    assert code0.size == 1000
    f = frame.copy()
    f[lay.plane_offset(0) + i // 8] |= 1 << (i % 8)
    _expect_rejected(f, bits.size, c.ERR_COUNTS)


@sim
def test_convenience_api_in_the_simulator():
    bits = gaussian_bits(5000, seed=2).reshape(50, 100)
    frame = gpu.compress(bits, dtype="bfloat16")
    ref = reference.encode(bits, Codebook.from_sample(bits), bits.shape)
    assert np.array_equal(np.asarray(frame), ref)
    y = gpu.decompress(frame)
    assert y.shape == (50, 100) and np.array_equal(np.asarray(y), bits)
    bad = np.array(frame)
    bad[fmt.Layout.for_count(5000).escapes_offset] ^= 4
    with pytest.raises(ValueError, match="checksum"):
        gpu.decompress(bad)
    with pytest.raises(ValueError, match="magic"):
        gpu.decompress(np.zeros(256, np.uint8))


@sim
def test_sigma_and_histogram_on_the_device():
    bits = gaussian_bits(20000, sigma=0.013, seed=4)
    assert gpu.estimate_sigma(bits) == pytest.approx(estimate_sigma(bits), rel=1e-12)
    c = edge_corpus()
    assert gpu.estimate_sigma(c) == pytest.approx(estimate_sigma(c), rel=1e-12)
    assert gpu.histogram_codebook(c) == Codebook.from_histogram(c, dtype="bfloat16")
    half_zero = gaussian_bits(30000, seed=9)
    half_zero[1::2] = 0  # not Gaussian: from_sample falls back to the sample's top-7
    assert gpu.sample_codebook(half_zero) == Codebook.from_sample(half_zero)
    assert gpu.sample_codebook(bits) == Codebook.from_sample(bits)


@sim
def test_default_codebook_is_chosen_on_the_device_as_on_the_host():
    from zipccl.kernels._common import WS_CODEBOOK

    g = gaussian_bits(20000, sigma=0.013, seed=4)
    half_zero = gaussian_bits(9000, seed=9)
    half_zero[1::2] = 0  # the sample's top-7 replaces the sigma window
    nan_only = np.full(300, 0x7FC0, np.uint16)  # no finite value: sigma 0, window at 0
    heavy = (g.astype(np.uint32) + (np.arange(g.size) % 5 == 0) * (40 << 7)).astype(np.uint16)
    for bits in (g, half_zero, nan_only, heavy, edge_corpus(), gaussian_bits(7, seed=1),
                 np.zeros(0, np.uint16)):
        ws = gpu.Workspace(max(bits.size, 1))
        gpu._choose_on_device(bits, bits.size, ws, None)
        cb = int(ws._slots()[WS_CODEBOOK])
        got = tuple((cb >> (8 * i)) & 0xFF for i in range(7))
        assert got == Codebook.from_sample(bits).exponents, bits[:8]
    frame = gpu.compress(half_zero, dtype="bfloat16", checksum=False)
    assert np.array_equal(np.asarray(frame),
                          reference.encode(half_zero, Codebook.from_sample(half_zero), None, False))


@sim
def test_header_crc_table_reproduces_zlib():
    import zlib

    from zipccl.kernels._common import CRC_TABLE, CRC_ZERO

    rng = np.random.default_rng(0)
    for _ in range(20):
        msg = rng.integers(0, 256, 124, dtype=np.uint8)
        bits = np.unpackbits(msg, bitorder="little").astype(bool)
        crc = CRC_ZERO
        for t in CRC_TABLE[bits]:
            crc ^= int(t)
        assert crc == zlib.crc32(msg.tobytes())
