"""Scaling projection: the alpha-beta model calibrated on 2-rank records, taken to p ranks.

``calibrate`` fits the parameters of ``zipccl.costmodel`` to what the records of
``experiments/bench_collectives.py`` measured: each transport's native link, its wire ratio,
and the codec's fixed cost per call, throughput (or, where the codec was timed on its own, the
overlap the pipeline hides) and reduction throughput, by a least-squares fit to the compressed
calls. ``project`` evaluates them for p ranks: ``ring_times`` on one flat link,
``hierarchical_times`` with native intra-node stages and a compressed inter-node stage.
``experiments/records.py`` reads the records and hands this module plain numbers.

A projection is a model, not a measurement: a 2-rank fit cannot tell a fixed cost that grows
with the number of peers from one that does not (``speedup_per_peer`` bounds it), and links
measured between 2 GPUs may differ from an 8-GPU node or a real network. The method and what
the committed projection holds: experiments/README.md, "Scaling projection".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from . import costmodel as cm
from .costfit import fit_alpha_beta
from .costmodel import OPS
from .metrics import busbw_factor, nccl_tests_size

MiB = 1 << 20


# --------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    """Model parameters: a native link and a wire link per transport, one codec, ratio, pipeline.

    ``codec.ratio`` is a placeholder; ``ratio[transport]`` is what each transport's
    records measured. ``overlap`` is the fraction of min(transfer, coding) time the
    compressed path hides (0: serial stages); ``chunks`` the pipeline depth.
    """

    links: Mapping[str, cm.Link]
    wires: Mapping[str, cm.Link]
    codec: cm.Codec
    ratio: Mapping[str, float]
    overlap: float = 0.0
    chunks: int = 1
    source: Mapping = field(default_factory=dict)  # what was fitted from, and how well

    def codec_for(self, transport: str) -> cm.Codec:
        """The codec with ``transport``'s measured wire ratio."""
        return replace(self.codec, ratio=float(self.ratio[transport]))

    def zipccl_time(self, op: str, nbytes: float, nranks: int, transport: str) -> float:
        """zipccl's compressed time for ``op`` on one flat link: ``costmodel.compressed_time`` on
        ``transport``'s wire with its codec, the all-to-all form of reduce-scatter, the calibrated
        chunks and overlap.

        >>> cal = Calibration.synthetic()
        >>> cal.zipccl_time("all_gather", 1 << 30, 2, "shm") == cm.compressed_time(
        ...     "all_gather", 1 << 30, 2, cal.wires["shm"], cal.codec_for("shm"), method="all_to_all")
        True
        """
        if nranks <= 1:
            return 0.0
        return cm.compressed_time(op, int(nbytes), nranks, self.wires[transport], self.codec_for(transport),
                                  chunks=self.chunks, method="all_to_all", overlap=self.overlap)

    @staticmethod
    def synthetic(overhead: float = 0.5e-3, codec_gbps: float = 1500.0, reduce_gbps: float = 800.0,
                  ratio: float = 0.70) -> Calibration:
        """Round numbers of the order of the 2-GPU records (NVLink 280 GB/s, shm 25 GB/s), for examples."""
        links = {"nvlink": cm.Link("nvlink", 280.0, 30e-6), "shm": cm.Link("shm", 25.0, 40e-6)}
        return Calibration(links, {k: cm.sendrecv_wire(v) for k, v in links.items()},
                           cm.Codec("zipccl", codec_gbps, codec_gbps, ratio, overhead, reduce_gbps),
                           {k: ratio for k in links})

    def as_records(self) -> list[dict]:
        """JSON-ready records: one per transport (link, wire, ratio), one for the codec."""
        out = []
        for name, link in self.links.items():
            out.append({"record": "link", "transport": name,
                        "busbw_gbps": {op: link.bw(op) for op in OPS if op in link.per_op},
                        "alpha_us": {op: 1e6 * link.lat(op) for op in OPS if op in link.per_op_latency},
                        "wire": {"busbw_gbps": self.wires[name].bandwidth,
                                 "alpha_us": 1e6 * self.wires[name].latency},
                        "ratio": self.ratio[name]})
        c = self.codec
        out.append({"record": "codec", "encode_gbps": c.encode_gbps, "decode_gbps": c.decode_gbps,
                    "reduce_gbps": None if math.isinf(c.reduce_gbps) else c.reduce_gbps,
                    "overhead_per_call_us": 1e6 * c.overhead, "overlap": self.overlap,
                    "chunks": self.chunks, **dict(self.source)})
        return out


