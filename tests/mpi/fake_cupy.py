"""A NumPy stand-in for the CuPy calls zipccl's device engine makes, for tests without a GPU.

With ``NUMBA_ENABLE_CUDASIM=1`` the GPU codec's kernels run in Numba's simulator
on host memory (or ``fake_gpu_codec`` stands in for them, on the CPU codec); this
module lets the rest of the device path run there too:
``DeviceEngine`` (workspaces, pinned length slots, streams, events, the reduction
kernel), the pipelined exchange's stream and event hooks, the host-staged MPI
transport and the spill kernels (``RawModule``: their NumPy twins, run at once).
``install()`` puts it in ``sys.modules["cupy"]``.

It is *not* CuPy: one "device" (host memory), every operation runs at once, streams
and events only check that they are used as CuPy's are (an event waited on or
synchronised must have been recorded). What it catches is the logic of the device
path (offsets, slots, which buffer goes where, the order of hooks), not CUDA timing.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import time
import types

import numpy as np

uint8, uint16, uint32, int16, int32, int64 = np.uint8, np.uint16, np.uint32, np.int16, np.int32, np.int64
float16, float32, float64 = np.float16, np.float32, np.float64
_ptrs = itertools.count(0x1000, 0x10)


class UnownedMemory:
    """CuPy's ``cuda.UnownedMemory(ptr, size, owner, device_id)``: memory CuPy did not allocate,
    kept alive by ``owner`` (None: by nobody; the caller keeps it alive)."""

    def __init__(self, ptr: int, size: int, owner, device_id: int = -1):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner
        self.device_id = 0 if device_id < 0 else int(device_id)

    @property
    def device(self):
        return Device(self.device_id)


class MemoryPointer:
    """CuPy's ``cuda.MemoryPointer(mem, offset)``: a place in ``mem`` (``.ptr``, ``.mem``)."""

    def __init__(self, mem, offset: int):
        self.mem, self.ptr = mem, mem.ptr + int(offset)

    @property
    def device_id(self) -> int:
        return self.mem.device_id


