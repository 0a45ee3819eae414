"""The alpha-beta cost model: when does compressing a collective pay?

One model shared by the theory notebook (``theory/03_when_compression_pays``), the
adaptive policy (native or compressed, per operation and size) and the scaling
projection. It predicts the time of each collective natively and compressed from:

- a ``Link``: per-step latency alpha (s) and bus bandwidth B (GB/s, the
  nccl-tests definition, so measured busbw plugs straight in), optionally per op;
- a ``Codec``: encode / decode throughput (GB/s of BF16 input), a fixed cost per
  call, the compression ratio r, and the local reduction throughput;
- the number of ranks p and the per-rank message size m (bytes, uncompressed;
  the same convention as ``zipccl.metrics.nccl_tests_size``);
- the number of pipeline chunks k.

Native ring times (nccl-tests' bus-bandwidth factors make these exact for a
measured B)::

    all_gather, reduce_scatter:  (p-1) * (alpha + m / B)          m = per-rank piece
    all_to_all:                  (p-1) * alpha + (p-1)/p * m / B   m = whole send buffer
    all_reduce:                  2(p-1) * alpha + 2(p-1)/p * m / B

Compressed, each rank encodes what it sends, moves r times the bytes, decodes
what it receives. Reduce-scatter cannot be compressed end to end through a ring
without re-encoding partial sums at every hop ("ring" method), so the usual
alternative is a compressed all-to-all followed by a local reduction
("all_to_all" method); the model evaluates both. All-reduce is a compressed
reduce-scatter followed by a compressed all-gather.

Pipelining cuts the message into k chunks whose stages (encode, transfer,
decode[, reduce]) overlap: with per-chunk stage times t_s = o_s + T_s / k
(o_s the fixed cost of a stage), the total is sum_s t_s + (k - 1) * max_s t_s.
k = 1 is the unpipelined sum; as k grows the time approaches the slowest stage,
until the per-chunk fixed costs win. The model assumes the codec and the
transfer do not slow each other down (on a GPU they share memory bandwidth,
which is small next to HBM at these link speeds).

>>> link = Link("shm", bandwidth=25.0, latency=20e-6)
>>> codec = Codec("zipccl", encode_gbps=2000.0, decode_gbps=2000.0, ratio=0.70)
>>> p = predict("all_gather", 64 << 20, 2, link, codec)
>>> round(p.speedup, 2), p.choice
(1.38, 'compressed')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")
GB = 1e9


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")


@dataclass(frozen=True)
class Link:
    """A transport between the ranks: latency per ring step and bus bandwidth.

    ``bandwidth`` (GB/s) is nccl-tests' bus bandwidth for large messages;
    ``per_op`` overrides it for individual collectives (NCCL's all-to-all and
    reduce-scatter do not reach all-gather's bandwidth on every transport), and
    ``per_op_latency`` overrides the latency.

    >>> Link("nvlink", 284.0, 10e-6, per_op={"all_to_all": 328.0}).bw("all_to_all")
    328.0
    """

    name: str
    bandwidth: float  # GB/s, bus bandwidth
    latency: float = 0.0  # seconds per ring step (alpha)
    per_op: Mapping[str, float] = field(default_factory=dict)
    per_op_latency: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if not self.bandwidth > 0:
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {self.bandwidth}")
        if self.latency < 0:
            raise ValueError(f"link latency must be >= 0 s, got {self.latency}")
        for op, bw in self.per_op.items():
            _check_op(op)
            if not bw > 0:
                raise ValueError(f"bandwidth of {op} must be > 0 GB/s, got {bw}")
        for op, lat in self.per_op_latency.items():
            _check_op(op)
            if lat < 0:
                raise ValueError(f"latency of {op} must be >= 0 s, got {lat}")

    def bw(self, op: str) -> float:
        """Bus bandwidth in GB/s used for ``op``."""
        return float(self.per_op.get(op, self.bandwidth))

    def lat(self, op: str) -> float:
        """Latency per ring step in seconds used for ``op``."""
        return float(self.per_op_latency.get(op, self.latency))


@dataclass(frozen=True)
class Codec:
    """A compressor's speed and ratio on one device.

    Throughputs are GB/s of uncompressed BF16 bytes; ``overhead`` is the fixed
    time of one encode or decode call (kernel launches, a header); ``reduce_gbps``
    is the local elementwise reduction speed (GB/s of input read) used by the
    all-to-all form of reduce-scatter.
    """

    name: str
    encode_gbps: float
    decode_gbps: float
    ratio: float  # compressed bytes / original bytes
    overhead: float = 0.0  # seconds per encode or decode call
    reduce_gbps: float = math.inf

    def __post_init__(self):
        if not (self.encode_gbps > 0 and self.decode_gbps > 0 and self.reduce_gbps > 0):
            raise ValueError("codec throughputs must be > 0 GB/s")
        if not 0 < self.ratio:
            raise ValueError(f"ratio must be > 0, got {self.ratio}")
        if self.overhead < 0:
            raise ValueError(f"overhead must be >= 0 s, got {self.overhead}")

    def encode_s(self, nbytes: float) -> float:
        """Seconds to encode ``nbytes`` of BF16 (one call)."""
        return self.overhead + nbytes / (self.encode_gbps * GB)

    def decode_s(self, nbytes: float) -> float:
        """Seconds to decode frames holding ``nbytes`` of BF16 (one call)."""
        return self.overhead + nbytes / (self.decode_gbps * GB)


@dataclass(frozen=True)
class Prediction:
    """Predicted times of one collective, native and compressed, and the better choice.

    ``stages`` holds the compressed path's per-stage totals (seconds, unpipelined),
    which is what ``explain`` prints.
    """

    op: str
    nbytes: int  # per-rank message size, uncompressed
    nranks: int
    link: str
    codec: str
    native_s: float
    compressed_s: float
    method: str  # how the compressed path runs (e.g. "all_to_all" for reduce_scatter)
    chunks: int
    stages: Mapping[str, float]

    @property
    def speedup(self) -> float:
        """native time / compressed time (> 1: compression pays)."""
        return self.native_s / self.compressed_s

    @property
    def choice(self) -> str:
        """"compressed" when it is predicted faster, else "native"."""
        return "compressed" if self.compressed_s < self.native_s else "native"

    def explain(self) -> str:
        """One readable line: both times, the stages of the compressed path, the choice."""
        st = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in self.stages.items())
        return (f"{self.op} {self.nbytes / 2**20:.1f} MiB x {self.nranks} ranks on {self.link}: "
                f"native {self.native_s * 1e3:.3f} ms, compressed ({self.codec}, {self.method}, "
                f"{self.chunks} chunk{'s' if self.chunks > 1 else ''}) {self.compressed_s * 1e3:.3f} ms "
                f"[stages ms: {st}] -> {self.choice} ({self.speedup:.2f}x)")


def native_time(op: str, nbytes: float, nranks: int, link: Link) -> float:
    """Seconds for the uncompressed ring collective (see the module docstring).

    >>> native_time("all_gather", 25e9, 2, Link("l", 25.0))  # one step of 25 GB at 25 GB/s
    1.0
    """
    _check_op(op)
    p, m, b, a = nranks, float(nbytes), link.bw(op) * GB, link.lat(op)
    if p <= 1:
        return 0.0
    if op in ("all_gather", "reduce_scatter"):
        return (p - 1) * (a + m / b)
    if op == "all_to_all":
        return (p - 1) * a + (p - 1) / p * m / b
    return 2 * (p - 1) * a + 2 * (p - 1) / p * m / b


def pipelined(stages: Sequence[tuple[float, float]], chunks: int) -> float:
    """Time of ``chunks`` chunks through stages given as (fixed cost per chunk, total work) seconds.

    Each chunk spends ``fixed + work / chunks`` in every stage; a stage starts a
    chunk when it has finished the previous one and the previous stage has handed
    it over. For equal chunks that is ``sum(t_s) + (chunks - 1) * max(t_s)``.

    >>> pipelined([(0.0, 1.0), (0.0, 2.0), (0.0, 1.0)], 1), pipelined([(0.0, 1.0), (0.0, 2.0), (0.0, 1.0)], 4)
    (4.0, 2.5)
    """
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    per = [fixed + work / chunks for fixed, work in stages]
    return sum(per) + (chunks - 1) * max(per) if per else 0.0


def _stages(op: str, nbytes: float, p: int, link: Link, codec: Codec,
            method: str) -> dict[str, tuple[float, float]]:
    """(fixed cost per chunk, total work) of each stage of the compressed path, per rank."""
    m, r = float(nbytes), codec.ratio
    a, enc, dec = link.lat(op), codec.encode_gbps * GB, codec.decode_gbps * GB
    o = codec.overhead

    def bw(o_):
        return link.bw(o_) * GB

    if op == "all_gather":  # encode own piece; move p-1 frames around the ring; decode them
        return {"encode": (o, m / enc), "transfer": ((p - 1) * a, (p - 1) * r * m / bw(op)),
                "decode": (o, (p - 1) * m / dec)}
    if op == "all_to_all":  # encode the p-1 outgoing pieces of m/p, exchange, decode p-1
        out = (p - 1) / p * m
        return {"encode": (o, out / enc), "transfer": ((p - 1) * a, r * out / bw(op)),
                "decode": (o, out / dec)}
    if op == "reduce_scatter":
        if method == "all_to_all":  # m = output piece; input is p*m
            return {"encode": (o, (p - 1) * m / enc),
                    "transfer": ((p - 1) * link.lat("all_to_all"), (p - 1) * r * m / bw("all_to_all")),
                    "decode": (o, (p - 1) * m / dec),
                    "reduce": (0.0, p * m / (codec.reduce_gbps * GB))}
        if method == "ring":  # every hop: encode partial sum, send, decode, add
            hops = p - 1
            return {"encode": (hops * o, hops * m / enc),
                    "transfer": (hops * a, hops * r * m / bw(op)),
                    "decode": (hops * o, hops * m / dec),
                    "reduce": (0.0, hops * 2 * m / (codec.reduce_gbps * GB))}
        raise ValueError(f"reduce_scatter methods are 'all_to_all' and 'ring', got {method!r}")
    raise ValueError(f"no stage model for {op!r}")


def compressed_time(op: str, nbytes: float, nranks: int, link: Link, codec: Codec, *,
                    chunks: int = 1, method: str | None = None) -> float:
    """Seconds for the compressed collective with ``chunks`` pipeline chunks.

    ``method`` picks the reduce-scatter algorithm ("all_to_all" or "ring"; default:
    the faster). All-reduce is compressed reduce-scatter of m/p + compressed
    all-gather of m/p, each pipelined on its own.

    >>> link, codec = Link("l", 25.0), Codec("c", 1e12, 1e12, 0.5)
    >>> round(compressed_time("all_gather", 25e9, 2, link, codec), 6)  # half the bytes
    0.5
    """
    return _best(op, nbytes, nranks, link, codec, chunks, method)[0]


def _best(op, nbytes, nranks, link, codec, chunks, method) -> tuple[float, str, dict[str, float]]:
    _check_op(op)
    p = nranks
    if p <= 1:
        return 0.0, "local", {}
    if op == "all_reduce":
        piece = nbytes / p
        t1, m1, s1 = _best("reduce_scatter", piece, p, link, codec, chunks, method)
        t2, _, s2 = _best("all_gather", piece, p, link, codec, chunks, None)
        stages = {f"rs.{k}": v for k, v in s1.items()} | {f"ag.{k}": v for k, v in s2.items()}
        return t1 + t2, f"rs:{m1}+ag", stages
    methods = [method] if method else (["all_to_all", "ring"] if op == "reduce_scatter" else ["-"])
    best = None
    for meth in methods:
        st = _stages(op, nbytes, p, link, codec, meth)
        t = pipelined(list(st.values()), chunks)
        totals = {k: fixed + work for k, (fixed, work) in st.items()}
        if best is None or t < best[0]:
            best = (t, meth, totals)
    return best


def best_chunks(op: str, nbytes: float, nranks: int, link: Link, codec: Codec, *,
                max_chunks: int = 64, method: str | None = None) -> int:
    """The chunk count in 1..max_chunks that minimizes the compressed time."""
    times = [compressed_time(op, nbytes, nranks, link, codec, chunks=k, method=method)
             for k in range(1, max_chunks + 1)]
    return 1 + min(range(len(times)), key=times.__getitem__)


def predict(op: str, nbytes: int, nranks: int, link: Link, codec: Codec, *,
            chunks: int | None = 1, method: str | None = None, max_chunks: int = 64) -> Prediction:
    """Native and compressed times of one collective; ``chunks=None`` picks the best chunk count.

    >>> p = predict("all_gather", 64 << 20, 2, Link("nvlink", 284.0, 10e-6),
    ...             Codec("dietgpu", 804.0, 1024.0, 0.674))
    >>> p.choice
    'native'
    """
    k = best_chunks(op, nbytes, nranks, link, codec, max_chunks=max_chunks, method=method) \
        if chunks is None else int(chunks)
    t, meth, stages = _best(op, nbytes, nranks, link, codec, k, method)
    return Prediction(op=op, nbytes=int(nbytes), nranks=nranks, link=link.name, codec=codec.name,
                      native_s=native_time(op, nbytes, nranks, link), compressed_s=t, method=meth,
                      chunks=k, stages=stages)


def break_even_throughput(op: str, nbytes: int, nranks: int, link: Link, ratio: float, *,
                          chunks: int | None = 1, overhead: float = 0.0, reduce_gbps: float = math.inf,
                          method: str | None = None, max_chunks: int = 64) -> float:
    """Codec throughput (GB/s, encode = decode) at which compressed equals native.

    ``chunks=None`` lets every candidate codec use its best chunk count (1..max_chunks).
    Returns ``math.inf`` when no codec speed can pay (e.g. ratio >= 1, or the fixed
    costs alone exceed the native time). Found by bisection on log speed.

    >>> link = Link("shm", 25.0)
    >>> round(break_even_throughput("all_gather", 1 << 30, 2, link, 0.7))  # 2 codec passes of m
    167
    """
    native = native_time(op, nbytes, nranks, link)

    def excess(gbps: float) -> float:
        c = Codec("x", gbps, gbps, ratio, overhead, reduce_gbps)
        k = best_chunks(op, nbytes, nranks, link, c, max_chunks=max_chunks, method=method) \
            if chunks is None else chunks
        return compressed_time(op, nbytes, nranks, link, c, chunks=k, method=method) - native

    lo, hi = 1e-3, 1e9
    if excess(hi) >= 0:
        return math.inf
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-6:
            break
    return hi


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


def link_from_busbw(name: str, op_busbw: Mapping[str, Mapping[int, float]], nranks: int = 2) -> Link:
    """Fit a ``Link`` from measured bus bandwidths {op: {per-rank bytes: GB/s}} on ``nranks`` ranks.

    Each measured busbw is turned back into a time with nccl-tests' definition,
    and alpha / B are fitted per op (``fit_alpha_beta`` on the ring-step form of
    ``native_time``). The link's latency is the mean alpha; its default bandwidth
    is all_gather's (or the first op's) fitted B; ``per_op`` and ``per_op_latency``
    keep every op's own fit.
    """
    from .metrics import busbw_factor, nccl_tests_size

    per_op, lats = {}, {}
    p = nranks
    for op, points in op_busbw.items():
        _check_op(op)
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


# Measured on 2 x H200 in one host (shared/GPU_MACHINE.md, 2026-11-30): NCCL bus bandwidth in
# GB/s by per-rank message size. Baselines for the notebooks and for a policy without a profile.
H200_NCCL_BUSBW: dict[str, dict[str, dict[int, float]]] = {
    "nvlink": {"all_gather": {16 << 20: 186, 64 << 20: 232, 256 << 20: 257, 1 << 30: 284},
               "reduce_scatter": {16 << 20: 164, 64 << 20: 203, 256 << 20: 229, 1 << 30: 268},
               "all_to_all": {16 << 20: 160, 64 << 20: 241, 256 << 20: 278, 1 << 30: 328}},
    "shm": {"all_gather": {16 << 20: 24.7, 64 << 20: 25.1, 256 << 20: 25.2, 1 << 30: 25.2},
            "reduce_scatter": {16 << 20: 24.4, 64 << 20: 25.0, 256 << 20: 25.2, 1 << 30: 25.3},
            "all_to_all": {16 << 20: 23.1, 64 << 20: 24.0, 256 << 20: 24.1, 1 << 30: 24.2}},
    "sockets": {"all_gather": {16 << 20: 3.3, 64 << 20: 3.4, 256 << 20: 3.5, 1 << 30: 3.5},
                "reduce_scatter": {16 << 20: 3.0, 64 << 20: 3.4, 256 << 20: 3.6, 1 << 30: 3.6},
                "all_to_all": {16 << 20: 2.3, 64 << 20: 2.4, 256 << 20: 2.3, 1 << 30: 2.6}},
}

# GPU codecs measured on one H200 on N(0, 0.02) BF16 data (shared/GPU_MACHINE.md):
# (ratio, {bytes: (compress GB/s, decompress GB/s)}).
H200_CODECS: dict[str, tuple[float, dict[int, tuple[float, float]]]] = {
    "dietgpu": (0.674, {1 << 20: (20, 27), 16 << 20: (172, 376), 64 << 20: (559, 810),
                        256 << 20: (769, 963), 512 << 20: (804, 1024)}),
    "nvcomp-ans": (0.685, {512 << 20: (434, 284)}),
}


def reference_links(nranks: int = 2) -> dict[str, Link]:
    """Links fitted to the measured 2 x H200 NCCL baselines: "nvlink", "shm", "sockets".

    Fits that make alpha negative (bandwidth still rising at the largest size)
    fall back to alpha = 0 with a through-the-origin bandwidth.
    """
    return {name: link_from_busbw(name, ops, nranks) for name, ops in H200_NCCL_BUSBW.items()}


def reference_codec(name: str, nbytes: int | None = None, reduce_gbps: float = math.inf) -> Codec:
    """A measured GPU codec baseline ("dietgpu", "nvcomp-ans") at the measured size nearest ``nbytes``.

    >>> reference_codec("dietgpu", 64 << 20).encode_gbps
    559
    """
    ratio, by_size = H200_CODECS[name]
    size = max(by_size) if nbytes is None else min(by_size, key=lambda s: abs(math.log(s / nbytes)))
    enc, dec = by_size[size]
    return Codec(name, enc, dec, ratio, reduce_gbps=reduce_gbps)
