"""Numba-side host glue for the kernels: device views, streams, workspaces, small copies.

``codec/gpu.py`` speaks in CuPy / torch / Numba objects; the kernels want flat
Numba device arrays. This module makes those views straight from
``__cuda_array_interface__`` pointers (no copy, and no stream synchronisation:
Numba's default import syncs on the producer's stream, which would put a host
sync in the hot path), caches them by (pointer, length, dtype) so that a
collective that reuses its buffers pays for a view once, and wraps foreign
stream handles. Under Numba's CUDA simulator the same functions work on NumPy
arrays (views share memory, as device pointers would).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda  # noqa: I001

from ..arrays import cai_buffer
from . import compat
from ._common import CRC_TABLE, WS_STATUS

SIMULATOR = compat.SIMULATOR

if SIMULATOR:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray


def _host_array_of(obj) -> np.ndarray:
    """Simulator only: the NumPy memory behind a simulated device array."""
    if isinstance(obj, FakeCUDAArray):
        return obj._ary
    if hasattr(obj, "_ary"):
        return obj._ary
    return np.asarray(obj)


def interface(obj) -> tuple[int, int, np.dtype, tuple[int, ...]]:
    """(device pointer, byte length, dtype, shape) of a C-contiguous device array.

    Accepts anything with ``__cuda_array_interface__`` (CuPy, Numba, torch with a
    dtype the interface supports). Raises ValueError for strided arrays.
    """
    if SIMULATOR:
        a = _host_array_of(obj)
        if not a.flags.c_contiguous:
            raise ValueError("zipccl needs C-contiguous device arrays")
        return a.__array_interface__["data"][0], a.nbytes, a.dtype, a.shape
    return cai_buffer(obj)


_SIM_BUFFERS: dict[int, np.ndarray] = {}


def view(obj_or_ptr, count: int, dtype) -> object:
    """A flat device array of ``count`` items of ``dtype`` starting at the object's pointer."""
    dtype = np.dtype(dtype)
    if SIMULATOR:
        a = _host_array_of(obj_or_ptr).reshape(-1).view(np.uint8)
        return FakeCUDAArray(a[: count * dtype.itemsize].view(dtype))
    ptr = obj_or_ptr if isinstance(obj_or_ptr, int) else interface(obj_or_ptr)[0]
    return _view(ptr, int(count), dtype.str)


@lru_cache(maxsize=256)
def _view(ptr: int, count: int, typestr: str):
    if count == 0 or ptr == 0:
        return _empty(typestr)
    desc = {"shape": (count,), "strides": None, "typestr": typestr, "data": (ptr, False),
            "version": 3}
    return cuda.from_cuda_array_interface(desc, owner=None, sync=False)


@lru_cache(maxsize=16)
def _empty(typestr: str):
    """A 16-byte allocation seen as 0 items: kernels get a valid pointer that they never read."""
    dt = np.dtype(typestr)
    return cuda.device_array(16 // dt.itemsize, dtype=dt)[:0]


_STREAMS: dict[int, object] = {}


def stream(handle):
    """A Numba stream for ``handle``: None/0 (legacy default stream), an int handle,
    a CuPy stream (``.ptr``), a torch stream (``.cuda_stream``) or a Numba stream."""
    if SIMULATOR:
        return 0
    if handle is None:
        return cuda.default_stream()
    if hasattr(handle, "handle") and hasattr(handle, "synchronize") and not hasattr(handle, "ptr"):
        return handle  # already a Numba stream
    ptr = handle
    if hasattr(handle, "ptr"):
        ptr = handle.ptr
    elif hasattr(handle, "cuda_stream"):
        ptr = handle.cuda_stream
    ptr = int(ptr)
    if ptr == 0:
        return cuda.default_stream()
    s = _STREAMS.get(ptr)
    if s is None:
        s = _STREAMS[ptr] = cuda.external_stream(ptr)
    return s


def _settled(dev):
    """``dev`` once its upload has landed in device memory.

    ``cuda.to_device`` of pageable host memory is a copy on the legacy default stream
    that may return before the DMA into device memory completes, and kernels on
    non-blocking streams (CuPy's ``Stream(non_blocking=True)``, the collectives'
    transfer and decode streams) are not ordered after the legacy stream. A kernel
    launched right after could read the freshly allocated memory's old contents (for
    a workspace: a garbage tile ticket, i.e. accesses far out of bounds). Waiting for
    the legacy stream here orders the upload before anything launched later.
    """
    cuda.default_stream().synchronize()
    return dev


def device_zeros(count: int, dtype):
    """A zero-filled Numba device array, visible to every stream (for set-up, not the hot path)."""
    return _settled(cuda.to_device(np.zeros(count, dtype=dtype)))


def device_empty(count: int, dtype):
    return cuda.device_array(count, dtype=dtype)


def to_host(dev, count: int | None = None, stream_=None) -> np.ndarray:
    """Copy (the first ``count`` items of) a device array to the host; synchronises ``stream_``."""
    if SIMULATOR:
        a = _host_array_of(dev).reshape(-1)
        return np.array(a if count is None else a[:count])
    if count is not None:
        dev = dev[:count]
    s = stream_ if stream_ is not None else 0
    out = dev.copy_to_host(stream=s)
    if s != 0:
        s.synchronize()
    return out


def host_bytes(obj, nbytes: int, stream_=None) -> np.ndarray:
    """The first ``nbytes`` bytes of a device array, on the host (a synchronisation)."""
    return to_host(view(obj, nbytes, np.uint8), None, stream_)


_CRC_DEV: dict[int, object] = {}


def crc_table():
    """The header CRC bit table on the current device (uploaded once per device)."""
    if SIMULATOR:
        return FakeCUDAArray(CRC_TABLE.copy())
    dev = cuda.get_current_device().id
    t = _CRC_DEV.get(dev)
    if t is None:
        t = _CRC_DEV[dev] = _settled(cuda.to_device(CRC_TABLE))
    return t


_CB_DEV: dict[int, tuple] = {}


def codebook_tables() -> tuple:
    """(square scales, window thresholds, window starts) of ``stats.choose_codebook`` on the
    current device (uploaded once per device)."""
    from ..codebook import window_table
    from .stats import SQUARE_SCALE

    thr, starts = window_table()
    if SIMULATOR:
        return tuple(FakeCUDAArray(a.copy()) for a in (SQUARE_SCALE, thr, starts))
    dev = cuda.get_current_device().id
    t = _CB_DEV.get(dev)
    if t is None:
        t = _CB_DEV[dev] = tuple(_settled(cuda.to_device(a)) for a in (SQUARE_SCALE, thr, starts))
    return t


def new_workspace_array(n_blocks: int):
    """Workspace memory for calls of up to ``n_blocks`` escape blocks (zeroed)."""
    if SIMULATOR:
        return FakeCUDAArray(np.zeros(WS_STATUS + max(1, n_blocks), dtype=np.int64))
    return device_zeros(WS_STATUS + max(1, n_blocks), np.int64)


def current_device_id() -> int:
    return 0 if SIMULATOR else cuda.get_current_device().id
