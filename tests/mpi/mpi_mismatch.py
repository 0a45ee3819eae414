"""Misuse on 2 and 3 ranks: every mismatch raises the same CollectiveError on every rank, no hang.

Run by ``tests/test_comm_mpi.py`` as ``mpiexec -n N python -m pytest tests/mpi/mpi_mismatch.py``
(N = 3; on 2 ranks in one job with ``mpi_collectives.py``) under a time limit, so a regression
that hangs fails instead of stalling.
Covers settings that differ at construction (issue 12) and calls that differ in
size, dtype, op, reduction and counts, on every path (compressed pipelined and
two-phase, native), both when the call is new and when some rank's call was
already agreed (the cases ``zipccl.comm.agreement``'s module docstring promises to catch),
plus one rank's local error.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import zipccl
from zipccl.comm import CollectiveError

WORLD = MPI.COMM_WORLD
P, ME = WORLD.Get_size(), WORLD.Get_rank()
BF16 = np.dtype(ml_dtypes.bfloat16)

if P < 2:
    pytest.skip("mismatches need at least two ranks", allow_module_level=True)


def same_error_everywhere(call, match: str | None = None) -> str:
    """Run ``call`` on every rank; every rank must raise CollectiveError with one message."""
    try:
        call()
        msg = None
    except CollectiveError as e:
        msg = str(e)
    msgs = WORLD.allgather(msg)
    assert all(m is not None for m in msgs), f"some ranks did not raise: {msgs}"
    assert len(set(msgs)) == 1, f"ranks raised different messages: {msgs}"
    if match is not None:
        assert re.search(match, msgs[0]), msgs[0]
    return msgs[0]


def bf16(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + ME)
    return rng.normal(0, 0.02, n).astype(np.float32).astype(BF16)


# -- settings that change the path: agreed at construction (issue 12, item 1) -------------------

@pytest.mark.parametrize("setting", [
    {"policy": "always" if ME == 0 else "never"},
    {"chunk_bytes": 8192 if ME == 0 else None},
    {"chunk_bytes": 0 if ME == P - 1 else 8192},
    {"policy": "auto", "min_compress_bytes": 4096 if ME == 0 else 1 << 20, "compress_host": True},
    {"compress_host": ME == 0},
    {"backend": "mpi" if ME == 0 else "auto"},
    {"checksum": ME == 1},
    {"verify": "always" if ME == 0 else "first"},
], ids=["policy", "chunk", "chunk-two-phase", "min-bytes", "compress-host", "backend", "checksum",
        "verify"])
def test_different_settings_raise_at_construction(setting):
    msg = same_error_everywhere(lambda: zipccl.Communicator(WORLD, **setting),
                                "ranks were created with different settings")
    assert "rank 0:" in msg and f"rank {P - 1}:" in msg
    with zipccl.Communicator(WORLD, policy="always") as c:  # the ranks are still in step
        x = bf16(100)
        out = np.zeros(P * 100, BF16)
        c.all_gather(x, out)


def test_settings_changed_on_every_rank_are_followed():
    with zipccl.Communicator(WORLD, policy="always", chunk_bytes=8192) as c:
        x, out = bf16(9000), np.zeros(P * 9000, BF16)
        c.all_gather(x, out)
        c.chunk = 0
        c.policy = zipccl.comm.Policy("never")
        c.all_gather(x, out)
        assert not c.last_decision.compress
        want = np.concatenate(WORLD.allgather(x.view(np.uint16)))
        assert np.array_equal(out.view(np.uint16), want)


# -- calls that differ -------------------------------------------------------------------------

# (policy, chunk_bytes, verify): compressed pipelined, compressed two-phase, native checked once,
# native checked on every call
PATHS = [("always", 8192, "first"), ("always", 0, "first"), ("never", None, "first"),
         ("never", None, "always")]


@pytest.fixture(params=PATHS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def comm(request):
    """A fresh communicator per test: "new" and "agreed" mean what each test says."""
    policy, chunk, verify = request.param
    c = zipccl.Communicator(WORLD, policy=policy, chunk_bytes=chunk, verify=verify)
    yield c
    c.close()


def gather_call(n: int, dtype=BF16):
    x = np.zeros(n, dtype)
    out = np.zeros(P * n, dtype)
    return lambda c: c.all_gather(x, out)


def scatter_call(m: int, op: str = "sum", dtype=BF16):
    x = np.zeros(P * m, dtype)
    out = np.zeros(m, dtype)
    return lambda c: c.reduce_scatter(x, out, op=op)


def reduce_call(n: int, op: str = "sum", dtype=BF16):
    b = np.zeros(n, dtype)
    return lambda c: c.all_reduce(b, op=op)


def a2a_call(n: int, dtype=BF16):
    x, out = np.zeros(P * n, dtype), np.zeros(P * n, dtype)
    return lambda c: c.all_to_all(x, out)


def pick(calls):
    """Rank 0 makes the first call, the others the second."""
    return calls[0] if ME == 0 else calls[1]


MISMATCHES = {
    "all_gather-size": (gather_call(5000), gather_call(5001)),
    "all_gather-dtype": (gather_call(5000), gather_call(5000, np.float16)),
    "reduce_scatter-size": (scatter_call(3000), scatter_call(2999)),
    "reduce_scatter-op": (scatter_call(300, "sum", np.float32), scatter_call(300, "max", np.float32)),
    "all_reduce-size": (reduce_call(7000), reduce_call(7001)),
    "all_to_all-size": (a2a_call(2000), a2a_call(2001)),
    "gather-vs-reduce": (gather_call(4000), reduce_call(4000 * P)),
    "gather-vs-all_to_all": (gather_call(4000), a2a_call(4000)),
    "bf16-vs-float32": (reduce_call(4000), reduce_call(4000, dtype=np.float32)),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_new_calls_that_differ(comm, case):
    call = pick(MISMATCHES[case])
    same_error_everywhere(lambda: call(comm), "ranks disagree on the call")
    MISMATCHES[case][0](comm)  # the ranks are still in step
    MISMATCHES[case][0](comm)


@pytest.mark.parametrize("case", ["all_gather-size", "all_reduce-size", "gather-vs-reduce",
                                  "gather-vs-all_to_all"])
def test_agreed_call_against_another(comm, case):
    """Both calls were agreed before; then the ranks make different ones.

    Caught on the compressed path (the signature rides on the first length exchange)
    and with verify="always"; an agreed native call against another agreed native
    call is, as documented, the caller's mistake and is not run here (it may hang).
    """
    first, second = MISMATCHES[case]
    first(comm)
    second(comm)
    if comm.policy.mode == "never" and comm.verify == "first":
        pytest.skip("documented: agreed native calls are not checked again")
    same_error_everywhere(lambda: pick((first, second))(comm), "ranks disagree on the call")
    first(comm)


def test_agreed_compressed_call_against_a_new_native_one():
    """Rank 0 repeats an agreed compressed call; the others make a new call that goes native."""
    with zipccl.Communicator(WORLD, policy="auto", compress_host=True, min_compress_bytes=8192,
                             chunk_bytes=8192) as c:
        big, small = gather_call(8000), gather_call(100)
        big(c)
        assert c.last_decision.compress
        same_error_everywhere(lambda: pick((big, small))(c), "ranks disagree on the call")
        big(c)
        small(c)
        assert not c.last_decision.compress


@pytest.mark.parametrize("agreed_before", [False, True])
def test_one_rank_local_error(comm, agreed_before):
    n = 3000
    x, good = np.zeros(n, BF16), np.zeros(P * n, BF16)
    if agreed_before:
        comm.all_gather(x, good)
        if comm.policy.mode == "never" and comm.verify == "first":
            pytest.skip("documented: agreed native calls are not checked again")
    bad = np.zeros(P * n, BF16)
    bad.flags.writeable = ME != P - 1
    same_error_everywhere(lambda: comm.all_gather(x, bad), f"rank {P - 1}: recv is read-only")
    comm.all_gather(x, good)


def test_counts_that_differ(comm):
    m = np.random.default_rng(5).integers(0, 3000, (P, P))
    x = np.zeros(int(m[ME].sum()), BF16)
    out = np.zeros(int(m[:, ME].sum()), BF16)
    comm.all_to_all(x, out, send_counts=list(m[ME]))  # agreed and fine
    sc = list(m[ME])
    if ME == 0:
        sc[1] += 1
    x2 = np.zeros(sum(sc), BF16)
    same_error_everywhere(lambda: comm.all_to_all(x2, out, send_counts=sc),
                          "rank 1: recv holds")
    rc = list(m[:, ME])
    if ME == 1:
        rc[0], rc[-1] = rc[0] + 1, rc[-1] - 1
    same_error_everywhere(lambda: comm.all_to_all(x, out, send_counts=list(m[ME]), recv_counts=rc),
                          "rank 1: recv_counts")
    # uneven all-to-all on one rank, a compressed all-gather on the others: one control row each
    calls = (lambda: comm.all_to_all(x, out, send_counts=list(m[ME])), lambda: gather_call(64)(comm))
    same_error_everywhere(pick(calls), "ranks disagree on the call")
    comm.all_to_all(x, out, send_counts=list(m[ME]))


# -- what an agreed call costs ----------------------------------------------------------------

def counting(c):
    counts = {"control": 0, "flags": 0}
    real = c.mpi.allgather_ints, c.mpi.any_flag

    def wrap(name, f):
        def g(*a, **k):
            counts[name] += 1
            return f(*a, **k)
        return g

    c.mpi.allgather_ints = wrap("control", real[0])
    c.mpi.any_flag = wrap("flags", real[1])
    return counts


@pytest.mark.parametrize("policy", ["never", "always"])
def test_an_agreed_call_costs_no_extra_exchange(policy):
    with zipccl.Communicator(WORLD, policy=policy, chunk_bytes=8192) as c:
        counts = counting(c)
        x, out = bf16(10000), np.zeros(P * 10000, BF16)  # 3 rounds of 4096
        c.all_gather(x, out)
        first = dict(counts)
        for k in counts:
            counts[k] = 0
        c.all_gather(x, out)
        if policy == "never":
            assert first == {"control": 1, "flags": 0}
            assert counts == {"control": 0, "flags": 0}  # nothing but the payload
        else:  # host arrays: the control row, then the slots (no final agreement)
            assert counts == first == {"control": 1, "flags": 0}
        assert np.array_equal(out.view(np.uint16), np.concatenate(WORLD.allgather(x.view(np.uint16))))
