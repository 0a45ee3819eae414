"""The device reductions (``pipeline.DeviceEngine``'s kernels) against the stated sum, bit for bit.

BF16, FP32 and FP16 rows of Gaussian values and of edge patterns (NaN payloads,
subnormals, +-0, +-inf, the largest finite values) summed on the GPU, whole and by
column ranges as the pipelined exchange calls them; compared with
``collectives.reduce_sum`` (NumPy). Needs a GPU: ``pytest -m gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest

from zipccl.comm.reduction import reduce_sum

pytestmark = pytest.mark.gpu

U = {np.uint16: np.uint16, np.float32: np.uint32, np.float16: np.uint16}


def rows(dtype, p: int, m: int, seed: int) -> np.ndarray:
    """(p, m) values of ``dtype``: Gaussian, with every 5th value an arbitrary bit pattern."""
    rng = np.random.default_rng(seed)
    u = U[dtype]
    if dtype is np.uint16:  # BF16 bits
        x = (rng.normal(0, 1, (p, m)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        x = rng.normal(0, 1, (p, m)).astype(dtype)
    bits = x.view(u)
    pick = rng.random((p, m)) < 0.2
    bits[pick] = rng.integers(0, np.iinfo(u).max, pick.sum(), dtype=u, endpoint=True)
    return x


@pytest.mark.parametrize("dtype", [np.uint16, np.float32, np.float16])
@pytest.mark.parametrize("p", [2, 3, 8])
def test_device_reduction_is_the_stated_sum(dtype, p):
    cupy = pytest.importorskip("cupy")
    from zipccl.comm.pipeline import DeviceEngine

    eng = DeviceEngine()
    m = 100_003
    host = rows(dtype, p, m, seed=p)
    want = np.empty(m, dtype)
    reduce_sum(host, want)
    got = cupy.zeros(m, dtype)
    eng.reduce_sum(cupy.asarray(host), got)
    eng.sync()
    g, w = cupy.asnumpy(got).view(U[dtype]), want.view(U[dtype])
    bad = np.flatnonzero(g != w)
    assert not bad.size, (f"{bad.size} differ; first {[hex(int(v)) for v in host.view(U[dtype])[:, bad[0]]]}"
                          f" -> {hex(int(g[bad[0]]))} vs {hex(int(w[bad[0]]))}")
    stage, cols = cupy.asarray(host.reshape(-1)), cupy.zeros(m, dtype)
    for lo, hi in [(0, 4096), (4096, 50_000), (50_000, m)]:  # the pipelined exchange's calls
        eng.reduce_cols(stage, p, m, lo, hi, cols)
    eng.sync()
    assert np.array_equal(cupy.asnumpy(cols).view(U[dtype]), want.view(U[dtype]))
