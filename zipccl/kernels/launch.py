"""The lean launch route: Numba kernels compiled once, launched from packed parameters.

Numba's dispatcher types, parses and converts every argument at every launch. Here each kernel
is compiled by Numba once per (signature, device) from the same ``@cuda.jit`` source the
simulator runs, and a launch is one ``cuLaunchKernel`` driver call whose ``void**`` parameter
array was packed once (``Params``, reproducing Numba's kernel ABI, checked against the driver's
parameter layout where it can report one) when the caller's buffer set was first seen: a
*plan*. A launch allocates nothing and parses nothing. A kernel's cubin is kept on disk
(``cache.py``); ``kernels()`` lists every ``Kernel`` made, for ``python -m zipccl warmup``.
Also here: the few driver calls the codec's hot path needs without Numba's wrappers. Under the
CUDA simulator ``simlaunch.py`` stands in for the driver call. docs/KERNELS.md, "The launch
route", says why and how.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
from numba import types
from numba.cuda.np import numpy_support

from . import cache as kernel_cache
from . import compat

_U64 = (1 << 64) - 1


def array(dtype) -> types.Array:
    """The Numba type of a 1-D C-contiguous array of ``dtype`` (a kernel parameter)."""
    return types.Array(numpy_support.from_dtype(np.dtype(dtype)), 1, "C")


I64 = types.int64


def int_tuple(k: int) -> types.UniTuple:
    return types.UniTuple(types.int64, k)


_DRIVER: list = []


def _driver():
    """cuda.bindings' driver module (imported on first use, then a list lookup)."""
    if not _DRIVER:
        from cuda.bindings import driver

        _DRIVER.append(driver)
    return _DRIVER[0]


def check(result, what: str):
    """The value(s) of a cuda.bindings call, or RuntimeError naming the driver error."""
    err = result[0]
    if err:
        drv = _driver()
        name = drv.cuGetErrorName(err)[1]
        raise RuntimeError(f"{what} failed: {name.decode() if name else int(err)}")
    return result[1] if len(result) == 2 else result[1:]


def current_device() -> int:
    """Ordinal of the current CUDA device (one driver call, no Numba context lookup)."""
    return int(check(_driver().cuCtxGetDevice(), "cuCtxGetDevice"))


def _slots(argtypes) -> int:
    n = 0
    for t in argtypes:
        if isinstance(t, types.Array):
            n += 7
        elif isinstance(t, types.BaseTuple):
            n += _slots(t.types)
        else:
            n += 1
    return n


_KERNELS: list = []  # every Kernel made, in order


def kernels() -> tuple:
    """Every ``Kernel`` made so far (the library's, once its kernel modules are imported)."""
    return tuple(_KERNELS)


class Kernel:
    """One ``@cuda.jit`` kernel for one signature; its CUfunction per device, compiled once
    per machine (``cache.py``) and loaded once per process and device."""

    def __init__(self, dispatcher, argtypes: tuple):
        self.dispatcher = dispatcher
        self.argtypes = tuple(argtypes)
        self.slots = _slots(self.argtypes)
        self._funcs: dict[int, int] = {}
        self.origin: dict[int, str] = {}  # per device: "cache", "compiled", "compiled, not cached"
        _KERNELS.append(self)

    @property
    def name(self) -> str:
        return self.dispatcher.py_func.__name__

    def data_slot(self, arg: int) -> int:
        """The parameter slot of the data pointer of array argument number ``arg``."""
        if not isinstance(self.argtypes[arg], types.Array):
            raise TypeError(f"argument {arg} of {self.dispatcher.__name__} is not an array")
        return _slots(self.argtypes[:arg]) + 4

    def function(self, device: int) -> int:
        """The CUfunction handle (as an int) on ``device``; from the kernel cache or compiled,
        and loaded, on first use."""
        f = self._funcs.get(device)
        if f is None:
            if compat.SIMULATOR:  # no driver: the stand-in's handle (simlaunch.py)
                from . import simlaunch
                return simlaunch.handle(self)
            f = self._funcs[device] = self._load(device)
        return f

    def _load(self, device: int) -> int:
        try:
            what, source = kernel_cache.ident(self.dispatcher, self.argtypes), \
                kernel_cache.source_of(self.dispatcher)
        except kernel_cache.Uncacheable:
            what = source = None
        handle, self.origin[device] = kernel_cache.default().fetch(
            what, kernel_cache.arch_name(compute_capability(device)), source, _load_image, self._compile)
        self._check_params(handle)
        return int(handle)

    def _compile(self):
        """Numba's compilation and load in the current context: (CUfunction, the cache entry or
        None when the code library holds what a cubin alone does not)."""
        kernel = self.dispatcher.compile(self.argtypes)
        kernel.bind()
        lib = kernel._codelibrary
        handle = lib.get_cufunc().handle
        drv = _driver()
        if isinstance(handle, drv.CUkernel):  # a library kernel: its function in this context
            handle = check(drv.cuKernelGetFunction(handle), "cuKernelGetFunction")
        entry = None
        image = _image_bytes(lib.get_cubin())
        if image is not None and not getattr(lib, "_setup_functions", None) and \
                getattr(kernel, "shared_memory_carveout", None) is None:
            entry = kernel_cache.Entry(image, lib._entry_name)
        return handle, entry

    def _check_params(self, handle) -> None:
        drv = _driver()
        info = getattr(drv, "cuFuncGetParamInfo", None)
        if info is not None:
            for i in range(self.slots):
                err, offset, size = info(handle, i)
                if err or size != 8 or offset != 8 * i:
                    raise RuntimeError(
                        f"{self.dispatcher.__name__}: parameter {i} is at offset {offset} with size "
                        f"{size} (error {int(err)}); the lean launcher packs 8-byte slots")
            err = info(handle, self.slots)[0]
            if not err:
                raise RuntimeError(f"{self.dispatcher.__name__} has more than the {self.slots} "
                                   "parameters the lean launcher packs")


