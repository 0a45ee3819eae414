"""The cost model's parameters from measurements: links, per-call costs, anchoring.

``fit_alpha_beta`` fits ``seconds = alpha + bytes / B`` to measured (size, time) points in
relative error; ``link_from_fits`` and ``link_from_busbw`` turn per-op fits or nccl-tests
bus bandwidths into a ``costmodel.Link`` that predicts them in the ring form; ``fit_offset``
and ``fit_exchange`` fit zipccl's per-call cost once the size-dependent terms are known;
``anchored`` scales a prediction to the measurement at the nearest size. The policy, the
calibration, the torch autotuner, the scaling projection and ``experiments/records.py`` use
them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from .costmodel import GB, Codec, Exchange, Link, Prediction, check_op, predict, ring_terms
from .metrics import busbw_factor, nccl_tests_size


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Fit ``seconds = alpha + nbytes / (beta * 1e9)``: (alpha s, beta GB/s).

    Minimizes the *relative* squared error (weights 1 / seconds^2), so small and
    large messages count alike. Use it on measured (size, time) points of one
    operation on one link (per ring step), or of one codec kernel. A negative
    alpha is clipped to 0 and beta refitted through the origin.

    >>> a, b = fit_alpha_beta([1e6, 2e6, 4e6], [1e-5 + 1e-4, 1e-5 + 2e-4, 1e-5 + 4e-4])
    >>> round(a * 1e6, 6), round(b, 6)
    (10.0, 10.0)
    """
    xs, ys = [float(x) for x in nbytes], [float(y) for y in seconds]
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("need at least two (size, time) points of equal count")
    if len(set(xs)) < 2:
        raise ValueError("need at least two different sizes")
    if min(ys) <= 0:
        raise ValueError("times must be > 0")
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    sy = sum(wi * y for wi, y in zip(w, ys, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det
    alpha = (sy - slope * sx) / sw
    if alpha < 0 or slope <= 0:  # refit through the origin
        alpha, slope = 0.0, sxy / sxx
    if slope <= 0:
        raise ValueError("time does not grow with size; cannot fit a bandwidth")
    return alpha, 1.0 / slope / GB


def fit_offset(seconds: Sequence[float], model: Sequence[float]) -> float:
    """The constant c >= 0 for which ``model + c`` best fits ``seconds`` in relative squared error.

    The compressed path's per-call cost, fitted on calls of real sizes once the
    size-dependent terms (``model``) are known.

    >>> round(fit_offset([2e-3, 11e-3], [1e-3, 10e-3]) * 1e3, 6)
    1.0
    """
    ys, ms = [float(y) for y in seconds], [float(m) for m in model]
    if len(ys) != len(ms) or not ys or min(ys) <= 0:
        raise ValueError("need at least one pair of (measured > 0, modelled) times of equal count")
    w = [1.0 / (y * y) for y in ys]
    return max(0.0, sum(wi * (y - m) for wi, y, m in zip(w, ys, ms, strict=True)) / sum(w))


def link_from_fits(name: str, fits: Mapping[str, tuple[float, float]], nranks: int = 2) -> Link:
    """A ``Link`` from per-op fits of ``seconds = alpha + m / (beta * 1e9)`` (``fit_alpha_beta``).

    ``m`` is the per-rank size (``metrics.nccl_tests_size``'s convention); each fit
    is turned into the ring form of ``native_time`` (``ring_terms``), so that the
    link predicts exactly the fitted times. The default bandwidth is all_gather's
    (or the first op's).

    >>> from zipccl.costmodel import native_time
    >>> link = link_from_fits("l", {"all_to_all": (2e-5, 50.0)}, nranks=2)
    >>> link.bw("all_to_all"), round(native_time("all_to_all", 50e9, 2, link), 6)
    (25.0, 1.00002)
    """
    if not fits:
        raise ValueError("need the fit of at least one op")
    per_op, lats = {}, {}
    for op, (alpha, beta) in fits.items():
        steps, factor = ring_terms(op, nranks)
        if not steps:  # one rank: no ring (native_time is 0); keep the fit as it is
            steps = factor = 1
        per_op[op], lats[op] = float(beta) * factor, float(alpha) / steps
    default = per_op.get("all_gather", next(iter(per_op.values())))
    return Link(name, default, min(lats.values()), per_op=per_op, per_op_latency=lats)


def link_from_busbw(name: str, op_busbw: Mapping[str, Mapping[int, float]], nranks: int = 2) -> Link:
    """Fit a ``Link`` from measured bus bandwidths {op: {per-rank bytes: GB/s}} on ``nranks`` ranks.

    Each measured busbw is turned back into a time with nccl-tests' definition,
    and alpha / B are fitted per op (``fit_alpha_beta`` on the ring-step form of
    ``native_time``). The link's latency is the mean alpha; its default bandwidth
    is all_gather's (or the first op's) fitted B; ``per_op`` and ``per_op_latency``
    keep every op's own fit.
    """
    per_op, lats = {}, {}
    p = nranks
    for op, points in op_busbw.items():
        check_op(op)
        xs, ys = [], []
        for m, gbps in sorted(points.items()):
            size = nccl_tests_size(op, m, p)
            t = size * busbw_factor(op, p) / (gbps * GB)
            steps = (2 if op == "all_reduce" else 1) * (p - 1)
            # native_time = steps * alpha + steps * x / B, with x the bytes one step moves
            x = size * busbw_factor(op, p) / steps
            xs.append(x)
            ys.append(t / steps)
        alpha, beta = fit_alpha_beta(xs, ys)
        per_op[op], lats[op] = beta, alpha
    default = per_op.get("all_gather", next(iter(per_op.values())))
    return Link(name, default, sum(lats.values()) / len(lats), per_op=per_op, per_op_latency=lats)


def fit_exchange(op: str, nranks: int, link: Link, codec: Codec, exchange: Exchange,
                 measured: Sequence[tuple[float, float]]) -> Exchange:
    """``exchange`` with its per-call cost fitted to measured (per-rank bytes, seconds) of the
    compressed path (``fit_offset`` over the model's time without it); as it is without points.

    >>> link, codec = Link("w", 25.0), Codec("c", 1e3, 1e3, 0.5)
    >>> ex = fit_exchange("all_gather", 2, link, codec, Exchange(), [(25e6, 1.55e-3), (250e6, 6.5e-3)])
    >>> round(ex.fixed_s * 1e3, 6)  # the model says 0.55 and 5.5 ms: 1 ms more per call
    1.0
    """
    pts = [(b, t) for b, t in measured if t > 0]
    if not pts:
        return exchange
    bare = dataclasses.replace(exchange, fixed_s=0.0)
    model = [predict(op, b, nranks, link, codec, exchange=bare).compressed_s for b, _ in pts]
    return dataclasses.replace(exchange, fixed_s=fit_offset([t for _, t in pts], model))


def anchored(pred: Prediction, nbytes: float, measured: Mapping[str, Sequence[Sequence[float]]],
             at: Callable[[float], Prediction]) -> Prediction:
    """``pred`` (the model at ``nbytes``) with each path scaled by measured / modelled time at the
    measured size nearest ``nbytes`` (in log size).

    ``measured[path]`` holds [bytes, seconds] points of "native" and "compressed" and ``at(bytes)``
    is the model's prediction there, sizes in one convention. The model alone assumes perfectly
    overlapped stages; where the measured times are steady this keeps its shape between sizes and
    its level at the nearest measurement. The factors are kept in ``Prediction.anchor``.

    >>> link, codec = Link("l", 25.0), Codec("c", 1e3, 1e3, 0.5)
    >>> def at(b):
    ...     return predict("all_gather", b, 2, link, codec)
    >>> a = anchored(at(1e8), 1e8, {"compressed": [[5e7, 2 * at(5e7).compressed_s]]}, at)
    >>> a.anchor, a.compressed_s == 2 * at(1e8).compressed_s, a.native_s == at(1e8).native_s
    ({'compressed': 2.0}, True, True)
    """
    scale = {}
    for path in ("native", "compressed"):
        pts = [(b, t) for b, t in measured.get(path, []) if b > 0 and t > 0]
        if not pts:
            continue
        b, t = min(pts, key=lambda bt: abs(math.log(bt[0] / max(nbytes, 1))))
        m = at(b)
        model_t = m.native_s if path == "native" else m.compressed_s
        if model_t > 0:
            scale[path] = t / model_t
    if not scale:
        return pred
    return dataclasses.replace(pred, native_s=pred.native_s * scale.get("native", 1.0),
                               compressed_s=pred.compressed_s * scale.get("compressed", 1.0), anchor=scale)
