"""The alpha-beta cost model: when does compressing a collective pay?

One model shared by the theory notebook (``theory/03_when_compression_pays.ipynb``), the
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

The same model, given an ``Exchange``, predicts zipccl's own compressed path as
``zipccl.comm.collectives`` runs it and as ``Communicator.calibrate`` measures it:
a fixed cost per call, then rounds of one chunk each whose stages (host work
per round, encode, transfer on a ``wire`` link, decode with any reduction on the
decode stream) overlap. The adaptive policy (``zipccl.comm.policy``) uses it, with the
per-call cost fitted to calibration calls (``fit_exchange``) and each path scaled to the
nearest steady measurement (``anchored``).

The module holds no measured numbers: links and codecs are fitted to (``link_from_busbw``,
``link_from_fits``, ``fit_alpha_beta``) or built from the project's committed records
(``experiments/records.py`` reads them: ``nccl_link``, ``baseline_codec``).

>>> link = Link("shm", bandwidth=25.0, latency=20e-6)
>>> codec = Codec("zipccl", encode_gbps=2000.0, decode_gbps=2000.0, ratio=0.70)
>>> p = predict("all_gather", 64 << 20, 2, link, codec)
>>> round(p.speedup, 2), p.choice
(1.38, 'compressed')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .metrics import OPS, busbw_factor, nccl_tests_size

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
    _check_op(op)
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
    _check_op(op)
    if nranks <= 1:
        return {"latency": 0.0, "bandwidth": 0.0}
    steps, factor = ring_terms(op, nranks)
    return {"latency": steps * link.lat(op), "bandwidth": factor * float(nbytes) / (link.bw(op) * GB)}


def native_time(op: str, nbytes: float, nranks: int, link: Link) -> float:
    """Seconds for the uncompressed ring collective (see the module docstring).

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
    _check_op(op)
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