def _image_bytes(cubin) -> bytes | None:
    """The bytes of a linked cubin (cuda.core's ``ObjectCode`` or the bytes themselves)."""
    code = getattr(cubin, "code", cubin)
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code)
    return None


_MODULES: list = []  # modules loaded from the kernel cache: they live as long as the process


def _load_image(entry) -> object:
    """The CUfunction of a cached kernel (``cache.Entry``), loaded into the current context."""
    drv = _driver()
    module = check(drv.cuModuleLoadData(entry.image), "cuModuleLoadData")
    _MODULES.append(module)
    return check(drv.cuModuleGetFunction(module, entry.entry.encode()), "cuModuleGetFunction")


def compute_capability(device: int) -> tuple[int, int]:
    """(major, minor) of device ``device`` (an ordinal)."""
    drv = _driver()
    dev = check(drv.cuDeviceGet(int(device)), "cuDeviceGet")
    attr = drv.CUdevice_attribute
    major = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                  "cuDeviceGetAttribute")
    minor = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                  "cuDeviceGetAttribute")
    return int(major), int(minor)


class Params:
    """Kernel parameters packed once: 8-byte slots and the ``void**`` array pointing at them.

    ``values`` follows the kernel's argument types: an array argument is given as
    ``(pointer, count)``, an integer as itself, a tuple as a tuple of integers.
    """

    __slots__ = ("vals", "ptrs", "address")

    def __init__(self, kernel: Kernel, values) -> None:
        flat: list[int] = []
        _pack(kernel.argtypes, values, flat)
        if len(flat) != kernel.slots:
            raise ValueError(f"{len(flat)} parameter slots packed, the kernel has {kernel.slots}")
        self.vals = np.array(flat, dtype=np.uint64)
        base = self.vals.ctypes.data
        self.ptrs = base + 8 * np.arange(len(flat), dtype=np.uint64)
        self.address = int(self.ptrs.ctypes.data)

    def set(self, slot: int, value: int) -> None:
        """Change one slot in place (the pointer array stays valid). A launch copies the
        parameters, so a slot may change as soon as the launch that used it returns."""
        self.vals[slot] = value


def _pack(argtypes, values, flat: list[int]) -> None:
    if len(argtypes) != len(values):
        raise ValueError(f"{len(values)} values for {len(argtypes)} kernel arguments")
    for t, v in zip(argtypes, values, strict=True):
        if isinstance(t, types.Array):
            ptr, count = v
            item = t.dtype.bitwidth // 8
            flat.extend((0, 0, int(count), item, int(ptr), int(count), item))
        elif isinstance(t, types.BaseTuple):
            _pack(t.types, tuple(v), flat)
        else:
            flat.append(int(v) & _U64)


def launch(function: int, grid: int, block: int, stream: int, params: Params) -> None:
    """One ``cuLaunchKernel`` of a 1-D grid on the stream handle ``stream`` (0: legacy default)."""
    got = _LAUNCH(function, grid, 1, 1, block, 1, 1, 0, stream, params.address, 0)
    if got[0]:
        check(got, "cuLaunchKernel")


class Words:
    """Launches of one kernel whose every parameter is a 64-bit word (the spill kernels,
    compiled by CuPy): ``go(blocks, stream, args)`` writes ``args`` into one packed array and
    makes one ``cuLaunchKernel`` on the raw stream handle ``stream``, where CuPy's own call
    converts and packs each argument anew at every launch. The array is reused launch after
    launch (a launch copies its parameters), by one caller thread at a time."""

    __slots__ = ("function", "block", "vals", "ptrs", "address")

    def __init__(self, function: int, count: int, block: int) -> None:
        self.function, self.block = int(function), int(block)
        self.vals = np.zeros(count, dtype=np.uint64)
        self.ptrs = self.vals.ctypes.data + 8 * np.arange(count, dtype=np.uint64)
        self.address = int(self.ptrs.ctypes.data)

    def __call__(self, blocks: int, stream: int, args: tuple) -> None:
        self.vals[:len(args)] = args
        got = _driver().cuLaunchKernel(self.function, blocks, 1, 1, self.block, 1, 1, 0, stream,
                                       self.address, 0)
        if got[0]:
            check(got, "cuLaunchKernel")


