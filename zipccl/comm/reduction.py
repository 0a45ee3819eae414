"""The reduction zipccl computes, defined once: NumPy for host arrays, CUDA C for the device.

The sum of p ranks' values is an FP32 accumulation in rank order ``((x_0 + x_1) + x_2) + ...``,
each addition rounded to nearest even in FP32, then for BF16 and FP16 one round-to-nearest-even
to the type (ml_dtypes' float32 -> bfloat16, NumPy's float32 -> float16), every NaN written as
the type's canonical quiet NaN (0x7FC0, 0x7FC00000, 0x7E00). Both reductions of
``reduce_scatter`` (compressed, and native where the transport has no such sum: MPI) run it,
so compressed and native agree bit for bit there; docs/COLLECTIVES.md says why.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from .base import value_code

CANONICAL_NAN = 0x7FC0  # BF16's; FP32's and FP16's are CANONICAL_NAN_FP32 / _FP16
CANONICAL_NAN_FP32 = 0x7FC00000
CANONICAL_NAN_FP16 = 0x7E00
REDUCE_CHUNK = 1 << 20  # elements per pass of the host reduction (bounds temporaries)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns to float32 values, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to BF16 bit patterns: nearest-even as ml_dtypes does, NaN -> 0x7FC0.

    >>> f32_to_bf16_bits(np.array([1.0, 1.00390625, 1.01171875, np.inf], np.float32))
    array([16256, 16256, 16258, 32640], dtype=uint16)
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    rounded[np.isnan(x)] = CANONICAL_NAN
    return rounded


def reduce_sum_bf16(stack: np.ndarray, out: np.ndarray) -> None:
    """out = BF16(sum over rows of ``stack`` in FP32, row 0 first); rows are ranks.

    ``stack`` is (p, m) uint16 bit patterns, ``out`` (m,) uint16. The sum starts
    from row 0 itself (not from +0, which would turn -0 into +0).
    """
    p, m = stack.shape
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN results are part of the definition
        for s in range(0, m, REDUCE_CHUNK):
            e = min(m, s + REDUCE_CHUNK)
            acc = bf16_bits_to_f32(stack[0, s:e])
            for r in range(1, p):
                acc += bf16_bits_to_f32(stack[r, s:e])
            out[s:e] = f32_to_bf16_bits(acc)


def reduce_sum_fp32(stack: np.ndarray, out: np.ndarray) -> None:
    """out = sum over rows of ``stack`` in FP32, row 0 first, each addition rounded; rows are
    ranks. ``stack`` is (p, m) float32, ``out`` (m,) float32; NaN -> 0x7FC00000.

    >>> out = np.empty(2, np.float32)
    >>> reduce_sum_fp32(np.array([[1.0, np.inf], [2.0 ** -24, -np.inf]], np.float32), out)
    >>> out.tolist(), hex(int(out.view(np.uint32)[1]))
    ([1.0, nan], '0x7fc00000')
    """
    p, m = stack.shape
    bits = out.view(np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, m, REDUCE_CHUNK):
            e = min(m, s + REDUCE_CHUNK)
            acc = stack[0, s:e].astype(np.float32)  # a copy: row 0 itself, so -0 stays -0
            for r in range(1, p):
                acc += stack[r, s:e]
            out[s:e] = acc
            bits[s:e][np.isnan(acc)] = CANONICAL_NAN_FP32


def reduce_sum_fp16(stack: np.ndarray, out: np.ndarray) -> None:
    """out = FP16(sum over rows of ``stack`` in FP32, row 0 first), one rounding; rows are
    ranks. ``stack`` is (p, m) float16, ``out`` (m,) float16; NaN -> 0x7E00.

    >>> out = np.empty(1, np.float16)
    >>> reduce_sum_fp16(np.array([[2048.0], [1.0], [1.0]], np.float16), out)  # FP16 alone: 2048
    >>> out.tolist()
    [2050.0]
    """
    p, m = stack.shape
    bits = out.view(np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, m, REDUCE_CHUNK):
            e = min(m, s + REDUCE_CHUNK)
            acc = stack[0, s:e].astype(np.float32)
            for r in range(1, p):
                acc += stack[r, s:e].astype(np.float32)
            out[s:e] = acc.astype(np.float16)
            bits[s:e][np.isnan(acc)] = CANONICAL_NAN_FP16


_REDUCE_SUM = {fmt.DTYPE_BF16: reduce_sum_bf16, fmt.DTYPE_FP32: reduce_sum_fp32,
               fmt.DTYPE_FP16: reduce_sum_fp16}


def divide(out: np.ndarray, p: int) -> None:
    """In place: ``out`` = type(FP32(``out``) / ``p``), one IEEE division and one
    round-to-nearest-even to the type, NaN -> the type's canonical NaN: AVG after the stated
    sum, for BF16 bits (uint16), float32 and float16.

    >>> x = f32_to_bf16_bits(np.array([3.0, -1.0, np.nan], np.float32)); divide(x, 2)
    >>> bf16_bits_to_f32(x).tolist()[:2], hex(int(x[2]))
    ([1.5, -0.5], '0x7fc0')
    """
    code = value_code(out)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if code == fmt.DTYPE_BF16:
            out[...] = f32_to_bf16_bits(bf16_bits_to_f32(out) / np.float32(p))
        elif code == fmt.DTYPE_FP32:
            f = out / np.float32(p)
            f.view(np.uint32)[np.isnan(f)] = CANONICAL_NAN_FP32
            out[...] = f
        else:
            f = out.astype(np.float32) / np.float32(p)
            h = f.astype(np.float16)
            h.view(np.uint16)[np.isnan(f)] = CANONICAL_NAN_FP16
            out[...] = h


def reduce_sum(stack: np.ndarray, out: np.ndarray) -> None:
    """The stated sum (module docstring) of the rows of ``stack`` (p, m) into ``out`` (m,), for
    the element type of ``out`` (``value_code``): ``reduce_sum_bf16`` / ``_fp32`` / ``_fp16``."""
    _REDUCE_SUM[value_code(out)](stack, out)


# One FP32 accumulation per element in rank order, one rounding to the type: the definition of
# reduce_sum_bf16 / _fp32 / _fp16, on the device. Keyed by element type: (parameters, results,
# body, kernel name); every kernel gets DEVICE_PREAMBLE. The additions are zipccl_add, an explicit
# PTX add.rn.f32: CuPy compiles every kernel with -ftz=true, under which __fadd_rn (and +) flush
# subnormal inputs and results to zero; the stated sum keeps them, as NumPy does.
# tests/test_gpu_reduce.py compares these sums with NumPy's bit for bit on a GPU (rows where
# every fifth value is an arbitrary bit pattern, subnormals included).
DEVICE_SUM = {
    fmt.DTYPE_BF16: ("raw uint16 stack, int64 p, int64 m", "uint16 out", r"""
