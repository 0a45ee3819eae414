"""``Policy(loopback=True)``: one rank runs the whole compressed path through a slot to itself
(for measuring host cost and capture on one GPU): every collective gives back its input's bits
(the reductions of one rank: the stated sum of one value), over MPI here; over a one-rank
gloo group in tests/torchdist/ranks.py (check_loopback, read by tests/test_torch.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from zipccl.comm import Policy
from zipccl.comm.reduction import reduce_sum


def test_loopback_needs_always_or_raw():
    with pytest.raises(ValueError, match="loopback=True"):
        Policy("auto", loopback=True)
    with pytest.raises(TypeError, match="loopback must be"):
        Policy("always", loopback=1)
    d = Policy("always", loopback=True).decide("all_gather", 64, dtype="bfloat16", device=True, world=1)
    assert d.compress and d.loopback and "loopback" in d.reason
    d = Policy("always", loopback=True).decide("all_gather", 64, dtype="bfloat16", device=True, world=2)
    assert d.compress and not d.loopback  # only one rank loops back
    assert not Policy("always").decide("all_gather", 64, dtype="bfloat16", device=True, world=1).compress


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize("mode", ["always", "raw"])
def test_communicator_loopback_is_exact(dtype, mode):
    from conftest import edge_corpus
    from mpi4py import MPI

    import zipccl

    np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float16": np.float16}[dtype]
    rng = np.random.default_rng(3)
    gauss = rng.normal(0, 0.02, 5000).astype(np.float32).astype(np_dtype)
    if dtype == "bfloat16":  # Gaussian values, then every edge case (NaN payloads, subnormals...)
        odd = edge_corpus().view(np_dtype)
    else:  # random bit patterns: NaNs, infinities, subnormals of the type among them
        width = np.uint16 if np.dtype(np_dtype).itemsize == 2 else np.uint32
        odd = rng.integers(0, np.iinfo(width).max, 3000, dtype=width, endpoint=True).view(np_dtype)
    x = np.concatenate([gauss, odd])
    bits = x.view(np.uint16 if x.itemsize == 2 else np.uint32)
    with zipccl.Communicator(MPI.COMM_SELF, policy=Policy(mode, loopback=True), chunk_bytes=4096) as c:
        o = np.empty_like(x)
        c.all_gather(x, o)
        assert np.array_equal(o.view(bits.dtype), bits)
        c.all_to_all(x, o)
        assert np.array_equal(o.view(bits.dtype), bits)
        c.all_to_all(x, o, [x.size], [x.size])
        assert np.array_equal(o.view(bits.dtype), bits)
        stated = np.empty_like(x.view(bits.dtype) if dtype == "bfloat16" else x)
        reduce_sum((x.view(np.uint16) if dtype == "bfloat16" else x).reshape(1, -1), stated)
        c.reduce_scatter(x, o)
        assert np.array_equal(o.view(bits.dtype), stated.view(bits.dtype))
        y = x.copy()
        c.all_reduce(y)
        assert np.array_equal(y.view(bits.dtype), stated.view(bits.dtype))
        assert c.stats.compressed_calls == c.stats.calls == 5
        assert c.last_decision.loopback
