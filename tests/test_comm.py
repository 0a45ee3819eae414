"""Single-process tests of zipccl.comm: the stated reduction, the policy, argument checks.

The collectives themselves run on 1, 2 and 4 ranks in tests/test_comm_mpi.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from conftest import edge_corpus, gaussian_bits

import zipccl
from zipccl.comm import CollectiveError, Policy, transport
from zipccl.comm.base import split_counts
from zipccl.comm.reduction import f32_to_bf16_bits, reduce_sum_bf16
from zipccl.format import slot as slots

BF16 = np.dtype(ml_dtypes.bfloat16)


def bf16(values) -> np.ndarray:
    return np.array(values, dtype=np.float32).astype(BF16).view(np.uint16)


def test_import_touches_neither_mpi_nor_gpu():
    code = ("import sys, zipccl, zipccl.comm; "
            "bad = [m for m in ('mpi4py.MPI', 'cupy', 'torch', 'numba.cuda') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rounding_is_ml_dtypes_rounding():
    rng = np.random.default_rng(0)
    u = np.concatenate([rng.integers(0, 1 << 32, 2_000_000, dtype=np.uint64).astype(np.uint32),
                        np.array([0, 0x80000000, 0x7F7FFFFF, 0x7F7F8000, 0x00008000, 0x00018000,
                                  0x3F808000, 0x3F818000, 0x7F800000, 0xFF800000], np.uint32)])
    x = u.view(np.float32)
    got = f32_to_bf16_bits(x)
    with np.errstate(invalid="ignore"):
        want = x.astype(BF16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert (got[nan] == 0x7FC0).all() and nan.sum() > 1000


def test_reduction_order_is_rank_order():
    big, one = 2.0 ** 24, 1.0  # big + 1 rounds back to big in FP32
    out = np.zeros(1, np.uint16)
    reduce_sum_bf16(np.stack([bf16([big]), bf16([one]), bf16([-big])]), out)
    assert out[0] == bf16([0.0])[0]  # (big + 1) - big = 0
    reduce_sum_bf16(np.stack([bf16([big]), bf16([-big]), bf16([one])]), out)
    assert out[0] == bf16([1.0])[0]  # (big - big) + 1 = 1


def test_reduction_special_values():
    s = np.array([[0x8000, 0x7F80, 0x7F80, 0x7F7F, 0x7FC1, 0x0001],
                  [0x8000, 0xFF80, 0x3F80, 0x7F7F, 0x3F80, 0x0001]], dtype=np.uint16)
    out = np.zeros(6, np.uint16)
    reduce_sum_bf16(s, out)
    # -0 + -0 = -0; inf - inf = NaN (canonical); inf + 1 = inf; max + max overflows to inf;
    # NaN payloads are not propagated; two smallest subnormals add exactly.
    assert out.tolist() == [0x8000, 0x7FC0, 0x7F80, 0x7F80, 0x7FC0, 0x0002]


def test_reduction_one_rank_is_identity():
    x = edge_corpus()
    out = np.zeros_like(x)
    reduce_sum_bf16(x[None, :], out)
    nan = np.isnan(x.view(BF16).astype(np.float32))
    assert np.array_equal(out[~nan], x[~nan]) and (out[nan] == 0x7FC0).all()


def _harness():
    """experiments/harness.py (the benchmarks' shared module; experiments/ is not a package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    try:
        import harness
    finally:
        sys.path.pop(0)
    return harness


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_library_reduction_equals_the_benchmarks_oracle(p):
    """reduce_sum_bf16 bit for bit against the NumPy oracle the benchmarks check the collectives
    with (experiments/harness.py: written from the stated order and rounding, not the library)."""
    harness = _harness()
    rng = np.random.default_rng(p)
    x = edge_corpus()
    rows = np.stack([np.roll(x, 97 * r) for r in range(p - 1)]
                    + [rng.integers(0, 1 << 16, x.size, dtype=np.uint16)])
    rows = np.concatenate([rows, np.stack([gaussian_bits(50_000, 0.02 * (r + 1), seed=r)
                                           for r in range(p)])], axis=1)
    out = np.zeros(rows.shape[1], np.uint16)
    reduce_sum_bf16(rows, out)
    assert np.array_equal(out, harness.stated_sum_bf16(list(rows)))


def test_harness_examples():
    import doctest

    r = doctest.testmod(_harness())
    assert r.failed == 0 and r.attempted >= 2


def test_regions_hold_every_frame():
    for n in [1, 2, 31, 32, 33, 100, 4095, 4096, 4097, 50_000]:
        frame_room = slots.region_bytes(n) - slots.SLOT_HEADER
        assert frame_room >= zipccl.max_compressed_size(n)
    assert split_counts(7, 3) == [3, 2, 2] and sum(split_counts(10**6 + 3, 4)) == 10**6 + 3


def test_policy():
    p = Policy("auto", min_bytes=1000)
    assert not p.decide("all_gather", 999, dtype="bfloat16", device=True, world=2).compress
    assert p.decide("reduce_scatter", 1000, dtype="bfloat16", device=True, world=2).compress
    assert not p.decide("all_gather", 10**9, dtype=None, device=True, world=2).compress
    assert not p.decide("all_gather", 10**9, dtype="bfloat16", device=True, world=1).compress
    assert not p.decide("all_to_all", 10**9, dtype="bfloat16", device=False, world=2).compress
    assert Policy("auto", compress_host=True).decide("all_to_all", 1 << 20, dtype="bfloat16",
                                                     device=False, world=2).compress
    assert Policy("always").decide("all_reduce", 1, dtype="bfloat16", device=False, world=2).compress
    assert not Policy("never").decide("all_reduce", 10**9, dtype="bfloat16", device=True, world=8).compress
    assert "threshold" in p.explain("all_gather", 10)
    with pytest.raises(ValueError):
        Policy("sometimes")


def test_cuda_awareness_is_detected_not_assumed(monkeypatch):
    monkeypatch.delenv(transport.ENV_CUDA_AWARE, raising=False)
    assert transport.detect_cuda_aware_mpi() is False  # the mpich wheel here has no CUDA
    monkeypatch.setenv(transport.ENV_CUDA_AWARE, "1")
    assert transport.detect_cuda_aware_mpi() is True


@pytest.fixture
def self_comm():
    from mpi4py import MPI

    c = zipccl.Communicator(MPI.COMM_SELF, policy="always")
    yield c
    c.close()


def test_one_rank_collectives_torch_and_numpy(self_comm):
    torch = pytest.importorskip("torch")
    x = gaussian_bits(5000, seed=3)
    t = torch.from_numpy(x.astype(np.int16)).view(torch.bfloat16)
    out = torch.zeros(5000, dtype=torch.bfloat16)
    self_comm.all_gather(t, out)
    assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), x)
    buf = x.copy().view(BF16)
    self_comm.all_reduce(buf)
    nan = np.isnan(x.view(BF16).astype(np.float32))
    assert np.array_equal(buf.view(np.uint16)[~nan], x[~nan])
    rs = np.zeros(5000, np.uint16)
    self_comm.reduce_scatter(x, rs, dtype="bfloat16")
    assert np.array_equal(rs, x)
    a2a = np.zeros(5000, np.uint16)
    self_comm.all_to_all(x, a2a, send_counts=[5000], dtype="bfloat16")
    assert np.array_equal(a2a, x)


