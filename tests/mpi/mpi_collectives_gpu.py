"""The collectives on device arrays, both transports, against seed-derived expectations.

Run by ``tests/test_comm_gpu.py`` as ``mpirun -n 2 python -m pytest tests/mpi/mpi_collectives_gpu.py``
on a machine with GPUs (one per rank when there are enough). Expected outputs are
computed on the host from the same seeds as ``mpi_collectives.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

cupy = pytest.importorskip("cupy")

from mpi_collectives import KINDS, expected_sum, rank_input  # noqa: E402

import zipccl  # noqa: E402
from zipccl.comm import CollectiveError  # noqa: E402

WORLD = MPI.COMM_WORLD
P, ME = WORLD.Get_size(), WORLD.Get_rank()
cupy.cuda.Device(ME % cupy.cuda.runtime.getDeviceCount()).use()


# (backend, policy, chunk_bytes): pipelined in one round (default chunk) and in rounds of
# 32768 elements (the larger sizes below take several), two-phase (0), native
@pytest.fixture(scope="module", params=[("nccl", "always", None), ("nccl", "always", 65536),
                                        ("nccl", "always", 0), ("nccl", "never", None),
                                        ("mpi", "always", 65536), ("mpi", "never", None)],
                ids=lambda b: f"{b[0]}-{b[1]}-{b[2]}")
def comm(request):
    backend, policy, chunk_bytes = request.param
    c = zipccl.Communicator(WORLD, backend=backend, policy=policy, chunk_bytes=chunk_bytes)
    yield c
    c.close()


def dev(bits: np.ndarray):
    return cupy.asarray(bits)


def host(a) -> np.ndarray:
    return cupy.asnumpy(a).view(np.uint16)


def _nan(bits: np.ndarray) -> np.ndarray:
    return (bits & 0x7FFF) > 0x7F80


def _subnormal(bits: np.ndarray) -> np.ndarray:
    return ((bits & 0x7F80) == 0) & ((bits & 0x7F) != 0)


def check_native_nccl_sum(comm, got: np.ndarray, direct: np.ndarray, shards: list[np.ndarray],
                          kind: str) -> None:
    """A native NCCL reduction: NCCL's bits, passed through unchanged, checked against the
    stated sum where NCCL's rounding is defined the same.

    ``direct`` is NCCL's own BF16 sum of the same data, called directly. NaN comes out where
    the stated sum has NaN (IEEE: a NaN or inf - inf among the addends), whatever its payload.
    Gaussian data has neither NaN nor subnormals, so the bits equal the stated sum; on two
    ranks a sum is one IEEE addition (commutative, rounded once), so they equal it too
    wherever no addend and no result is subnormal (a GPU may flush those) or NaN.
    """
    assert comm.transport_name == "nccl" and not comm.last_decision.compress
    assert np.array_equal(got, direct)
    want = expected_sum(shards)
    assert np.array_equal(_nan(got), _nan(want))
    if kind == "gaussian":
        assert np.array_equal(got, want)
    elif P == 2:
        defined = ~(_nan(want) | _subnormal(want) | _subnormal(shards[0]) | _subnormal(shards[1]))
        assert got.size < 1000 or defined.mean() > 0.9  # the comparison covers most values
        assert np.array_equal(got[defined], want[defined])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 33, 4097, 100_000])
def test_all_gather(comm, kind, n):
    out = cupy.full(P * n, 0xABCD, dtype=cupy.uint16)
    comm.all_gather(dev(rank_input(kind, ME, n)), out, dtype="bfloat16")
    assert np.array_equal(host(out), np.concatenate([rank_input(kind, r, n) for r in range(P)]))


def test_transport_is_the_one_asked_for(comm):
    out = cupy.zeros(P * 8, dtype=cupy.uint16)
    comm.all_gather(dev(rank_input("gaussian", ME, 8)), out, dtype="bfloat16")
    expected = "nccl" if comm.backend == "nccl" else ("mpi" if comm.mpi.cuda_aware else "mpi-staged")
    assert comm.transport_name == expected


@pytest.mark.parametrize("kind", KINDS)
def test_all_to_all_uneven(comm, kind):
    m = np.random.default_rng(11).integers(0, 30000, (P, P))
    inputs = [rank_input(kind, r, int(m[r].sum()), seed=4) for r in range(P)]
    out = cupy.zeros(int(m[:, ME].sum()), dtype=cupy.uint16)
    comm.all_to_all(dev(inputs[ME]), out, send_counts=list(m[ME]), dtype="bfloat16")
    pieces = [inputs[r][int(m[r, :ME].sum()):][:m[r, ME]] for r in range(P)]
    assert np.array_equal(host(out), np.concatenate(pieces))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 70_000])
def test_reduce_scatter(comm, kind, m):
    inputs = [rank_input(kind, r, P * m, seed=6) for r in range(P)]
    out = cupy.zeros(m, dtype=cupy.uint16)
    comm.reduce_scatter(dev(inputs[ME]), out, dtype="bfloat16")
    shards = [x[ME * m:(ME + 1) * m] for x in inputs]
    if comm.last_decision.compress or comm.transport_name != "nccl":
        assert np.array_equal(host(out), expected_sum(shards))
    else:
        direct = cupy.zeros(m, dtype=cupy.uint16)
        comm._nccl.reduce_scatter(dev(inputs[ME]), direct, "sum", dtype="bfloat16")
        check_native_nccl_sum(comm, host(out), host(direct), shards, kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [5, 150_001])
def test_all_reduce(comm, kind, n):
    inputs = [rank_input(kind, r, n, seed=8) for r in range(P)]
    buf = dev(inputs[ME])
    comm.all_reduce(buf, dtype="bfloat16")
    got = host(buf)
    assert len({g.tobytes() for g in WORLD.allgather(got)}) == 1  # the same bits on every rank
    if comm.last_decision.compress or comm.transport_name != "nccl":
        assert np.array_equal(got, expected_sum(inputs))
    else:
        direct = dev(inputs[ME])
        comm._nccl.allreduce(direct, "sum", dtype="bfloat16")
        check_native_nccl_sum(comm, got, host(direct), inputs, kind)


def test_torch_and_numba_arrays_and_streams(comm):
    torch = pytest.importorskip("torch")
    n = 50_000
    x = rank_input("gaussian", ME, n)
    t = torch.from_numpy(x.astype(np.int16)).cuda().view(torch.bfloat16)
    out = torch.zeros(P * n, dtype=torch.bfloat16, device="cuda")
    comm.all_gather(t, out)
    torch.cuda.synchronize()
    want = np.concatenate([rank_input("gaussian", r, n) for r in range(P)])
    assert np.array_equal(out.view(torch.int16).cpu().numpy().view(np.uint16), want)

    from numba import cuda

    nb_out = cuda.device_array(P * n, dtype=np.uint16)
    s = cupy.cuda.Stream(non_blocking=True)
    comm.all_gather(cuda.to_device(x), nb_out, dtype="bfloat16", stream=s)
    s.synchronize()
    assert np.array_equal(nb_out.copy_to_host(), want)


def test_errors_on_every_rank(comm):
    x = cupy.zeros(100 + (ME == 0), dtype=cupy.uint16)
    with pytest.raises(CollectiveError):
        comm.all_gather(x, cupy.zeros(P * 100, dtype=cupy.uint16), dtype="bfloat16")
    host_or_dev = np.zeros(100, np.uint16) if ME == 0 else cupy.zeros(100, dtype=cupy.uint16)
    with pytest.raises(CollectiveError):
        comm.all_gather(host_or_dev, cupy.zeros(P * 100, dtype=cupy.uint16), dtype="bfloat16")
    good = cupy.zeros(P * 100, dtype=cupy.uint16)
    comm.all_gather(x[:100], good, dtype="bfloat16")


def test_calibrated_auto_on_device():
    c = zipccl.Communicator(WORLD, backend="nccl", policy="auto")
    prof = c.calibrate(device=True, sizes=(1 << 16, 1 << 20), ops=("all_gather",), repeat=1)
    assert prof.key.startswith(f"device|nccl|{P} ranks|")
    assert prof.predict("all_gather", 1 << 20) is not None
    out = cupy.zeros(P * 4096, dtype=cupy.uint16)
    c.all_gather(dev(rank_input("gaussian", ME, 4096)), out, dtype="bfloat16")
    assert np.array_equal(host(out), np.concatenate([rank_input("gaussian", r, 4096) for r in range(P)]))
    assert len(set(WORLD.allgather(str(c.last_decision)))) == 1
    c.close()


@pytest.mark.skipif(P == 1, reason="one rank sends no frames")
@pytest.mark.parametrize("where", ["header", "payload"])
def test_corrupted_frame_detected_on_device(where):
    from zipccl.comm.transport import cupy_stream

    c = zipccl.Communicator(WORLD, backend="nccl", policy="always", checksum=True,
                            chunk_bytes=65536)
    n = 100_000  # 4 rounds of 32768 elements
    x = dev(rank_input("edge", ME, n))
    out = cupy.zeros(P * n, dtype=cupy.uint16)
    c.all_gather(x, out, dtype="bfloat16")  # sets NCCL up
    real, calls = c._nccl.allgather, []

    def corrupting(send, recv, stream=None):
        real(send, recv, stream)
        calls.append(1)
        if ME == 0 and len(calls) == 2:  # the second round's frame from rank 1
            at = ((ME + 1) % P) * send.nbytes + {"header": 20, "payload": 200}[where]
            with cupy_stream(stream):
                recv[at:at + 1] ^= 1

    c._nccl.allgather = corrupting
    with pytest.raises(CollectiveError, match="rank 0: frame from rank 1: corrupted"):
        c.all_gather(x, out, dtype="bfloat16")
    c._nccl.allgather = real
    c.all_gather(x, out, dtype="bfloat16")  # usable afterwards
    assert np.array_equal(host(out), np.concatenate([rank_input("edge", r, n) for r in range(P)]))
    c.close()


def test_agreed_native_calls_replay_the_bound_nccl_call():
    """A native call seen before: no control exchange, the NCCL call from its plan, same bits."""
    c = zipccl.Communicator(WORLD, backend="nccl", policy="never")
    n = 4096
    x = dev(rank_input("gaussian", ME, P * n))
    outs = {"ag": cupy.zeros(P * P * n, dtype=cupy.uint16), "a2a": cupy.zeros(P * n, dtype=cupy.uint16),
            "ar": cupy.zeros(P * n, dtype=cupy.uint16)}
    calls = {"ag": lambda: c.all_gather(x, outs["ag"], dtype="bfloat16"),
             "a2a": lambda: c.all_to_all(x, outs["a2a"], dtype="bfloat16"),
             "ar": lambda: c.all_reduce(outs["ar"], dtype="bfloat16")}
    for f in calls.values():
        f()  # agreed and planned
    control = []
    real = c.mpi.allgather_ints
    c.mpi.allgather_ints = lambda *a: control.append(1) or real(*a)
    outs["ar"][...] = x
    for f in calls.values():
        f()
    assert not control
    assert sum(plan.run is not None for plan in c._plans.values()) == 3
    inputs = [rank_input("gaussian", r, P * n) for r in range(P)]
    assert np.array_equal(host(outs["ag"]), np.concatenate(inputs))
    assert np.array_equal(host(outs["a2a"]), np.concatenate([i[ME * n:(ME + 1) * n] for i in inputs]))
    ref = x.copy()  # NCCL's own BF16 sum, called directly
    c._nccl.allreduce(ref, "sum", None, dtype="bfloat16")
    assert np.array_equal(host(outs["ar"]), host(ref))
    c.close()