def _compressed_raw(op: str, m: float, p: int, wire: cm.Link, codec: cm.Codec,
                    chunks: int) -> cm.Prediction:
    return cm.predict(op, int(m), p, wire, codec, chunks=chunks, method="all_to_all")


def _design_row(op: str, m: float, p: int, wire: cm.Link, ratio: float, chunks: int,
                codec_known: cm.Codec | None) -> tuple[float, list[float]]:
    """(fixed part, coefficients) of the compressed time, linear in the unknown codec parameters.

    Unknowns: (overhead s, 1/throughput s per GB, 1/reduce s per GB) when the codec
    throughput is unknown; (overhead, phi, 1/reduce) when it is known. Exact because
    ``compressed_time`` with one chunk is a sum of stages.
    """
    inf = math.inf

    def t(enc=inf, red=inf, o=0.0):
        return _compressed_raw(op, m, p, wire, cm.Codec("x", enc, enc, ratio, o, red), chunks).compressed_s

    if chunks != 1:
        raise ValueError("the linear codec fit needs chunks == 1 records")
    base = t()
    c_o, c_r = t(o=1.0) - base, t(red=1.0) - base
    if codec_known is None:
        return base, [c_o, t(enc=1.0) - base, c_r]
    c = replace(codec_known, ratio=ratio, overhead=0.0, reduce_gbps=inf)
    pred = _compressed_raw(op, m, p, wire, c, chunks)
    return pred.compressed_s, [c_o, -cm.hidden_time(pred.stages), c_r]


@dataclass(frozen=True)
class Timed:
    """One measured call of zipccl's compressed path: what the codec fit needs of a record."""

    transport: str
    op: str
    nbytes: int  # per-rank bytes, metrics.nccl_tests_size convention
    nranks: int
    seconds: float


def fit_codec_gpu(encode: Mapping[int, float], decode: Mapping[int, float]) -> cm.Codec | None:
    """Encode / decode throughput of the GPU codec from its device times {input bytes: seconds}.

    Each throughput is the alpha-beta fit's beta over the sizes (the fixed per-call
    part is fitted with the collectives instead); None unless both have >= 2 sizes.

    >>> c = fit_codec_gpu({1e6: 1e-5 + 1e-6, 1e7: 1e-5 + 1e-5}, {1e6: 2e-6, 1e7: 2e-5})
    >>> round(c.encode_gbps, 6), round(c.decode_gbps, 6)
    (1000.0, 500.0)
    """
    if min(len(encode), len(decode)) < 2:
        return None
    gbps = {}
    for op, by in (("encode", encode), ("decode", decode)):
        sizes = sorted(by)
        gbps[op] = fit_alpha_beta(sizes, [by[s] for s in sizes])[1]
    return cm.Codec("zipccl", gbps["encode"], gbps["decode"], 0.7)


FIT_DIGITS = 10  # significant digits kept of what ``fit_codec`` fits


def _settled(v: float) -> float:
    """``v`` to ``FIT_DIGITS`` significant digits.

    The least-squares solution differs in its last bits between machines (BLAS and SIMD
    paths), and so would every record projected from it; the measured times carry three or
    four digits, so ten keep all they say and make a committed projection the same bytes
    wherever it is rebuilt.
    """
    return float(f"{v:.{FIT_DIGITS}g}")


