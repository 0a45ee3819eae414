"""The collectives against seed-derived expectations, bit for bit, wherever the data lives.

    mpiexec -n N python -m pytest tests/mpi/mpi_collectives.py            # NumPy: host memory, MPI
    mpiexec -n 2 python -m pytest tests/mpi/mpi_collectives.py -k cupy    # CuPy: device memory

Every case is written once and runs over the array module (``Place``): ``numpy``
(host arrays, the CPU codec, MPI) and ``cupy`` (device arrays, the GPU codec, NCCL
and MPI). Who runs which:

- ``tests/test_comm_mpi.py`` (``make test``): NumPy on 1, 2 and 4 ranks (CuPy is
  not installed there: its cases skip), then the CuPy cases on 2 ranks with
  ``fake_cupy`` as CuPy and NCCL and ``fake_gpu_codec`` as the GPU codec
  (``with_fake_cupy.py --cpu-codec``): the device engine's whole code path on host
  memory.
- ``tests/test_comm_gpu.py`` (``make test-gpu``): the CuPy cases on GPUs.

Every rank builds every rank's input from seeds alone, so each rank knows the
expected output without being told. Reductions are checked against the stated
sum (FP32 in rank order, one rounding to BF16 / FP16), written here independently
of the library. BF16 cases, then the same collectives on FP32 and FP16. Sizes
stay moderate: four ranks share two cores in CI.
"""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest
from conftest import edge_corpus, gaussian_bits, need_torch
from mpi4py import MPI

import zipccl
import zipccl.format.slot
from zipccl.comm import CollectiveError

WORLD = MPI.COMM_WORLD  # a test's main communicator; the library itself never names it
P, ME = WORLD.Get_size(), WORLD.Get_rank()
BF16 = np.dtype(ml_dtypes.bfloat16)
KINDS = ("gaussian", "edge", "escape", "mixed")
XPS = ("numpy", "cupy")


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


def gathered(kind: str, n: int, seed: int = 0) -> np.ndarray:
    return np.concatenate([rank_input(kind, r, n, seed) for r in range(P)])


def expected_sum(shards: list[np.ndarray]) -> np.ndarray:
    """The stated BF16 reduction, written independently: FP32 in rank order, one rounding."""
    with np.errstate(over="ignore", invalid="ignore"):
        acc = shards[0].view(BF16).astype(np.float32)
        for s in shards[1:]:
            acc = acc + s.view(BF16).astype(np.float32)
        out = acc.astype(BF16).view(np.uint16)
    out[np.isnan(acc)] = 0x7FC0
    return out


# -- where the data lives ----------------------------------------------------------------------

class Place:
    """One array module: how a case makes its arrays, reads them back and which backend it uses.

    Host arrays go in as BF16-typed NumPy arrays; device arrays (CuPy has no BF16
    dtype) as uint16 with ``dtype="bfloat16"`` (``kw``).
    """

    def __init__(self, name: str):
        self.name = name
        self.device = name == "cupy"
        if self.device:
            cupy = pytest.importorskip("cupy")
            cupy.cuda.Device(ME % cupy.cuda.runtime.getDeviceCount()).use()
            self.xp = cupy
        else:
            self.xp = np
        self.backend = "nccl" if self.device else "auto"
        self.kw = {"dtype": "bfloat16"} if self.device else {}

    def array(self, bits: np.ndarray):
        """A fresh array of this place holding ``bits``, typed as the collectives take it."""
        return self.xp.asarray(bits) if self.device else bits.copy().view(BF16)

    def out(self, n: int, fill: int = 0xABCD):
        """A poisoned output buffer of ``n`` values."""
        return self.array(np.full(n, fill, dtype=np.uint16))

    def bits(self, a) -> np.ndarray:
        """uint16 bit patterns of ``a``, on the host."""
        return (self.xp.asnumpy(a) if self.device else np.array(a)).view(np.uint16)

    def xor(self, buf, at: int, mask: int, stream=None) -> None:
        """Flip bits of one byte of a received buffer, in the stream order of the transfer."""
        if self.device:
            from zipccl.comm.transport import cupy_stream

            with cupy_stream(stream):
                buf[at:at + 1] ^= mask
        else:
            buf[at] ^= mask

    def only(self, name: str, why: str) -> None:
        if self.name != name:
            pytest.skip(why)


