"""Codebooks: the 7 exponent values that get a 3-bit code.

For x ~ N(0, sigma^2) the probability that a BF16 value has biased exponent e
(a normal number, 2^(e-127) <= |x| < 2^(e-126)) is

    P(e) = 2 * [Phi(2^(e-126) / sigma) - Phi(2^(e-127) / sigma)],

which depends on sigma only through 2^(e-127) / sigma, i.e. through
e - 127 - log2(sigma). Shifting sigma by a factor of two shifts the whole
distribution by one exponent, so the best 7-value window is
floor(log2 sigma) + 127 + offset(frac(log2 sigma)), a closed-form function of
sigma (``window_start``). ``theory/01_sigma_codebook.ipynb`` derives and checks it.

A codebook never affects correctness: exponents outside it are escaped and
stored whole. A poor codebook only costs ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .format import CODEBOOK_SIZE

SAMPLE_SIZE = 4096  # values read by the strided sigma estimate
_LOWEST_START = 0  # exponent 0: zeros and subnormals
_HIGHEST_START = 254 - (CODEBOOK_SIZE - 1)  # keep 255 (inf / NaN) out of a sigma window


def _phi(z: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def exponent_probabilities(sigma: float, exponents) -> np.ndarray:
    """P(biased exponent == e) for x ~ N(0, sigma^2), for each e in ``exponents``.

    Exponent 0 collects zeros and subnormals (|x| < 2^-126); 255 is never hit
    by a finite Gaussian (overflow beyond the BF16 range is neglected).

    >>> p = exponent_probabilities(1.0, [126, 127])  # 0.5 <= |x| < 1 and 1 <= |x| < 2
    >>> [round(float(v), 4) for v in p]
    [0.2998, 0.2718]
    """
    out = np.zeros(len(exponents))
    for i, e in enumerate(exponents):
        e = int(e)
        if e == 0:
            out[i] = 2.0 * _phi(2.0 ** -126 / sigma) - 1.0
        elif 0 < e < 255:
            lo = math.ldexp(1.0, e - 127) / sigma
            hi = math.ldexp(1.0, e - 126) / sigma
            out[i] = math.erfc(lo / math.sqrt(2.0)) - math.erfc(hi / math.sqrt(2.0))
    return out


def window_start(sigma: float) -> int:
    """First exponent of the most probable 7-exponent window for N(0, sigma^2).

    The candidate windows are those around 127 + log2(sigma); the one with the
    largest Gaussian mass wins (ties go to the lower start). A sigma that is zero,
    negative or not finite gives the window at exponent 0, which holds zeros.

    >>> window_start(0.02)
    116
    """
    if not (sigma > 0.0 and math.isfinite(sigma)):
        return _LOWEST_START
    centre = 127 + math.floor(math.log2(sigma))
    best, best_mass = None, -1.0
    for start in range(centre - 9, centre + 4):
        s = min(max(start, _LOWEST_START), _HIGHEST_START)
        mass = float(exponent_probabilities(sigma, range(s, s + CODEBOOK_SIZE)).sum())
        if mass > best_mass:
            best, best_mass = s, mass
    return best


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) to float32 values, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def estimate_sigma(bits: np.ndarray, samples: int = SAMPLE_SIZE) -> float:
    """Root-mean-square of a strided sample of about ``samples`` BF16 values.

    Reads at most ``samples`` values (a fixed stride over the flattened tensor, so
    the estimate is deterministic), ignores inf and NaN, and returns 0.0 when no
    finite value is seen. Zero-mean Gaussian data has RMS == sigma.

    >>> import numpy as np
    >>> bits = (np.full(10, 0.5, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    >>> estimate_sigma(bits)
    0.5
    """
    flat = np.asarray(bits).reshape(-1)
    if flat.size == 0:
        return 0.0
    stride = max(1, flat.size // samples)
    v = bf16_bits_to_float(flat[::stride][:samples]).astype(np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0
    return float(np.sqrt(np.mean(v * v)))


def exponents_of(bits: np.ndarray) -> np.ndarray:
    """The 8-bit biased exponent of each BF16 bit pattern."""
    return ((np.asarray(bits, dtype=np.uint16) >> 7) & 0xFF).astype(np.uint8)


@dataclass(frozen=True)
class Codebook:
    """Seven distinct exponent values; exponent ``exponents[i]`` is coded as i + 1.

    >>> Codebook.from_sigma(0.02).exponents
    (116, 117, 118, 119, 120, 121, 122)
    """

    exponents: tuple[int, ...]
    sigma: float | None = None  # the sigma it was derived from, if any

    def __post_init__(self):
        ex = tuple(int(e) for e in self.exponents)
        if len(ex) != CODEBOOK_SIZE or len(set(ex)) != CODEBOOK_SIZE:
            raise ValueError(f"a codebook needs {CODEBOOK_SIZE} distinct exponents, got {ex}")
        if not all(0 <= e <= 255 for e in ex):
            raise ValueError(f"codebook exponents must be in 0..255, got {ex}")
        object.__setattr__(self, "exponents", ex)

    @classmethod
    def from_sigma(cls, sigma: float) -> "Codebook":
        """The most probable window for N(0, sigma^2), in closed form (no data needed)."""
        s = window_start(float(sigma))
        return cls(tuple(range(s, s + CODEBOOK_SIZE)), sigma=float(sigma))

    @classmethod
    def from_sample(cls, bits: np.ndarray, samples: int = SAMPLE_SIZE) -> "Codebook":
        """``from_sigma`` of the strided-sample sigma estimate: the default codebook."""
        return cls.from_sigma(estimate_sigma(bits, samples))

    @classmethod
    def from_histogram(cls, x, *, dtype: str | None = None) -> "Codebook":
        """The exact 7 most frequent exponents of ``x`` (ties: lower exponent first).

        Exponents that never occur fill the remaining places in ascending order, so a
        tensor with fewer than 7 distinct exponents still gets a valid codebook.
        """
        from .arrays import host_bits

        bits = host_bits(x, dtype=dtype)
        hist = np.bincount(exponents_of(bits.reshape(-1)), minlength=256)
        order = np.lexsort((np.arange(256), -hist))  # count descending, then exponent
        return cls(tuple(int(e) for e in order[:CODEBOOK_SIZE]))

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
        from .arrays import host_bits

        bits = host_bits(x, dtype=dtype).reshape(-1)
        if bits.size == 0:
            return 1.0
        return float(np.count_nonzero(self.lut()[exponents_of(bits)]) / bits.size)
