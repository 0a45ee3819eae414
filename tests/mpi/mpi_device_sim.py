"""The device path of the collectives without a GPU: ``mpiexec -n 2 pytest tests/mpi/mpi_device_sim.py``.

Run by ``tests/test_comm_mpi.py`` (marked slow: the simulator runs every kernel
thread in Python) with ``NUMBA_ENABLE_CUDASIM=1``. ``fake_cupy`` stands in for
CuPy, so ``DeviceEngine``, the pipelined exchange's stream / event / pinned-length
hooks, the two-phase exchange's header reads and the host-staged MPI transport
all run, on messages of a few thousand elements in rounds of 4096, and must give
exactly the expected bits.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 (set by tests/test_comm_mpi.py)", allow_module_level=True)

import fake_cupy  # noqa: E402

cupy = fake_cupy.install()

from mpi_collectives import expected_sum, rank_input  # noqa: E402

import zipccl  # noqa: E402
from zipccl.comm import CollectiveError  # noqa: E402
from zipccl.format.slot import SLOT_HEADER  # noqa: E402

WORLD = MPI.COMM_WORLD
P, ME = WORLD.Get_size(), WORLD.Get_rank()


@pytest.fixture(scope="module", params=[8192, 0], ids=["rounds", "one-round"])
def comm(request):
    c = zipccl.Communicator(WORLD, backend="mpi", policy="always", chunk_bytes=request.param,
                            checksum=True)
    yield c
    c.close()


def dev(bits):
    return cupy.asarray(bits)


def host(a):
    return np.asarray(a).view(np.uint16)


@pytest.mark.parametrize("kind", ["gaussian", "mixed"])
def test_all_gather(comm, kind):
    n = 5000  # two rounds of 4096
    out = cupy.full(P * n, 0xABCD, dtype=cupy.uint16)
    comm.all_gather(dev(rank_input(kind, ME, n)), out, dtype="bfloat16")
    assert comm.transport_name == "mpi-staged"
    assert np.array_equal(host(out), np.concatenate([rank_input(kind, r, n) for r in range(P)]))


def test_reduce_scatter_and_all_reduce(comm):
    m = 4500
    inputs = [rank_input("gaussian", r, P * m, seed=6) for r in range(P)]
    out = cupy.zeros(m, dtype=cupy.uint16)
    comm.reduce_scatter(dev(inputs[ME]), out, dtype="bfloat16")
    assert np.array_equal(host(out), expected_sum([x[ME * m:(ME + 1) * m] for x in inputs]))
    n = 2 * 4097 + 1
    inputs = [rank_input("edge", r, n, seed=8) for r in range(P)]
    buf = dev(inputs[ME])
    comm.all_reduce(buf, dtype="bfloat16")
    assert np.array_equal(host(buf), expected_sum(inputs))


def test_all_to_all_uneven_unaligned(comm):
    m = np.array([[4100, 3], [5, 4099]])[:P, :P]
    inputs = [rank_input("gaussian", r, int(m[r].sum()), seed=4) for r in range(P)]
    out = cupy.zeros(int(m[:, ME].sum()), dtype=cupy.uint16)
    comm.all_to_all(dev(inputs[ME]), out, send_counts=list(m[ME]), dtype="bfloat16")
    pieces = [inputs[r][int(m[r, :ME].sum()):][:m[r, ME]] for r in range(P)]
    assert np.array_equal(host(out), np.concatenate(pieces))


@pytest.mark.skipif(P == 1, reason="one rank sends no frames")
def test_corrupted_frame_detected(comm):
    n = 5000
    x = dev(rank_input("gaussian", ME, n))
    out = cupy.zeros(P * n, dtype=cupy.uint16)
    real_a, calls = comm.mpi.alltoallv, []

    def a2a(send, sc, sd, recv, rc, rd, stream=None):  # the slot exchange: one transfer a round
        real_a(send, sc, sd, recv, rc, rd, stream)
        calls.append(1)
        if ME == 0 and len(calls) == 1:  # round 1's frame from rank 1: a sign-mantissa byte
            recv[rd[1] + SLOT_HEADER + 200] ^= 0x10

    comm.mpi.alltoallv = a2a
    try:
        comm.all_gather(x, out, dtype="bfloat16")  # enqueued; the error surfaces at synchronize()
    finally:
        comm.mpi.alltoallv = real_a
    with pytest.raises(CollectiveError, match="rank 0: corrupted zipccl frame"):
        comm.synchronize()
    with pytest.raises(CollectiveError, match="failed earlier"):  # sticky
        comm.all_gather(x, out, dtype="bfloat16")