def fit_codec(timed: Sequence[Timed], wires: Mapping[str, cm.Link], ratio: Mapping[str, float],
              codec_known: cm.Codec | None = None, chunks: int = 1) -> tuple[cm.Codec, float, dict]:
    """(codec, overlap, diagnostics) from the compressed path's measured times.

    One codec for every transport. Without ``codec_known`` it fits the per-call
    overhead, the encode = decode throughput and the reduction throughput, with
    overlap 0; with it, the overhead, the overlap and the reduction throughput.
    Non-negative least squares on relative errors (``scipy.optimize.nnls``); the fitted
    values and the diagnostics are kept to ``FIT_DIGITS`` significant digits.
    """
    from scipy.optimize import nnls

    if len(timed) < 3:
        raise ValueError(f"need at least 3 compressed records to fit the codec, got {len(timed)}")
    rows, ys, ws = [], [], []
    for t in timed:
        base, row = _design_row(t.op, t.nbytes, t.nranks, wires[t.transport], ratio[t.transport], chunks,
                                codec_known)
        rows.append(row)
        ys.append(float(t.seconds) - base)
        ws.append(1.0 / float(t.seconds))
    a, y, w = np.array(rows), np.array(ys), np.array(ws)
    x = np.array([_settled(float(v)) for v in nnls(a * w[:, None], y * w)[0]])
    o, second, inv_red = (float(v) for v in x)
    red = math.inf if inv_red == 0 else 1.0 / inv_red
    if codec_known is None:
        if second == 0:
            raise ValueError("the compressed times do not grow with the coded bytes")
        codec = cm.Codec("zipccl", 1.0 / second, 1.0 / second, 0.7, o, red)
        overlap = 0.0
    else:
        codec = replace(codec_known, overhead=o, reduce_gbps=red)
        overlap = min(1.0, second)
    rel = (a @ x - y) * w  # predicted / measured - 1
    diag = {"codec_fit": "overhead, throughput, reduction" if codec_known is None
            else "overhead, overlap, reduction (throughput from codec_gpu records)",
            "fit_records": len(timed), "fit_rms_rel_err": _settled(float(np.sqrt(np.mean(rel ** 2)))),
            "fit_max_abs_rel_err": _settled(float(np.max(np.abs(rel))))}
    return codec, overlap, diag


def calibrate(links: Mapping[str, cm.Link], ratio: Mapping[str, float], timed: Sequence[Timed], *,
              chunks: int = 1, codec_known: cm.Codec | None = None,
              source: Mapping | None = None) -> Calibration:
    """Model parameters from each transport's native ``Link``, its wire ratio, and the compressed
    path's measured times (``fit_codec``); ``source`` says what they were read from.

    Compressed frames travel as grouped send/recv (``comm.exchange.slot_exchange``), so each
    transport's wire is ``costmodel.sendrecv_wire`` of its link: the link's all-to-all latency
    and bandwidth, whatever the operation. ``chunks``: the pipeline depth the records name (1:
    encode, transfer and decode one after another). ``experiments/records.py`` reads all of
    these from the benchmarks' records.

    >>> truth = Calibration.synthetic()
    >>> timed = [Timed(t, op, m, 2, truth.zipccl_time(op, m, 2, t))
    ...          for t in truth.links for op in OPS for m in (16 * MiB, 256 * MiB)]
    >>> cal = calibrate(truth.links, truth.ratio, timed)
    >>> round(cal.codec.encode_gbps), round(cal.codec.overhead * 1e6), round(cal.codec.reduce_gbps)
    (1500, 500, 800)
    """
    wires = {n: cm.sendrecv_wire(lk) for n, lk in links.items()}
    codec, overlap, diag = fit_codec(timed, wires, ratio, codec_known, chunks)
    return Calibration(dict(links), wires, codec, dict(ratio), overlap, chunks, {**diag, **(source or {})})