class Setup(Place):
    """A place and one Communicator on it."""

    def __init__(self, name: str, backend: str, policy: str, chunk_bytes: int | None):
        super().__init__(name)
        self.backend = backend
        self.comm = zipccl.Communicator(WORLD, backend=backend, policy=policy, chunk_bytes=chunk_bytes)


# (array module, backend, policy, chunk_bytes): the pipelined exchange in one round (default
# chunk) and in rounds of one escape block (8192 bytes: 4096 elements) or of 32768 elements
# (65536), all in one round (0), the native path (never); on the device over NCCL and
# over MPI (host-staged unless MPI is CUDA-aware)
SETTINGS = [("numpy", "auto", "always", None), ("numpy", "auto", "always", 8192),
            ("numpy", "auto", "always", 0), ("numpy", "auto", "never", None),
            ("cupy", "nccl", "always", None), ("cupy", "nccl", "always", 65536),
            ("cupy", "nccl", "always", 0), ("cupy", "nccl", "never", None),
            ("cupy", "mpi", "always", 65536), ("cupy", "mpi", "never", None)]


@pytest.fixture(scope="module", params=SETTINGS, ids=lambda s: "-".join(map(str, s)))
def zc(request):
    s = Setup(*request.param)
    yield s
    s.comm.close()


@pytest.fixture(scope="module", params=XPS)
def place(request):
    return Place(request.param)


# -- all-gather ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 7, 33, 4097, 9000, 100_000])
def test_all_gather(zc, kind, n):
    out = zc.out(P * n)
    zc.comm.all_gather(zc.array(rank_input(kind, ME, n)), out, **zc.kw)
    assert np.array_equal(zc.bits(out), gathered(kind, n))


def test_all_gather_uint16_with_dtype_and_in_place(zc):
    n = 3000
    out = zc.xp.zeros(P * n, dtype=zc.xp.uint16)
    out[ME * n:(ME + 1) * n] = zc.xp.asarray(rank_input("gaussian", ME, n, seed=5))
    zc.comm.all_gather(out[ME * n:(ME + 1) * n], out, dtype="bfloat16")  # in place, like NCCL
    assert np.array_equal(zc.bits(out), gathered("gaussian", n, seed=5))


def test_transport_is_the_one_asked_for(zc):
    out = zc.out(P * 8)
    zc.comm.all_gather(zc.array(rank_input("gaussian", ME, 8)), out, **zc.kw)
    if zc.backend == "nccl":
        assert zc.comm.transport_name == "nccl"
    elif zc.device:
        assert zc.comm.transport_name == ("mpi" if zc.comm.mpi.cuda_aware else "mpi-staged")
    else:
        assert zc.comm.transport_name in ("mpi", "mpi-staged")  # host data never takes NCCL
        assert zc.comm._nccl is None


def test_torch_tensors(place):
    """Torch tensors in and out: shape kept, nothing written outside the output (host); on the
    device also Numba arrays and a caller's non-blocking stream."""
    if not place.device and P != 2:
        pytest.skip("importing torch on every rank is slow; 1 rank: test_comm.py")
    torch = need_torch()
    c = zipccl.Communicator(WORLD, backend=place.backend, policy="always")
    n = 2048 if not place.device else 50_000
    want = gathered("gaussian", n)
    x = torch.from_numpy(rank_input("gaussian", ME, n).astype(np.int16)).view(torch.bfloat16)
    big = torch.full((P * n + 64,), 0x5555, dtype=torch.int16)
    if place.device:
        x, big = x.cuda(), big.cuda()
    out = big[32:32 + P * n].view(torch.bfloat16).reshape(P, n)
    c.all_gather(x, out)
    if place.device:
        torch.cuda.synchronize()
    got = big.cpu().numpy().view(np.uint16)
    assert np.array_equal(got[32:32 + P * n], want)
    assert (got[:32] == 0x5555).all() and (got[-32:] == 0x5555).all()
    if place.device:
        from numba import cuda

        nb_out = cuda.device_array(P * n, dtype=np.uint16)
        s = place.xp.cuda.Stream(non_blocking=True)
        c.all_gather(cuda.to_device(rank_input("gaussian", ME, n)), nb_out, dtype="bfloat16", stream=s)
        s.synchronize()
        assert np.array_equal(nb_out.copy_to_host(), want)
    c.close()


# -- all-to-all ------------------------------------------------------------------------------

