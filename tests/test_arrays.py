"""``zipccl.arrays``, the one array-kind adapter: kinds, identities, pointers and cached views.

A view cached by identity must never come back for memory seen another way (another address,
shape, strides, dtype or device), and an unowned view must not keep its array alive. The CUDA
paths are stood in for by an object with ``__cuda_array_interface__`` over host memory and, for
CuPy, a module in ``sys.modules`` whose ``ndarray`` subclasses NumPy's (as the stand-in CuPy of
``tests/mpi`` does); the GPU suites run the real ones.
"""

from __future__ import annotations

import gc
import sys
import types
import weakref

import numpy as np
import pytest

from zipccl import arrays
from zipccl.comm import args


class Interface:
    """A device array as far as ``__cuda_array_interface__`` goes, over a NumPy array's memory."""

    def __init__(self, a: np.ndarray):
        self.a = a
        ai = a.__array_interface__
        self.__cuda_array_interface__ = {"shape": ai["shape"], "typestr": ai["typestr"],
                                         "data": ai["data"], "strides": ai["strides"], "version": 3}


@pytest.fixture
def stand_in_cupy(monkeypatch):
    """A module named cupy whose ndarray is a NumPy subclass."""
    mod = types.ModuleType("cupy")

    class ndarray(np.ndarray):  # noqa: N801 -- CuPy's name
        @property
        def data(self):
            return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    mod.ndarray = ndarray
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


def test_kinds():
    assert arrays.kind(np.zeros(3, np.uint16)) == arrays.NUMPY
    assert arrays.kind(Interface(np.zeros(3))) == arrays.CAI
    assert arrays.kind([1.0]) is None and arrays.kind(b"ab") is None and arrays.kind(None) is None


def test_a_cupy_array_is_cupy_before_it_is_numpy(stand_in_cupy):
    x = np.zeros(4, np.uint16).view(stand_in_cupy.ndarray)
    assert arrays.kind(x) == arrays.CUPY
    assert arrays.cupy_of(x) is stand_in_cupy and arrays.cupy_of(np.zeros(1)) is None
    assert arrays.address(x) == x.__array_interface__["data"][0]


def test_torch_kind_identity_and_views():
    torch = pytest.importorskip("torch")
    t = torch.zeros(6, dtype=torch.bfloat16)
    assert arrays.kind(t) == arrays.TORCH and arrays.torch_of(t) is torch
    assert arrays.identity(t) == arrays.identity(t.view(torch.bfloat16))
    assert arrays.identity(t) != arrays.identity(t.view(torch.int16))  # dtype
    assert arrays.identity(t) != arrays.identity(t[:3])  # shape
    assert arrays.identity(t)[-1] == torch.device("cpu")  # device: a host pointer is not a device one
    with pytest.raises(TypeError, match="CPU torch tensor goes to the host codec"):
        arrays.device_buffer(t)
    bits = np.array([16256, 0], np.uint16)
    v = arrays.as_torch(bits, "bfloat16")
    assert v.dtype == torch.bfloat16 and v.float().tolist() == [1.0, 0.0]
    v[1] = 2.0
    assert bits[1] == 0x4000  # a view: the write lands in the NumPy array
    assert arrays.as_torch(bits).dtype == torch.int16
    assert arrays.as_torch(t) is t


def test_identity_names_everything_a_view_depends_on():
    x = np.zeros(16, np.uint16)
    same = [x, x[:], x.reshape(16)]
    assert len({arrays.identity(a) for a in same}) == 1
    other = [x[1:], x[:8], x[::2], x.view(np.int16), x.reshape(4, 4), x.view(np.uint8)]
    ro = x[:]
    ro.flags.writeable = False
    keys = {arrays.identity(a) for a in [x, *other, ro]}
    assert len(keys) == len(other) + 2
    assert arrays.identity([0]) is None


def test_unowned_views_are_cached_by_identity_and_never_stale():
    x = np.arange(16, dtype=np.uint16)
    v = arrays.unowned(x)
    assert arrays.unowned(x[:]) is v  # another object, the same memory seen the same way
    for a in (x[:8], x[4:], x.view(np.int16), x.reshape(4, 4)):
        w = arrays.unowned(a)
        assert w is not v and w.dtype == a.dtype and w.shape == a.reshape(-1).shape
        assert arrays.address(w) == arrays.address(a) and np.array_equal(w, a.reshape(-1))
    v[3] = 99
    assert x[3] == 99
    assert arrays.unowned(np.zeros(0, np.float32)).size == 0


def test_an_unowned_view_does_not_keep_its_array_alive():
    x = np.arange(1024, dtype=np.float32)
    gone = weakref.ref(x)
    v = arrays.unowned(x)
    del x
    gc.collect()
    assert gone() is None and v.size == 1024


def test_device_buffer_through_the_interface():
    a = np.zeros(10, np.uint16)
    ptr, nbytes, item = arrays.device_buffer(Interface(a))
    assert (ptr, nbytes, item) == (a.__array_interface__["data"][0], 20, 2)
    assert arrays.cai_buffer(Interface(a.reshape(2, 5)))[3] == (2, 5)
    with pytest.raises(ValueError, match="C-contiguous"):
        arrays.device_buffer(Interface(np.zeros(10, np.uint16)[::2]))


def test_device_torch_views_are_cached_by_identity(monkeypatch):
    """``as_torch`` of a device array: one view per identity and ``dtype=``, made without an
    owner (``torch.as_tensor`` stood in for: it reads the interface over host memory here)."""
    torch = pytest.importorskip("torch")
    made = []

    def as_tensor(obj, device=None):
        desc = obj.__cuda_array_interface__
        assert not hasattr(obj, "a")  # the bare interface, not the array: no owner is held
        n = int(np.prod(desc["shape"]))
        buf = (np.ctypeslib.as_ctypes_type(np.dtype(desc["typestr"])) * n).from_address(desc["data"][0])
        made.append(desc)
        return torch.from_numpy(np.frombuffer(buf, np.dtype(desc["typestr"])))

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    a = np.arange(8, dtype=np.uint16)
    t = arrays.as_torch(Interface(a))
    assert t.dtype == torch.int16 and t.tolist() == list(range(8))
    assert arrays.as_torch(Interface(a)) is t and len(made) == 1
    assert arrays.as_torch(Interface(a), "bfloat16").dtype == torch.bfloat16
    assert arrays.as_torch(Interface(a[:4])).numel() == 4
    assert arrays.as_torch(Interface(a.view(np.int16))) is not t
    assert len(made) == 4


def test_plan_keys_are_identities():
    x = np.zeros(8, np.float32)
    key, st = args.call_key("all_reduce", x, None, None, None)
    assert key == ("all_reduce", arrays.identity(x), None, None, None, None) and st is None
    assert args.call_key("all_gather", x, x[:4], None, None)[0][2] == arrays.identity(x[:4])
    assert args.call_key("all_gather", x, [0.0], None, None) == (None, None)
    assert args.ptr_range(x[2:]) == (arrays.address(x) + 8, arrays.address(x) + 32)
