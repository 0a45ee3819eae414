"""Statistics on the GPU: the sigma estimate behind the default codebook, and the
exponent histogram behind ``Codebook.from_histogram`` (kept for comparison).

``sample_sumsq`` reads the same strided sample as ``codebook.estimate_sigma``
(``codebook.sample_stride``, the first ``samples`` values, inf and NaN
skipped) and sums the squares in float64. Each square is exact (a BF16 value
has 8 significant bits), so the estimate differs from the NumPy one only by the
order of the float64 additions (a fixed tree here): the last bits of sigma, and
the codebook only if sigma sits on a window boundary to within that rounding.

``gather_sample`` copies that sample into a small buffer, so that the host can
run ``Codebook.from_sample`` on it (sigma window or top-7 fallback) and get the
very codebook the host codec picks.

``exponent_histogram`` counts the 256 exponent values of the whole tensor
(per-block shared-memory counts, then one global atomic per non-zero bin).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..codebook import sample_stride
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from .compat import load16

SUM_TPB = 256
HIST_TPB = 256
HIST_MAX_BLOCKS = 2 if compat.SIMULATOR else 1024


@cuda.jit
def sample_sumsq(x16, stride, count, out):
    """out[0] = sum of squares of the finite sampled values, out[1] = how many (one block)."""
    ssum = cuda.shared.array(SUM_TPB, dtype=np.float64)
    scnt = cuda.shared.array(SUM_TPB, dtype=np.float64)
    tid = cuda.threadIdx.x
    s = 0.0
    c = 0.0
    i = tid
    while i < count:
        b = np.int64(x16[i * stride])
        e = (b >> 7) & 0xFF
        if e != 255:
            m = b & 0x7F
            if e > 0:
                m += 128
            else:
                e = 1
            mf = float(m)
            s += mf * mf * (2.0 ** (2 * (e - 134)))  # |x| = m * 2**(e - 127 - 7), squared exactly
            c += 1.0
        i += SUM_TPB
    ssum[tid] = s
    scnt[tid] = c
    cuda.syncthreads()
    h = SUM_TPB // 2
    while h > 0:
        if tid < h:
            ssum[tid] += ssum[tid + h]
            scnt[tid] += scnt[tid + h]
        cuda.syncthreads()
        h //= 2
    if tid == 0:
        out[0] = ssum[0]
        out[1] = scnt[0]


@cuda.jit
def gather_sample(x16, stride, count, out):
    """out[i] = x16[i * stride] for i < count (one block: count is a few thousand)."""
    i = cuda.threadIdx.x
    while i < count:
        out[i] = x16[i * stride]
        i += SUM_TPB


@cuda.jit
def exponent_histogram(x32, x16, n, hist):
    """hist[e] += number of values with exponent e (hist must start at zero)."""
    local = cuda.shared.array(256, dtype=np.int32)
    tid = cuda.threadIdx.x
    local[tid] = 0
    cuda.syncthreads()
    groups = n >> 3
    g = np.int64(cuda.blockIdx.x) * HIST_TPB + tid
    step = np.int64(cuda.gridDim.x) * HIST_TPB
    while g < groups:
        v0, v1, v2, v3 = load16(x32, g)
        for w in (np.int64(v0), np.int64(v1), np.int64(v2), np.int64(v3)):
            cuda.atomic.add(local, (w >> 7) & 0xFF, 1)
            cuda.atomic.add(local, (w >> 23) & 0xFF, 1)
        g += step
    if cuda.blockIdx.x == 0 and tid < (n & 7):
        cuda.atomic.add(local, (np.int64(x16[(n & ~np.int64(7)) + tid]) >> 7) & 0xFF, 1)
    cuda.syncthreads()
    if local[tid] != 0:
        cuda.atomic.add(hist, tid, np.int64(local[tid]))


def _sample_shape(n: int, samples: int) -> tuple[int, int]:
    stride = sample_stride(n, samples) if n else 1
    return stride, (min(samples, (n + stride - 1) // stride) if n else 0)


def launch_sumsq(x16, n: int, samples: int, out, stream) -> None:
    """Enqueue the strided-sample sum of squares of the n values of x16 into out[0:2]."""
    stride, count = _sample_shape(n, samples)
    sample_sumsq[1, SUM_TPB, stream](x16, stride, count, out)


def launch_gather(x16, n: int, samples: int, out, stream) -> int:
    """Enqueue the copy of the strided sample of x16 into out; returns its length."""
    stride, count = _sample_shape(n, samples)
    if count:
        gather_sample[1, SUM_TPB, stream](x16, stride, count, out)
    return count


def launch_histogram(x32, x16, n: int, hist, stream) -> None:
    """Enqueue the exponent histogram of the n values of x16 into the zeroed int64 hist[256]."""
    blocks = max(1, min(HIST_MAX_BLOCKS, (n + 8 * HIST_TPB - 1) // (8 * HIST_TPB)))
    exponent_histogram[blocks, HIST_TPB, stream](x32, x16, n, hist)