# --------------------------------------------------------------------------------------------
# Projection
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Projection:
    """Predicted native and zipccl times of one collective in one arrangement."""

    arrangement: str  # "ring" or "hierarchical"
    transport: str  # the link ("shm"), or "intra+inter" ("nvlink+shm")
    op: str
    nbytes: int  # per-rank bytes, metrics.nccl_tests_size convention
    nranks: int
    ranks_per_node: int | None
    native_s: float
    compressed_s: float
    stages: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # name: (native, zipccl)
    per_peer_extra_s: float = 0.0  # fixed costs a per-peer launch adds (see ``per_peer_extra``)

    @property
    def speedup(self) -> float:
        """native / zipccl time."""
        return self.native_s / self.compressed_s if self.compressed_s > 0 else 1.0

    @property
    def speedup_per_peer(self) -> float:
        """native / zipccl time with one encode and one decode call per peer (as the library's
        slot exchange codes each frame)."""
        t = self.compressed_s + self.per_peer_extra_s
        return self.native_s / t if t > 0 else 1.0

    @property
    def auto_s(self) -> float:
        """The time of a policy that picks the faster path for each stage."""
        return sum(min(a, b) for a, b in self.stages.values()) if self.stages else \
            min(self.native_s, self.compressed_s)

    @property
    def speedup_auto(self) -> float:
        """native / ``auto_s`` (never below 1: the policy can always stay native)."""
        return self.native_s / self.auto_s if self.auto_s > 0 else 1.0

    def as_record(self) -> dict:
        """JSON-ready dict (times in seconds, bus bandwidths on uncompressed bytes)."""
        p, size = self.nranks, nccl_tests_size(self.op, self.nbytes, self.nranks)
        f = busbw_factor(self.op, p)
        return {"record": "projection", "arrangement": self.arrangement, "transport": self.transport,
                "ranks_per_node": self.ranks_per_node, "op": self.op, "per_rank_bytes": self.nbytes,
                "nranks": p, "native_s": self.native_s, "compressed_s": self.compressed_s,
                "speedup": self.speedup, "auto_s": self.auto_s, "speedup_auto": self.speedup_auto,
                "compressed_per_peer_s": self.compressed_s + self.per_peer_extra_s,
                "speedup_per_peer": self.speedup_per_peer,
                "native_busbw_gbps": size * f / self.native_s / 1e9 if self.native_s else None,
                "compressed_busbw_gbps": size * f / self.compressed_s / 1e9 if self.compressed_s else None,
                "stages": {k: {"native_s": a, "zipccl_s": b} for k, (a, b) in self.stages.items()}}


def codec_calls(op: str, nranks: int, per_peer: bool) -> int:
    """Encode + decode calls of one compressed ``op``: batched (the model) or one per peer (the library).

    The model charges the fixed cost once per codec stage: 2 per exchange, 4 for
    all-reduce (two exchanges). The library's slot exchange encodes and decodes each peer's
    frame with its own call (an all-gather encodes once): more calls from 3 ranks on.

    >>> [codec_calls(op, 2, True) == codec_calls(op, 2, False) for op in OPS]
    [True, True, True, True]
    >>> codec_calls("all_to_all", 64, True), codec_calls("all_to_all", 64, False)
    (126, 2)
    """
    if nranks <= 1:
        return 0
    if not per_peer:
        return 4 if op == "all_reduce" else 2
    peers = nranks - 1
    return {"all_gather": 1 + peers, "all_to_all": 2 * peers, "reduce_scatter": 2 * peers,
            "all_reduce": 2 * peers + 1 + peers}[op]


def per_peer_extra(op: str, nranks: int, cal: Calibration) -> float:
    """Seconds a per-peer launch adds to the model's compressed time (0 at 2 ranks).

    An upper bound: the fitted per-call cost also holds per-exchange host
    synchronisations, which do not multiply with the peers.
    """
    return (codec_calls(op, nranks, True) - codec_calls(op, nranks, False)) * cal.codec.overhead


def ring_times(op: str, nbytes: int, nranks: int, cal: Calibration, transport: str) -> Projection:
    """p ranks on one flat link: NCCL's ring (native) and zipccl's compressed exchange.

    >>> cal = Calibration.synthetic()
    >>> t = ring_times("all_gather", 1 << 30, 2, cal, "shm")
    >>> round(t.speedup, 2), ring_times("all_gather", 1 << 30, 64, cal, "shm").speedup > 1.3
    (1.32, True)
    >>> t = ring_times("all_to_all", 256 << 20, 8, Calibration.synthetic(), "nvlink")
    >>> t.speedup < 1  # NVLink is faster than the codec's fixed costs and passes can pay for
    True
    """
    nat = cm.native_time(op, nbytes, nranks, cal.links[transport])
    comp = cal.zipccl_time(op, nbytes, nranks, transport)
    return Projection("ring", transport, op, int(nbytes), nranks, None, nat, comp,
                      {op: (nat, comp)}, per_peer_extra(op, nranks, cal))