def count_matrix(seed: int, zeros: bool, high: int = 3000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.integers(0, high, (P, P))
    if zeros:
        m[rng.random((P, P)) < 0.3] = 0
    return m


def a2a_expected(inputs: list[np.ndarray], m: np.ndarray) -> np.ndarray:
    return np.concatenate([inputs[r][int(m[r, :ME].sum()):][:m[r, ME]] for r in range(P)])


@pytest.mark.parametrize("kind", KINDS)
def test_all_to_all_equal(zc, kind):
    n = 1500 * P
    out = zc.out(n)
    zc.comm.all_to_all(zc.array(rank_input(kind, ME, n, seed=3)), out, **zc.kw)
    b = n // P
    assert np.array_equal(zc.bits(out), np.concatenate([rank_input(kind, r, n, seed=3)[ME * b:(ME + 1) * b]
                                                        for r in range(P)]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("give_recv_counts", [True, False])
@pytest.mark.parametrize("high", [3000, 30000])
def test_all_to_all_uneven(zc, kind, give_recv_counts, high):
    m = count_matrix(11, zeros=True, high=high)
    inputs = [rank_input(kind, r, int(m[r].sum()), seed=4) for r in range(P)]
    out = zc.out(int(m[:, ME].sum()))
    zc.comm.all_to_all(zc.array(inputs[ME]), out, send_counts=list(m[ME]),
                       recv_counts=list(m[:, ME]) if give_recv_counts else None, **zc.kw)
    assert np.array_equal(zc.bits(out), a2a_expected(inputs, m))


def test_all_to_all_uneven_several_rounds(zc):
    m = np.random.default_rng(13).integers(0, 11000, (P, P))  # up to 3 rounds of 4096
    m[0, P - 1] = 0
    inputs = [rank_input("mixed", r, int(m[r].sum()), seed=5) for r in range(P)]
    out = zc.out(int(m[:, ME].sum()))
    zc.comm.all_to_all(zc.array(inputs[ME]), out, send_counts=list(m[ME]), **zc.kw)
    assert np.array_equal(zc.bits(out), a2a_expected(inputs, m))


# -- reductions ------------------------------------------------------------------------------

def _nan(bits: np.ndarray) -> np.ndarray:
    return (bits & 0x7FFF) > 0x7F80


def _subnormal(bits: np.ndarray) -> np.ndarray:
    return ((bits & 0x7F80) == 0) & ((bits & 0x7F) != 0)


def check_sum(zc: Setup, got: np.ndarray, shards: list[np.ndarray], kind: str, direct) -> None:
    """A reduction's bits against the stated sum of ``shards``.

    Compressed, and every reduction zipccl does itself, gives the stated sum exactly.
    A native NCCL reduction passes NCCL's own bits through: ``direct()`` calls NCCL on
    the same data, and the result must equal it bit for bit. NCCL's sum is then checked
    against the stated one wherever its rounding is defined the same: NaN where the
    stated sum has NaN (a NaN or inf - inf among the addends), whatever its payload;
    Gaussian data (no NaN, no subnormals) exactly; on two ranks a sum is one IEEE
    addition (commutative, rounded once), so every value where no addend and no result
    is subnormal (a GPU may flush those) or NaN equals it too.
    """
    want = expected_sum(shards)
    if zc.comm.last_decision.compress or zc.comm.transport_name != "nccl":
        assert np.array_equal(got, want)
        return
    assert np.array_equal(got, zc.bits(direct()))
    assert np.array_equal(_nan(got), _nan(want))
    if kind == "gaussian":
        assert np.array_equal(got, want)
    elif P == 2:
        defined = ~(_nan(want) | _subnormal(want) | _subnormal(shards[0]) | _subnormal(shards[1]))
        assert got.size < 1000 or defined.mean() > 0.9  # the comparison covers most values
        assert np.array_equal(got[defined], want[defined])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [0, 1, 1000, 4500, 70_000])
def test_reduce_scatter(zc, kind, m):
    inputs = [rank_input(kind, r, P * m, seed=6) for r in range(P)]
    out = zc.out(m)
    zc.comm.reduce_scatter(zc.array(inputs[ME]), out, **zc.kw)

    def direct():
        ref = zc.out(m)
        zc.comm._nccl.reduce_scatter(zc.array(inputs[ME]), ref, "sum", dtype="bfloat16")
        return ref

    check_sum(zc, zc.bits(out), [x[ME * m:(ME + 1) * m] for x in inputs], kind, direct)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 5, 3001, 8191, 150_001])
