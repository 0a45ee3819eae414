"""Reading the committed results: the benchmarks' JSON-lines records, as the model needs them.

The library's models (``zipccl.costmodel``, ``zipccl.scaling``) take plain numbers;
this module knows the records' fields and which run of each link counts, and
turns ``experiments/results/*.jsonl`` into those numbers. The projection
(``project_scaling.py``), the figures and the theory notebooks read records
through it. Scripts outside ``experiments/`` put the repository root on
``sys.path`` and ``from experiments import records``.

- ``collectives.jsonl`` (``bench_collectives.py``): per call, ``bench`` "collectives",
  ``link``, ``run``, ``op``, ``variant`` ("nccl": NCCL alone; "always" / "auto":
  through zipccl), ``per_rank_bytes``, ``nranks``, ``time_s``, ``busbw_gbps``,
  ``wire_ratio``; ``select_latest`` picks each link's newest usable run;
  ``nccl_link`` fits NCCL's alpha and bus bandwidth to its "nccl" records;
- ``codec_gpu*.jsonl`` (``bench_codec.py``): the library's GPU codec alone;
- ``codec_peers.jsonl`` (``bench_peers.py``): zipccl, DietGPU and nvCOMP timed in one run on
  the same buffers (``peer_codec``); ``codec_gpu_baselines.jsonl``: the figures quoted for
  DietGPU and nvCOMP before this project ran them (kept for the codec figure's history).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from zipccl import costfit as cf
from zipccl import costmodel as cm
from zipccl import scaling as sc

RESULTS = Path(__file__).resolve().parent / "results"


def load_records(paths: Iterable[str | Path]) -> list[dict]:
    """All JSON-lines records of the given files, in file order (blank lines skipped)."""
    out = []
    for path in paths:
        with open(path) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def run_id(rec: Mapping) -> str:
    """A record's run id; the first collectives run wrote none ("" sorts first).

    >>> run_id({"run": "2026-11-30T21:23:07"}), run_id({"run_id": "x"}), run_id({})
    ('2026-11-30T21:23:07', 'x', '')
    """
    return str(rec.get("run", rec.get("run_id", "")) or "")


def record_chunks(rec: Mapping) -> int:
    """The pipeline chunk count a compressed record names (1 where it names none).

    >>> record_chunks({"config": {"chunks": 4}}), record_chunks({})
    (4, 1)
    """
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


def nccl_busbw(records: Iterable[Mapping], link: str, min_bytes: int = 0
               ) -> tuple[int, dict[str, dict[int, float]]]:
    """(ranks, {op: {per-rank bytes: GB/s}}): NCCL's bus bandwidth in the ``variant == "nccl"``
    records of ``link``, the median of the records of each size, sizes >= ``min_bytes``,
    operations measured at >= 2 sizes.

    >>> recs = [{"variant": "nccl", "link": "shm", "op": "all_gather", "nranks": 2,
    ...          "per_rank_bytes": m, "busbw_gbps": g} for m, g in ((1, 20.0), (2, 24.0), (2, 25.0))]
    >>> nccl_busbw(recs, "shm")
    (2, {'all_gather': {1: 20.0, 2: 24.5}})
    """
    points: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    ranks = set()
    for r in records:
        if r.get("variant") == "nccl" and r["link"] == link and int(r["per_rank_bytes"]) >= min_bytes:
            points[r["op"]][int(r["per_rank_bytes"])].append(float(r["busbw_gbps"]))
            ranks.add(int(r["nranks"]))
    if not points:
        raise ValueError(f"no native records of link {link!r}")
    if len(ranks) != 1:
        raise ValueError(f"link {link!r}: records of several rank counts {sorted(ranks)}")
    busbw = {op: {m: statistics.median(v) for m, v in by.items()} for op, by in points.items()
             if len(by) >= 2}
    return ranks.pop(), busbw


def nccl_link(records: Iterable[Mapping], link: str, min_bytes: int = 0) -> cm.Link:
    """NCCL's ``Link`` (alpha and B per op) fitted to ``nccl_busbw(records, link, min_bytes)``."""
    nranks, busbw = nccl_busbw(records, link, min_bytes)
    return cf.link_from_busbw(link, busbw, nranks)


def codec_gpu_seconds(records: Iterable[Mapping], variant: str = "v2"
                      ) -> tuple[dict[int, float], dict[int, float]]:
    """(encode, decode) device seconds {input bytes: median} of ``variant``'s ``codec_gpu`` records
    (``mode == "graph"``: device time); ``zipccl.scaling.fit_codec_gpu`` takes them."""
    pts: dict[str, dict[int, list[float]]] = {"encode": defaultdict(list), "decode": defaultdict(list)}
    for r in records:
        if r.get("bench") == "codec_gpu" and r.get("variant") == variant and r.get("mode") == "graph" \
                and r.get("op") in pts:
            pts[r["op"]][int(r["input_bytes"])].append(float(r["seconds"]))
    enc, dec = ({b: statistics.median(v) for b, v in pts[op].items()} for op in ("encode", "decode"))
    return enc, dec