float acc = __uint_as_float(((unsigned int)stack[i]) << 16);
for (long long r = 1; r < p; ++r) {
    acc = zipccl_add(acc, __uint_as_float(((unsigned int)stack[r * m + i]) << 16));
}
unsigned int u = __float_as_uint(acc);
out = isnan(acc) ? (unsigned short)0x7FC0
                 : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
""", "zipccl_reduce_sum_bf16"),
    fmt.DTYPE_FP32: ("raw float32 stack, int64 p, int64 m", "float32 out", r"""
float acc = stack[i];
for (long long r = 1; r < p; ++r) {
    acc = zipccl_add(acc, stack[r * m + i]);
}
out = isnan(acc) ? __uint_as_float(0x7FC00000u) : acc;
""", "zipccl_reduce_sum_fp32"),
    # FP16 as uint16 bit patterns (the views below), converted exactly in integer arithmetic
    # (the kernel source cannot count on cuda_fp16.h): DEVICE_PREAMBLE
    fmt.DTYPE_FP16: ("raw uint16 stack, int64 p, int64 m", "uint16 out", r"""
float acc = zipccl_h2f(stack[i]);
for (long long r = 1; r < p; ++r) {
    acc = zipccl_add(acc, zipccl_h2f(stack[r * m + i]));
}
out = isnan(acc) ? (unsigned short)0x7E00 : zipccl_f2h(acc);
""", "zipccl_reduce_sum_fp16"),
}


# zipccl_add: IEEE addition with subnormals (see DEVICE_SUM). FP16 <-> FP32: exact widening;
# narrowing rounded to nearest even (NumPy's float32 -> float16); their multiplications never
# meet an FP32 subnormal that matters (h2f's results are normal FP32; in f2h an FP32 subnormal
# input flushed to 0 still rounds to the FP16 zero it would round to).
DEVICE_PREAMBLE = r"""
__device__ __forceinline__ float zipccl_add(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float zipccl_div(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ float zipccl_h2f(unsigned short h) {
    unsigned int s = ((unsigned int)h & 0x8000u) << 16, e = ((unsigned int)h >> 10) & 0x1Fu;
    unsigned int f = (unsigned int)h & 0x3FFu;
    if (e == 0) {
        float v = (float)f * 5.9604644775390625e-08f;  /* subnormal: f * 2^-24, exact */
        return s ? -v : v;
    }
    if (e == 31) return __uint_as_float(s | 0x7F800000u | (f << 13));
    return __uint_as_float(s | ((e + 112u) << 23) | (f << 13));
}
__device__ unsigned short zipccl_f2h(float x) {
    unsigned int u = __float_as_uint(x), s = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (unsigned short)(s | 0x7E00u);   /* NaN */
    if (a >= 0x477FF000u) return (unsigned short)(s | 0x7C00u);  /* rounds to inf */
    if (a >= 0x38800000u)                                        /* normal: round at bit 13 */
        return (unsigned short)(s | ((a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13));
    /* subnormal or zero: |x| * 2^24 (exact) rounded to the nearest even integer */
    return (unsigned short)(s | (unsigned int)__float2int_rn(__uint_as_float(a) * 16777216.0f));
}
"""


# AVG's division after the stated sum (``divide``), in place on the device: div.rn.f32 (IEEE,
# subnormals kept, as in DEVICE_SUM), one rounding to the type, NaN -> canonical. Keyed by type:
# (parameters, results, body, kernel name); every kernel gets DEVICE_PREAMBLE.
DEVICE_DIVIDE = {
    fmt.DTYPE_BF16: ("uint16 x, float32 p", "uint16 y", r"""
float f = zipccl_div(__uint_as_float(((unsigned int)x) << 16), p);
unsigned int u = __float_as_uint(f);
y = isnan(f) ? (unsigned short)0x7FC0 : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
""", "zipccl_divide_bf16"),
    fmt.DTYPE_FP32: ("float32 x, float32 p", "float32 y", r"""
float f = zipccl_div(x, p);
y = isnan(f) ? __uint_as_float(0x7FC00000u) : f;
""", "zipccl_divide_fp32"),
    fmt.DTYPE_FP16: ("uint16 x, float32 p", "uint16 y", r"""
float f = zipccl_div(zipccl_h2f(x), p);
y = isnan(f) ? (unsigned short)0x7E00 : zipccl_f2h(f);
""", "zipccl_divide_fp16"),
}