class ndarray(np.ndarray):
    """Host memory that says it is a device array.

    ``ndarray(shape, dtype, memptr)`` takes CuPy's arguments: over ``memptr``'s memory, or new
    memory without it. (Views of NumPy arrays, ``a.view(ndarray)``, do not come through here.)
    """

    def __new__(cls, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is None:
            return np.ndarray.__new__(cls, shape, dtype, strides=strides, order=order)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes == 0:
            return np.ndarray.__new__(cls, shape, dtype, strides=strides, order=order)
        buf = (ctypes.c_char * nbytes).from_address(memptr.ptr)
        a = np.ndarray.__new__(cls, shape, dtype, buffer=buf, strides=strides, order=order)
        a._memptr = memptr  # CuPy's array holds its MemoryPointer (and so its memory's owner)
        return a

    @property
    def data(self):  # CuPy: a MemoryPointer with .ptr
        ptr = self.__array_interface__["data"][0]
        return MemoryPointer(UnownedMemory(ptr, self.nbytes, self), 0)

    @property
    def device(self):  # CuPy: the array's Device (one here)
        return Device(0)

    @property
    def __cuda_array_interface__(self):
        ai = self.__array_interface__
        return {"shape": ai["shape"], "typestr": ai["typestr"], "data": ai["data"],
                "strides": ai["strides"], "version": 3}

    def get(self, stream=None, order="C", out=None, blocking=True):
        _check_stream(stream)
        if out is None:
            return np.array(self.view(np.ndarray), order=order)
        if out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError(f"get(out=): shape/dtype {out.shape} {out.dtype} != {self.shape} {self.dtype}")
        out[...] = self.view(np.ndarray)
        return out

    def set(self, arr, stream=None):
        _check_stream(stream)
        arr = np.asarray(arr)
        if arr.shape != self.shape:
            raise ValueError(f"set(): shape {arr.shape} != {self.shape}")
        self.view(np.ndarray)[...] = arr


def _wrap(a: np.ndarray) -> ndarray:
    return a.view(ndarray)


def zeros(shape, dtype=float):
    return _wrap(np.zeros(shape, dtype=dtype))


def empty(shape, dtype=float):
    return _wrap(np.full(shape, 0x5A, dtype=dtype))  # not zeros: code must not rely on them


def full(shape, value, dtype=float):
    return _wrap(np.full(shape, value, dtype=dtype))


def arange(*args, **kwargs):
    return _wrap(np.arange(*args, **kwargs))


def asarray(x):
    if isinstance(x, ndarray):
        return x
    return _wrap(np.array(x, order="C"))  # host data is copied "to the device", as CuPy does


def array(x):
    return _wrap(np.array(x, order="C"))  # always a copy, as cupy.array


def asnumpy(x, stream=None):
    _check_stream(stream)
    return np.array(np.asarray(x))


def count_nonzero(x):
    return int(np.count_nonzero(np.asarray(x)))


def get_default_memory_pool():
    return types.SimpleNamespace(free_all_blocks=lambda: None)


# -- streams and events ------------------------------------------------------------------------

class Stream:
    """A stream handle with CuPy's methods; the work it names has already run."""

    def __init__(self, non_blocking: bool = False, ptr: int | None = None):
        self.ptr = next(_ptrs) if ptr is None else int(ptr)

    def synchronize(self) -> None:
        pass

    def wait_event(self, event) -> None:
        if not isinstance(event, Event):
            raise TypeError(f"wait_event needs an Event, got {type(event).__name__}")
        if not event.recorded:
            raise RuntimeError("waiting on an event that was never recorded")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def ExternalStream(ptr):  # noqa: N802 -- CuPy's name
    return Stream(ptr=ptr)


_CURRENT = Stream(ptr=0)


def get_current_stream():
    return _CURRENT


def _check_stream(stream) -> None:
    if stream is not None and not isinstance(stream, Stream):
        raise TypeError(f"stream must be a Stream, got {type(stream).__name__}")


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.recorded = False
        self.t = 0.0

    def record(self, stream=None) -> None:
        _check_stream(stream)
        self.recorded = True
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        if not self.recorded:
            raise RuntimeError("synchronising an event that was never recorded")

    @property
    def done(self) -> bool:  # CuPy's name (it has no query()); every operation has run at once
        if not self.recorded:
            raise RuntimeError("querying an event that was never recorded")
        return True


def alloc_pinned_memory(nbytes: int):
    return bytearray(int(nbytes))


CAPTURING: set[int] = set()  # raw stream handles a test says are being captured into a graph


class _Runtime:
    CUDARuntimeError = RuntimeError
    memcpyDeviceToDevice = 3

    @staticmethod
    def streamIsCapturing(stream: int) -> bool:  # noqa: N802
        return int(stream) in CAPTURING

    @staticmethod
    def memsetAsync(ptr: int, value: int, size: int, stream: int) -> None:  # noqa: N802
        ctypes.memset(int(ptr), int(value), int(size))  # at once, as every stand-in launch

    @staticmethod
    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:  # noqa: N802
        if kind != 3 or not isinstance(stream, int):
            raise TypeError("fake memcpyAsync: device to device, on a raw stream handle")
        ctypes.memmove(int(dst), int(src), int(size))

    @staticmethod
    def getDevice():  # noqa: N802
        return 0

    @staticmethod
    def getDeviceCount():  # noqa: N802
        return 1

    @staticmethod
    def getDeviceProperties(i):  # noqa: N802
        return {"name": b"simulated device"}


class Device:
    def __init__(self, i: int = 0):
        self.id = i

    @property
    def pci_bus_id(self) -> str:
        """One stand-in GPU per process, unless ``FAKE_CUPY_GPU_ID`` names one they all share."""
        return os.environ.get("FAKE_CUPY_GPU_ID") or f"fake:{os.getpid()}"

    def use(self) -> None:
        pass


# -- the one elementwise kernel zipccl defines ------------------------------------------------

class ElementwiseKernel:
    """zipccl's reductions (``reduction.DEVICE_SUM`` / ``DEVICE_DIVIDE``): the stated sum and
    AVG's division of ``reduction``, by name."""

    _TYPES = {"zipccl_reduce_sum_bf16": np.uint16, "zipccl_reduce_sum_fp32": np.float32,
              "zipccl_reduce_sum_fp16": np.float16, "zipccl_divide_bf16": np.uint16,
              "zipccl_divide_fp32": np.float32, "zipccl_divide_fp16": np.float16}

    def __init__(self, in_params: str, out_params: str, operation: str, name: str, preamble: str = ""):
        if name not in self._TYPES:
            raise NotImplementedError(f"fake_cupy knows only zipccl's reductions, not {name}")
        self.dtype = self._TYPES[name]
        self.divide = name.startswith("zipccl_divide")

    def __call__(self, stack, p, m, out=None):
        from zipccl.comm.reduction import divide, reduce_sum

        if self.divide:  # (x, p, y): in place, y is x
            y = np.asarray(m).view(self.dtype)
            divide(y, int(p))
            return

        p, m, k = int(p), int(m), out.size
        flat = np.asarray(stack).reshape(-1).view(self.dtype)
        rows = np.stack([flat[r * m:r * m + k] for r in range(p)])
        res = np.zeros(k, dtype=self.dtype)
        reduce_sum(rows, res)
        np.asarray(out).view(self.dtype)[...] = res


class RawModule:
    """zipccl's CUDA C kernels (``kernels.spill``): each kernel runs its NumPy twin at once,
    on the addresses it is launched with (host memory here)."""

    def __init__(self, code: str = "", options=(), **kwargs):
        from zipccl.kernels import spill

        if not all(name in code for name in spill.HOST_TWINS):
            raise NotImplementedError("fake_cupy.RawModule knows only zipccl's spill kernels")
        self._twins = spill.HOST_TWINS

    def get_function(self, name: str):
        if name not in self._twins:
            raise NotImplementedError(f"fake_cupy.RawModule has no kernel {name}")
        return _RawKernel(self._twins[name])


class _RawKernel:
    def __init__(self, twin):
        self.twin = twin

    def __call__(self, grid, block, args, stream=None, shared_mem: int = 0) -> None:
        if not isinstance(stream, int):  # zipccl passes its raw stream handle (kernels.launch.words)
            _check_stream(stream)
        if not (isinstance(grid, tuple) and isinstance(block, tuple)):
            raise TypeError("RawKernel grid and block are tuples")
        if not all(isinstance(a, np.uint64) for a in args):
            raise TypeError(f"zipccl passes kernel arguments as numpy.uint64, got {args!r}")
        self.twin(*(int(a) for a in args))


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (host time here)."""
    return 1e3 * (end.t - start.t)


class _RandomState:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def standard_normal(self, n: int, dtype=np.float64):
        return _wrap(self.rng.standard_normal(n).astype(dtype))


random = types.SimpleNamespace(RandomState=_RandomState)
__version__ = "fake"


# -- NCCL over MPI (BF16 sums are zipccl's stated sum; other types reduce in rank order) -----

def _bytes_at(ptr: int, nbytes: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr))[:nbytes]


class _Nccl(types.ModuleType):
    NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
    NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
    _ITEM = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2}
    _group: list | None = None

    def __init__(self):
        super().__init__("cupy.cuda.nccl")
        self.NcclCommunicator = _make_nccl_comm(self)

    @staticmethod
    def get_version():
        return 22809

    @staticmethod
    def get_unique_id():
        return (0,)

    def groupStart(self):  # noqa: N802
        self._group = []

    def groupEnd(self):  # noqa: N802
        ops, self._group = self._group, None
        reqs = []
        for kind, comm, buf, peer in ops:
            reqs.append(comm.Isend(buf, dest=peer, tag=7) if kind == "send"
                        else comm.Irecv(buf, source=peer, tag=7))
        from mpi4py import MPI

        MPI.Request.Waitall(reqs)


_NUMPY = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
          6: np.float16, 7: np.float32, 8: np.float64}
_OPS = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}


def _make_nccl_comm(nccl: _Nccl):
    class NcclCommunicator:
        def __init__(self, size: int, uid, rank: int):
            from mpi4py import MPI

            self.comm = MPI.COMM_WORLD.Dup()  # a test stand-in: the ranks are the world's
            assert self.comm.Get_size() == size and self.comm.Get_rank() == rank

        def allGather(self, send, recv, count, dtype, stream):  # noqa: N802
            n = count * nccl._ITEM[dtype]
            self.comm.Allgather(_bytes_at(send, n).copy(), _bytes_at(recv, n * self.comm.Get_size()))

        def _reduced(self, send, count, dtype, op):
            """Every rank's ``count`` values reduced: BF16 sums as zipccl states them (FP32 in
            rank order, one rounding), other types with NumPy in rank order."""
            p, item = self.comm.Get_size(), nccl._ITEM[dtype]
            mine = _bytes_at(send, item * count).copy()
            allb = np.empty(p * item * count, np.uint8)
            self.comm.Allgather(mine, allb)
            if dtype == nccl.NCCL_BFLOAT16 and op != nccl.NCCL_SUM:  # max, min: exact in FP32
                from zipccl.comm.reduction import bf16_bits_to_f32, f32_to_bf16_bits

                rows = bf16_bits_to_f32(allb.view(np.uint16).reshape(p, count))
                out = rows[0].copy()
                for r in range(1, p):
                    out = _OPS[op](out, rows[r])
                return f32_to_bf16_bits(out).view(np.uint8)
            if dtype == nccl.NCCL_BFLOAT16:
                from zipccl.comm.reduction import reduce_sum_bf16

                out = np.empty(count, np.uint16)
                reduce_sum_bf16(allb.view(np.uint16).reshape(p, count), out)
                return out.view(np.uint8)
            rows = allb.view(_NUMPY[dtype]).reshape(p, count)
            out = rows[0].copy()
            for r in range(1, p):
                out = _OPS[op](out, rows[r])
            return out.view(np.uint8)

        def allReduce(self, send, recv, count, dtype, op, stream):  # noqa: N802
            _bytes_at(recv, nccl._ITEM[dtype] * count)[...] = self._reduced(send, count, dtype, op)

        def reduceScatter(self, send, recv, count, dtype, op, stream):  # noqa: N802
            p, me, item = self.comm.Get_size(), self.comm.Get_rank(), nccl._ITEM[dtype]
            full = self._reduced(send, p * count, dtype, op)
            _bytes_at(recv, item * count)[...] = full[me * item * count:(me + 1) * item * count]

        def send(self, ptr, count, dtype, peer, stream):
            nccl._group.append(("send", self.comm, _bytes_at(ptr, count * nccl._ITEM[dtype]).copy(),
                                peer))

        def recv(self, ptr, count, dtype, peer, stream):
            nccl._group.append(("recv", self.comm, _bytes_at(ptr, count * nccl._ITEM[dtype]), peer))

        def destroy(self):
            self.comm.Free()

    return NcclCommunicator


def install() -> types.ModuleType:
    """Make ``import cupy`` return this module (with ``cupy.cuda``)."""
    mod = sys.modules[__name__]
    cuda = types.ModuleType("cupy.cuda")
    cuda.Stream, cuda.ExternalStream, cuda.Event = Stream, ExternalStream, Event
    cuda.get_current_stream, cuda.alloc_pinned_memory = get_current_stream, alloc_pinned_memory
    cuda.runtime, cuda.Device, cuda.get_elapsed_time = _Runtime, Device, get_elapsed_time
    cuda.UnownedMemory, cuda.MemoryPointer = UnownedMemory, MemoryPointer
    cuda.nccl = _Nccl()
    mod.cuda = cuda
    sys.modules["cupy"] = mod
    sys.modules["cupy.cuda"] = cuda
    sys.modules["cupy.cuda.nccl"] = cuda.nccl
    return mod