def test_argument_errors(self_comm):
    x = np.zeros(10, dtype=BF16)
    with pytest.raises(CollectiveError, match="recv holds 9"):
        self_comm.all_gather(x, np.zeros(9, dtype=BF16))
    with pytest.raises(CollectiveError, match="non-contiguous"):
        self_comm.all_gather(np.zeros(20, dtype=BF16)[::2], np.zeros(10, dtype=BF16))
    with pytest.raises(CollectiveError, match="read-only"):
        ro = np.zeros(10, dtype=BF16)
        ro.flags.writeable = False
        self_comm.all_gather(x, ro)
    with pytest.raises(CollectiveError, match="misaligned"):
        raw = np.zeros(21, dtype=np.uint8)
        self_comm.all_reduce(raw[1:].view(np.uint16), dtype="bfloat16")
    with pytest.raises(CollectiveError, match="16-bit"):
        self_comm.all_reduce(np.zeros(4, np.float32), dtype="bfloat16")
    with pytest.raises(CollectiveError, match="must be a NumPy"):
        self_comm.all_reduce([1.0, 2.0])
    with pytest.raises(CollectiveError, match="send_counts add up"):
        self_comm.all_to_all(x, np.zeros(10, dtype=BF16), send_counts=[9])
    with pytest.raises(CollectiveError, match="op must be"):
        self_comm.reduce_scatter(x, x.copy(), op="mean")


def test_reductions_alike_sum_avg_stated_others_the_transports(self_comm):
    """SUM and AVG are zipccl's (stated); any other reduction is the transport's own, and the
    decision says so; BF16 has none over MPI: a CollectiveError naming NCCL."""
    x = np.arange(8, dtype=np.float32)
    self_comm.all_reduce(x, op="max")
    assert "transport's own" in self_comm.last_decision.reason
    assert np.array_equal(x, np.arange(8, dtype=np.float32))
    b = np.arange(8, dtype=np.float32).astype(BF16)
    self_comm.all_reduce(b, op="avg")  # one rank: the value divided by 1, exactly
    assert np.array_equal(b.view(np.uint16), np.arange(8, dtype=np.float32).astype(BF16).view(np.uint16))
    with pytest.raises(CollectiveError, match="MPI has no BF16 max"):
        self_comm.all_reduce(b, op="max")
    with pytest.raises(CollectiveError, match="op='avg' takes BF16"):
        self_comm.all_reduce(np.zeros(4, np.int32), op="avg")


def test_zipccl_policy_env_replaces_the_default_auto(monkeypatch):
    """$ZIPCCL_POLICY replaces a Communicator's default "auto", as in zipccl.torch; an explicit
    mode in code stays."""
    from mpi4py import MPI

    monkeypatch.setenv("ZIPCCL_POLICY", "never")
    with zipccl.Communicator(MPI.COMM_SELF) as c:
        assert c.policy.mode == "never"
    with zipccl.Communicator(MPI.COMM_SELF, policy="always") as c:
        assert c.policy.mode == "always"
    monkeypatch.setenv("ZIPCCL_POLICY", "sometimes")
    with pytest.raises(ValueError, match="ZIPCCL_POLICY"):
        zipccl.Communicator(MPI.COMM_SELF)


def test_nccl_backend_refuses_host_arrays():
    from mpi4py import MPI

    with zipccl.Communicator(MPI.COMM_SELF, backend="nccl") as c:
        with pytest.raises(CollectiveError, match="device arrays only"):
            c.all_gather(np.zeros(4, dtype=BF16), np.zeros(4, dtype=BF16))
    with pytest.raises(ValueError, match="backend"):
        zipccl.Communicator(MPI.COMM_SELF, backend="gloo")
