"""A ``Communicator``'s compressed calls replayed from their plans, against fresh ones, bit for bit.

    mpiexec -n 2 python tests/mpi/with_fake_cupy.py --cpu-codec -m pytest tests/mpi/mpi_replay.py

A call whose arrays (by identity) and stream were seen before replays the call kept in its plan
(``core.Core.call``) without describing it again. These cases count the descriptions (the
collective file's ``describe``) and check that a replayed call moves the data its arrays hold
now, exactly as a fresh ``Communicator`` does, and that a new array, another size, another
``dtype=``, another stream or a changed setting plans again. Host arrays (NumPy) and device
arrays (CuPy, the stand-in under ``with_fake_cupy.py``; skipped where there is none); one rank
loops back through its slot (``Policy.loopback``). ``tests/test_comm_replay.py`` runs it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import gaussian_bits
from mpi4py import MPI

import zipccl
from zipccl import format as fmt
from zipccl.comm import Policy

WORLD = MPI.COMM_WORLD  # a test's communicator; the library itself never names it
P, ME = WORLD.Get_size(), WORLD.Get_rank()
N = 3 * fmt.BLOCK + 5  # elements per rank: several rounds of CHUNK, a part block at the end
CHUNK = 2 * fmt.BLOCK * 2  # bytes per round: two escape blocks
OPS = ("all_gather", "all_gather_in_place", "reduce_scatter", "all_to_all", "all_reduce")


class Place:
    """Host (NumPy, BF16-typed) or device (CuPy, uint16 bits with ``dtype="bfloat16"``) arrays."""

    def __init__(self, name: str):
        self.device = name == "cupy"
        self.xp = pytest.importorskip("cupy") if self.device else np
        self.kw = {"dtype": "bfloat16"} if self.device else {}

    def array(self, bits: np.ndarray):
        return self.xp.asarray(bits) if self.device else bits.copy().view(ml_dtypes.bfloat16)

    def bits(self, a) -> np.ndarray:
        return (self.xp.asnumpy(a) if self.device else np.array(a)).view(np.uint16)

    def fill(self, a, bits: np.ndarray) -> None:
        """Write ``bits`` into ``a`` in place (its identity unchanged)."""
        if self.device:
            a.set(bits)
        else:
            a.view(np.uint16)[...] = bits


def communicator(**kw) -> zipccl.Communicator:
    return zipccl.Communicator(WORLD, policy=Policy("always", loopback=True), chunk_bytes=CHUNK, **kw)


def counted(monkeypatch) -> dict[str, int]:
    """Descriptions per collective file from now on."""
    from zipccl.comm import all_gather, all_reduce, all_to_all, reduce_scatter

    counts: dict[str, int] = {}
    for mod in (all_gather, reduce_scatter, all_to_all, all_reduce):
        def describe(*a, _f=mod.describe, _op=mod.OP, **k):
            counts[_op] = counts.get(_op, 0) + 1
            return _f(*a, **k)

        monkeypatch.setattr(mod, "describe", describe)
    return counts


def arrays(place: Place, op: str, seed: int):
    """(send, recv) of ``op`` holding this rank's seeded input (recv: a poisoned buffer)."""
    x = place.array(gaussian_bits(N if op.startswith("all_gather") else P * N, sigma=0.02,
                                  seed=seed + ME))
    if op == "all_gather_in_place":
        out = place.array(np.full(P * N, 0xABCD, np.uint16))
        out[ME * N:(ME + 1) * N] = x
        return out[ME * N:(ME + 1) * N], out
    if op == "all_reduce":
        return x, x
    n = N if op == "reduce_scatter" else x.size if op == "all_to_all" else P * N
    return x, place.array(np.full(n, 0xABCD, np.uint16))


def call(comm, place: Place, op: str, send, recv, **kw) -> None:
    if op.startswith("all_gather"):
        comm.all_gather(send, recv, **place.kw, **kw)
    elif op == "all_reduce":
        comm.all_reduce(send, **place.kw, **kw)
    else:
        getattr(comm, op)(send, recv, **place.kw, **kw)


def fresh(place: Place, op: str, bits: np.ndarray) -> np.ndarray:
    """What a new Communicator (no plans) gives for ``op`` on a send buffer holding ``bits``."""
    send, recv = arrays(place, op, 0)
    place.fill(send, bits)
    with communicator() as c:
        call(c, place, op, send, recv)
    return place.bits(recv)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("xp", ["numpy", "cupy"])
def test_a_replayed_call_gives_the_fresh_bytes(xp, op, monkeypatch):
    place = Place(xp)
    counts = counted(monkeypatch)
    send, recv = arrays(place, op, 0)
    with communicator() as c:
        for k in range(3):  # new data in the same arrays each time: the replay reads them anew
            bits = gaussian_bits(send.size, sigma=0.01 * (k + 1), seed=100 * k + ME)
            place.fill(send, bits)
            call(c, place, op, send, recv)
            assert np.array_equal(place.bits(recv), fresh(place, op, bits)), f"call {k}"
        assert c.stats.compressed_calls == 3
    mine = op.removesuffix("_in_place")
    assert counts[mine] == 1 + 3, counts  # once here, then once per fresh Communicator


