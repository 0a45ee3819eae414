"""Transports: the byte movers under the collectives, NCCL or MPI behind one small interface.

The compressed collectives only ever need byte exchanges whose sizes sender and receiver
know in advance (``alltoallv``, ``allgather``), plus the native typed reductions the
uncompressed path uses; ``Transport`` states that interface. Everything here is a thin
wrapper around mpi4py or ``cupy.cuda.nccl``: no algorithm lives here.

- ``MPITransport`` moves NumPy buffers directly, and device buffers straight to MPI only when
  the MPI library *says* it is CUDA-aware (``detect_cuda_aware_mpi``); otherwise through
  reusable pinned host buffers, because device pointers crash a non-CUDA-aware MPI.
- ``NCCLTransport`` moves CuPy device buffers with NCCL on a CUDA stream (all-to-all as
  grouped send/recv), its unique id broadcast over the wrapped MPI communicator.
- ``choose_device_transport``: NCCL where every rank can run it on a GPU of its own, else MPI.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import numpy as np

REDUCE_OPS = ("sum", "prod", "max", "min")
ENV_CUDA_AWARE = "ZIPCCL_MPI_CUDA_AWARE"  # "1"/"0": the user states it; unset: ask the library


def detect_cuda_aware_mpi() -> bool:
    """True only if the loaded MPI library reports CUDA support at run time.

    Asks ``MPIX_Query_cuda_support()`` (Open MPI, MPICH) or
    ``MPIX_GPU_query_support(CUDA)`` (MPICH) in the library mpi4py is linked to.
    If neither exists the answer is False: CUDA-awareness is never assumed. The
    environment variable ``ZIPCCL_MPI_CUDA_AWARE=0|1`` overrides the query.

    >>> isinstance(detect_cuda_aware_mpi(), bool)
    True
    """
    env = os.environ.get(ENV_CUDA_AWARE)
    if env in ("0", "1"):
        return env == "1"
    try:
        from mpi4py import MPI

        lib = ctypes.CDLL(MPI.__file__)  # dlsym on it also searches libmpi, its dependency
    except (ImportError, OSError):
        return False
    query = getattr(lib, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.restype = ctypes.c_int
        query.argtypes = []
        return bool(query())
    gpu_query = getattr(lib, "MPIX_GPU_query_support", None)
    if gpu_query is not None:
        supported = ctypes.c_int(0)
        gpu_query.restype = ctypes.c_int
        if gpu_query(ctypes.c_int(0), ctypes.byref(supported)) == 0:  # 0 = MPIX_GPU_SUPPORT_CUDA
            return bool(supported.value)
    return False


def is_device_buffer(x) -> bool:
    """True for a CuPy array (the only device buffer type the transports see)."""
    return hasattr(x, "__cuda_array_interface__")


def stream_ptr(stream) -> int:
    """The raw cudaStream_t of a CuPy / torch stream, an int, or None (CuPy's current stream)."""
    if stream is None:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"cannot read a CUDA stream handle from {type(stream).__name__}")


_CUPY_STREAMS: dict[tuple[int, int], object] = {}


def cupy_stream(stream):
    """A cached CuPy wrapper of the caller's stream (CuPy / torch / int / None = CuPy's current)."""
    import cupy

    ptr = stream_ptr(stream)
    key = (cupy.cuda.runtime.getDevice(), ptr)
    s = _CUPY_STREAMS.get(key)
    if s is None:
        import warnings

        with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external(obj); we hold a raw handle
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _CUPY_STREAMS[key] = cupy.cuda.ExternalStream(ptr)
    return s


class DeviceChoice(NamedTuple):
    """Where a communicator's device arrays go (``choose_device_transport``)."""

    name: str | None  # "nccl" | "mpi"; None with an error
    note: str | None  # one line saying why NCCL was passed over, where the user should know
    error: str | None  # the forced backend cannot run: what to change


def current_gpu_id() -> str | None:
    """"<PCI bus id> on <node>" of CuPy's current device: equal on two ranks exactly when they
    share a GPU; None when it cannot be read (then no sharing is assumed)."""
    try:
        import socket

        import cupy

        return f"{cupy.cuda.Device().pci_bus_id} on {socket.gethostname()}"
    except Exception:  # noqa: BLE001 -- no CuPy, no device, a CuPy without the property
        return None


