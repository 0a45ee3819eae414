"""The alpha-beta cost model: when does compressing a collective pay?

One model for the theory notebook (``theory/03_when_compression_pays.ipynb``), the policy
and the scaling projection. From a ``Link`` (per-step latency, nccl-tests' bus bandwidth, per
op), a ``Codec`` (encode, decode and reduction throughput, fixed cost per call, ratio), the ranks
and the per-rank size it predicts each collective's time natively (ring terms) and compressed:
pipelined stages in chunks, or, given an ``Exchange``, zipccl's own rounds (``exchange_time``).
It holds no measured numbers; ``zipccl.costfit`` fits its parameters to measurements. The formulas and
what they assume: docs/COST_MODEL.md.

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

from .metrics import OPS

GB = 1e9


def check_op(op: str) -> None:
    """Raise ValueError unless ``op`` is one of ``metrics.OPS``."""
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
            check_op(op)
            if not bw > 0:
                raise ValueError(f"bandwidth of {op} must be > 0 GB/s, got {bw}")
        for op, lat in self.per_op_latency.items():
            check_op(op)
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
class Exchange:
    """How zipccl's compressed path runs, as ``Communicator.calibrate`` measures it.

    A call costs ``fixed_s`` once, then ``rounds(message)`` rounds of at most
    ``chunk_bytes`` of every message each (0: one round); every round has a host
    stage of ``round_s`` (planning the round, posting the transfer and spill kernels) beside the
    encode, transfer and decode stages. With ``overlap`` (device streams) the
    rounds' stages overlap (``pipelined``); without (host codec) they run one after
    another.

    >>> Exchange(chunk_bytes=64 << 20).rounds(1 << 30), Exchange().rounds(1 << 30)
    (16, 1)
    """

    fixed_s: float = 0.0  # per call
    round_s: float = 0.0  # host work per round
    chunk_bytes: int = 0  # bytes of one message moved per round; 0: the whole message in one round
    overlap: bool = True

    def __post_init__(self):
        if self.fixed_s < 0 or self.round_s < 0 or self.chunk_bytes < 0:
            raise ValueError(f"exchange costs and chunk must be >= 0, got {self}")

    def rounds(self, message_bytes: float) -> int:
        """Rounds a message of ``message_bytes`` (one peer's share) is cut into."""
        return max(1, math.ceil(message_bytes / self.chunk_bytes)) if self.chunk_bytes else 1


@dataclass(frozen=True)
class Prediction:
    """Predicted times of one collective, native and compressed, and the better choice.

    ``native_stages`` splits the native time into its latency and bandwidth terms;
    ``stages`` holds the compressed path's per-stage totals (seconds, not
    overlapped; with an ``Exchange`` also its "fixed" cost per call and the "host"
    work of its rounds), which is what ``explain`` prints.
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
    native_stages: Mapping[str, float] = field(default_factory=dict)
    # measured / modelled time at the nearest calibrated size, per path, already applied to
    # native_s / compressed_s (empty: the model alone). Stage terms stay the model's.
    anchor: Mapping[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """native time / compressed time (> 1: compression pays)."""
        return self.native_s / self.compressed_s

    @property
    def rounds(self) -> int:
        """The compressed path's pipeline rounds (``chunks``)."""
        return self.chunks

    @property
    def choice(self) -> str:
        """"compressed" when it is predicted faster, else "native"."""
        return "compressed" if self.compressed_s < self.native_s else "native"

    def terms(self) -> str:
        """Both predicted times in ms with the terms they add up from."""
        nat = " + ".join(f"{k} {v * 1e3:.3f}" for k, v in self.native_stages.items())
        st = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in self.stages.items())
        k = f"{self.chunks} round{'s' if self.chunks > 1 else ''}"
        anchor = ""
        if self.anchor:
            anchor = ("; model scaled to the nearest measured size: "
                      + ", ".join(f"{p} x{f:.2f}" for p, f in self.anchor.items()))
        return (f"native {self.native_s * 1e3:.3f} ms" + (f" ({nat})" if nat else "")
                + f", compressed {self.compressed_s * 1e3:.3f} ms ({k}; stage totals ms: {st})"
                + anchor)

    def explain(self) -> str:
        """One readable line: both times, the stages of the compressed path, the choice."""
        st = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in self.stages.items())
        return (f"{self.op} {self.nbytes / 2**20:.1f} MiB x {self.nranks} ranks on {self.link}: "
                f"native {self.native_s * 1e3:.3f} ms, compressed ({self.codec}, {self.method}, "
                f"{self.chunks} chunk{'s' if self.chunks > 1 else ''}) {self.compressed_s * 1e3:.3f} ms "
                f"[stages ms: {st}] -> {self.choice} ({self.speedup:.2f}x)")


