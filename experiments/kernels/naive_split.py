"""The naive split baseline of ``bench_codec.py --variants naive``: one element per thread,
a sign-mantissa byte and an exponent byte out, no coding (the speed of the simplest kernel
that touches every value; experiments/kernels/NOTES.md)."""

from __future__ import annotations

import numpy as np
from numba import cuda

from zipccl.kernels import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)


@cuda.jit
def naive_split(x16, n, sm, ex):
    """Value i -> sm[i] = sign | mantissa, ex[i] = exponent."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        v = np.int64(x16[i])
        sm[i] = ((v >> 8) & 0x80) | (v & 0x7F)
        ex[i] = (v >> 7) & 0xFF
        i += step
