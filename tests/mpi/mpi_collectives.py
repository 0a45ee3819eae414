"""Compressed collectives against the uncompressed ones, bit for bit, on any number of ranks.

Run by ``tests/test_comm_mpi.py`` as ``mpiexec -n N python -m pytest tests/mpi/mpi_collectives.py``
for N = 1, 2, 4 (the file name keeps it out of the single-process collection).
Every rank builds every rank's input from seeds alone, so each rank knows the
expected output without being told. Sizes stay small: four ranks share two cores.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import edge_corpus, gaussian_bits
from mpi4py import MPI

import zipccl
from zipccl.comm import CollectiveError

WORLD = MPI.COMM_WORLD  # a test's main communicator; the library itself never names it
P, ME = WORLD.Get_size(), WORLD.Get_rank()
BF16 = np.dtype(ml_dtypes.bfloat16)
KINDS = ("gaussian", "edge", "escape", "mixed")


def rank_input(kind: str, rank: int, n: int, seed: int = 0) -> np.ndarray:
    """uint16 BF16 bits of rank ``rank``'s input: a function of the arguments only."""
    if kind == "mixed":  # a different kind on each rank: RAW frames next to compressed ones
        kind = ("gaussian", "edge", "escape")[rank % 3]
    if kind == "gaussian":
        return gaussian_bits(n, sigma=0.02 * (rank + 1), seed=1000 * seed + rank)
    if kind == "edge":
        corpus = edge_corpus()
        return np.roll(np.resize(corpus, max(n, 1)), 37 * rank + seed)[:n].copy()
    if kind == "escape":  # every exponent outside any sigma window: frames go RAW
        rng = np.random.default_rng(77 + rank + seed)
        return (rng.integers(0, 2, n) << 15 | np.full(n, 0xFE) << 7
                | rng.integers(0, 128, n)).astype(np.uint16)
    raise ValueError(kind)


def expected_sum(shards: list[np.ndarray]) -> np.ndarray:
    """The stated BF16 reduction, written independently: FP32 in rank order, one rounding."""
    with np.errstate(over="ignore", invalid="ignore"):
        acc = shards[0].view(BF16).astype(np.float32)
        for s in shards[1:]:
            acc = acc + s.view(BF16).astype(np.float32)
        out = acc.astype(BF16).view(np.uint16)
    out[np.isnan(acc)] = 0x7FC0
    return out


# (policy, chunk_bytes): the pipelined exchange in one round (default chunk) and in rounds of
# one escape block (4096 elements: most messages below take several), the two-phase exchange (0)
@pytest.fixture(scope="module", params=[("always", None), ("always", 8192), ("always", 0),
                                        ("never", None)], ids=lambda v: f"{v[0]}-{v[1]}")
def comm(request):
    policy, chunk_bytes = request.param
    c = zipccl.Communicator(WORLD, policy=policy, chunk_bytes=chunk_bytes)
    yield c
    c.close()


def bits_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


# -- all-gather ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 7, 33, 4097, 9000])
def test_all_gather(comm, kind, n):
    x = rank_input(kind, ME, n)
    out = np.full(P * n, 0xABCD, dtype=np.uint16)
    comm.all_gather(x.view(BF16), out.view(BF16))
    expected = np.concatenate([rank_input(kind, r, n) for r in range(P)])
    assert bits_equal(out, expected)


def test_all_gather_uint16_with_dtype_and_in_place(comm):
    n = 3000
    out = np.zeros(P * n, dtype=np.uint16)
    out[ME * n:(ME + 1) * n] = rank_input("gaussian", ME, n, seed=5)
    comm.all_gather(out[ME * n:(ME + 1) * n], out, dtype="bfloat16")  # in place, like NCCL
    assert bits_equal(out, np.concatenate([rank_input("gaussian", r, n, seed=5) for r in range(P)]))


