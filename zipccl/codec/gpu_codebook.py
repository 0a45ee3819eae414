"""Codebooks chosen on the device, the same as the host's for the same values.

``estimate_sigma``, ``sample_codebook`` and ``histogram_codebook`` are ``codebook``'s functions
of a device array: the strided sample or the histogram is made on the device and read back (a
synchronisation). ``_choose`` / ``_choose_on_device`` enqueue ``kernels/stats.choose_codebook``
(the default codebook of BF16 and FP32 values, bit for bit the host's ``choose_codebook``) into a
workspace, where the encoder reads it: no synchronisation, no host sample.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from ..codebook import SAMPLE_SIZE, Codebook, sample_stride
from .gpu_arrays import _bits_view, _dtype_name, _raw, _typed_view, _u16
from .gpu_route import _codebook_tables, _device_pointer, _kernels
from .gpu_workspace import _PLANS, Workspace, _remember


def _wide_sample(xb, n: int, code: int, samples: int, stream) -> np.ndarray:
    """The strided sample ``codebook.choose_codebook`` reads, gathered on the device and read
    back (a synchronisation): FP16 values, or the upper halves of FP32 values."""
    _, _, _, runtime, stats = _kernels()
    if n == 0:
        return np.zeros(0, np.uint16)
    stride = sample_stride(n, samples)
    count = min(samples, (n + stride - 1) // stride)
    if code == fmt.DTYPE_FP32:  # the upper half of value i is uint16 2i + 1
        src = runtime.view(_raw(xb)[0] + 2, 2 * n - 1, np.uint16) if not runtime.SIMULATOR \
            else runtime.view(xb, 2 * n, np.uint16)[1:]
        stride *= 2
    else:
        src = runtime.view(xb if runtime.SIMULATOR else _raw(xb)[0], n, np.uint16)
    buf = runtime.device_empty(count, np.uint16) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(count, np.uint16), count, np.uint16)
    s = runtime.stream(stream)
    stats.gather_sample[1, stats.SUM_TPB, s](src, stride, count, buf)
    return runtime.to_host(buf, count, s)


def estimate_sigma(x, samples: int = SAMPLE_SIZE, stream=None, dtype: str | None = "bfloat16") -> float:
    """``codebook.estimate_sigma`` on the device (reads one 16-byte result: a synchronisation)."""
    _, _, _, runtime, stats = _kernels()
    xb, _ = _bits_view(x, dtype)
    xb, n = _u16(xb)
    if n == 0:
        return 0.0
    s = runtime.stream(stream)
    res = runtime.device_empty(2, np.float64) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(2), 2, np.float64)
    scale = runtime.codebook_tables()[0]
    stats.launch_sumsq(runtime.view(xb, n, np.uint16), n, samples, scale, res, s)
    ssum, cnt = runtime.to_host(res, None, s)
    return float(np.sqrt(ssum / cnt)) if cnt else 0.0


def sample_codebook(x, samples: int = SAMPLE_SIZE, stream=None, dtype: str | None = "bfloat16") -> Codebook:
    """``Codebook.from_sample`` of a device tensor: the strided sample (at most ``samples``
    values, 8 KiB) is gathered on the device and read back (a synchronisation), so the
    codebook is exactly the one the host codec picks for the same values. FP32 and FP16
    arrays (``dtype`` is ignored for float arrays) get theirs from the same positions."""
    _, _, _, runtime, stats = _kernels()
    xw, _, code = _typed_view(x, None if dtype == "bfloat16" and not _is_int16(x) else dtype)
    if code != fmt.DTYPE_BF16:
        n = _raw(xw)[1] // fmt.ITEMSIZE[code]
        sample = _wide_sample(xw, n, code, samples, stream)
        return Codebook.from_sample(sample, samples, dtype=fmt.DTYPE_FP16 if code == fmt.DTYPE_FP16
                                    else fmt.DTYPE_BF16)
    xb, _ = _bits_view(x, dtype)
    xb, n = _u16(xb)
    s = runtime.stream(stream)
    buf = runtime.device_empty(max(1, samples), np.uint16) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(max(1, samples), np.uint16), max(1, samples), np.uint16)
    count = stats.launch_gather(runtime.view(xb, n, np.uint16), n, samples, buf, s)
    return Codebook.from_sample(runtime.to_host(buf, count, s) if count else np.zeros(0, np.uint16),
                                samples)


def _is_int16(x) -> bool:
    return _dtype_name(x).replace("torch.", "") in ("uint16", "int16")


def histogram_codebook(x, stream=None, dtype: str | None = "bfloat16") -> Codebook:
    """``Codebook.from_histogram`` on the device (reads the 256 counts back: a synchronisation)."""
    _, _, _, runtime, stats = _kernels()
    xb, _ = _bits_view(x, dtype)
    xb, n = _u16(xb)
    s = runtime.stream(stream)
    hist = runtime.device_zeros(256, np.int64) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(256, np.int64), 256, np.int64)
    stats.launch_histogram(runtime.view(xb, (n & ~7) // 2, np.uint32),
                           runtime.view(xb, n, np.uint16), n, hist, s)
    h = runtime.to_host(hist, None, s)
    order = np.lexsort((np.arange(256), -h))
    return Codebook(tuple(int(e) for e in order[:fmt.CODEBOOK_SIZE]))


def _choose_on_device(xb, n: int, ws: Workspace, stream, code: int = fmt.DTYPE_BF16) -> None:
    """Enqueue ``stats.choose_codebook`` through Numba's dispatcher (the simulator's route,
    and the tests'; on a GPU ``compress`` launches ``_choose``'s plan): the default codebook
    of ``xb`` (BF16 values, or FP32 values: their upper halves), into ``ws``."""
    _, _, _, runtime, stats = _kernels()
    fp32 = code == fmt.DTYPE_FP32
    x16 = runtime.view(xb, 2 * n, np.uint16)[1:] if fp32 else runtime.view(xb, n, np.uint16)
    stats.launch_codebook(x16, n, SAMPLE_SIZE, *runtime.codebook_tables(), ws.array, runtime.stream(stream),
                          step=2 if fp32 else 1)


def _choose(x_ptr: int, n: int, ws: Workspace, s: int, step: int = 1) -> None:
    """``stats.choose_codebook`` of the n values at uint16 steps of ``step`` from ``x_ptr``."""
    plan = _choose_plan(x_ptr, n, ws, step)
    plan.retarget(x_ptr)
    plan.launch(s)


def _choose_plan(x_ptr: int, n: int, ws: Workspace, step: int = 1):
    """The cached plan of ``_choose`` (built on first use)."""
    key = (2, n, ws.ptr, step)
    plan = _PLANS.get(key)
    if plan is None:
        stats = _kernels()[4]
        ptrs = tuple((_device_pointer(t), t.size) for t in _codebook_tables())
        plan = stats.CodebookPlan(ws.device, x_ptr, n, SAMPLE_SIZE, ptrs, ws.ptr, ws.count, step)
        plan.keep = ws
        plan = _remember(key, plan)
    return plan
