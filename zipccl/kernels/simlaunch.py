"""The lean launch route under Numba's CUDA simulator: ``cuLaunchKernel`` stood in for.

On a GPU a plan (``plan.py``) launches a compiled kernel from a ``void**`` array packed once
(``launch.Params``). The simulator has no driver to take that array, so here a kernel's
"function handle" is its number in a table of ``launch.Kernel`` objects, and ``launch_packed``
takes the same arguments as ``cuLaunchKernel``: it reads the parameter slots back from the
packed array, rebuilds each argument from them by the kernel's argument types (an array from
its data pointer and count, checked against the itemsize, shape and stride slots), and calls
the kernel through the simulator with the grid and block it was given. So the plans, the
packing, ``retarget`` and the grid choices run under the simulator exactly as on a GPU, and
only the final driver call differs. Device pointers under the simulator are host addresses
(``runtime.interface``); the memory must stay alive while a plan points at it, as on a GPU.
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import types
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

_KERNELS: list = []


def handle(kernel) -> int:
    """The stand-in function handle of ``kernel`` (a ``launch.Kernel``): one per kernel, from 1."""
    for i, k in enumerate(_KERNELS):
        if k is kernel:
            return i + 1
    _KERNELS.append(kernel)
    return len(_KERNELS)


def _array(t: types.Array, slots: list[int]):
    meminfo, parent, nitems, itemsize, data, shape, stride = slots
    dtype = np.dtype(str(t.dtype))
    if (meminfo, parent) != (0, 0) or itemsize != dtype.itemsize or shape != nitems \
            or stride != dtype.itemsize:
        raise ValueError(f"array slots {slots} do not describe a 1-D C-contiguous {dtype} array")
    if nitems and not data:
        raise ValueError(f"array of {nitems} {dtype} items at a null pointer")
    if not nitems:
        return FakeCUDAArray(np.empty(0, dtype))
    raw = (ctypes.c_uint8 * (nitems * dtype.itemsize)).from_address(data)
    return FakeCUDAArray(np.frombuffer(raw, dtype=dtype))


def _unpack(argtypes, slots: list[int], at: int) -> tuple[list, int]:
    """The arguments of ``argtypes`` from the 8-byte ``slots`` starting at ``at``."""
    args = []
    for t in argtypes:
        if isinstance(t, types.Array):
            args.append(_array(t, slots[at:at + 7]))
            at += 7
        elif isinstance(t, types.BaseTuple):
            inner, at = _unpack(t.types, slots, at)
            args.append(tuple(inner))
        else:
            v = slots[at]
            args.append(v - (1 << 64) if v >> 63 else v)  # int64 scalars
            at += 1
    return args, at


def arguments(function: int, params_address: int) -> list:
    """The arguments a launch of ``function`` with the ``void**`` array at ``params_address``
    passes, rebuilt from the packed slots."""
    kernel = _KERNELS[function - 1]
    ptrs = (ctypes.c_uint64 * kernel.slots).from_address(params_address)
    slots = [ctypes.c_uint64.from_address(p).value for p in ptrs]
    args, used = _unpack(kernel.argtypes, slots, 0)
    assert used == kernel.slots
    return args


def launch_packed(function: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int,
                  stream: int, params_address: int, extra) -> tuple[int]:
    """``cuLaunchKernel``'s arguments: run the kernel in the simulator (synchronously); its
    result as the driver binding gives it, (0,)."""
    if shmem or extra:
        raise ValueError("the lean route launches without dynamic shared memory or extra")
    kernel = _KERNELS[function - 1]
    kernel.dispatcher[(gx, gy, gz), (bx, by, bz), 0](*arguments(function, params_address))
    return (0,)


def device_pointer(array) -> int:
    """The "device pointer" of a simulated device array: its host address."""
    a = array._ary if hasattr(array, "_ary") else np.asarray(array)
    return int(a.__array_interface__["data"][0])