def test_all_reduce(zc, kind, n):
    inputs = [rank_input(kind, r, n, seed=8) for r in range(P)]
    buf = zc.array(inputs[ME])
    zc.comm.all_reduce(buf, **zc.kw)
    got = zc.bits(buf)
    assert len({g.tobytes() for g in WORLD.allgather(got)}) == 1  # the same bits on every rank

    def direct():
        ref = zc.array(inputs[ME])
        zc.comm._nccl.allreduce(ref, "sum", dtype="bfloat16")
        return ref

    check_sum(zc, got, inputs, kind, direct)


def expected_avg(shards: list[np.ndarray]) -> np.ndarray:
    """The stated BF16 AVG, written independently: the stated sum, then FP32 / P, one rounding."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = expected_sum(shards).view(BF16).astype(np.float32) / np.float32(P)
        out = f.astype(BF16).view(np.uint16)
    out[np.isnan(f)] = 0x7FC0
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_avg_is_the_stated_sum_divided(zc, kind):
    """op="avg" (BF16): compressed or native, the stated sum then one division, on every rank,
    as zipccl.torch's AVG."""
    n = 3001
    inputs = [rank_input(kind, r, P * n, seed=9) for r in range(P)]
    buf = zc.array(inputs[ME])
    zc.comm.all_reduce(buf, op="avg", **zc.kw)
    assert np.array_equal(zc.bits(buf), expected_avg(inputs))
    out = zc.out(n)
    zc.comm.reduce_scatter(zc.array(inputs[ME]), out, op="avg", **zc.kw)
    assert np.array_equal(zc.bits(out), expected_avg([x[ME * n:(ME + 1) * n] for x in inputs]))


def test_reduction_matches_ml_dtypes_rounding(place):
    c = zipccl.Communicator(WORLD, backend=place.backend, policy="always")
    n = 20000
    inputs = [gaussian_bits(n, sigma=1.0, seed=90 + r) for r in range(P)]
    buf = place.array(inputs[ME])
    c.all_reduce(buf, **place.kw)
    acc = sum((x.view(BF16).astype(np.float32) for x in inputs[1:]),
              inputs[0].view(BF16).astype(np.float32))
    assert np.array_equal(place.bits(buf), acc.astype(BF16).view(np.uint16))  # exactly ml_dtypes'
    c.close()


# -- FP32 and FP16: the same collectives, each frame of its own type -------------------------

WIDE = ("float32", "float16")
_UINT = {"float32": np.uint32, "float16": np.uint16}
_CANONICAL = {"float32": 0x7FC00000, "float16": 0x7E00}


def _fp32_edges() -> np.ndarray:
    """Every FP32 exponent with edge mantissas and both signs, NaN payloads, +-0, +-inf."""
    mants = [0, 1, 0x7FFFFF, 0x400000, 0x3FFFFF, 0x00FFFF, 0x555555]
    edge = [(s << 31) | (e << 23) | m for s in (0, 1) for e in range(256) for m in mants]
    nans = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA5A5A5]
    return np.array(edge + nans + [0, 0x80000000, 0x7F800000, 0xFF800000, 1, 0x80000001],
                    np.uint32)


