"""Host channels: the byte messages the spill progress threads move tails over.

A ``HostChannel`` carries point-to-point byte messages between the ranks of one communicator,
for one thread (``spill.Spills``' progress thread, or a capture's, ``spill_sites.Sites``):
``MPIChannel`` over a duplicate of an mpi4py communicator here, ``TorchChannel`` over a gloo
group of zipccl's own in ``zipccl.torch.transport``. A send returns a handle (``SendHandle``)
that keeps its buffer alive until it completes.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Handle(Protocol):
    def wait(self) -> None: ...

    def test(self) -> bool: ...


class HostChannel(Protocol):
    """Point-to-point byte messages between the ranks of one communicator, for one thread."""

    rank: int
    size: int

    def isend(self, data: np.ndarray, peer: int, tag: int) -> Handle: ...

    def recv(self, out: np.ndarray, peer: int, tag: int) -> None: ...

    def twin(self) -> HostChannel: ...

    def close(self) -> None: ...


class SendHandle:
    """A send in flight: its channel's wait and test, and the buffer it must keep alive."""

    def __init__(self, wait, test, buffer):
        self._wait, self._test, self.buffer = wait, test, buffer

    def wait(self) -> None:
        self._wait()

    def test(self) -> bool:
        return bool(self._test())


class MPIChannel:
    """A host channel over a duplicate of an mpi4py communicator (a collective call).

    The progress thread uses it while the caller's thread runs MPI too, so MPI must have
    been initialised with ``MPI_THREAD_MULTIPLE`` (mpi4py's default).
    """

    def __init__(self, comm):
        from mpi4py import MPI

        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError(
                "zipccl's spill thread needs MPI initialised with MPI_THREAD_MULTIPLE; MPI "
                f"provides level {MPI.Query_thread()} (mpi4py requests MULTIPLE unless "
                "mpi4py.rc.thread_level was changed before importing mpi4py.MPI)")
        self._mpi = MPI
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def isend(self, data: np.ndarray, peer: int, tag: int) -> SendHandle:
        req = self.comm.Isend(data, dest=peer, tag=tag)
        return SendHandle(req.Wait, req.Test, data)

    def twin(self) -> MPIChannel:
        """Another channel over the same ranks (a collective call, like this one's making)."""
        return MPIChannel(self.comm)

    def recv(self, out: np.ndarray, peer: int, tag: int) -> None:
        status = self._mpi.Status()
        self.comm.Recv(out, source=peer, tag=tag, status=status)
        got = status.Get_count(self._mpi.BYTE)
        if got != out.size:
            raise RuntimeError(f"spill from rank {peer} (tag {tag}): {got} bytes, expected {out.size}")

    def close(self) -> None:
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
