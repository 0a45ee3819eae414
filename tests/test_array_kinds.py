"""What comes back is the kind of array that went in: NumPy, CPU torch, CuPy, CUDA torch.

``compress`` gives a uint8 frame of the input's kind and ``decompress`` of that frame the
input's kind, type and shape again, bit for bit; ``out=`` buffers keep their own kind (the
result is a view of them). One behaviour, written once and run for every kind; the CuPy
and CUDA torch cases need a GPU (``pytest -m gpu``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import zipccl

TYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float16": np.float16}
BITS = {"bfloat16": np.uint16, "float32": np.uint32, "float16": np.uint16}


class Kind:
    """One array kind: make arrays of it from NumPy values, read them back, name their type."""

    def __init__(self, name: str):
        self.name = name
        if name == "numpy":
            return
        self.torch = pytest.importorskip("torch")
        if name == "torch":
            return
        from test_gpu_codec import _cupy_with_a_device

        self.cupy = _cupy_with_a_device()  # skips without a real GPU
        if name == "torch-cuda" and not self.torch.cuda.is_available():
            pytest.skip("torch has no CUDA here")

    @property
    def is_torch(self) -> bool:
        return self.name.startswith("torch")

    def make(self, values: np.ndarray):
        """``values`` (NumPy, any of the three types) as an array of this kind, same type."""
        if self.name == "numpy":
            return values.copy()
        if self.name == "cupy":  # CuPy has no bfloat16: its bit patterns, with dtype=
            bits = values.view(BITS[values.dtype.name]) if values.dtype.name == "bfloat16" else values
            return self.cupy.asarray(bits)
        t = self.torch.from_numpy(values.view(np.int16 if values.itemsize == 2 else np.int32).copy())
        t = t.view(getattr(self.torch, values.dtype.name))
        return t.cuda() if self.name == "torch-cuda" else t

    def empty(self, shape, type_name: str):
        """A new array of this kind for ``out=`` (type_name "uint8" for frames)."""
        if self.name == "numpy":
            return np.zeros(shape, TYPES.get(type_name, type_name))
        if self.name == "cupy":
            return self.cupy.zeros(shape, BITS[type_name] if type_name == "bfloat16" else type_name)
        return self.torch.zeros(shape, dtype=getattr(self.torch, type_name),
                                device="cuda" if self.name == "torch-cuda" else "cpu")

    def compress(self, x, **kw):
        dtype = "bfloat16" if self.name == "cupy" and x.dtype == np.uint16 else None
        return zipccl.compress(x, dtype=dtype, **kw)

    def owns(self, a) -> bool:
        """True when ``a`` is an array of this kind (and on this side: host or device)."""
        if self.name == "numpy":
            return isinstance(a, np.ndarray)
        if self.name == "cupy":
            return isinstance(a, self.cupy.ndarray)
        return isinstance(a, self.torch.Tensor) and a.is_cuda == (self.name == "torch-cuda")

    def type_name(self, a) -> str:
        return str(a.dtype).replace("torch.", "")

    def host_bytes(self, a) -> np.ndarray:
        """The bytes of ``a`` (contiguous) as a flat NumPy uint8 array."""
        if self.name == "numpy":
            return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        if self.name == "cupy":
            return self.cupy.asnumpy(a).reshape(-1).view(np.uint8)
        t = a.detach().cpu().contiguous().reshape(-1)
        same_size = {1: self.torch.uint8, 2: self.torch.int16, 4: self.torch.int32}[t.element_size()]
        return t.view(same_size).numpy().view(np.uint8)

    def address(self, a) -> int:
        if self.name == "numpy":
            return a.__array_interface__["data"][0]
        if self.name == "cupy":
            return a.data.ptr
        return a.data_ptr()


HOST = ["numpy", "torch"]
DEVICE = [pytest.param("cupy", marks=pytest.mark.gpu), pytest.param("torch-cuda", marks=pytest.mark.gpu)]


def values(type_name: str, shape, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0, 0.02, shape).astype(np.float32).astype(TYPES[type_name])
    return np.asarray(x)


def _expected_type(kind: Kind, type_name: str) -> str:
    return "uint16" if kind.name == "cupy" and type_name == "bfloat16" else type_name


def _check_round_trip(kind: Kind, type_name: str, shape) -> None:
    v = values(type_name, shape)
    x = kind.make(v)
    frame = kind.compress(x)
    assert kind.owns(frame) and kind.type_name(frame) == "uint8" and frame.ndim == 1
    # the same bytes as the NumPy frame of the same values
    assert np.array_equal(kind.host_bytes(frame), zipccl.compress(v, backend="reference"))
    y = zipccl.decompress(frame)
    assert kind.owns(y) and kind.type_name(y) == _expected_type(kind, type_name)
    assert tuple(y.shape) == tuple(v.shape)
    assert np.array_equal(kind.host_bytes(y), v.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("shape", [(7, 1031), (0,), ()])
@pytest.mark.parametrize("name", HOST)
def test_host_round_trip_keeps_the_kind(name, type_name, shape):
    _check_round_trip(Kind(name), type_name, shape)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("name", DEVICE)
def test_device_round_trip_keeps_the_kind(name, type_name):
    _check_round_trip(Kind(name), type_name, (7, 1031))


def _check_out_buffers(kind: Kind, type_name: str) -> None:
    v = values(type_name, (3, 2000), seed=1)
    x = kind.make(v)
    buf = kind.empty(zipccl.max_compressed_size(v.size, type_name), "uint8")
    frame = kind.compress(x, out=buf)
    assert kind.owns(frame) and kind.address(frame) == kind.address(buf)  # a view of out=
    assert np.array_equal(kind.host_bytes(frame), zipccl.compress(v, backend="reference"))
    out = kind.empty(v.shape, type_name)
    assert zipccl.decompress(frame, out=out) is out
    assert np.array_equal(kind.host_bytes(out), v.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("name", HOST)
def test_host_out_buffers_keep_their_kind(name, type_name):
    _check_out_buffers(Kind(name), type_name)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("name", DEVICE)
def test_device_out_buffers_keep_their_kind(name, type_name):
    _check_out_buffers(Kind(name), type_name)


@pytest.mark.parametrize("type_name", TYPES)
def test_a_torch_frame_is_a_frame_wherever_its_bytes_go(type_name):
    torch = pytest.importorskip("torch")
    v = values(type_name, (5, 999), seed=2)
    frame = zipccl.compress(Kind("torch").make(v))
    want = v.reshape(-1).view(np.uint8)
    # its bytes as NumPy, as bytes, and into a NumPy out=: NumPy results
    for host in (frame.numpy(), bytes(frame.numpy())):
        y = zipccl.decompress(host)
        assert isinstance(y, np.ndarray) and y.dtype == v.dtype and y.shape == v.shape
        assert np.array_equal(y.reshape(-1).view(np.uint8), want)
    out = np.zeros(v.shape, v.dtype)
    assert zipccl.decompress(frame, out=out) is out and np.array_equal(out.view(np.uint8).reshape(-1), want)
    # a NumPy frame into a torch out=
    t_out = Kind("torch").empty(v.shape, type_name)
    zipccl.decompress(frame.numpy(), out=t_out)
    assert np.array_equal(Kind("torch").host_bytes(t_out), want)
    # a strided torch frame (every other byte of a larger tensor) reads the same
    wide = torch.zeros(2 * frame.numel(), dtype=torch.uint8)
    wide[::2] = frame
    y = zipccl.decompress(wide[::2])
    assert isinstance(y, torch.Tensor) and np.array_equal(Kind("torch").host_bytes(y), want)
    with pytest.raises(TypeError, match="uint8"):
        zipccl.decompress(frame.view(torch.int8))


def test_torch_bit_patterns_come_back_as_values():
    torch = pytest.importorskip("torch")
    v = values("bfloat16", 3000, seed=3)
    patterns = torch.from_numpy(v.view(np.int16).copy())
    y = zipccl.decompress(zipccl.compress(patterns, dtype="bfloat16"))
    assert y.dtype == torch.bfloat16 and torch.equal(y.view(torch.int16), patterns)