def wide_input(dtype: str, kind: str, rank: int, n: int, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s FP32 / FP16 input (a NumPy array of ``dtype``), from the arguments only.

    "gaussian": N(0, (0.02 (rank + 1))^2); "edge": every FP16 pattern, or the FP32 edge
    patterns, among Gaussian values (RAW frames and escapes next to coded values)."""
    rng = np.random.default_rng(500 + 10 * seed + rank)
    x = rng.normal(0.0, 0.02 * (rank + 1), n).astype(dtype)
    if kind == "edge":
        edges = np.arange(1 << 16).astype(np.uint16) if dtype == "float16" else _fp32_edges()
        bits = x.view(_UINT[dtype])
        k = min(n, edges.size)
        bits[rng.permutation(n)[:k]] = np.roll(edges, 37 * rank + seed)[:k]
    return x


def wide_sum(shards: list[np.ndarray]) -> np.ndarray:
    """The stated sum of FP32 / FP16 shards, written independently: each FP32 addition as a
    double addition rounded to FP32 (exact for two FP32 operands), in rank order; FP16 then
    rounded once; NaN -> the type's canonical quiet NaN."""
    dtype = shards[0].dtype.name
    with np.errstate(over="ignore", invalid="ignore"):
        acc = shards[0].astype(np.float32)
        for s in shards[1:]:
            acc = (acc.astype(np.float64) + s.astype(np.float64)).astype(np.float32)
        out = acc.astype(dtype).view(_UINT[dtype]).copy()
    out[np.isnan(acc)] = _CANONICAL[dtype]
    return out


def _host(zc, a) -> np.ndarray:
    return zc.xp.asnumpy(a) if zc.device else np.asarray(a)


def _patterns(zc, a) -> np.ndarray:
    h = _host(zc, a)
    return h.view(_UINT[h.dtype.name])


def check_wide_sum(zc, got: np.ndarray, want: np.ndarray, kind: str) -> None:
    """Compressed, and every reduction zipccl does itself: the stated sum exactly. NCCL's own
    sum (native): NaN where it has NaN; Gaussian data on two ranks, one addition, exactly."""
    if zc.comm.last_decision.compress or zc.comm.transport_name != "nccl":
        assert np.array_equal(got, want)
        return
    dtype = "float32" if got.dtype == np.uint32 else "float16"
    assert np.array_equal(np.isnan(got.view(dtype)), np.isnan(want.view(dtype)))
    if kind == "gaussian" and P == 2:
        assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", WIDE)
@pytest.mark.parametrize("kind", ["gaussian", "edge"])
@pytest.mark.parametrize("n", [0, 4097, 70_000])
def test_wide_all_gather(zc, dtype, kind, n):
    out = zc.xp.full(P * n, 7, dtype=dtype)
    zc.comm.all_gather(zc.xp.array(wide_input(dtype, kind, ME, n)), out)
    want = np.concatenate([wide_input(dtype, kind, r, n) for r in range(P)])
    assert np.array_equal(_patterns(zc, out), want.view(_UINT[dtype]))
    if P > 1 and n and zc.comm.policy.mode == "always":
        assert zc.comm.last_decision.compress


@pytest.mark.parametrize("dtype", WIDE)
def test_wide_all_to_all_uneven_and_bit_patterns(zc, dtype):
    m = count_matrix(21, zeros=True, high=12000)
    inputs = [wide_input(dtype, "edge", r, int(m[r].sum()), seed=2) for r in range(P)]
    out = zc.xp.zeros(int(m[:, ME].sum()), dtype=_UINT[dtype])  # integer bit patterns, dtype=
    zc.comm.all_to_all(zc.xp.array(inputs[ME].view(_UINT[dtype])), out, send_counts=list(m[ME]),
                       dtype=dtype)
    want = a2a_expected([x.view(_UINT[dtype]) for x in inputs], m)
    assert np.array_equal(_host(zc, out), want)


@pytest.mark.parametrize("dtype", WIDE)
@pytest.mark.parametrize("kind", ["gaussian", "edge"])
@pytest.mark.parametrize("m", [1, 4500, 40_000])
def test_wide_reduce_scatter(zc, dtype, kind, m):
    inputs = [wide_input(dtype, kind, r, P * m, seed=3) for r in range(P)]
    out = zc.xp.zeros(m, dtype=dtype)
    zc.comm.reduce_scatter(zc.xp.array(inputs[ME]), out)
    check_wide_sum(zc, _patterns(zc, out), wide_sum([x[ME * m:(ME + 1) * m] for x in inputs]), kind)


@pytest.mark.parametrize("dtype", WIDE)
@pytest.mark.parametrize("kind", ["gaussian", "edge"])
def test_wide_all_reduce(zc, dtype, kind):
    n = 9001
    inputs = [wide_input(dtype, kind, r, n, seed=4) for r in range(P)]
    buf = zc.xp.array(inputs[ME])
    zc.comm.all_reduce(buf)
    got = _patterns(zc, buf)
    assert len({g.tobytes() for g in WORLD.allgather(got)}) == 1  # the same bits on every rank
    check_wide_sum(zc, got, wide_sum(inputs), kind)


def test_wide_reductions_other_than_sum_stay_native(zc):
    x = zc.xp.array(wide_input("float32", "gaussian", ME, 5000))
    zc.comm.all_reduce(x, op="max")
    assert not zc.comm.last_decision.compress
    want = np.max(np.stack([wide_input("float32", "gaussian", r, 5000) for r in range(P)]), axis=0)
    assert np.array_equal(_host(zc, x), want)


# -- other dtypes pass through the native collective ----------------------------------------

def test_other_dtypes_native(zc):
    xp = zc.xp
    n = 1000
    f = xp.arange(n, dtype=xp.float32) + ME
    out = xp.zeros(P * n, xp.float32)
    zc.comm.all_gather(f, out)
    assert np.array_equal(zc.xp.asnumpy(out) if zc.device else out,
                          np.concatenate([np.arange(n, dtype=np.float32) + r for r in range(P)]))
    i = xp.arange(P * 10, dtype=xp.int32) * (ME + 1)
    rs = xp.zeros(10, xp.int32)
    zc.comm.reduce_scatter(i, rs)
    got = zc.xp.asnumpy(rs) if zc.device else rs
    assert np.array_equal(got, np.arange(ME * 10, ME * 10 + 10, dtype=np.int32) * (P * (P + 1) // 2))
    d = xp.full(17, float(ME + 1))
    zc.comm.all_reduce(d, op="max")
    assert np.array_equal(zc.xp.asnumpy(d) if zc.device else d, np.full(17, float(P)))
    a = xp.arange(P * 3, dtype=xp.int64) + 100 * ME
    b = xp.zeros(P * 3, xp.int64)
    zc.comm.all_to_all(a, b)
    assert np.array_equal(zc.xp.asnumpy(b) if zc.device else b,
                          np.concatenate([np.arange(ME * 3, ME * 3 + 3) + 100 * r for r in range(P)]))
    assert zc.comm.last_decision is not None and not zc.comm.last_decision.compress


# -- errors on every rank, never hangs -------------------------------------------------------

def test_mismatched_sizes_raise_everywhere(zc):
    n = 100 + (ME == P - 1)  # the last rank disagrees (on one rank: recv is still right)
    x = zc.out(n, 0)
    out = zc.out(P * 100 if P > 1 else n, 0)
    with pytest.raises(CollectiveError) if P > 1 else contextlib.nullcontext():
        zc.comm.all_gather(x, out, **zc.kw)


def test_wrong_buffer_on_one_rank_raises_everywhere(zc):
    x = zc.out(64, 0)
    out = zc.out(P * 64 - (ME == 0), 0)  # rank 0's recv is one short
    with pytest.raises(CollectiveError, match="rank 0"):
        zc.comm.all_gather(x, out, **zc.kw)
    big = zc.out(P * 64 * 2, 0).reshape(P * 64, 2)
    strided = big[:, 0] if ME == P - 1 else big[:, 0].copy()  # non-contiguous on the last rank
    with pytest.raises(CollectiveError, match="non-contiguous"):
        zc.comm.reduce_scatter(strided, zc.out(64, 0), **zc.kw)
    good = zc.out(P * 64, 0)
    if zc.device:  # host memory on one rank, device memory on the others
        mixed = np.zeros(64, np.uint16) if ME == 0 else x
        with pytest.raises(CollectiveError):
            zc.comm.all_gather(mixed, good, **zc.kw)
    else:  # BF16 on the host has two spellings: the same on every rank or an error
        with pytest.raises(CollectiveError, match="send is uint16 but recv is bfloat16"):
            zc.comm.all_gather(x.view(np.uint16) if ME == 0 else x, good)
    zc.comm.all_gather(x, good, **zc.kw)  # still usable afterwards


def test_mismatched_dtypes_across_ranks(zc):
    dtype = (BF16 if not zc.device else zc.xp.uint16) if ME % 2 == 0 else zc.xp.float16
    x = zc.xp.zeros(10, dtype=dtype)
    out = zc.xp.zeros(10 * P, dtype=dtype)
    kw = zc.kw if ME % 2 == 0 else {}
    with pytest.raises(CollectiveError, match="disagree") if P > 1 else contextlib.nullcontext():
        zc.comm.all_gather(x, out, **kw)


def test_bad_counts_raise_everywhere(zc):
    m = count_matrix(12, zeros=False)
    x = zc.out(int(m[ME].sum()), 0)
    out = zc.out(int(m[:, ME].sum()) + 1, 0)  # one too many on every rank
    with pytest.raises(CollectiveError, match="recv holds"):
        zc.comm.all_to_all(x, out, send_counts=list(m[ME]), **zc.kw)
    rc = list(m[:, ME])
    rc[0] += 1
    out = zc.out(sum(rc), 0)
    # the first call with both counts (device arrays: later ones make no host exchange and
    # are not checked across ranks, as NCCL's all-to-all-v is not)
    with zipccl.Communicator(WORLD, backend=zc.backend, policy=zc.comm.policy,
                             chunk_bytes=2 * zc.comm.chunk) as fresh:
        with pytest.raises(CollectiveError, match="recv_counts"):
            fresh.all_to_all(x, out, send_counts=list(m[ME]), recv_counts=rc, **zc.kw)
    # BF16 MAX: the transport's own reduction where it has one (NCCL), refused over MPI
    if zc.device and zc.comm.transport_name == "nccl":
        zc.comm.all_reduce(zc.out(8, 0), op="max", **zc.kw)
        assert "transport's own" in zc.comm.last_decision.reason
    else:
        with pytest.raises(CollectiveError, match="MPI has no BF16 max"):
            zc.comm.all_reduce(zc.out(8, 0), op="max", **zc.kw)


@pytest.mark.skipif(P == 1, reason="one rank sends no frames")
@pytest.mark.parametrize("chunk_bytes", [0, 8192, None])
@pytest.mark.parametrize("where", ["header", "escapes", "payload"])
def test_corrupted_frame_detected_everywhere(place, where, chunk_bytes):
    c = zipccl.Communicator(WORLD, backend=place.backend, policy="always", checksum=True,
                            chunk_bytes=chunk_bytes)
    x = place.array(rank_input("edge", ME, 6000))  # plenty of escapes
    out = place.out(P * 6000)
    c.all_gather(x, out, **place.kw)  # sets the transport up
    tr = c._nccl if place.backend == "nccl" else c.mpi
    real = tr.alltoallv
    calls = []
    peer = (ME + 1) % P
    n = 6000 if not c.chunk else min(6000, c.chunk)  # elements of the first frame

    def corrupting_slots(send, sc, sd, recv, rc, rd, stream=None):  # the slot exchange (device)
        real(send, sc, sd, recv, rc, rd, stream)
        calls.append(1)
        if ME == 0 and rc[peer] and len(calls) == 1:
            frame = rd[peer] + zipccl.format.slot.SLOT_HEADER
            off = {"header": 20, "payload": 200, "escapes": zipccl.format.static_size(n)}[where]
            mask = 0x80 if where == "escapes" else (0x01 if where == "header" else 0x10)
            place.xor(recv, frame + off, mask, stream)

    tr.alltoallv = corrupting_slots
    try:
        if place.device or ME != 0:  # enqueued and returned / not the rank that decodes it
            c.all_gather(x, out, **place.kw)
        else:  # a host call has run when it returns: the rank that found it raises at once
            with pytest.raises(CollectiveError, match="frame from rank 1: corrupted"):
                c.all_gather(x, out, **place.kw)
    finally:
        tr.alltoallv = real
    # every rank learns it at synchronize() (the device: there first)
    with pytest.raises(CollectiveError, match="rank 0: .*(corrupted|did not decode)"):
        c.synchronize()
    with pytest.raises(CollectiveError, match="failed"):  # and stays failed (sticky)
        c.all_gather(x, out, **place.kw)
    c.close()


# -- the policy ------------------------------------------------------------------------------

def test_policy_decisions_are_shared(place):
    c = zipccl.Communicator(WORLD, backend=place.backend, policy="auto", compress_host=True,
                            min_compress_bytes=4096)
    x = place.out(4096, 0)
    out = place.out(P * 4096, 0)
    c.all_gather(x[:100], out[:100 * P], **place.kw)
    assert not c.last_decision.compress
    c.all_gather(x, out, **place.kw)
    if not place.device:  # the device default policy is calibrated (test_calibrated_policy)
        assert c.last_decision.compress == (P > 1)
    decisions = WORLD.allgather(str(c.last_decision))
    assert len(set(decisions)) == 1
    c.close()


def test_calibrated_policy_is_shared_and_cached(place, tmp_path):
    path = WORLD.bcast(str(tmp_path / "profile.json"), root=0)  # rank 0 reads and writes it
    c = zipccl.Communicator(WORLD, backend=place.backend, policy="auto")
    sizes = (8192, 131072) if not place.device else (1 << 16, 1 << 20)
    prof = c.calibrate(sizes=sizes, ops=("all_gather", "reduce_scatter"), repeat=1, path=path,
                       device=place.device)
    where = "device|nccl" if place.device else "host|mpi"
    assert prof.key.startswith(f"{where}|{P} ranks|")
    n = 65536
    x, out = place.out(n, 0), place.out(P * n, 0)
    c.all_gather(x, out, **place.kw)
    decisions = WORLD.allgather(str(c.last_decision))
    assert len(set(decisions)) == 1  # every rank fitted the same numbers
    if "all_gather" in prof.native and P > 1:
        assert "predicted native" in c.last_decision.reason
        assert c.last_decision.native_s > 0 and c.last_decision.compressed_s > 0
        line = c.explain("all_gather", 1 << 30, device=place.device, quiet=True)
        pred = prof.predict("all_gather", 1 << 30)  # the model extrapolates beyond the calibrated sizes
        faster = pred.compressed_s < (1 - c.policy.margin) * pred.native_s
        assert "extrapolated beyond the calibrated" in line
        assert ("-> compressed" if faster else "-> native") in line
    assert sorted(prof.measured) == ["all_gather", "reduce_scatter"]
    assert all(len(v["compressed"]) == 2 for v in prof.measured.values())
    again = zipccl.Communicator(WORLD, backend=place.backend, policy="auto")
    assert again.calibrate(path=path, device=place.device).to_json() == prof.to_json()  # loaded
    for comm_ in (c, again):
        comm_.close()



def test_forcing_overrides_the_policy_and_drops_plans(place):
    """``Communicator.forcing`` (what calibration times): BF16 calls take the forced path on
    every rank, entering and leaving drop the plans, a nested block restores the outer one."""
    c = zipccl.Communicator(WORLD, backend=place.backend, policy="never")
    n = 4096
    x, out = place.array(rank_input("gaussian", ME, n)), place.out(P * n)
    c.all_gather(x, out, **place.kw)
    assert not c.last_decision.compress and len(c._core.plans) == 1
    with c.forcing(True):
        assert not c._core.plans
        c.all_gather(x, out, **place.kw)
        assert c.last_decision.compress == (P > 1)  # one rank: nothing to compress, not forced
        with c.forcing(False):
            c.all_gather(x, out, **place.kw)
            assert not c.last_decision.compress
        c.all_gather(x, out, **place.kw)
        assert c.last_decision.compress == (P > 1)
        assert np.array_equal(place.bits(out), gathered("gaussian", n))
    assert not c._core.plans
    c.all_gather(x, out, **place.kw)
    assert not c.last_decision.compress and c.last_decision.reason != "calibration"
    with pytest.raises(TypeError, match="forcing takes True"), c.forcing(1):
        pass
    c.close()

def test_agreed_native_calls_replay_the_bound_call(place):
    """A native call seen before: no control exchange, the transport call from its plan, same bits."""
    c = zipccl.Communicator(WORLD, backend=place.backend, policy="never")
    n = 4096
    x = place.array(rank_input("gaussian", ME, P * n))
    outs = {"ag": place.out(P * P * n), "a2a": place.out(P * n), "ar": place.out(P * n)}
    calls = {"ag": lambda: c.all_gather(x, outs["ag"], **place.kw),
             "a2a": lambda: c.all_to_all(x, outs["a2a"], **place.kw),
             "ar": lambda: c.all_reduce(outs["ar"], **place.kw)}
    for f in calls.values():
        f()  # agreed and planned
    control = []
    real = c.mpi.allgather_ints
    c.mpi.allgather_ints = lambda *a: control.append(1) or real(*a)
    outs["ar"][...] = x
    for f in calls.values():
        f()
    c.mpi.allgather_ints = real
    assert not control
    inputs = [rank_input("gaussian", r, P * n) for r in range(P)]
    assert np.array_equal(place.bits(outs["ag"]), np.concatenate(inputs))
    assert np.array_equal(place.bits(outs["a2a"]), np.concatenate([i[ME * n:(ME + 1) * n] for i in inputs]))
    if place.device:
        assert sum(plan.run is not None for plan in c._core.plans.values()) == 3
        ref = x.copy()  # NCCL's own BF16 sum, called directly
        c._nccl.allreduce(ref, "sum", None, dtype="bfloat16")
        assert np.array_equal(place.bits(outs["ar"]), place.bits(ref))
    else:
        assert np.array_equal(place.bits(outs["ar"]), expected_sum(inputs))
    c.close()
