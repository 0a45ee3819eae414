"""``compress`` / ``decompress`` keep what a signature derived (``gpu.py``'s ``_Kept``), checked on
the GPU's launch route under the simulator (``gpu_route.plans_under_simulator``).

A second call of a signature derives nothing (no kept call, plan or workspace); a larger
tensor, another type, stream or checksum setting derive anew; a kept call writes the bytes a
fresh one and the reference write; a frame that differs from the kept header is decoded right
or refused with the host's words.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from conftest import gaussian_bits, simulator_only

from zipccl import format as fmt
from zipccl.codebook import Codebook
from zipccl.codec import gpu, gpu_route, gpu_workspace, reference

pytestmark = simulator_only


@pytest.fixture
def made(monkeypatch):
    """The plan route, no kept calls, and a count of what compress / decompress derive."""
    made = {"compress": 0, "decoder": 0, "workspace": 0}

    def counted(name, fn):
        def call(*a, **k):
            made[name] += 1
            return fn(*a, **k)
        return call

    monkeypatch.setattr(gpu, "_compress_kept", counted("compress", gpu._compress_kept))
    monkeypatch.setattr(gpu, "_decoder_kept", counted("decoder", gpu._decoder_kept))
    monkeypatch.setattr(gpu_workspace.Workspace, "__init__",
                        counted("workspace", gpu_workspace.Workspace.__init__))
    gpu_workspace._CALLS.clear()
    with gpu_route.plans_under_simulator():
        yield made
    gpu_workspace._CALLS.clear()


def _bits(n: int, seed: int, specials: int = 0) -> np.ndarray:
    b = gaussian_bits(n, seed=seed)
    b[:specials] = 0x7F80  # inf: an escape each, so frames of equal n differ in length
    return b


def _ref(bits: np.ndarray, shape=None) -> np.ndarray:
    return reference.encode(bits, Codebook.from_sample(bits), shape)


def test_a_second_call_derives_nothing(made):
    n = 1500
    b1, b2 = _bits(n, 1), _bits(n, 2, specials=40)
    f1 = gpu.compress(b1.copy(), dtype="bfloat16")
    assert made == {"compress": 1, "decoder": 0, "workspace": made["workspace"]}
    plans, before = len(gpu_workspace._PLANS), dict(made)
    f2 = gpu.compress(b2.copy(), dtype="bfloat16")
    assert made == before and len(gpu_workspace._PLANS) == plans
    assert np.array_equal(f1, _ref(b1)) and np.array_equal(f2, _ref(b2)) and f1.size != f2.size
    y1 = gpu.decompress(f1.copy())
    before = dict(made)
    y2 = gpu.decompress(f2.copy())  # a frame of another length: the kept decoder, resized
    assert made == before and len(gpu_workspace._PLANS) == plans
    assert np.array_equal(y1, b1) and np.array_equal(y2, b2)
    out = np.zeros(n, np.uint16)
    gpu.decompress(f1.copy(), out=out)
    before = dict(made)
    assert gpu.decompress(f2.copy(), out=out) is out and np.array_equal(out, b2)
    assert made == before


def test_a_new_signature_derives_anew(made):
    n = 1200
    x = _bits(n, 3)
    gpu.compress(x, dtype="bfloat16")
    for i, (arg, kw) in enumerate([(_bits(2 * n, 4), {"dtype": "bfloat16"}),  # larger
                                   (x.reshape(30, 40), {"dtype": "bfloat16"}),  # another shape
                                   (np.random.default_rng(5).normal(0, 1e-3, n).astype(np.float32), {}),
                                   (x, {"dtype": "bfloat16", "stream": 12345}),  # another stream
                                   (x, {"dtype": "bfloat16", "checksum": False}),
                                   (x, {"dtype": "bfloat16", "sigma": 0.02})]):
        ws = made["workspace"]
        frame = gpu.compress(arg, **kw)
        assert made["compress"] == i + 2, kw
        if "stream" in kw:
            assert made["workspace"] == ws + 1  # a workspace per stream
        h = fmt.parse_header(frame)
        bits = arg.reshape(-1).view(np.uint32 if arg.dtype == np.float32 else np.uint16)
        cb = Codebook.from_sigma(0.02) if "sigma" in kw else Codebook.from_sample(bits, dtype=h.dtype)
        want = reference.encode(bits, cb, arg.shape, kw.get("checksum", True), dtype=h.dtype)
        assert np.array_equal(frame, want), kw
    gpu.compress(x, dtype="bfloat16")
    assert made["compress"] == 7  # the first signature is still kept


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_a_kept_call_writes_a_fresh_calls_bytes(made, dtype):
    n = 1100
    if dtype == "bfloat16":
        x, kw = _bits(n, 6, specials=9), {"dtype": "bfloat16"}
    else:
        x, kw = np.random.default_rng(6).normal(0, 1e-2, n).astype(dtype), {}
    kept = [gpu.compress(x, **kw) for _ in range(2)]
    gpu_workspace._CALLS.clear()
    fresh = gpu.compress(x, **kw)
    assert np.array_equal(kept[0], fresh) and np.array_equal(kept[1], fresh)
    backs = [gpu.decompress(fresh.copy()) for _ in range(2)]
    gpu_workspace._CALLS.clear()
    backs.append(gpu.decompress(fresh.copy()))
    for y in backs:
        assert y.dtype.itemsize == x.dtype.itemsize
        assert np.array_equal(y.view(f"u{y.itemsize}"), x.view(f"u{x.itemsize}"))


def _with_codebook(frame: np.ndarray, codebook: bytes) -> np.ndarray:
    """``frame`` with other codebook bytes and its header CRC made right again."""
    raw = bytearray(frame[:fmt.HEADER_SIZE].tobytes())
    raw[fmt.CODEBOOK_AT:fmt.CODEBOOK_AT + fmt.CODEBOOK_SIZE] = codebook
    raw[-4:] = zlib.crc32(bytes(raw[:-4])).to_bytes(4, "little")
    out = frame.copy()
    out[:fmt.HEADER_SIZE] = np.frombuffer(bytes(raw), np.uint8)
    return out


def test_a_frame_unlike_the_kept_header(made):
    """Another shape of the same count comes back in its shape; another count decodes again;
    a corrupted payload, a bad header or a codebook that only the host checks is refused in
    the host's words."""
    n = 1200
    b = _bits(n, 7)
    flat = _ref(b)
    assert np.array_equal(gpu.decompress(flat.copy()), b)
    y = gpu.decompress(_ref(b, (40, 30)))
    assert y.shape == (40, 30) and np.array_equal(y.reshape(-1), b)
    y = gpu.decompress(_ref(b, (40, 30)))  # the new shape is the kept one now
    assert y.shape == (40, 30) and np.array_equal(y.reshape(-1), b)
    small = _bits(700, 8)
    assert np.array_equal(gpu.decompress(_ref(small)), small)
    assert np.array_equal(gpu.decompress(flat.copy()), b)
    bad = flat.copy()
    bad[fmt.Layout.for_count(n).escapes_offset - 1] ^= 4
    with pytest.raises(ValueError, match="checksum"):
        gpu.decompress(bad)
    with pytest.raises(ValueError, match="magic"):
        gpu.decompress(np.zeros(flat.size, np.uint8))
    cb = flat[fmt.CODEBOOK_AT:fmt.CODEBOOK_AT + 7].tobytes()
    twice = _with_codebook(flat, cb[:6] + cb[:1])  # valid CRC, repeated entry
    with pytest.raises(ValueError, match="repeated"):
        gpu.decompress(twice)
    with pytest.raises(ValueError, match="out= has"):
        gpu.decompress(flat.copy(), out=np.zeros(n + 1, np.uint16))
    assert np.array_equal(gpu.decompress(flat.copy()), b)  # still right after every refusal
