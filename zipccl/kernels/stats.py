"""Statistics on the GPU: the codebook choice, the sigma estimate behind the default codebook,
and the exponent histogram behind ``Codebook.from_histogram`` (kept for comparison).

``choose_codebook`` is ``codebook.choose_codebook`` on the device (the same sample, the same
float64 sum of squares bit for bit, the same window table and top-7 fallback), writing the 7
exponents to the workspace where the encoder reads them, so that ``compress`` never reads
anything back before encoding. ``sample_sumsq`` and ``gather_sample`` give the host the
sigma estimate and the sample itself; ``exponent_histogram`` counts a whole tensor's
exponents. docs/KERNELS.md, "The codebook on the device", says how each agrees with the host.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ..codebook import FALLBACK_MARGIN, RMS_LANES, sample_stride
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from . import launch as launch_route
from ._common import WS_CODEBOOK
from .compat import load16, shfl_xor

HIST_TPB = 256
HIST_MAX_BLOCKS = 2 if compat.SIMULATOR else 1024


SUM_TPB = 256
SAMPLE_MAX = 4096  # values a one-block sample kernel holds in shared memory (codebook.SAMPLE_SIZE)
# threads of the sample kernels: all load, SUM_TPB of them sum (SUM_TPB under the simulator,
# where every thread is a Python thread)
LOAD_TPB = SUM_TPB if compat.SIMULATOR else 1024


@cuda.jit(device=True)
def _load_sample(x16, stride, count, samp):
    """Block-wide gather of the strided sample into shared memory (count <= SAMPLE_MAX):
    every load is issued at once, instead of one dependent load after another."""
    i = np.int64(cuda.threadIdx.x)
    while i < count:
        samp[i] = x16[i * stride]
        i += LOAD_TPB
    cuda.syncthreads()


@cuda.jit(device=True)
def _sample_sums(samp, count, scale, ssum, cnt):
    """ssum[0] = the sum of squares of the finite values of the shared sample in
    ``codebook._rms``'s order (thread j < SUM_TPB adds values j, j + 256, ... in turn,
    then a halving tree), cnt[0] = how many."""
    tid = cuda.threadIdx.x
    if tid < SUM_TPB:
        s = 0.0
        c = np.int64(0)
        i = np.int64(tid)
        while i < count:
            b = np.int64(samp[i])
            e = (b >> 7) & 0xFF
            if e != 255:
                m = b & 0x7F
                if e > 0:
                    m += 128
                s += float(m * m) * scale[e]  # exact: m * 2^(e - 134) squared
                c += 1
            i += SUM_TPB
        ssum[tid] = s
        cnt[tid] = c
    cuda.syncthreads()
    h = SUM_TPB // 2
    while h > 0:
        if tid < h:
            ssum[tid] = ssum[tid] + ssum[tid + h]
            cnt[tid] += cnt[tid + h]
        cuda.syncthreads()
        h //= 2


@cuda.jit
def sample_sumsq(x16, stride, count, scale, out):
    """out[0] = sum of squares of the finite sampled values, out[1] = how many (one block)."""
    samp = cuda.shared.array(SAMPLE_MAX, dtype=np.uint16)
    ssum = cuda.shared.array(SUM_TPB, dtype=np.float64)
    cnt = cuda.shared.array(SUM_TPB, dtype=np.int64)
    _load_sample(x16, stride, count, samp)
    _sample_sums(samp, count, scale, ssum, cnt)
    if cuda.threadIdx.x == 0:
        out[0] = ssum[0]
        out[1] = float(cnt[0])


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


def launch_sumsq(x16, n: int, samples: int, scale, out, stream) -> None:
    """Enqueue the strided-sample sum of squares of the n values of x16 into out[0:2]
    (``scale``: ``SQUARE_SCALE`` on the device)."""
    stride, count = _sample_shape(n, samples)
    if count > SAMPLE_MAX:
        raise ValueError(f"the device sample holds at most {SAMPLE_MAX} values, not {count}")
    sample_sumsq[1, LOAD_TPB, stream](x16, stride, count, scale, out)


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


# square of a BF16 value of biased exponent e with integer significand m: m^2 * SQUARE_SCALE[e]
# (exact float64 powers of two; exponent 0 holds subnormals, scaled as exponent 1)
SQUARE_SCALE = np.array([math.ldexp(1.0, 2 * (max(e, 1) - 134)) for e in range(256)], dtype=np.float64)
assert SUM_TPB == 256 == RMS_LANES, "one thread per exponent bin and per partial sum"


CHOICE_TPB = SUM_TPB  # threads of choose_codebook: few warps make each block barrier cheap
CHOICE_LOADS = SAMPLE_MAX // CHOICE_TPB  # sampled values per thread


@cuda.jit
def choose_codebook(x16, stride, count, threshold, scale, thr, starts, n_thr, ws):
    """ws[WS_CODEBOOK] = the default codebook of the strided sample (docs/KERNELS.md, "The
    codebook on the device"; one block of CHOICE_TPB threads). Block barriers only where every
    thread's data meet: around the sample's stores and the histogram, in the sum's halving
    tree, after the window; the top-7 is found by warp 0 alone with shuffles (7 rounds of a
    warp maximum, no barrier)."""
    samp = cuda.shared.array(SAMPLE_MAX, dtype=np.uint16)
    hist = cuda.shared.array(256, dtype=np.int32)  # 32-bit: native shared-memory atomics
    ssum = cuda.shared.array(SUM_TPB, dtype=np.float64)
    key = cuda.shared.array(SUM_TPB, dtype=np.int64)
    found = cuda.shared.array(1, dtype=np.int64)
    tid = cuda.threadIdx.x
    hist[tid] = 0
    if tid == 0:
        found[0] = 0
    # the sample: each thread's 16 loads into registers first, all in flight together (a
    # load may not move above a store to shared memory: generic pointers may alias it)
    v = cuda.local.array(CHOICE_LOADS, dtype=np.uint16)
    for k in range(CHOICE_LOADS):
        i = np.int64(tid) + k * CHOICE_TPB
        v[k] = x16[i * stride] if i < count else 0
    cuda.syncthreads()  # the histogram is zeroed (the loads stay in flight)
    for k in range(CHOICE_LOADS):
        i = np.int64(tid) + k * CHOICE_TPB
        if i < count:
            samp[i] = v[k]
            cuda.atomic.add(hist, (np.int64(v[k]) >> 7) & 0xFF, 1)
    cuda.syncthreads()
    _sample_sums(samp, count, scale, ssum, key)
    total = ssum[0]
    finite = key[0]
    sigma = 0.0
    if finite > 0:
        sigma = math.sqrt(total / finite)
    # the window: the last threshold <= sigma (sigma 0 keeps the window at exponent 0)
    if sigma > 0.0:
        t = np.int64(tid)
        while t < n_thr:
            if thr[t] <= sigma and (t + 1 == n_thr or thr[t + 1] > sigma):
                found[0] = starts[t]
            t += CHOICE_TPB
    cuda.syncthreads()
    if tid < 32:  # the sample's top-7 (count descending, then exponent ascending): warp 0
        lane = np.int64(tid)
        taken = np.int64(0)  # bit k: bin 8 lane + k is in the top already
        cb_top = np.int64(0)
        n_top = np.int64(0)
        for r in range(7):
            best = np.int64(-1)
            for k in range(8):
                b = 8 * lane + k
                kk = np.int64(hist[b]) * 256 + (255 - b)
                if ((taken >> k) & 1) == 0 and kk > best:
                    best = kk
            for off in (16, 8, 4, 2, 1):
                other = shfl_xor(best, off)
                if other > best:
                    best = other
            b = 255 - (best & 255)
            if (b >> 3) == lane:
                taken |= np.int64(1) << (b & 7)
            cb_top |= b << (8 * r)
            n_top += best >> 8
        if tid == 0:
            start = found[0]
            n_sigma = np.int64(0)
            for r in range(7):
                n_sigma += np.int64(hist[start + r])
            cb = np.int64(0)
            if count > 0 and n_top - n_sigma > threshold:
                cb = cb_top
            else:
                for r in range(7):
                    cb |= (start + r) << (8 * r)
            ws[WS_CODEBOOK] = cb


def codebook_args(n: int, samples: int) -> tuple[int, int, int]:
    """(stride, count, fallback threshold) of the sample of n values: the rule
    ``n_top - n_sigma > FALLBACK_MARGIN * count`` on integers is ``> floor(margin * count)``."""
    stride, count = _sample_shape(n, samples)
    if count > SAMPLE_MAX:
        raise ValueError(f"the device sample holds at most {SAMPLE_MAX} values, not {count}")
    return stride, count, int(math.floor(FALLBACK_MARGIN * count))


def launch_codebook(x16, n: int, samples: int, scale, thr, starts, ws, stream, step: int = 1) -> None:
    """Enqueue ``choose_codebook`` (Numba's dispatcher: the simulator's route) for the n
    values at every ``step``-th uint16 of ``x16`` (2: FP32 upper halves)."""
    stride, count, threshold = codebook_args(n, samples)
    choose_codebook[1, CHOICE_TPB, stream](x16, step * stride, count, threshold, scale, thr, starts,
                                           thr.size, ws)


_A = launch_route.array
CODEBOOK = launch_route.Kernel(choose_codebook, (_A(np.uint16), launch_route.I64, launch_route.I64,
                                                 launch_route.I64, _A(np.float64), _A(np.float64),
                                                 _A(np.int64), launch_route.I64, _A(np.int64)))


class CodebookPlan:
    """``choose_codebook`` for one buffer and workspace, launched from packed parameters."""

    __slots__ = ("function", "params", "keep")

    def __init__(self, device: int, x_ptr: int, n: int, samples: int, tables, ws_ptr: int,
                 ws_count: int, step: int = 1):
        """The n values at every ``step``-th uint16 from ``x_ptr`` (2: FP32 upper halves)."""
        stride, count, threshold = codebook_args(n, samples)
        (scale_ptr, scale_n), (thr_ptr, thr_n), (st_ptr, st_n) = tables
        self.function = CODEBOOK.function(device)
        span = max(0, step * (n - 1) + 1)  # uint16 elements up to the last value
        self.params = launch_route.Params(CODEBOOK, ((x_ptr, span), step * stride, count, threshold,
                                                     (scale_ptr, scale_n), (thr_ptr, thr_n),
                                                     (st_ptr, st_n), thr_n, (ws_ptr, ws_count)))

    def retarget(self, x_ptr: int) -> None:
        """Point the plan at other values of the same count."""
        self.params.vals[_CB_X_SLOT] = x_ptr  # Params.set, inline

    def launch(self, stream: int) -> None:
        launch_route.launch(self.function, 1, CHOICE_TPB, stream, self.params)


_CB_X_SLOT = CODEBOOK.data_slot(0)
