"""Codebooks: the 7 exponent values that get a 3-bit code.

For x ~ N(0, sigma^2) the probability of each BF16 exponent e depends on sigma only through
e - 127 - log2(sigma), so the best 7-value window is a closed-form function of sigma
(``window_start``; ``theory/01_sigma_codebook.ipynb`` derives and checks it, for values rounded
to BF16 and with a non-zero mean as well). Real tensors are not all zero-mean Gaussians (biases
and norm weights, heavy tails, exact zeros), so the default codebook (``Codebook.from_sample``)
reads one small strided sample, takes the sigma window from its RMS, and falls back to the
sample's own top-7 exponents when those cover clearly more of it (``choose_codebook``;
``theory/02_real_tensors.ipynb`` shows where). It never builds a histogram of the whole tensor.

A codebook never affects correctness: exponents outside it are escaped and stored whole. A
poor codebook only costs ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import format as fmt
from .format import CODEBOOK_SIZE

SAMPLE_SIZE = 4096  # values read by the strided sigma estimate
# The sample's top-7 replaces the sigma window only when it covers at least this
# fraction more of the sample: ~3 standard deviations of the sampling noise of a
# one-exponent difference at SAMPLE_SIZE, so Gaussian data keeps its sigma window.
FALLBACK_MARGIN = 0.005
_LOWEST_START = 0  # exponent 0: zeros and subnormals
_HIGHEST_START = 254 - (CODEBOOK_SIZE - 1)  # keep 255 (inf / NaN) out of a sigma window


@dataclass(frozen=True)
class FloatSpec:
    """What the sigma window needs to know about an element type: exponent bias, the
    all-ones exponent (inf / NaN) and the mantissa width (for rounding)."""

    bias: int
    emax: int
    mantissa_bits: int

    @property
    def highest_start(self) -> int:
        return self.emax - 1 - (CODEBOOK_SIZE - 1)


# FP32 shares BF16's exponent: its values round to FP32, half an FP32 step below 2^k.
SPECS = {fmt.DTYPE_BF16: FloatSpec(127, 255, 7), fmt.DTYPE_FP32: FloatSpec(127, 255, 23),
         fmt.DTYPE_FP16: FloatSpec(15, 31, 10)}
BF16_SPEC = SPECS[fmt.DTYPE_BF16]


def _phi(z: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _lower_bound(e: int, rounded: bool, spec: FloatSpec = BF16_SPEC) -> float:
    """Smallest |x| whose BF16 value has biased exponent ``e`` (1 <= e <= 255).

    Unrounded: 2^(e-127). Rounded to nearest BF16: the midpoint between 2^(e-127)
    and the BF16 value just below it (ties round up to the even 2^(e-127)), i.e.
    2^(e-127) * (1 - 2^-9), or (1 - 2^-8) for e = 1, whose neighbour below is the
    largest subnormal. e = 255 starts where values overflow to inf. Other element
    types (``spec``): bias b and m mantissa bits give 2^(e-b) * (1 - 2^-(m+2)).
    """
    if not rounded:
        return math.ldexp(1.0, e - spec.bias)
    m = spec.mantissa_bits
    return math.ldexp(1.0 - (2.0 ** -(m + 1) if e == 1 else 2.0 ** -(m + 2)), e - spec.bias)


@lru_cache(maxsize=8)
def _bounds(rounded: bool, spec: FloatSpec) -> tuple[float, ...]:
    """Where each exponent's interval starts, for e = 0 .. emax + 1: 0.0, ``_lower_bound(e)``
    for 1 <= e <= emax, and inf above (exponent emax holds the overflow to inf)."""
    return (0.0, *(_lower_bound(e, rounded, spec) for e in range(1, spec.emax + 1)), math.inf)


def exponent_probabilities(sigma: float, exponents, mean: float = 0.0, *,
                           rounded: bool = True, spec: FloatSpec = BF16_SPEC) -> np.ndarray:
    """P(biased exponent == e) for x ~ N(mean, sigma^2) stored as BF16, for each e in ``exponents``.

    With ``rounded=False`` this is the textbook form P(2^(e-127) <= |x| < 2^(e-126)),
    whose zero-mean value is 2 * [Phi(2^(e-126) / sigma) - Phi(2^(e-127) / sigma)].
    By default it describes values rounded to BF16 (round to nearest even), as every
    tensor zipccl sees is: the interval of exponent e then starts half a BF16 step
    below 2^(e-127) (``_lower_bound``). Both depend on sigma only through
    2^(e-127) / sigma. Exponent 0 collects zeros and subnormals, 255 overflow
    (never hit in practice). A non-zero ``mean`` (norm weights near 1.0, biases)
    adds the mirrored negative interval separately.

    >>> p = exponent_probabilities(1.0, [126, 127], rounded=False)  # 0.5 <= |x| < 1, 1 <= |x| < 2
    >>> [round(float(v), 4) for v in p]
    [0.2998, 0.2718]
    >>> round(float(exponent_probabilities(0.01, [126], mean=1.0, rounded=False)[0]), 4)
    0.5
    """
    out = np.zeros(len(exponents))
    if not (sigma > 0.0 and math.isfinite(sigma)):
        return out
    bounds = _bounds(rounded, spec)
    for i, e in enumerate(exponents):
        e = int(e)
        if e < 0 or e > spec.emax:
            continue
        lo, hi = bounds[e], bounds[e + 1]
        if mean == 0.0:
            # 2 * [Phi(hi/s) - Phi(lo/s)], written with erfc to keep far tails accurate
            out[i] = math.erfc(lo / sigma / math.sqrt(2.0)) - math.erfc(hi / sigma / math.sqrt(2.0))
        else:
            out[i] = (_phi((hi - mean) / sigma) - _phi((lo - mean) / sigma)
                      + _phi((-lo - mean) / sigma) - _phi((-hi - mean) / sigma))
    return out


def gaussian_coverage(sigma: float, start: int | None = None, mean: float = 0.0) -> float:
    """Predicted coverage of the window starting at ``start`` (default: ``window_start(sigma)``).

    The fraction of N(mean, sigma^2) values whose exponent lies in
    ``start .. start + 6``. Over all sigma its zero-mean optimum stays between
    about 97.0% and 97.9% (theory notebook 01).

    >>> round(gaussian_coverage(0.02), 4)
    0.9787
    """
    s = window_start(sigma) if start is None else int(start)
    return float(exponent_probabilities(sigma, range(s, s + CODEBOOK_SIZE), mean).sum())


def window_start(sigma: float, spec: FloatSpec = BF16_SPEC) -> int:
    """First exponent of the most probable 7-exponent window for N(0, sigma^2).

    The candidate windows are those around 127 + log2(sigma) (the bias of ``spec``'s
    type in general); the one with the largest Gaussian mass wins (ties go to the
    lower start). A sigma that is zero, negative or not finite gives the window at
    exponent 0, which holds zeros. The window never reaches the all-ones exponent.

    >>> window_start(0.02), window_start(0.02, SPECS[fmt.DTYPE_FP16])
    (116, 4)
    """
    if not (sigma > 0.0 and math.isfinite(sigma)):
        return _LOWEST_START
    centre = spec.bias + math.floor(math.log2(sigma))
    best, best_mass = None, -1.0
    for start in range(centre - 9, centre + 4):
        s = min(max(start, _LOWEST_START), spec.highest_start)
        mass = float(exponent_probabilities(sigma, range(s, s + CODEBOOK_SIZE), spec=spec).sum())
        if mass > best_mass:
            best, best_mass = s, mass
    return best


# window_start is scale-invariant where no clamp or special exponent is near: sigma * 2^k
# moves the window by k exactly (every quantity it compares scales by a power of two).
# Binades of sigma inside _SCALE_FREE share the breakpoints of binade 0; the others are
# bisected one by one. RMS values of BF16 data lie in [2^-140, 2^128).
_SIGMA_BINADES = (-141, 129)
_SCALE_FREE = (-100, 100)


def _breakpoints(lo: float, hi: float) -> list[tuple[float, int]]:
    """(first sigma, start) of each window start taken on [lo, hi), window_start non-decreasing."""
    out = [(lo, window_start(lo))]
    last = window_start(math.nextafter(hi, 0.0))
    while out[-1][1] != last:
        # smallest sigma in (out[-1][0], hi) whose start exceeds the current one: bisect bits
        a = int(np.float64(out[-1][0]).view(np.int64))
        b = int(np.float64(math.nextafter(hi, 0.0)).view(np.int64))
        cur = out[-1][1]
        while b - a > 1:
            mid = (a + b) // 2
            if window_start(float(np.int64(mid).view(np.float64))) > cur:
                b = mid
            else:
                a = mid
        x = float(np.int64(b).view(np.float64))
        out.append((x, window_start(x)))
    return out


@lru_cache(maxsize=1)
def window_table() -> tuple[np.ndarray, np.ndarray]:
    """``window_start`` as a step table: (sigma thresholds, starts), float64 and int64.

    ``window_start(s) == starts[i]`` for the last i with ``thresholds[i] <= s``, for
    every finite s > 0 below 2^129 (``window_start_tabulated``; tests check it at
    every breakpoint and at random sigma). The GPU codebook kernel looks sigma up in
    this table instead of evaluating the normal CDF, so host and device agree exactly.
    """
    k0, k1 = _SIGMA_BINADES
    unit = _breakpoints(1.0, 2.0)
    steps: list[tuple[float, int]] = [(0.0, window_start(math.ldexp(1.0, k0)))]
    for k in range(k0, k1):
        if _SCALE_FREE[0] <= k < _SCALE_FREE[1]:
            steps += [(math.ldexp(x, k), st + k) for x, st in unit]
        else:
            steps += _breakpoints(math.ldexp(1.0, k), math.ldexp(1.0, k + 1))
    thr, starts = [], []
    for x, st in steps:  # keep only changes
        if not starts or st != starts[-1]:
            thr.append(x)
            starts.append(st)
    return np.array(thr, dtype=np.float64), np.array(starts, dtype=np.int64)


def window_start_tabulated(sigma: float) -> int:
    """``window_start`` read from ``window_table`` (what the GPU does).

    >>> window_start_tabulated(0.02) == window_start(0.02)
    True
    """
    if not (sigma > 0.0 and math.isfinite(sigma)):
        return _LOWEST_START
    thr, starts = window_table()
    return int(starts[int(np.searchsorted(thr, sigma, side="right")) - 1])


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) to float32 values, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def sample_bits(bits: np.ndarray, dtype=fmt.DTYPE_BF16) -> np.ndarray:
    """The 16-bit patterns the codebook is chosen from: BF16 and FP16 bits as they are,
    and for FP32 the upper halves, which are BF16 values with the same sign and exponent
    (the chooser sees each FP32 value truncated to BF16; the code depends on the
    exponent only).

    >>> sample_bits(np.array([1.5], np.float32).view(np.uint32), "float32")
    array([16320], dtype=uint16)
    """
    code = fmt.dtype_code(dtype)
    b = np.asarray(bits)
    if code == fmt.DTYPE_FP32:
        return (b.astype(np.uint32) >> 16).astype(np.uint16)
    return b.astype(np.uint16, copy=False)


def sample_stride(n: int, samples: int = SAMPLE_SIZE) -> int:
    """The stride of the strided sample: the largest s <= n // samples with gcd(s, n) == 1.

    A stride that shares a factor with the row length of a matrix samples only a
    few of its columns: stride 256 over 256-wide rows reads column 0 only (the
    diagonal of a causal attention matrix, never its masked zeros), stride 43 over
    688-wide rows (16 x 43, like Llama's 11008 = 256 x 43) reads 16 columns. Every
    row length L of any C-contiguous view of the tensor divides n, so a stride prime
    to n is prime to L, and the sample visits min(L, samples) distinct columns.

    >>> sample_stride(1 << 20), sample_stride(256 * 688), sample_stride(4096), sample_stride(100)
    (255, 41, 1, 1)
    """
    s = max(1, n // max(1, samples))
    while s > 1 and math.gcd(s, n) != 1:
        s -= 1
    return s


def strided_sample(bits: np.ndarray, samples: int = SAMPLE_SIZE) -> np.ndarray:
    """At most ``samples`` BF16 bit patterns at a fixed stride over the flattened tensor.

    Deterministic (no randomness), so every implementation picks the same sample:
    elements 0, s, 2s, ... with s = ``sample_stride(n, samples)``, the first
    ``samples`` of them.

    >>> import numpy as np
    >>> strided_sample(np.arange(20, dtype=np.uint16), 4)  # stride 3: 5 and 4 share factors with 20
    array([0, 3, 6, 9], dtype=uint16)
    """
    flat = np.asarray(bits).reshape(-1)
    if flat.size == 0:
        return flat.astype(np.uint16)
    return flat[::sample_stride(flat.size, samples)][:samples].astype(np.uint16, copy=False)


RMS_LANES = 256  # the summation order of the RMS: 256 strided partial sums, then a halving tree


def _rms(sample: np.ndarray, dtype: int = fmt.DTYPE_BF16) -> float:
    """RMS of the finite values of a BF16 sample, summed in one fixed order.

    Each square is exact in float64 (a BF16 value has 8 significant bits); the
    order of the additions is fixed so that the GPU (``kernels/stats.py``, one
    block of ``RMS_LANES`` threads) gets the same float64 sum bit for bit, hence
    the same sigma and the same codebook: partial sum j adds the squares of
    values j, j + 256, j + 512, ... in turn, then partials h..2h-1 are added
    to 0..h-1 for h = 128, 64, ..., 1. Non-finite values add 0.0 and are not counted.
    An FP16 sample (``dtype``) is read as FP16 values (11 significant bits: squares
    exact too); FP32 samples arrive as their BF16 upper halves (``sample_bits``).
    """
    bits = np.asarray(sample, dtype=np.uint16)
    # Finite means an exponent below all ones; decided on the bits, and the non-finite
    # patterns become +0 before the cast, because casting a signalling NaN to
    # float64 raises "invalid value" (a warning about data the codec keeps exactly).
    fp16 = dtype == fmt.DTYPE_FP16
    mask = 0x7C00 if fp16 else 0x7F80
    finite = (bits & mask) != mask
    count = int(np.count_nonzero(finite))
    if count == 0:
        return 0.0
    clean = np.where(finite, bits, 0).astype(np.uint16)
    v = (clean.view(np.float16) if fp16 else bf16_bits_to_float(clean)).astype(np.float64)
    sq = v * v
    rows = np.zeros(-(-sq.size // RMS_LANES) * RMS_LANES)
    rows[:sq.size] = sq
    acc = np.zeros(RMS_LANES)
    for row in rows.reshape(-1, RMS_LANES):  # sequential per lane, as each GPU thread adds
        acc = acc + row
    h = RMS_LANES // 2
    while h:
        acc[:h] = acc[:h] + acc[h:2 * h]
        h //= 2
    return float(np.sqrt(acc[0] / count))


def estimate_sigma(bits: np.ndarray, samples: int = SAMPLE_SIZE, dtype=fmt.DTYPE_BF16) -> float:
    """Root-mean-square of a strided sample of about ``samples`` BF16 values.

    Reads at most ``samples`` values (``strided_sample``, so the estimate is
    deterministic), ignores inf and NaN, and returns 0.0 when no finite value is
    seen. Zero-mean Gaussian data has RMS == sigma. The RMS, not the standard
    deviation, is what places the window: the exponent depends on |x|, so a
    tensor of mean 1.0 needs the window of 1.0, not that of its spread.

    >>> import numpy as np
    >>> bits = (np.full(10, 0.5, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    >>> estimate_sigma(bits)
    0.5
    """
    code = fmt.dtype_code(dtype)
    return _rms(sample_bits(strided_sample_any(bits, samples), code),
                fmt.DTYPE_FP16 if code == fmt.DTYPE_FP16 else fmt.DTYPE_BF16)


def strided_sample_any(bits: np.ndarray, samples: int = SAMPLE_SIZE) -> np.ndarray:
    """``strided_sample`` keeping the item type (uint32 FP32 patterns stay uint32)."""
    flat = np.asarray(bits).reshape(-1)
    if flat.size == 0:
        return flat
    return flat[::sample_stride(flat.size, samples)][:samples]


def exponents_of(bits: np.ndarray, dtype=fmt.DTYPE_BF16) -> np.ndarray:
    """The biased exponent of each bit pattern: 8 bits for BF16 (uint16 patterns) and FP32
    (uint32 patterns), 5 bits for FP16 (uint16 patterns)."""
    code = fmt.dtype_code(dtype)
    b = np.asarray(bits)
    if code == fmt.DTYPE_FP32:
        return ((b.astype(np.uint32) >> 23) & 0xFF).astype(np.uint8)
    if code == fmt.DTYPE_FP16:
        return ((b.astype(np.uint16) >> 10) & 0x1F).astype(np.uint8)
    return ((b.astype(np.uint16) >> 7) & 0xFF).astype(np.uint8)


def exponent_histogram(bits: np.ndarray, dtype=fmt.DTYPE_BF16) -> np.ndarray:
    """Counts of each of the 256 exponent values (int64, length 256; FP16 uses 0..31)."""
    return np.bincount(exponents_of(np.asarray(bits).reshape(-1), dtype),
                       minlength=256).astype(np.int64)


def top_exponents(hist: np.ndarray, k: int = CODEBOOK_SIZE) -> tuple[int, ...]:
    """The ``k`` most frequent exponents of a 256-bin histogram (ties: lower exponent first).

    Exponents that never occur fill the remaining places in ascending order.

    >>> h = np.zeros(256, np.int64); h[[3, 9]] = [5, 7]
    >>> top_exponents(h)
    (9, 3, 0, 1, 2, 4, 5)
    """
    order = np.lexsort((np.arange(256), -np.asarray(hist)))  # count descending, then exponent
    return tuple(int(e) for e in order[:k])


def exponent_entropy(hist: np.ndarray) -> float:
    """Shannon entropy (bits) of the exponent distribution given by a histogram.

    8 + exponent_entropy is the entropy limit in bits per BF16 value of any coder
    that stores the sign-mantissa byte raw and codes exponents independently.

    >>> exponent_entropy(np.array([1, 1, 2]))
    1.5
    """
    h = np.asarray(hist, dtype=np.float64)
    total = h.sum()
    if total == 0:
        return 0.0
    p = h[h > 0] / total
    return float(-(p * np.log2(p)).sum() + 0.0)


@dataclass(frozen=True)
class Codebook:
    """Seven distinct exponent values; exponent ``exponents[i]`` is coded as i + 1.

    >>> Codebook.from_sigma(0.02).exponents
    (116, 117, 118, 119, 120, 121, 122)
    >>> Codebook.from_sigma(0.02, dtype="float16").exponents
    (4, 5, 6, 7, 8, 9, 10)
    """

    exponents: tuple[int, ...]
    sigma: float | None = None  # the sigma it was derived from, if any

    def __post_init__(self):
        if not hasattr(self.exponents, "__iter__"):
            raise TypeError(f"a codebook takes a sequence of {CODEBOOK_SIZE} integer exponents, "
                            f"got {type(self.exponents).__name__} {self.exponents!r}")
        given = tuple(self.exponents)
        bad = [e for e in given if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer))]
        if bad:  # refused, never truncated (116.7 is no exponent) or parsed
            raise TypeError(f"codebook exponents must be integers (Python int or NumPy integer); "
                            f"got {type(bad[0]).__name__} {bad[0]!r} in {given!r}")
        ex = tuple(int(e) for e in given)
        if len(ex) != CODEBOOK_SIZE or len(set(ex)) != CODEBOOK_SIZE:
            raise ValueError(f"a codebook needs {CODEBOOK_SIZE} distinct exponents, got {ex}")
        if not all(0 <= e <= 255 for e in ex):
            raise ValueError(f"codebook exponents must be in 0..255, got {ex}")
        object.__setattr__(self, "exponents", ex)

    @classmethod
    def from_sigma(cls, sigma: float, dtype="bfloat16") -> Codebook:
        """The most probable window for N(0, sigma^2), in closed form (no data needed).

        ``dtype``: the element type whose exponents the window counts (BF16 and FP32
        share one exponent, FP16 has 5 bits and bias 15). ``sigma`` must be positive and
        finite (ValueError otherwise: no Gaussian has that sigma); for data without a
        nonzero finite value use ``from_sample``, which then takes the window of zeros.

        >>> Codebook.from_sigma(-1.0)
        Traceback (most recent call last):
        ...
        ValueError: sigma must be a positive, finite number; got -1.0
        """
        value = float(sigma)
        if not (value > 0.0 and math.isfinite(value)):
            raise ValueError(f"sigma must be a positive, finite number; got {sigma!r}")
        return _sigma_window(value, fmt.dtype_code(dtype))

    @classmethod
    def from_sample(cls, bits: np.ndarray, samples: int = SAMPLE_SIZE, *,
                    fallback: bool = True, dtype="bfloat16") -> Codebook:
        """The default codebook, from one strided sample of at most ``samples`` values.

        ``from_sigma`` of the sample's RMS; with ``fallback`` (the default) the
        sample's top-7 exponents replace that window when they cover clearly more
        of the sample (``choose_codebook``). Reads only the sample. ``bits``: uint16
        patterns of BF16 or FP16 (``dtype``), or uint32 patterns of FP32.
        """
        if not fallback:
            code = fmt.dtype_code(dtype)  # FP32 is chosen as the BF16 data of its upper halves
            return _sigma_window(estimate_sigma(bits, samples, code),
                                 fmt.DTYPE_BF16 if code == fmt.DTYPE_FP32 else code)
        return choose_codebook(bits, samples, dtype=dtype).codebook

    @classmethod
    def from_histogram(cls, x, *, dtype: str | None = None) -> Codebook:
        """The exact 7 most frequent exponents of ``x`` (ties: lower exponent first).

        Exponents that never occur fill the remaining places in ascending order, so a
        tensor with fewer than 7 distinct exponents still gets a valid codebook.
        """
        from .arrays import host_values

        bits, code = host_values(x, dtype=dtype)
        return cls(top_exponents(exponent_histogram(bits, code)))

    def lut(self) -> np.ndarray:
        """256-entry uint8 table: exponent -> code (0 = escape)."""
        table = np.zeros(256, dtype=np.uint8)
        for i, e in enumerate(self.exponents):
            table[e] = i + 1
        return table

    def as_array(self) -> np.ndarray:
        """The 7 exponents as uint8, in code order."""
        return np.array(self.exponents, dtype=np.uint8)

    def coverage(self, x, *, dtype: str | None = None) -> float:
        """Fraction of the values of ``x`` whose exponent is in this codebook."""
        from .arrays import host_values

        bits, code = host_values(x, dtype=dtype)
        bits = bits.reshape(-1)
        if bits.size == 0:
            return 1.0
        return float(np.count_nonzero(self.lut()[exponents_of(bits, code)]) / bits.size)


@dataclass(frozen=True)
class CodebookChoice:
    """How the default codebook was chosen for one tensor (see ``choose_codebook``)."""

    codebook: Codebook
    sigma: float  # RMS of the sample
    sigma_window: tuple[int, ...]  # from_sigma(sigma).exponents
    sample_size: int
    sigma_sample_coverage: float  # of the sigma window, on the sample
    top_sample_coverage: float  # of the sample's top-7, on the sample
    fallback: bool  # True when the sample's top-7 replaced the sigma window


def _sigma_window(sigma: float, code: int) -> Codebook:
    """The sigma window of an RMS estimated from data (``Codebook.from_sigma``), where 0.0
    -- no nonzero finite value seen -- gives the window at exponent 0, which holds zeros
    (what the device chooser takes too)."""
    s = window_start(sigma, SPECS[code])
    return Codebook(tuple(range(s, s + CODEBOOK_SIZE)), sigma=sigma)


def choose_codebook(bits: np.ndarray, samples: int = SAMPLE_SIZE,
                    margin: float = FALLBACK_MARGIN, *, dtype="bfloat16") -> CodebookChoice:
    """The default codebook and why: sigma window, or the sample's top-7 as a fallback.

    One strided sample of at most ``samples`` values is read. Its RMS places the
    sigma window (``Codebook.from_sigma``); its exponent histogram (256 bins, on
    the sample only) checks that window. When the sample's own top-7 covers more
    than ``margin`` more of the sample, the tensor is not the Gaussian the closed
    form assumes (exact zeros, heavy tails, skewed or shifted values), and the
    top-7 is used instead. For Gaussian data the two agree within sampling noise
    and the sigma window is kept.

    >>> import numpy as np
    >>> bits = (np.random.default_rng(0).normal(0, 0.02, 4096).astype(np.float32)
    ...         .view(np.uint32) >> 16).astype(np.uint16)
    >>> bits[1::2] = 0  # half exact zeros: the sigma window misses them
    >>> c = choose_codebook(bits)
    >>> c.fallback, 0 in c.codebook.exponents, 0 in c.sigma_window
    (True, True, False)

    FP32 (uint32 patterns) is sampled at the same positions and chosen from its BF16
    upper halves (``sample_bits``); FP16 from its own values and 5-bit exponents.
    """
    code = fmt.dtype_code(dtype)
    sample = sample_bits(strided_sample_any(bits, samples), code)
    if code == fmt.DTYPE_FP32:  # from here on the sample is BF16 data (the upper halves)
        code = fmt.DTYPE_BF16
    sigma = _rms(sample, code)
    by_sigma = _sigma_window(sigma, code)
    if sample.size == 0:
        return CodebookChoice(by_sigma, sigma, by_sigma.exponents, 0, 1.0, 1.0, False)
    hist = exponent_histogram(sample, fmt.DTYPE_FP16 if code == fmt.DTYPE_FP16 else fmt.DTYPE_BF16)
    top = top_exponents(hist)
    n_sigma, n_top = int(hist[list(by_sigma.exponents)].sum()), int(hist[list(top)].sum())
    cov_sigma, cov_top = n_sigma / sample.size, n_top / sample.size
    fallback = n_top - n_sigma > margin * sample.size  # integer counts: same on every device
    chosen = Codebook(top) if fallback else by_sigma
    return CodebookChoice(chosen, sigma, by_sigma.exponents, int(sample.size), cov_sigma, cov_top,
                          fallback)
