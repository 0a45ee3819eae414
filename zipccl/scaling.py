"""Scaling projection: the alpha-beta model calibrated on 2-rank measurements, taken to p ranks.

Only 2 x H200 measurements exist, so how zipccl scales beyond 2 GPUs is a model
prediction. This module turns the records of ``experiments/bench_collectives.py``
into the parameters of ``zipccl.costmodel`` and evaluates them for p ranks:

**Calibration** (``calibrate``), from the 2-rank records of each transport:

- the *link* (``fit_link``): NCCL's latency alpha and bus bandwidth B per
  operation, fitted to the native records with ``costmodel.link_from_busbw``
  (median bus bandwidth per size over the records used);
- the *wire* (``wire_link``): compressed frames travel as grouped NCCL
  send/recv (``comm.collectives.compressed_exchange``), i.e. at the link's
  all-to-all alpha and B, whatever the operation;
- the *ratio*: the median wire ratio (frame bytes / BF16 bytes) the compressed
  records report;
- the *codec* (``fit_codec``): one GPU codec for all transports (the codec does not
  know the link): a fixed cost per encode or decode call (``Codec.overhead``:
  launches, header reads, host synchronisations), the encode = decode throughput,
  and the local reduction throughput. ``costmodel.compressed_time`` with one
  chunk is linear in (overhead, 1 / throughput, 1 / reduction throughput), so the
  three are a non-negative least-squares fit of the compressed records'
  times minus the wire time, weighted by 1 / time (relative error). When codec
  throughput was measured on its own (``experiments/bench_codec.py``'s
  ``codec_gpu`` records), that throughput is used instead and the fit finds the
  *overlap* ``phi`` in its place: the fraction of min(transfer, coding) that the
  collective hides, 0 for stages run one after the other;
- the *pipeline*: the chunk count the records name (``chunks`` in the record or
  its config), 1 where they name none (the measured library ran encode,
  transfer and decode one after another).

**Projection**, per operation, per-rank size m (the ``metrics.nccl_tests_size``
convention) and rank count p:

- ``ring``: p ranks on one flat link (``ring_times``): native is
  ``costmodel.native_time``; compressed is ``costmodel.compressed_time`` on the wire
  link with the all-to-all form of reduce-scatter (the one zipccl implements) and
  the calibrated chunks and overlap (``Calibration.zipccl_time``);
- ``hierarchical``: p = N nodes x g ranks per node, intra-node link (NVLink) and
  inter-node link (the shared-memory transport stands in for a ~200 Gb/s
  network, one per GPU) (``hierarchical_times``), the usual two-level
  algorithms: all-gather = inter-node all-gather of m among N, then intra-node
  all-gather of N*m among g; reduce-scatter the reverse; all-reduce =
  intra reduce-scatter, inter all-reduce of m/g among N, intra all-gather; all-to-all
  = intra all-to-all of the buffer, then inter all-to-all among N. zipccl
  compresses the inter-node stage only and leaves the intra-node stages native.

Every prediction is a ``Projection`` with both times and the stage split.

Limits (say them beside any number this produces): the 2-rank fit cannot separate
a fixed cost that grows with the number of peers (zipccl launches one encode and
one decode per peer today) from one that does not; the model charges it once per
codec stage, as a batched launch would, and ``speedup_per_peer`` charges it per
call of today's library (an upper bound on that cost). Links are those measured between 2 GPUs;
an 8-GPU NVSwitch node and a real network may differ.

>>> cal = Calibration.synthetic()
>>> t = ring_times("all_gather", 1 << 30, 2, cal, "shm")
>>> round(t.speedup, 2), ring_times("all_gather", 1 << 30, 64, cal, "shm").speedup > 1.3
(1.32, True)
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from . import costmodel as cm
from .costmodel import OPS
from .metrics import busbw_factor, nccl_tests_size

MiB = 1 << 20


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------

def load_records(paths: Iterable[str]) -> list[dict]:
    """All JSON-lines records of the given files, in file order (blank lines skipped)."""
    out = []
    for path in paths:
        with open(path) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def run_id(rec: Mapping) -> str:
    """A record's run id; the first collectives run wrote none ("" sorts first)."""
    return str(rec.get("run", rec.get("run_id", "")) or "")


def record_chunks(rec: Mapping) -> int:
    """The pipeline chunk count a compressed record names (1 where it names none)."""
    cfg = rec.get("config") or {}
    return int(rec.get("chunks") or cfg.get("chunks") or 1)


def _fittable(recs: list[dict]) -> bool:
    """A run can calibrate a link if its native records cover >= 2 sizes of some op and it
    timed the compressed path (``policy="always"``) too."""
    sizes: dict[str, set] = defaultdict(set)
    for r in recs:
        if r.get("variant") == "nccl":
            sizes[r["op"]].add(int(r["per_rank_bytes"]))
    return any(len(v) >= 2 for v in sizes.values()) and any(r.get("variant") == "always" for r in recs)