def shared_gpus(gpu_ids: Sequence) -> list[list[int]]:
    """The groups of ranks (two or more each) whose ``gpu_ids`` (one hashable per rank, e.g.
    "<PCI bus id> on <node>"; None: unknown, shared with no one) are equal.

    >>> shared_gpus([("a", "0:19"), ("a", "0:19"), ("b", "0:19"), None, None])
    [[0, 1]]
    """
    groups: dict = {}
    for rank, gid in enumerate(gpu_ids):
        if gid is not None:
            groups.setdefault(gid, []).append(rank)
    return [ranks for ranks in groups.values() if len(ranks) > 1]


def choose_device_transport(backend: str, nccl_errors: Sequence[str | None], gpu_ids: Sequence,
                            cuda_aware: bool = False) -> DeviceChoice:
    """The transport of device arrays, from every rank's NCCL check and GPU: NCCL where it can
    run (every rank has it, no two ranks on one GPU), else MPI under ``backend="auto"``; under
    ``backend="nccl"`` an error saying what to change. The same on every rank (same inputs).

    >>> choose_device_transport("auto", [None, None], ["gpu0", "gpu1"])
    DeviceChoice(name='nccl', note=None, error=None)
    >>> choose_device_transport("auto", [None, None], ["gpu0", "gpu0"]).name
    'mpi'
    >>> choose_device_transport("nccl", [None, None], ["gpu0", "gpu0"]).error.split(": ", 1)[1][:55]
    'backend="nccl" cannot run here: ranks 0 and 1 share one'
    """
    if backend not in ("auto", "nccl"):
        raise ValueError(f'backend must be "auto" or "nccl" here, got {backend!r}')
    shared = shared_gpus(gpu_ids)
    if shared:
        first = shared[0]
        who = (f"ranks {', '.join(map(str, first[:-1]))} and {first[-1]} share one GPU "
               f"({gpu_ids[first[0]]})" + (f", and {len(shared) - 1} more GPUs are shared"
                                           if len(shared) > 1 else ""))
        if backend == "nccl":
            return DeviceChoice(None, None, f'zipccl: backend="nccl" cannot run here: {who}, and NCCL '
                                f'refuses two ranks on one device; use backend="auto" or "mpi" '
                                f'(device arrays over MPI), or one rank per GPU')
        how = "CUDA-aware" if cuda_aware else "staged through host memory"
        return DeviceChoice("mpi", f"zipccl: {who}; NCCL cannot run two ranks on one GPU, so device "
                            f"arrays go over MPI ({how})", None)
    errors = [f"rank {r}: {e}" for r, e in enumerate(nccl_errors) if e]
    if errors:
        text = "zipccl NCCL set-up failed: " + "; ".join(errors)
        return DeviceChoice(None, None, text) if backend == "nccl" else DeviceChoice("mpi", None, None)
    return DeviceChoice("nccl", None, None)