def ring_terms(op: str, nranks: int) -> tuple[float, float]:
    """(latency steps, bandwidth factor) of the native ring: time = steps * alpha + factor * m / B.

    >>> ring_terms("all_gather", 4), ring_terms("all_reduce", 2)
    ((3, 3), (2, 1.0))
    """
    check_op(op)
    p = nranks
    if op in ("all_gather", "reduce_scatter"):
        return p - 1, p - 1
    if op == "all_to_all":
        return p - 1, (p - 1) / p
    return 2 * (p - 1), 2 * (p - 1) / p


def native_terms(op: str, nbytes: float, nranks: int, link: Link) -> dict[str, float]:
    """The native time's two terms in seconds: {"latency": steps * alpha, "bandwidth": factor * m / B}.

    >>> native_terms("all_to_all", 25e9, 2, Link("l", 25.0, 1e-5))
    {'latency': 1e-05, 'bandwidth': 0.5}
    """
    check_op(op)
    if nranks <= 1:
        return {"latency": 0.0, "bandwidth": 0.0}
    steps, factor = ring_terms(op, nranks)
    return {"latency": steps * link.lat(op), "bandwidth": factor * float(nbytes) / (link.bw(op) * GB)}


def native_time(op: str, nbytes: float, nranks: int, link: Link) -> float:
    """Seconds for the uncompressed ring collective (``ring_terms``, docs/COST_MODEL.md).

    >>> native_time("all_gather", 25e9, 2, Link("l", 25.0))  # one step of 25 GB at 25 GB/s
    1.0
    """
    return sum(native_terms(op, nbytes, nranks, link).values())


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


def hidden_time(stages: Mapping[str, float]) -> float:
    """Time an overlapped path can hide: per exchange, min(transfer, encode + decode).

    ``stages`` are ``Prediction.stages`` (all-reduce's are prefixed "rs." and "ag.");
    for a codec without fixed costs the hidden time is linear in the overlap.

    >>> hidden_time({"rs.encode": 1.0, "rs.transfer": 3.0, "rs.decode": 1.0, "ag.encode": 2.0,
    ...              "ag.transfer": 1.0, "ag.decode": 2.0})
    3.0
    """
    groups: dict[str, dict[str, float]] = {}
    for k, v in stages.items():
        pre, _, name = k.rpartition(".")
        groups.setdefault(pre, {})[name] = v
    return sum(min(g.get("transfer", 0.0), g.get("encode", 0.0) + g.get("decode", 0.0))
               for g in groups.values())


def compressed_time(op: str, nbytes: float, nranks: int, link: Link, codec: Codec, *,
                    chunks: int = 1, method: str | None = None, overlap: float = 0.0) -> float:
    """Seconds for the compressed collective with ``chunks`` pipeline chunks.

    ``method`` picks the reduce-scatter algorithm ("all_to_all" or "ring"; default:
    the faster). All-reduce is compressed reduce-scatter of m/p + compressed
    all-gather of m/p, each pipelined on its own.

    ``overlap`` (0..1) is the fraction of each exchange's ``hidden_time`` that the
    path hides beyond its ``chunks``: a measured stand-in for pipelining that the
    chunk count does not describe (the scaling projection fits it to the records).
    Only the per-byte coding and transfer overlap; fixed costs and the reduction do not.

    >>> link, codec = Link("l", 25.0), Codec("c", 1e12, 1e12, 0.5)
    >>> round(compressed_time("all_gather", 25e9, 2, link, codec), 6)  # half the bytes
    0.5
    >>> slow = Codec("s", 25.0, 25.0, 0.5)  # coding 2 x 1 s, transfer 0.5 s: half of 0.5 s hidden
    >>> compressed_time("all_gather", 25e9, 2, link, slow), compressed_time(
    ...     "all_gather", 25e9, 2, link, slow, overlap=0.5)
    (2.5, 2.25)
    """
    t = _best(op, nbytes, nranks, link, codec, chunks, method)[0]
    if overlap:
        bare = Codec(codec.name, codec.encode_gbps, codec.decode_gbps, codec.ratio)
        t -= overlap * hidden_time(_best(op, nbytes, nranks, link, bare, chunks, method)[2])
    return t


def _best(op, nbytes, nranks, link, codec, chunks, method) -> tuple[float, str, dict[str, float]]:
    check_op(op)
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


def exchange_wire(link: Link, nranks: int) -> Link:
    """The link zipccl's frames cross, from the native ``link``.

    All-gather's frames move as an all-gather; on two ranks every round of every
    operation is one frame each way, also an all-gather; on more ranks the other
    operations' frames move as grouped send/recv, at all-to-all's bandwidth. The
    latency is zero: a round's fixed costs are the ``Exchange``'s.

    >>> nv = Link("nv", 250.0, per_op={"all_gather": 250.0, "all_to_all": 230.0})
    >>> exchange_wire(nv, 2).bw("all_to_all"), exchange_wire(nv, 4).bw("all_to_all")
    (250.0, 230.0)
    """
    gather = link.bw("all_gather")
    pairs = gather if nranks == 2 else link.bw("all_to_all")
    return Link(f"{link.name} frames", gather, 0.0,
                per_op={"all_gather": gather, "all_to_all": pairs, "reduce_scatter": pairs,
                        "all_reduce": pairs})