@pytest.mark.skipif(P != 2, reason="importing torch on every rank is slow; 1 rank: test_comm.py")
def test_all_gather_keeps_shape_and_never_writes_outside():
    torch = pytest.importorskip("torch")
    c = zipccl.Communicator(WORLD, policy="always")
    n = 2048
    x = torch.from_numpy(rank_input("gaussian", ME, n).astype(np.int16)).view(torch.bfloat16)
    big = np.full(P * n + 64, 0x5555, dtype=np.uint16)
    out = torch.from_numpy(big.view(np.int16)[32:32 + P * n]).view(torch.bfloat16).reshape(P, n)
    c.all_gather(x, out)  # torch CPU tensors in and out
    assert bits_equal(big[32:32 + P * n], np.concatenate([rank_input("gaussian", r, n)
                                                          for r in range(P)]))
    assert (big[:32] == 0x5555).all() and (big[-32:] == 0x5555).all()
    c.close()


# -- all-to-all ------------------------------------------------------------------------------

def count_matrix(seed: int, zeros: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 3000, (P, P))
    if zeros:
        m[rng.random((P, P)) < 0.3] = 0
    return m


@pytest.mark.parametrize("kind", KINDS)
def test_all_to_all_equal(comm, kind):
    n = 1500 * P
    x = rank_input(kind, ME, n, seed=3)
    out = np.zeros(n, dtype=np.uint16)
    comm.all_to_all(x.view(BF16), out.view(BF16))
    b = n // P
    expected = np.concatenate([rank_input(kind, r, n, seed=3)[ME * b:(ME + 1) * b] for r in range(P)])
    assert bits_equal(out, expected)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("give_recv_counts", [True, False])
def test_all_to_all_uneven(comm, kind, give_recv_counts):
    m = count_matrix(11, zeros=True)
    inputs = [rank_input(kind, r, int(m[r].sum()), seed=4) for r in range(P)]
    out = np.full(int(m[:, ME].sum()), 0xABCD, dtype=np.uint16)
    comm.all_to_all(inputs[ME].view(BF16), out.view(BF16), send_counts=list(m[ME]),
                    recv_counts=list(m[:, ME]) if give_recv_counts else None)
    pieces = []
    for r in range(P):
        start = int(m[r, :ME].sum())
        pieces.append(inputs[r][start:start + m[r, ME]])
    assert bits_equal(out, np.concatenate(pieces))


def test_all_to_all_uneven_several_rounds(comm):
    m = np.random.default_rng(13).integers(0, 11000, (P, P))  # up to 3 rounds of 4096
    m[0, P - 1] = 0
    inputs = [rank_input("mixed", r, int(m[r].sum()), seed=5) for r in range(P)]
    out = np.full(int(m[:, ME].sum()), 0xABCD, dtype=np.uint16)
    comm.all_to_all(inputs[ME].view(BF16), out.view(BF16), send_counts=list(m[ME]))
    pieces = [inputs[r][int(m[r, :ME].sum()):][:m[r, ME]] for r in range(P)]
    assert bits_equal(out, np.concatenate(pieces))


# -- reductions ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [0, 1, 1000, 4500])
def test_reduce_scatter(comm, kind, m):
    inputs = [rank_input(kind, r, P * m, seed=6) for r in range(P)]
    out = np.full(m, 0xABCD, dtype=np.uint16)
    comm.reduce_scatter(inputs[ME].view(BF16), out.view(BF16))
    assert bits_equal(out, expected_sum([x[ME * m:(ME + 1) * m] for x in inputs]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 5, 3001, 8191])
def test_all_reduce(comm, kind, n):
    inputs = [rank_input(kind, r, n, seed=8) for r in range(P)]
    buf = inputs[ME].copy()
    comm.all_reduce(buf.view(BF16))
    assert bits_equal(buf, expected_sum(inputs))


def test_reduction_matches_ml_dtypes_rounding():
    c = zipccl.Communicator(WORLD, policy="always")
    n = 20000
    inputs = [gaussian_bits(n, sigma=1.0, seed=90 + r) for r in range(P)]
    buf = inputs[ME].copy()
    c.all_reduce(buf, dtype="bfloat16")
    acc = sum((x.view(BF16).astype(np.float32) for x in inputs[1:]),
              inputs[0].view(BF16).astype(np.float32))
    assert bits_equal(buf, acc.astype(BF16))  # finite data: exactly ml_dtypes' rounding
    c.close()


# -- other dtypes pass through the native collective ----------------------------------------

