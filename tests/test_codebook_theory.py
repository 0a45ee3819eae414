"""The sigma -> codebook theory: closed form, scale invariance, coverage bound, Monte Carlo, fallback."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import zipccl
from zipccl.codebook import (
    Codebook,
    choose_codebook,
    estimate_sigma,
    exponent_entropy,
    exponent_histogram,
    exponent_probabilities,
    gaussian_coverage,
    sample_stride,
    strided_sample,
    top_exponents,
    window_start,
)
from zipccl.metrics import frame_ratio, tensor_stats

ALL = range(256)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


@pytest.mark.parametrize("sigma", [1e-30, 1e-6, 0.02, 0.7, 1.0, 3.3, 1e4])
@pytest.mark.parametrize("mean", [0.0, 0.5, -1.0])
def test_probabilities_sum_to_one(sigma, mean):
    assert exponent_probabilities(sigma, ALL, mean).sum() == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("sigma", [3e-5, 0.013, 0.02, 0.37, 1.9])
def test_doubling_sigma_shifts_every_exponent_by_one(sigma):
    """P depends on sigma only through frac(log2 sigma): sigma -> 2 sigma is e -> e + 1."""
    e = np.arange(60, 180)
    p1 = exponent_probabilities(sigma, e)
    p2 = exponent_probabilities(2 * sigma, e + 1)
    assert np.allclose(p1, p2, rtol=1e-9, atol=1e-15)
    assert window_start(2 * sigma) == window_start(sigma) + 1
    assert gaussian_coverage(2 * sigma) == pytest.approx(gaussian_coverage(sigma), rel=1e-12)


def test_window_is_the_best_contiguous_window_and_best_of_all():
    for sigma in 2.0 ** np.linspace(-10, 1, 37):
        p = exponent_probabilities(sigma, ALL)
        best_any = np.sort(p)[-7:].sum()  # the unconstrained top-7 of the distribution
        assert gaussian_coverage(sigma) == pytest.approx(best_any, abs=1e-12)
        s = window_start(sigma)
        assert set(range(s, s + 7)) == set(top_exponents(p))


def test_coverage_bound_over_all_sigma():
    """The optimal window covers between ~97.0% and ~97.9% of a Gaussian, whatever sigma."""
    fracs = np.linspace(0, 1, 257)[:-1]
    cov = np.array([gaussian_coverage(2.0 ** (-6 + f)) for f in fracs])
    assert 0.9695 < cov.min() < 0.9710
    assert 0.9785 < cov.max() < 0.9795


@pytest.mark.parametrize("sigma,mean", [(0.02, 0.0), (0.0037, 0.0), (1.3, 0.0), (0.05, 1.0),
                                        (0.1, 0.6), (0.2, -0.3)])
def test_monte_carlo_matches_the_closed_form(sigma, mean):
    n = 400_000
    x = np.random.default_rng(7).normal(mean, sigma, n)
    bits = bf16_bits(x)
    hist = exponent_histogram(bits) / n
    pred = exponent_probabilities(sigma, ALL, mean)
    # BF16 rounding moves values within 2^-9 of a power of two up one exponent: tiny
    assert np.abs(hist - pred).max() < 0.004
    s = window_start(sigma)
    pred_cov = gaussian_coverage(sigma, s, mean)
    meas_cov = Codebook(tuple(range(s, s + 7))).coverage(bits, dtype="bfloat16")
    assert abs(meas_cov - pred_cov) < 0.002


def test_sigma_estimate_of_gaussian_data():
    for sigma in (1e-4, 0.02, 2.0):
        bits = bf16_bits(np.random.default_rng(1).normal(0, sigma, 1 << 18))
        assert estimate_sigma(bits) == pytest.approx(sigma, rel=0.05)
    assert estimate_sigma(np.zeros(0, np.uint16)) == 0.0
    assert estimate_sigma(np.full(9, 0x7FC0, np.uint16)) == 0.0  # NaN only


@pytest.mark.parametrize("rows,cols", [(4096, 256), (256, 688), (16, 11008), (1024, 1024), (4, 4 * 256 * 256),
                                       (105, 3 * 5 * 7), (3, 4097), (1, 5000), (7, 7 * 4096)])
def test_strided_sample_reads_every_column(rows, cols):
    """Every row length of a C-contiguous view divides n: a stride prime to n visits all columns."""
    n = rows * cols
    s = sample_stride(n)
    assert s >= 1 and math.gcd(s, n) == 1 and s <= max(1, n // 4096)
    idx = np.arange(n, dtype=np.int64)[::s][:4096]
    assert idx.size == min(n, 4096)
    assert np.unique(idx % cols).size == min(cols, idx.size)
    m = np.zeros((rows, cols), np.uint16)
    m[:, 0] = 0x3F80  # one column differs, as a causal attention matrix's first column does
    sample = strided_sample(m)
    assert np.array_equal(sample, m.reshape(-1)[idx])
    if cols > 1:
        assert np.count_nonzero(sample) < sample.size


def test_gaussian_data_keeps_its_sigma_window():
    rng = np.random.default_rng(3)
    for _ in range(50):
        sigma = 2.0 ** rng.uniform(-14, 3)
        bits = bf16_bits(rng.normal(0, sigma, 50_000))
        c = choose_codebook(bits)
        assert not c.fallback
        assert Codebook.from_sample(bits) == Codebook.from_sigma(estimate_sigma(bits))


@pytest.mark.parametrize("make", [
    lambda r: np.where(r.random(1 << 16) < 0.6, 0.0, r.normal(0, 0.02, 1 << 16)),  # sparse gradient
    lambda r: r.laplace(0, 0.01, 1 << 16) * r.normal(0, 1, 1 << 16),  # heavy tails
    lambda r: np.exp(r.normal(-6, 2.5, 1 << 16)),  # softmax-like, log-normal, positive
])
def test_fallback_fixes_non_gaussian_tensors(make):
    bits = bf16_bits(make(np.random.default_rng(5)))
    by_sigma = Codebook.from_sigma(estimate_sigma(bits)).coverage(bits, dtype="bfloat16")
    default = Codebook.from_sample(bits).coverage(bits, dtype="bfloat16")
    best = Codebook.from_histogram(bits, dtype="bfloat16").coverage(bits, dtype="bfloat16")
    assert choose_codebook(bits).fallback
    assert default > by_sigma + 0.005
    assert default > best - 0.01  # the sample's top-7 is nearly the exact top-7
    assert Codebook.from_sample(bits, fallback=False).coverage(bits, dtype="bfloat16") == by_sigma


@pytest.mark.parametrize("sigma", [0.0, -0.0, -1.0, -1e-30, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_from_sigma_rejects_what_no_gaussian_has(sigma, dtype):
    with pytest.raises(ValueError, match="sigma must be a positive, finite number"):
        Codebook.from_sigma(sigma, dtype)
    x = np.random.default_rng(0).normal(0, 0.02, 100).astype(np.float32).astype(
        ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    with pytest.raises(ValueError, match="sigma must be a positive, finite number"):
        zipccl.compress(x, sigma=sigma)


@pytest.mark.parametrize("values", [np.zeros(5000), np.full(5000, np.nan), np.full(5000, -np.inf),
                                    np.zeros(0)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_data_without_a_sigma_gets_the_window_of_zeros(values, dtype):
    # Its sigma estimate is 0.0, which from_sigma refuses; the data's own choice is the
    # window at exponent 0 (zeros, subnormals), and the frame is still exact.
    from zipccl.arrays import host_values
    from zipccl.codec import reference

    x = values.astype(np.float32).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    bits, _ = host_values(x)
    zeros = tuple(range(7))
    assert estimate_sigma(bits, dtype=dtype) == 0.0
    assert Codebook.from_sample(bits, dtype=dtype, fallback=False).exponents == zeros
    # the default choice: that window, or (inf, NaN) the exponents the data has
    chosen = Codebook.from_sample(bits, dtype=dtype).exponents
    assert chosen == (zeros if not values.size or values[0] == 0
                      else Codebook.from_histogram(x).exponents)
    frame = zipccl.compress(x)
    assert np.array_equal(frame, zipccl.compress(x, backend="reference"))
    assert zipccl.format.parse_header(frame).codebook == chosen
    back, _ = reference.decode(frame)
    assert np.array_equal(back.reshape(-1), bits.reshape(-1))
    if dtype == "bfloat16":
        assert tensor_stats(bits).sigma == 0.0


def test_entropy_and_frame_ratio():
    assert exponent_entropy(np.ones(8)) == pytest.approx(3.0)
    assert exponent_entropy(np.zeros(256)) == 0.0
    assert frame_ratio(0, 0) == 1.0
    n = 1 << 20
    assert frame_ratio(n, n) == pytest.approx((128 + 2 * n) / (2 * n))  # RAW frame


@pytest.mark.parametrize("n", [1, 1000, 4096, 70_001])
def test_tensor_stats_predicts_the_real_frame_size(n):
    x = np.random.default_rng(n).standard_t(3, n) * 0.01  # heavy tails: some escapes
    bf = np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)
    frame = zipccl.compress(bf, backend="reference")
    s = tensor_stats(bf.view(np.uint16), frame_bytes=int(frame.size))
    assert s.ratio_default == pytest.approx(frame.size / bf.nbytes)
    assert s.coverage_hist >= s.coverage_default - 1e-12 and s.coverage_hist >= s.coverage_sigma - 1e-12
    assert sum(s.hist.values()) == n
    with pytest.raises(ValueError, match="layout predicts"):
        tensor_stats(bf.view(np.uint16), frame_bytes=int(frame.size) + 1)


def test_window_table_is_window_start_at_every_breakpoint_and_at_random_sigma():
    import math

    from zipccl.codebook import window_start, window_start_tabulated, window_table

    thr, starts = window_table()
    assert np.all(np.diff(thr) > 0) and np.all(np.diff(starts) > 0)
    for t in thr[1:]:
        for s in (math.nextafter(t, 0.0), float(t), math.nextafter(t, math.inf)):
            assert window_start_tabulated(s) == window_start(s), s
    rng = np.random.default_rng(7)
    for s in np.exp2(rng.uniform(-142.0, 129.0, 400)):
        assert window_start_tabulated(float(s)) == window_start(float(s)), s
    for s in (0.0, -1.0, math.inf, math.nan):
        assert window_start_tabulated(s) == window_start(s) == 0


def test_rms_has_a_fixed_summation_order_close_to_the_mean():
    from conftest import gaussian_bits

    from zipccl.codebook import _rms

    bits = gaussian_bits(4096, sigma=0.02, seed=3)
    v = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert _rms(bits) == pytest.approx(float(np.sqrt(np.mean(v * v))), rel=1e-14)
    assert _rms(np.array([0x7FC0, 0x3F80], np.uint16)) == 1.0  # NaN skipped, 1.0 counted