def select_latest(records: Iterable[Mapping], nranks: int = 2) -> list[dict]:
    """The ``collectives`` records of ``nranks`` ranks from the newest usable run of each link.

    Runs are per link (one link per process), so each transport is calibrated on
    what the library measured most recently on it. A run that stopped before its
    native records covered two sizes of any operation, or that timed no compressed
    call, cannot be fitted and is passed over for the newest one that can (its
    records are still checked).

    >>> recs = [{"bench": "collectives", "link": "shm", "nranks": 2, "run": r, "variant": v,
    ...          "op": "all_gather", "per_rank_bytes": m}
    ...         for r in ("b", "a") for m in (1, 2) for v in ("nccl", "always")]
    >>> sorted({r["run"] for r in select_latest(recs)})
    ['b']
    >>> recs.append({**recs[0], "run": "c"})  # a newer run with one size only
    >>> sorted({r["run"] for r in select_latest(recs)})
    ['b']
    """
    recs = [dict(r) for r in records if r.get("bench") == "collectives" and r.get("nranks") == nranks]
    by_run: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in recs:
        by_run[(r["link"], run_id(r))].append(r)
    newest: dict[str, str] = {}
    for (link, run), rs in by_run.items():
        if _fittable(rs) and run >= newest.get(link, ""):
            newest[link] = run
    return [r for r in recs if r["link"] in newest and run_id(r) == newest[r["link"]]]


# --------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------

def fit_link(name: str, records: Iterable[Mapping]) -> cm.Link:
    """Native NCCL ``Link`` (alpha, B per op) from the ``variant == "nccl"`` records of one link.

    Several records of one (op, size) are merged by their median bus bandwidth.
    """
    points: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    ranks = set()
    for r in records:
        if r.get("variant") == "nccl" and r["link"] == name:
            points[r["op"]][int(r["per_rank_bytes"])].append(float(r["busbw_gbps"]))
            ranks.add(int(r["nranks"]))
    if not points:
        raise ValueError(f"no native records of link {name!r}")
    if len(ranks) != 1:
        raise ValueError(f"link {name!r}: records of several rank counts {sorted(ranks)}")
    busbw = {op: {m: statistics.median(v) for m, v in by.items()} for op, by in points.items()
             if len(by) >= 2}
    return cm.link_from_busbw(name, busbw, ranks.pop())


def wire_link(link: cm.Link) -> cm.Link:
    """The link compressed frames travel on: grouped send/recv, i.e. the all-to-all fit, for every op."""
    return cm.Link(f"{link.name}:send/recv", link.bw("all_to_all"), link.lat("all_to_all"))


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
        """Round numbers near the 2 x H200 measurements (NVLink 280 GB/s, shm 25 GB/s), for examples."""
        links = {"nvlink": cm.Link("nvlink", 280.0, 30e-6), "shm": cm.Link("shm", 25.0, 40e-6)}
        return Calibration(links, {k: wire_link(v) for k, v in links.items()},
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


def fit_codec_gpu(records: Iterable[Mapping], variant: str = "v2") -> cm.Codec | None:
    """Encode / decode throughput of the library's GPU codec from ``codec_gpu`` records, or None.

    Uses the device-time (``mode == "graph"``) records of ``variant``; each op's
    throughput is the alpha-beta fit's beta over its sizes (the fixed per-call
    part is fitted with the collectives instead).
    """
    pts: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("bench") == "codec_gpu" and r.get("variant") == variant and r.get("mode") == "graph" \
                and r.get("op") in ("encode", "decode"):
            pts[r["op"]][int(r["input_bytes"])].append(float(r["seconds"]))
    if set(pts) != {"encode", "decode"} or min(len(v) for v in pts.values()) < 2:
        return None
    gbps = {}
    for op, by in pts.items():
        sizes = sorted(by)
        gbps[op] = cm.fit_alpha_beta(sizes, [statistics.median(by[s]) for s in sizes])[1]
    return cm.Codec("zipccl", gbps["encode"], gbps["decode"], 0.7)


def fit_codec(records: Iterable[Mapping], wires: Mapping[str, cm.Link], ratio: Mapping[str, float],
              codec_known: cm.Codec | None = None) -> tuple[cm.Codec, float, int, dict]:
    """(codec, overlap, chunks, diagnostics) from compressed (``variant == "always"``) records.

    One codec for every transport. Without ``codec_known`` it fits the per-call
    overhead, the encode = decode throughput and the reduction throughput, with
    overlap 0; with it, the overhead, the overlap and the reduction throughput.
    Non-negative least squares on relative errors (``scipy.optimize.nnls``).
    """
    from scipy.optimize import nnls

    recs = [r for r in records if r.get("variant") == "always" and r.get("compressed", True)
            and r["link"] in wires]
    if len(recs) < 3:
        raise ValueError(f"need at least 3 compressed records to fit the codec, got {len(recs)}")
    chunks = {record_chunks(r) for r in recs}
    if len(chunks) != 1:
        raise ValueError(f"compressed records with several chunk counts {sorted(chunks)}")
    k = chunks.pop()
    rows, ys, ws = [], [], []
    for r in recs:
        base, row = _design_row(r["op"], r["per_rank_bytes"], int(r["nranks"]), wires[r["link"]],
                                ratio[r["link"]], k, codec_known)
        rows.append(row)
        ys.append(float(r["time_s"]) - base)
        ws.append(1.0 / float(r["time_s"]))
    a, y, w = np.array(rows), np.array(ys), np.array(ws)
    x, _ = nnls(a * w[:, None], y * w)
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
            "fit_records": len(recs), "fit_rms_rel_err": float(np.sqrt(np.mean(rel ** 2))),
            "fit_max_abs_rel_err": float(np.max(np.abs(rel)))}
    return codec, overlap, k, diag