def test_other_dtypes_native(comm):
    n = 1000
    f = np.arange(n, dtype=np.float32) + ME
    out = np.zeros(P * n, np.float32)
    comm.all_gather(f, out)
    assert np.array_equal(out, np.concatenate([np.arange(n, dtype=np.float32) + r for r in range(P)]))
    i = np.arange(P * 10, dtype=np.int32) * (ME + 1)
    rs = np.zeros(10, np.int32)
    comm.reduce_scatter(i, rs)
    assert np.array_equal(rs, np.arange(ME * 10, ME * 10 + 10, dtype=np.int32) * (P * (P + 1) // 2))
    d = np.full(17, float(ME + 1))
    comm.all_reduce(d, op="max")
    assert np.array_equal(d, np.full(17, float(P)))
    a = np.arange(P * 3, dtype=np.int64) + 100 * ME
    b = np.zeros(P * 3, np.int64)
    comm.all_to_all(a, b)
    assert np.array_equal(b, np.concatenate([np.arange(ME * 3, ME * 3 + 3) + 100 * r for r in range(P)]))
    assert comm.last_decision is not None and not comm.last_decision.compress


# -- errors on every rank, never hangs -------------------------------------------------------

def test_mismatched_sizes_raise_everywhere(comm):
    n = 100 + (ME == P - 1)  # the last rank disagrees (on one rank: recv is still right)
    x = np.zeros(n, dtype=BF16)
    out = np.zeros(P * 100, dtype=BF16)
    if P == 1:
        out = np.zeros(n, dtype=BF16)
    with pytest.raises(CollectiveError) if P > 1 else _nothing():
        comm.all_gather(x, out)


def test_wrong_buffer_on_one_rank_raises_everywhere(comm):
    x = np.zeros(64, dtype=BF16)
    out = np.zeros(P * 64 - (ME == 0), dtype=BF16)  # rank 0's recv is one short
    with pytest.raises(CollectiveError, match="rank 0"):
        comm.all_gather(x, out)
    big = np.zeros((P * 64, 2), dtype=BF16)
    strided = big[:, 0] if ME == P - 1 else big[:, 0].copy()  # non-contiguous on the last rank
    with pytest.raises(CollectiveError, match="non-contiguous"):
        comm.reduce_scatter(strided, np.zeros(64, dtype=BF16))
    good = np.zeros(P * 64, dtype=BF16)
    with pytest.raises(CollectiveError, match="send is uint16 but recv is bfloat16"):
        comm.all_gather(x.view(np.uint16) if ME == 0 else x, good)
    comm.all_gather(x, good)  # still usable afterwards


def test_mismatched_dtypes_across_ranks(comm):
    x = np.zeros(10, dtype=BF16 if ME % 2 == 0 else np.float16)
    out = np.zeros(10 * P, dtype=x.dtype)
    with pytest.raises(CollectiveError, match="disagree") if P > 1 else _nothing():
        comm.all_gather(x, out)


def test_bad_counts_raise_everywhere(comm):
    m = count_matrix(12, zeros=False)
    x = np.zeros(int(m[ME].sum()), dtype=BF16)
    out = np.zeros(int(m[:, ME].sum()) + 1, dtype=BF16)  # one too many on every rank
    with pytest.raises(CollectiveError, match="recv holds"):
        comm.all_to_all(x, out, send_counts=list(m[ME]))
    rc = list(m[:, ME])
    rc[0] += 1
    out = np.zeros(sum(rc), dtype=BF16)
    with pytest.raises(CollectiveError, match="recv_counts"):
        comm.all_to_all(x, out, send_counts=list(m[ME]), recv_counts=rc)
    with pytest.raises(CollectiveError, match="op='sum'"):
        comm.all_reduce(np.zeros(8, dtype=BF16), op="max")


@pytest.mark.skipif(P == 1, reason="one rank sends no frames")
@pytest.mark.parametrize("chunk_bytes", [0, 8192, None])
@pytest.mark.parametrize("where", ["header", "escapes", "payload"])
def test_corrupted_frame_detected_everywhere(where, chunk_bytes):
    c = zipccl.Communicator(WORLD, policy="always", checksum=True, chunk_bytes=chunk_bytes)
    real, real_gather = c.mpi.alltoallv, c.mpi.allgather
    calls = []
    peer = (ME + 1) % P
    n = 6000 if not c.chunk else min(6000, c.chunk)  # elements of the first frame

    def corrupting(send, sc, sd, recv, rc, rd, stream=None):  # the two-phase exchange
        real(send, sc, sd, recv, rc, rd, stream)
        calls.append(1)
        phase = len(calls)
        if ME == 0 and rc[peer]:
            if where == "header" and phase == 1:
                recv[rd[peer] + 20] ^= 0x01
            elif where == "payload" and phase == 1:
                recv[rd[peer] + 200] ^= 0x10  # a sign-mantissa byte: only the checksum sees it
            elif where == "escapes" and phase == 2:
                recv[rd[peer]] ^= 0x80

    def corrupting_gather(send, recv, stream=None):  # the pipelined one: whole frames per round
        real_gather(send, recv, stream)
        calls.append(1)
        at = peer * send.nbytes  # the peer's frame in the gathered round
        if ME == 0 and len(calls) == 1:
            off = {"header": 20, "payload": 200, "escapes": zipccl.format.static_size(n)}[where]
            recv[at + off] ^= 0x80 if where == "escapes" else (0x01 if where == "header" else 0x10)

    c.mpi.alltoallv, c.mpi.allgather = corrupting, corrupting_gather
    x = rank_input("edge", ME, 6000)  # plenty of escapes
    out = np.zeros(P * 6000, dtype=np.uint16)
    with pytest.raises(CollectiveError, match="rank 0: frame from rank 1: corrupted"):
        c.all_gather(x, out, dtype="bfloat16")
    c.mpi.alltoallv, c.mpi.allgather = real, real_gather
    c.all_gather(x, out, dtype="bfloat16")
    assert bits_equal(out, np.concatenate([rank_input("edge", r, 6000) for r in range(P)]))
    c.close()


def test_policy_decisions_are_shared():
    c = zipccl.Communicator(WORLD, policy="auto", compress_host=True, min_compress_bytes=4096)
    x = np.zeros(4096, dtype=BF16)
    out = np.zeros(P * 4096, dtype=BF16)
    c.all_gather(x[:100], out[:100 * P])
    assert not c.last_decision.compress
    c.all_gather(x, out)
    assert c.last_decision.compress == (P > 1)
    decisions = WORLD.allgather(str(c.last_decision))
    assert len(set(decisions)) == 1
    c.close()


def test_calibrated_policy_is_shared_and_cached(tmp_path):
    path = WORLD.bcast(str(tmp_path / "profile.json"), root=0)  # rank 0 reads and writes it
    c = zipccl.Communicator(WORLD, policy="auto")
    prof = c.calibrate(sizes=(8192, 131072), ops=("all_gather", "reduce_scatter"), repeat=1, path=path)
    assert prof.key.startswith(f"host|mpi|{P} ranks|")
    x = np.zeros(65536, dtype=BF16)
    out = np.zeros(P * 65536, dtype=BF16)
    c.all_gather(x, out)
    decisions = WORLD.allgather(str(c.last_decision))
    assert len(set(decisions)) == 1  # every rank fitted the same numbers
    if "all_gather" in prof.native and P > 1:
        assert "predicted native" in c.last_decision.reason
        assert c.last_decision.native_s > 0 and c.last_decision.compressed_s > 0
        line = c.explain("all_gather", 1 << 30, device=False, quiet=True)
        pred = prof.predict("all_gather", 1 << 30)  # the model extrapolates beyond the calibrated sizes
        faster = pred.compressed_s < (1 - c.policy.margin) * pred.native_s
        assert "extrapolated beyond the calibrated" in line
        assert ("-> compressed" if faster else "-> native") in line
    assert sorted(prof.measured) == ["all_gather", "reduce_scatter"]
    assert all(len(v["compressed"]) == 2 for v in prof.measured.values())
    again = zipccl.Communicator(WORLD, policy="auto")
    assert again.calibrate(path=path).to_json() == prof.to_json()  # loaded, not measured
    for comm_ in (c, again):
        comm_.close()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