def calibrate(records: Iterable[Mapping], codec_records: Iterable[Mapping] = (), *,
              nranks: int = 2, latest: bool = True, codec_variant: str = "v2") -> sc.Calibration:
    """``zipccl.scaling.calibrate`` on ``collectives`` records (and optional ``codec_gpu`` records).

    With ``latest`` (default) each link is calibrated on its newest run only (the
    library changes between runs); otherwise on every ``nranks``-rank record.
    ``codec_variant`` names the ``codec_gpu`` kernel variant the collectives ran
    with ("v2": the library's kernels when the 2 x H200 collectives were measured).
    """
    recs = select_latest(records, nranks) if latest else \
        [dict(r) for r in records if r.get("bench") == "collectives" and r.get("nranks") == nranks]
    names = sorted({r["link"] for r in recs if r.get("variant") == "nccl"})
    ratio = {}
    for n in names:
        rs = [float(r["wire_ratio"]) for r in recs if r["link"] == n and r.get("variant") == "always"
              and r.get("wire_ratio")]
        ratio[n] = statistics.median(rs) if rs else math.nan
    have = [n for n in names if not math.isnan(ratio[n])]  # sorted: records come out in one order
    links = {n: nccl_link(recs, n) for n in have}
    comp = [r for r in recs if r.get("variant") == "always" and r.get("compressed", True)
            and r["link"] in links]
    chunks = {record_chunks(r) for r in comp}
    if len(chunks) > 1:
        raise ValueError(f"compressed records with several chunk counts {sorted(chunks)}")
    timed = [sc.Timed(r["link"], r["op"], r["per_rank_bytes"], int(r["nranks"]), float(r["time_s"]))
             for r in comp]
    known = sc.fit_codec_gpu(*codec_gpu_seconds(codec_records, codec_variant))
    runs = sorted({f"{r['link']}:{run_id(r) or '(first run)'}" for r in recs})
    return sc.calibrate(links, {n: ratio[n] for n in have}, timed, chunks=chunks.pop() if chunks else 1,
                        codec_known=known,
                        source={"runs": runs, "nranks": nranks,
                                "codec_variant": codec_variant if known is not None else None,
                                "machine": sorted({r.get("machine", "?") for r in recs})})


def check(cal: sc.Calibration, records: Iterable[Mapping], fitted: Iterable[Mapping] = ()) -> list[dict]:
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
        t = sc.ring_times(r["op"], int(r["per_rank_bytes"]), p, cal, r["link"])
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


def peer_codec(records: Iterable[Mapping], codec: str, nbytes: int | None = None, *,
               data: str = "gaussian", mode: str = "eager", name: str | None = None,
               reduce_gbps: float = math.inf) -> cm.Codec:
    """A codec of ``bench_peers.py``'s records (``results/codec_peers.jsonl``) as a
    ``costmodel.Codec``: from the newest run that has ``codec`` (its ``codec`` field: "dietgpu",
    "nvcomp-ans", "zipccl", ...) on ``data``, its compress / decompress GB/s in ``mode`` and its
    ratio at the measured size nearest ``nbytes`` (default: the largest).

    >>> recs = [{"bench": "codec_peers", "run_id": "r1", "codec": "dietgpu", "data": "gaussian",
    ...          "mode": "eager", "op": op, "size_mib": s, "gbps": g, "ratio": 0.674}
    ...         for s, op, g in ((16, "compress", 324), (16, "decompress", 274),
    ...                          (256, "compress", 788), (256, "decompress", 971))]
    >>> c = peer_codec(recs, "dietgpu", 200 << 20)
    >>> c.name, c.encode_gbps, c.decode_gbps, c.ratio
    ('dietgpu', 788.0, 971.0, 0.674)
    """
    rows = [r for r in records if r.get("bench") == "codec_peers" and r.get("codec") == codec
            and r.get("data") == data and r.get("mode") == mode]
    if not rows:
        raise ValueError(f"no codec_peers record of {codec!r} on {data!r} data ({mode})")
    newest = max(str(r.get("run_id")) for r in rows)
    by_size: dict[int, dict] = defaultdict(dict)
    for r in rows:
        if str(r.get("run_id")) == newest:
            by_size[int(float(r["size_mib"]) * (1 << 20))][r["op"]] = r
    sizes = [s for s, ops in by_size.items() if {"compress", "decompress"} <= set(ops)]
    size = max(sizes) if nbytes is None else min(sizes, key=lambda s: abs(math.log(s / nbytes)))
    enc, dec = by_size[size]["compress"], by_size[size]["decompress"]
    return cm.Codec(name or codec, float(enc["gbps"]), float(dec["gbps"]), float(enc["ratio"]),
                    reduce_gbps=reduce_gbps)