@pytest.mark.parametrize("xp", ["numpy", "cupy"])
def test_a_changed_call_plans_again(xp, monkeypatch):
    """A new array, another size, ``dtype=``, stream or setting: described anew, still exact."""
    place = Place(xp)
    counts = counted(monkeypatch)

    def check(c, send, recv, described: int, **kw) -> None:
        bits = place.bits(send).copy()
        call(c, place, "all_gather", send, recv, **kw)
        assert counts["all_gather"] == described
        gathered = np.empty(P * send.size, np.uint16)
        WORLD.Allgather(bits, gathered)
        assert np.array_equal(place.bits(recv), gathered)

    send, recv = arrays(place, "all_gather", 1)
    with communicator() as c:
        check(c, send, recv, 1)
        check(c, send, recv, 1)  # replayed
        other, _ = arrays(place, "all_gather", 2)  # a new array (send still alive)
        check(c, other, recv, 2)
        check(c, send, recv, 2)  # both kept
        check(c, send[:N - fmt.BLOCK], recv[:P * (N - fmt.BLOCK)], 3)  # another size
        if place.device:
            stream = place.xp.cuda.Stream()
            check(c, send, recv, 4, stream=stream)  # another stream
            check(c, send, recv, 4, stream=stream)
        else:
            check(c, send.view(np.uint16), recv.view(np.uint16), 4, dtype="bfloat16")
        c.chunk = 4 * fmt.BLOCK  # a setting: every plan dropped, on every rank
        check(c, send, recv, 5)
        check(c, send, recv, 5)
        c.policy = Policy("raw", loopback=True)
        check(c, send, recv, 6)
        assert c.last_decision.raw
        assert P == 1 or c.last_stats.wire_bytes > c.last_stats.raw_bytes  # RAW frames
        c.policy = Policy("always", loopback=True)  # and back: the shared channel follows
        check(c, send, recv, 7)
        check(c, send, recv, 7)
        assert not c.last_decision.raw
        assert P == 1 or c.last_stats.wire_bytes < c.last_stats.raw_bytes  # compressed again


def test_a_compressed_call_inside_a_graph_capture(monkeypatch):
    """On a stream being captured into a CUDA graph (every rank capturing, as a captured
    training step does) the kept call goes through its slot channel's captured sites and moves
    exact bytes (the stand-in runs at once what a replay would run); a new signature (it would
    agree and allocate) and a call over a transport that cannot be captured (MPI, host-staged)
    raise before anything is enqueued; a native call is the transport's own and goes on; after
    the capture the kept plan still replays, exact."""
    place = Place("cupy")
    import contextlib

    import fake_cupy  # the stand-in's capture switch (a real run would begin a graph capture)

    from zipccl.comm import CollectiveError
    from zipccl.kernels import launch

    monkeypatch.setattr(launch, "capture_id", lambda stream: 7)  # the driver's capture id
    monkeypatch.setattr(launch, "relaxed_capture", contextlib.nullcontext)
    send, recv = arrays(place, "all_gather", 3)
    gathered = np.empty(P * send.size, np.uint16)
    WORLD.Allgather(place.bits(send).copy(), gathered)
    stream = place.xp.cuda.Stream()
    kw = {"policy": Policy("always", loopback=True), "chunk_bytes": CHUNK}
    with communicator() as c, zipccl.Communicator(WORLD, policy=Policy("never")) as native, \
            zipccl.Communicator(WORLD, backend="mpi", **kw) as staged:
        call(c, place, "all_gather", send, recv, stream=stream)  # planned, kept
        call(staged, place, "all_gather", send, recv, stream=stream)
        fake_cupy.CAPTURING.add(stream.ptr)
        try:
            recv[...] = 0
            call(c, place, "all_gather", send, recv, stream=stream)  # through captured sites
            assert np.array_equal(place.bits(recv), gathered)
            (ch,) = c._core.channels().values()
            assert list(ch._captures) == [7] and ch._captures[7].sites.stats()["sites"] >= 2
            r = place.array(np.zeros(P * (send.size - 1), np.uint16))
            with pytest.raises(CollectiveError, match="outside the capture first"):
                call(c, place, "all_gather", send[:-1], r, stream=stream)
            with pytest.raises(CollectiveError, match="mpi transport cannot be captured"):
                call(staged, place, "all_gather", send, recv, stream=stream)
            recv[...] = 0
            call(native, place, "all_gather", send, recv, stream=stream)
            assert np.array_equal(place.bits(recv), gathered)
        finally:
            fake_cupy.CAPTURING.discard(stream.ptr)
        recv[...] = 0
        call(c, place, "all_gather", send, recv, stream=stream)
        assert np.array_equal(place.bits(recv), gathered)
        assert c.stats.compressed_calls == 3