def words(fn, block: int):
    """``go(blocks, stream, args)`` enqueueing kernel ``fn`` (a CuPy ``RawKernel``) on the raw
    stream handle ``stream``: ``blocks`` x ``block`` threads, every argument a 64-bit word (a
    ``Words``; a stand-in without a CUfunction, tests' CuPy, is called as CuPy calls it)."""
    ptr = getattr(getattr(fn, "kernel", None), "ptr", None)
    if ptr is None:
        return lambda blocks, stream, args: fn((int(blocks),), (block,), tuple(map(np.uint64, args)),
                                               stream=stream)
    return Words(int(ptr), 5, block)


def _launcher():
    """cuda.bindings' ``cuLaunchKernel`` taking the packed ``void**`` address as an int: the
    cheapest of the routes ``experiments/bench_launch.py`` compares (libcuda through ctypes,
    cuda.core's ``launch``; records in ``experiments/results/launch_gpu.jsonl``)."""
    if compat.SIMULATOR:  # the stand-in that runs the kernel from the packed parameters
        from .simlaunch import launch_packed
        return launch_packed
    return _driver().cuLaunchKernel  # returns (CUresult,)


_LAUNCH = _launcher()


_CAPTURE_ACTIVE, _CAPTURE_INVALIDATED = 1, 2  # CUstreamCaptureStatus
_CAPTURE_MODE_RELAXED = 2  # CUstreamCaptureMode


def capture_id(stream: int) -> int | None:
    """The id of the CUDA graph capture under way on the stream handle ``stream``, or None when
    it is not being captured (always None under the simulator). A capture that was
    invalidated (a call the capture forbids) raises RuntimeError."""
    if compat.SIMULATOR:
        return None
    drv = _driver()
    got = drv.cuStreamGetCaptureInfo(drv.CUstream(int(stream)))
    status = int(check(got[:2], "cuStreamGetCaptureInfo"))
    if status == _CAPTURE_INVALIDATED:
        raise RuntimeError("the CUDA graph capture on this stream was invalidated by an earlier call")
    return int(got[2]) if status == _CAPTURE_ACTIVE else None


class relaxed_capture:
    """Within it, this thread may make the allocations a global-mode capture forbids (pinned
    host memory, device memory zeroed on a stream of its own): none of them is stream work of
    the capture. (``cuThreadExchangeStreamCaptureMode``; nothing under the simulator.)"""

    def __enter__(self):
        self.mode = None
        if not compat.SIMULATOR:
            self.mode = check(_driver().cuThreadExchangeStreamCaptureMode(_CAPTURE_MODE_RELAXED),
                              "cuThreadExchangeStreamCaptureMode")
        return self

    def __exit__(self, *exc):
        if self.mode is not None:
            check(_driver().cuThreadExchangeStreamCaptureMode(self.mode),
                  "cuThreadExchangeStreamCaptureMode")


class PinnedSlots:
    """A small pinned host buffer for device-to-host reads of a few bytes (one per thread)."""

    def __init__(self, nbytes: int = 4096):
        self.nbytes = nbytes
        self.ptr = int(check(_driver().cuMemAllocHost(nbytes), "cuMemAllocHost"))
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.ptr))

    def read(self, device_ptr: int, nbytes: int, stream: int) -> np.ndarray:
        """Copy ``nbytes`` from the device, wait for ``stream``; a view of the pinned bytes."""
        drv = _driver()
        check(drv.cuMemcpyDtoHAsync(self.ptr, device_ptr, nbytes, stream), "cuMemcpyDtoHAsync")
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return self.array[:nbytes]

    def read_two(self, first: tuple[int, int], second: tuple[int, int], stream: int):
        """Two small device-to-host copies, ``(device_ptr, nbytes)`` each, then one wait for
        ``stream``: (view of the first's bytes, view of the second's), one synchronisation."""
        (p1, n1), (p2, n2) = first, second
        at = -(-n1 // 16) * 16
        if at + n2 > self.nbytes:
            raise ValueError(f"{n1} + {n2} bytes do not fit the {self.nbytes}-byte pinned buffer")
        drv = _driver()
        check(drv.cuMemcpyDtoHAsync(self.ptr, p1, n1, stream), "cuMemcpyDtoHAsync")
        check(drv.cuMemcpyDtoHAsync(self.ptr + at, p2, n2, stream), "cuMemcpyDtoHAsync")
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return self.array[:n1], self.array[at:at + n2]


_PINNED = threading.local()


def pinned() -> PinnedSlots:
    """This thread's pinned read buffer (allocated on first use)."""
    slots = getattr(_PINNED, "slots", None)
    if slots is None:
        slots = _PINNED.slots = PinnedSlots()
    return slots


def device_pointer(numba_array) -> int:
    """The device pointer of a Numba device array."""
    return int(numba_array.device_ctypes_pointer.value or 0)


__all__ = ["Kernel", "Params", "launch", "array", "I64", "int_tuple", "current_device", "pinned",
           "device_pointer", "kernels", "compute_capability", "capture_id", "relaxed_capture"]