def hierarchical_stages(op: str, nbytes: float, nranks: int, ranks_per_node: int
                        ) -> list[tuple[str, str, float, int]]:
    """The two-level algorithm as (level, op, per-rank bytes, ranks) stages ("intra" / "inter").

    >>> hierarchical_stages("all_reduce", 64, 16, 8)
    [('intra', 'reduce_scatter', 8.0, 8), ('inter', 'all_reduce', 8.0, 2), ('intra', 'all_gather', 8.0, 8)]
    """
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}")
    g = min(ranks_per_node, nranks)
    if nranks % g:
        raise ValueError(f"{nranks} ranks are not whole nodes of {ranks_per_node}")
    n = nranks // g
    m = float(nbytes)
    if n == 1:  # one node: the op itself, on the intra-node link
        return [("intra", op, m, g)] if g > 1 else []
    if op == "all_gather":
        st = [("inter", "all_gather", m, n), ("intra", "all_gather", n * m, g)]
    elif op == "reduce_scatter":
        st = [("intra", "reduce_scatter", n * m, g), ("inter", "reduce_scatter", m, n)]
    elif op == "all_to_all":
        st = [("intra", "all_to_all", m, g), ("inter", "all_to_all", m, n)]
    else:
        st = [("intra", "reduce_scatter", m / g, g), ("inter", "all_reduce", m / g, n),
              ("intra", "all_gather", m / g, g)]
    return [s for s in st if s[3] > 1]


def hierarchical_times(op: str, nbytes: int, nranks: int, cal: Calibration, *, intra: str = "nvlink",
                       inter: str = "shm", ranks_per_node: int = 8) -> Projection:
    """p = N x g ranks: intra-node stages native on ``intra``, inter-node stage compressed on ``inter``.

    The usual two-level algorithms (``hierarchical_stages``): all-gather = inter-node all-gather
    of m among N, then intra-node all-gather of N*m among g; reduce-scatter the reverse;
    all-reduce = intra reduce-scatter, inter all-reduce of m/g among N, intra all-gather;
    all-to-all = intra all-to-all, then inter all-to-all among N. Within one node (p <= g)
    nothing crosses the network: zipccl is native (speed-up 1).

    >>> cal = Calibration.synthetic()
    >>> hierarchical_times("all_gather", 1 << 30, 8, cal).speedup
    1.0
    >>> 1.0 < hierarchical_times("all_gather", 1 << 30, 64, cal).speedup < 1 / 0.7
    True
    """
    stages, nat, comp, extra = {}, 0.0, 0.0, 0.0
    for i, (level, sop, m, k) in enumerate(hierarchical_stages(op, nbytes, nranks, ranks_per_node)):
        t_nat = cm.native_time(sop, m, k, cal.links[intra if level == "intra" else inter])
        t_z = cal.zipccl_time(sop, m, k, inter) if level == "inter" else t_nat
        stages[f"{i}.{level}.{sop}"] = (t_nat, t_z)
        nat, comp = nat + t_nat, comp + t_z
        extra += per_peer_extra(sop, k, cal) if level == "inter" else 0.0
    return Projection("hierarchical", f"{intra}+{inter}", op, int(nbytes), nranks,
                      ranks_per_node, nat, comp, stages, extra)


def project(cal: Calibration, *, ops: Sequence[str] = OPS, sizes: Sequence[int] = (16 * MiB, 64 * MiB,
            256 * MiB, 1024 * MiB), ranks: Sequence[int] = (2, 4, 8, 16, 32, 64), ranks_per_node: int = 8,
            intra: str = "nvlink", inter: str = "shm") -> list[Projection]:
    """Every (arrangement, transport, op, size, p): rings on each calibrated link, and hierarchical.

    A ring on the ``intra`` link stops at ``ranks_per_node`` ranks: an NVLink domain
    is one node, measured between 2 GPUs.
    """
    out = []
    for op in ops:
        for m in sizes:
            for p in ranks:
                out += [ring_times(op, m, p, cal, t) for t in cal.links
                        if t != intra or p <= ranks_per_node]
                if intra in cal.links and inter in cal.links:
                    out.append(hierarchical_times(op, m, p, cal, intra=intra, inter=inter,
                                                  ranks_per_node=ranks_per_node))
    return out