class Transport:
    """The interface every transport fills.

    - ``alltoallv``: rank i sends ``scounts[j]`` bytes at ``send[sdispls[j]:]`` to rank j and
      receives ``rcounts[j]`` bytes into ``recv[rdispls[j]:]`` (an all-gather is the same call
      with one send region shared by every peer);
    - ``allgather``: equal blocks, for the native (uncompressed) all-gather;
    - ``reduce_scatter``, ``allreduce``: the native typed reductions, for dtypes the transport
      can reduce.

    Counts and displacements are in bytes for the byte exchanges and in elements for the typed
    reductions. Only the regions named by counts and displacements are ever written in a
    receive buffer. Two more services, for the communicator and the collectives:

    - **control exchanges** (``allgather_ints``, ``allgather_objects``, ``any_flag``): small
      host messages of int64 (signatures, error flags) and, on failure only, Python objects
      (error messages), always over the wrapped MPI communicator, whichever transport carries
      the payload; blocking and ordered with each other on every rank;
    - **bound calls** (``bind_*``): a native collective with its arguments packed once (raw
      device pointers, byte counts, the stream handle) into a callable that holds no reference
      to the arrays. ``NCCLTransport`` returns one that is the NCCL call and nothing else; a
      transport that cannot (MPI needs buffer objects) returns None and is called the
      ordinary way.
    """

    name = "abstract"
    own_reduction = False  # a typed sum of its own for BF16, FP32 and FP16 (MPI has no BF16 one)
    moves_device = False  # True: device buffers go to the wire without host staging
    capturable = False  # True: its device calls record into a CUDA graph (NCCL)

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def alltoallv(self, send, scounts: Sequence[int], sdispls: Sequence[int], recv,
                  rcounts: Sequence[int], rdispls: Sequence[int], stream=None) -> None:
        raise NotImplementedError

    def alltoallv_shared(self, send, count: int, at: int, recv, rcounts: Sequence[int],
                         rdispls: Sequence[int], stream=None) -> None:
        """Every peer receives the same ``count`` bytes at ``send[at:]`` (an all-gather's slot;
        every rank sends the same count). An all-to-all reading one region for every peer,
        which MPI and NCCL do without a copy."""
        sc = [0 if j == self.rank else int(count) for j in range(self.size)]
        self.alltoallv(send, sc, [int(at)] * self.size, recv, rcounts, rdispls, stream)

    def allgather(self, send, recv, stream=None) -> None:
        raise NotImplementedError

    def reduce_scatter(self, send, recv, op: str, stream=None, dtype: str | None = None) -> None:
        """Native reduce-scatter of typed buffers; ``dtype`` overrides the buffers' own."""
        raise NotImplementedError

    def allreduce(self, buf, op: str, stream=None, dtype: str | None = None) -> None:
        """Native in-place all-reduce of a typed buffer; ``dtype`` overrides the buffer's own."""
        raise NotImplementedError

    def close(self) -> None:
        """Release transport resources (NCCL communicator, pinned buffers)."""

    # -- control exchanges (host, over MPI, whatever moves the payload) -----------------------
    def allgather_ints(self, row: np.ndarray, table: np.ndarray) -> None:
        """table[i] = rank i's ``row`` (int64; ``table`` is (size, row.size))."""
        self.comm.Allgather(row, table)

    def allgather_objects(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order."""
        return self.comm.allgather(obj)

    def any_flag(self, flag: bool) -> bool:
        """True on every rank if any rank passes True (one 8-byte all-reduce)."""
        from mpi4py import MPI

        mine = self._flag_buffers()
        mine[0] = 1 if flag else 0
        self.comm.Allreduce(mine[:1], mine[1:], op=MPI.MAX)
        return bool(mine[1])

    def _flag_buffers(self) -> np.ndarray:
        buf = getattr(self, "_flags", None)
        if buf is None:
            buf = self._flags = np.zeros(2, dtype=np.int64)
        return buf

    # -- bound native calls: None = "call me the ordinary way" --------------------------------
    def bind_allgather(self, send, recv, stream):
        return None

    def bind_reduce_scatter(self, send, recv, op: str, stream, dtype: str | None = None):
        return None

    def bind_allreduce(self, buf, op: str, stream, dtype: str | None = None):
        return None

    def bind_alltoallv(self, send, scounts, sdispls, recv, rcounts, rdispls, stream):
        return None


class MPITransport(Transport):
    """mpi4py underneath; device buffers staged through pinned host memory unless MPI is CUDA-aware."""

    name = "mpi"

    def __init__(self, comm, cuda_aware: bool | None = None):
        super().__init__(comm)
        self.cuda_aware = detect_cuda_aware_mpi() if cuda_aware is None else bool(cuda_aware)
        self.moves_device = self.cuda_aware
        self._pinned: dict[str, np.ndarray] = {}

    # -- host staging for device buffers ----------------------------------------------------
    def _pinned_buffer(self, role: str, nbytes: int) -> np.ndarray:
        """A reusable pinned host uint8 buffer of at least ``nbytes`` (grown, never shrunk)."""
        buf = self._pinned.get(role)
        if buf is None or buf.size < nbytes:
            import cupy

            mem = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            buf = np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 1))
            self._pinned[role] = buf
        return buf[:nbytes]

    def _stage_in(self, role: str, dev, regions, stream) -> np.ndarray:
        """Copy the byte ``regions`` [(offset, count)] of device array ``dev`` to pinned memory."""
        import cupy

        d8 = dev.view(cupy.uint8)
        host = self._pinned_buffer(role, d8.size)
        s = cupy_stream(stream)
        for off, cnt in regions:
            if cnt:
                d8[off:off + cnt].get(stream=s, out=host[off:off + cnt])
        s.synchronize()
        return host

    def _stage_out(self, host: np.ndarray, dev, regions, stream) -> None:
        """Copy the byte ``regions`` of pinned ``host`` back into device array ``dev``.

        Waits for the copies: the pinned buffer is reused by the next call, whatever its stream.
        """
        import cupy

        d8 = dev.view(cupy.uint8)
        s = cupy_stream(stream)
        for off, cnt in regions:
            if cnt:
                d8[off:off + cnt].set(host[off:off + cnt], stream=s)
        s.synchronize()

    def _device(self, *bufs) -> bool:
        dev = [is_device_buffer(b) for b in bufs]
        if any(dev) and not all(dev):
            raise TypeError("MPI transport: mixing host and device buffers in one call")
        return bool(dev and dev[0])

    def _sync(self, stream) -> None:
        cupy_stream(stream).synchronize()

    # -- byte exchanges ---------------------------------------------------------------------
    def alltoallv(self, send, scounts, sdispls, recv, rcounts, rdispls, stream=None) -> None:
        from mpi4py import MPI

        sc, sd = [int(c) for c in scounts], [int(d) for d in sdispls]
        rc, rd = [int(c) for c in rcounts], [int(d) for d in rdispls]
        device = self._device(send, recv)
        if device and not self.cuda_aware:
            hsend = self._stage_in("send", send, list(zip(sd, sc, strict=True)), stream)
            hrecv = self._pinned_buffer("recv", recv.nbytes)
            self.comm.Alltoallv([hsend, sc, sd, MPI.BYTE], [hrecv, rc, rd, MPI.BYTE])
            self._stage_out(hrecv, recv, list(zip(rd, rc, strict=True)), stream)
            return
        if device:
            self._sync(stream)
        self.comm.Alltoallv([send, sc, sd, MPI.BYTE], [recv, rc, rd, MPI.BYTE])

    def allgather(self, send, recv, stream=None) -> None:
        from mpi4py import MPI

        n = send.nbytes
        device = self._device(send, recv)
        if device and not self.cuda_aware:
            hsend = self._stage_in("send", send, [(0, n)], stream)
            hrecv = self._pinned_buffer("recv", recv.nbytes)
            self.comm.Allgather([hsend, n, MPI.BYTE], [hrecv, n, MPI.BYTE])
            self._stage_out(hrecv, recv, [(0, recv.nbytes)], stream)
            return
        if device:
            self._sync(stream)
        self.comm.Allgather([send, n, MPI.BYTE], [recv, n, MPI.BYTE])

    # -- native typed reductions (host dtypes MPI knows) ------------------------------------
    @staticmethod
    def _mpi_op(op: str):
        from mpi4py import MPI

        return {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]

    def reduce_scatter(self, send, recv, op: str, stream=None, dtype: str | None = None) -> None:
        if dtype == "bfloat16":
            raise TypeError("MPI has no BF16 reduction; zipccl reduces BF16 itself")
        if self._device(send, recv):
            if not self.cuda_aware:
                hsend = self._stage_in("send", send, [(0, send.nbytes)], stream)
                hrecv = self._pinned_buffer("recv", recv.nbytes)
                self.comm.Reduce_scatter_block(hsend.view(send.dtype), hrecv.view(recv.dtype),
                                               self._mpi_op(op))
                self._stage_out(hrecv, recv, [(0, recv.nbytes)], stream)
                return
            self._sync(stream)
        self.comm.Reduce_scatter_block(send, recv, self._mpi_op(op))

    def allreduce(self, buf, op: str, stream=None, dtype: str | None = None) -> None:
        from mpi4py import MPI

        if dtype == "bfloat16":
            raise TypeError("MPI has no BF16 reduction; zipccl reduces BF16 itself")
        if self._device(buf):
            if not self.cuda_aware:
                hbuf = self._stage_in("send", buf, [(0, buf.nbytes)], stream)
                self.comm.Allreduce(MPI.IN_PLACE, hbuf.view(buf.dtype), self._mpi_op(op))
                self._stage_out(hbuf, buf, [(0, buf.nbytes)], stream)
                return
            self._sync(stream)
        self.comm.Allreduce(MPI.IN_PLACE, buf, self._mpi_op(op))

    def close(self) -> None:
        self._pinned.clear()


def nccl_dtype(dtype) -> int:
    """The NCCL datatype enum for a NumPy dtype (BF16 included)."""
    from cupy.cuda import nccl

    name = dtype if dtype == "bfloat16" else np.dtype(dtype).name
    table = {"int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8, "int32": nccl.NCCL_INT32,
             "uint32": nccl.NCCL_UINT32, "int64": nccl.NCCL_INT64, "uint64": nccl.NCCL_UINT64,
             "float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
             "float64": nccl.NCCL_FLOAT64,
             "bfloat16": getattr(nccl, "NCCL_BFLOAT16", 9)}  # ncclBfloat16 = 9 since NCCL 2.10
    if name not in table:
        raise TypeError(f"NCCL cannot reduce dtype {name}")
    return table[name]


class NCCLTransport(Transport):
    """NCCL through ``cupy.cuda.nccl`` on the current CUDA device; device buffers only."""

    name = "nccl"
    own_reduction = True
    moves_device = True
    capturable = True

    def __init__(self, comm):
        super().__init__(comm)
        from cupy.cuda import nccl

        self._nccl = nccl
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nccl_comm = nccl.NcclCommunicator(self.size, uid, self.rank)

    def _check(self, *bufs) -> None:
        for b in bufs:  # is_device_buffer, inline: every compressed call passes here
            if not hasattr(b, "__cuda_array_interface__"):
                raise TypeError("the NCCL transport moves device buffers only")

    def alltoallv(self, send, scounts, sdispls, recv, rcounts, rdispls, stream=None) -> None:
        self._check(send, recv)
        self._alltoallv(send.data.ptr, scounts, sdispls, recv.data.ptr, rcounts, rdispls,
                        stream_ptr(stream))

    def _alltoallv(self, sp: int, scounts, sdispls, rp: int, rcounts, rdispls, s: int) -> None:
        """Grouped send/recv between raw device addresses; the block to self is a device copy."""
        nc = self._nccl
        nc.groupStart()
        try:
            for peer in range(self.size):
                if peer == self.rank:
                    continue
                if scounts[peer]:
                    self.nccl_comm.send(sp + int(sdispls[peer]), int(scounts[peer]), nc.NCCL_UINT8,
                                        peer, s)
                if rcounts[peer]:
                    self.nccl_comm.recv(rp + int(rdispls[peer]), int(rcounts[peer]), nc.NCCL_UINT8,
                                        peer, s)
        finally:
            nc.groupEnd()
        me = self.rank
        if rcounts[me]:
            if rcounts[me] != scounts[me]:
                raise ValueError("alltoallv: self send and receive counts differ")
            from cupy.cuda import runtime

            runtime.memcpyAsync(rp + int(rdispls[me]), sp + int(sdispls[me]), int(rcounts[me]),
                                runtime.memcpyDeviceToDevice, s)

    def allgather(self, send, recv, stream=None) -> None:
        self._check(send, recv)
        self.nccl_comm.allGather(send.data.ptr, recv.data.ptr, send.nbytes, self._nccl.NCCL_UINT8,
                                 stream_ptr(stream))

    def _op(self, op: str) -> int:
        nc = self._nccl
        return {"sum": nc.NCCL_SUM, "prod": nc.NCCL_PROD, "max": nc.NCCL_MAX, "min": nc.NCCL_MIN}[op]

    def reduce_scatter(self, send, recv, op: str, stream=None, dtype: str | None = None) -> None:
        self._check(send, recv)
        self.nccl_comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size,
                                     nccl_dtype(dtype or recv.dtype), self._op(op), stream_ptr(stream))

    def allreduce(self, buf, op: str, stream=None, dtype: str | None = None) -> None:
        self._check(buf)
        self.nccl_comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, nccl_dtype(dtype or buf.dtype),
                                 self._op(op), stream_ptr(stream))

    # -- bound calls: the NCCL call with its arguments packed, nothing else per call ----------
    def bind_allgather(self, send, recv, stream):
        self._check(send, recv)
        return partial(self.nccl_comm.allGather, send.data.ptr, recv.data.ptr, send.nbytes,
                       self._nccl.NCCL_UINT8, stream_ptr(stream))

    def bind_reduce_scatter(self, send, recv, op: str, stream, dtype: str | None = None):
        self._check(send, recv)
        return partial(self.nccl_comm.reduceScatter, send.data.ptr, recv.data.ptr, recv.size,
                       nccl_dtype(dtype or recv.dtype), self._op(op), stream_ptr(stream))

    def bind_allreduce(self, buf, op: str, stream, dtype: str | None = None):
        self._check(buf)
        return partial(self.nccl_comm.allReduce, buf.data.ptr, buf.data.ptr, buf.size,
                       nccl_dtype(dtype or buf.dtype), self._op(op), stream_ptr(stream))

    def bind_alltoallv(self, send, scounts, sdispls, recv, rcounts, rdispls, stream):
        self._check(send, recv)
        return partial(self._alltoallv, send.data.ptr, [int(c) for c in scounts],
                       [int(d) for d in sdispls], recv.data.ptr, [int(c) for c in rcounts],
                       [int(d) for d in rdispls], stream_ptr(stream))

    def close(self) -> None:
        comm, self.nccl_comm = getattr(self, "nccl_comm", None), None
        if comm is not None:
            comm.destroy()