def calibrate(records: Iterable[Mapping], codec_records: Iterable[Mapping] = (), *,
              nranks: int = 2, latest: bool = True, codec_variant: str = "v2") -> Calibration:
    """Model parameters from ``collectives`` records (and optional ``codec_gpu`` records).

    With ``latest`` (default) each link is calibrated on its newest run only (the
    library changes between runs); otherwise on every ``nranks``-rank record.
    ``codec_variant`` names the ``codec_gpu`` kernel variant the collectives ran
    with ("v2": the library's kernels when the 2 x H200 collectives were measured).
    """
    recs = select_latest(records, nranks) if latest else \
        [dict(r) for r in records if r.get("bench") == "collectives" and r.get("nranks") == nranks]
    names = sorted({r["link"] for r in recs if r.get("variant") == "nccl"})
    links = {n: fit_link(n, recs) for n in names}
    wires = {n: wire_link(lk) for n, lk in links.items()}
    ratio = {}
    for n in names:
        rs = [float(r["wire_ratio"]) for r in recs if r["link"] == n and r.get("variant") == "always"
              and r.get("wire_ratio")]
        ratio[n] = statistics.median(rs) if rs else math.nan
    have = [n for n in names if not math.isnan(ratio[n])]  # sorted: records come out in one order
    known = fit_codec_gpu(codec_records, codec_variant)
    codec, overlap, chunks, diag = fit_codec(recs, {n: wires[n] for n in have}, ratio, known)
    runs = sorted({f"{r['link']}:{run_id(r) or '(first run)'}" for r in recs})
    return Calibration({n: links[n] for n in have}, {n: wires[n] for n in have}, codec,
                       {n: ratio[n] for n in have}, overlap, chunks,
                       {**diag, "runs": runs, "nranks": nranks,
                        "codec_variant": codec_variant if known is not None else None,
                        "machine": sorted({r.get("machine", "?") for r in recs})})


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
        """native / zipccl time with one encode and one decode call per peer (today's library)."""
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
    """Encode + decode calls of one compressed ``op``: batched (the model) or one per peer (today).

    The model charges the fixed cost once per codec stage: 2 per exchange, 4 for
    all-reduce (two exchanges). The library today encodes and decodes each peer's
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

    Within one node (p <= g) nothing crosses the network: zipccl is native (speed-up 1).

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


def check(cal: Calibration, records: Iterable[Mapping], fitted: Iterable[Mapping] = ()) -> list[dict]:
    """Each measured record beside the model's prediction for it (ring on its link, its rank count).

    ``variant`` "nccl" is compared with the native time, "always" with the compressed
    time, "auto" with whichever path the record says it took. ``in_fit`` marks the
    records the calibration used. rel_err = predicted / measured - 1.
    """
    keys = {(r["link"], run_id(r), r["op"], r["variant"], r["per_rank_bytes"]) for r in fitted
            if r.get("variant") in ("nccl", "always")}
    out = []
    for r in records:
        if r.get("bench") != "collectives" or r["link"] not in cal.links:
            continue
        v, p = r["variant"], int(r["nranks"])
        t = ring_times(r["op"], int(r["per_rank_bytes"]), p, cal, r["link"])
        if v == "nccl":
            pred = t.native_s
        elif v == "always" or (v == "auto" and r.get("compressed")):
            pred = t.compressed_s
        elif v == "auto":
            pred = t.native_s
        else:
            continue
        meas = float(r["time_s"])
        out.append({"record": "check", "link": r["link"], "run": run_id(r) or None, "op": r["op"],
                    "variant": v, "nranks": p, "per_rank_bytes": int(r["per_rank_bytes"]),
                    "measured_s": meas, "predicted_s": pred, "rel_err": pred / meas - 1,
                    "measured_speedup": r.get("speedup_vs_nccl"),
                    "predicted_speedup": t.speedup if v != "nccl" else 1.0,
                    "in_fit": (r["link"], run_id(r), r["op"], v, r["per_rank_bytes"]) in keys})
    return out