def sendrecv_wire(link: Link) -> Link:
    """The link frames cross when they move as grouped send/recv: all-to-all's alpha and B, for
    every op.

    The scaling projection's assumption, from the library of its first calibration runs; today's
    pipelined exchange moves frames as an all-gather on two ranks (``exchange_wire``, which the
    policy uses), and the projection does not model that yet.

    >>> w = sendrecv_wire(Link("nv", 250.0, 1e-5, per_op={"all_to_all": 230.0}))
    >>> w.bw("all_gather"), w.lat("all_reduce")
    (230.0, 1e-05)
    """
    return Link(f"{link.name}:send/recv", link.bw("all_to_all"), link.lat("all_to_all"))


def _exchange_part(op: str, nbytes: float, p: int, wire: Link, codec: Codec,
                   ex: Exchange) -> tuple[float, int, dict[str, float]]:
    """(seconds without the per-call cost, rounds, stage totals) of one compressed exchange."""
    message = nbytes / p if op == "all_to_all" else nbytes  # what one peer receives
    k = ex.rounds(message)
    st = _stages(op, nbytes, p, wire, codec, "all_to_all")
    if "reduce" in st:  # the reduction runs on the decode stream as each round is decoded
        (fd, wd), (fr, wr) = st.pop("decode"), st.pop("reduce")
        st["decode+reduce"] = (fd + fr, wd + wr)
    st = {"host": (ex.round_s, 0.0), **st}
    t = pipelined(list(st.values()), k) if ex.overlap else sum(k * f + w for f, w in st.values())
    return t, k, {name: k * f + w for name, (f, w) in st.items()}


def exchange_time(op: str, nbytes: float, nranks: int, wire: Link, codec: Codec,
                  exchange: Exchange) -> tuple[float, int, dict[str, float]]:
    """(seconds, rounds, stage totals) of zipccl's compressed path for ``op`` on ``nbytes`` per rank.

    Reduce-scatter runs as an all-to-all of frames and a reduction on the decode
    stream; all-reduce as that reduce-scatter of the buffer, then an all-gather of
    one piece, each pipelined on its own, the per-call cost counted once.

    >>> ex = Exchange(fixed_s=1e-3)  # one round
    >>> t, k, st = exchange_time("all_gather", 25e9, 2, Link("w", 25.0), Codec("free", 1e9, 1e9, 0.5), ex)
    >>> round(t, 4), k, list(st)
    (0.501, 1, ['fixed', 'host', 'encode', 'transfer', 'decode'])
    """
    check_op(op)
    p = nranks
    if p <= 1:
        return 0.0, 1, {}
    parts = ([("rs.", "reduce_scatter", nbytes / p), ("ag.", "all_gather", nbytes / p)]
             if op == "all_reduce" else [("", op, nbytes)])
    total, rounds, stages = exchange.fixed_s, 1, {"fixed": exchange.fixed_s}
    for prefix, sub, size in parts:
        t, k, st = _exchange_part(sub, size, p, wire, codec, exchange)
        total, rounds = total + t, max(rounds, k)
        stages |= {prefix + name: v for name, v in st.items()}
    return total, rounds, stages


def predict(op: str, nbytes: int, nranks: int, link: Link, codec: Codec, *,
            chunks: int | None = 1, method: str | None = None, max_chunks: int = 64,
            exchange: Exchange | None = None, wire: Link | None = None) -> Prediction:
    """Native and compressed times of one collective; ``chunks=None`` picks the best chunk count.

    With ``exchange`` the compressed path is zipccl's (``exchange_time``): its frames
    cross ``wire`` (default ``exchange_wire(link)``), its rounds come from the
    exchange, and ``chunks`` and ``method`` are not used.

    >>> p = predict("all_gather", 64 << 20, 2, Link("nvlink", 284.0, 10e-6),
    ...             Codec("dietgpu", 804.0, 1024.0, 0.674))
    >>> p.choice
    'native'
    """
    if exchange is not None:
        wire = exchange_wire(link, nranks) if wire is None else wire
        t, k, stages = exchange_time(op, nbytes, nranks, wire, codec, exchange)
        meth = {"reduce_scatter": "all_to_all", "all_reduce": "rs:all_to_all+ag"}.get(op, "-")
    else:
        k = best_chunks(op, nbytes, nranks, link, codec, max_chunks=max_chunks, method=method) \
            if chunks is None else int(chunks)
        t, meth, stages = _best(op, nbytes, nranks, link, codec, k, method)
    return Prediction(op=op, nbytes=int(nbytes), nranks=nranks, link=link.name, codec=codec.name,
                      native_s=native_time(op, nbytes, nranks, link), compressed_s=t, method=meth,
                      chunks=k, stages=stages, native_stages=native_terms(op, nbytes, nranks, link))


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
