"""A compressed device call makes no host wait: ``with_fake_cupy.py --cpu-codec -m pytest`` on 2 ranks.

Every entry point through which zipccl could make the caller's thread wait for the device or
for a peer is counted while steady-state compressed calls run on device arrays (the fake
CuPy: host memory that says it is a device, NCCL over MPI): stream and event
synchronisation, device-to-host reads (``get``, ``asnumpy``, workspace read-backs), and the
communicator's host agreements (its control row and error flags over MPI). The transfers
themselves (NCCL, here stood in for by MPI) are the transport's, not zipccl's, and are not
counted. The first call of a signature agrees once, so each case warms up first.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from mpi4py import MPI

import zipccl
from zipccl.comm import transport as _transport

WORLD = MPI.COMM_WORLD
P, ME = WORLD.Get_size(), WORLD.Get_rank()


@contextlib.contextmanager
def counted_waits():
    """Count every call of the entry points that wait (yields the dict of counts)."""
    import cupy

    import zipccl.codec.gpu_workspace as gpu_workspace  # the stand-in codec, once installed

    counts: dict[str, int] = {}
    patches = []

    def wrap(owner, name: str, label: str):
        real = getattr(owner, name)

        def counting(*args, **kwargs):
            counts[label] = counts.get(label, 0) + 1
            return real(*args, **kwargs)

        patches.append((owner, name, real))
        setattr(owner, name, counting)

    wrap(cupy.cuda.Stream, "synchronize", "Stream.synchronize")
    wrap(cupy.cuda.Event, "synchronize", "Event.synchronize")
    wrap(cupy.ndarray, "get", "ndarray.get")
    wrap(cupy, "asnumpy", "cupy.asnumpy")
    wrap(gpu_workspace.Workspace, "_slots", "Workspace read-back")
    for name in ("allgather_ints", "any_flag", "allgather_objects"):
        wrap(_transport.MPITransport, name, f"MPITransport.{name}")
    try:
        yield counts
    finally:
        for owner, name, real in reversed(patches):
            setattr(owner, name, real)


@pytest.fixture(scope="module")
def comm():
    c = zipccl.Communicator(WORLD, backend="nccl", policy="always")
    yield c
    c.close()


def gaussian(n: int, seed: int) -> np.ndarray:
    import ml_dtypes

    x = np.random.default_rng(seed).normal(0, 0.02, n).astype(ml_dtypes.bfloat16)
    return x.view(np.uint16)


CALLS = ("all_gather", "reduce_scatter", "all_to_all", "all_to_all_counts", "all_reduce")


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("n", [4096, 70_000])
def test_steady_state_compressed_calls_make_no_host_wait(comm, call, n):
    import cupy

    x = cupy.asarray(gaussian(P * n, ME))
    out_big = cupy.zeros(P * n, dtype=cupy.uint16)
    out_small = cupy.zeros(n, dtype=cupy.uint16)
    total = sum(n + 7 * (ME + 1) * (j + 1) for j in range(P))
    x_counts = cupy.asarray(gaussian(total, ME + 10))
    out_counts = cupy.zeros(total, dtype=cupy.uint16)

    def run():
        if call == "all_gather":
            comm.all_gather(x[:n], out_big, dtype="bfloat16")
        elif call == "reduce_scatter":
            comm.reduce_scatter(x, out_small, dtype="bfloat16")
        elif call == "all_to_all":
            comm.all_to_all(x, out_big, dtype="bfloat16")
        elif call == "all_to_all_counts":  # per-peer counts, both given (as MoE dispatch has them)
            sc = [n + 7 * (ME + 1) * (j + 1) for j in range(P)]
            rc = [n + 7 * (j + 1) * (ME + 1) for j in range(P)]
            comm.all_to_all(x_counts, out_counts, sc, rc, dtype="bfloat16")
        else:
            buf = x.copy()
            comm.all_reduce(buf, dtype="bfloat16")

    run()  # the first call of a signature agrees once (and sets up NCCL)
    assert comm.last_decision.compress
    with counted_waits() as counts:
        for _ in range(5):
            run()
    assert counts == {}, f"{call} of {n} values waited on the host: {counts}"


def test_counting_sees_a_wait():
    """The instrument itself: a synchronising call is counted (so the test above can fail)."""
    import cupy

    with counted_waits() as counts:
        cupy.asnumpy(cupy.zeros(4))
        cupy.cuda.get_current_stream().synchronize()
    assert counts == {"cupy.asnumpy": 1, "Stream.synchronize": 1}
