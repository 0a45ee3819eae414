"""Project zipccl's collectives to 2-64 GPUs from the 2-rank measurements (no timing here).

Reads every ``experiments/results/collectives*.jsonl`` (and ``codec_gpu*.jsonl`` where
present) through ``experiments/records.py``, calibrates ``zipccl.scaling`` on the newest
2-rank run of each link, and
writes ``experiments/results/scaling_projection.jsonl``:

- ``inputs``: the files read and what was (not) measured;
- ``link`` (one per transport) and ``codec``: the calibrated parameters;
- ``projection``: predicted native and zipccl times and speed-up for each
  arrangement (``ring`` on each link, ``hierarchical`` = NVLink inside nodes of
  ``--ranks-per-node`` GPUs + the shared-memory transport standing in for the
  network), operation, per-rank size and rank count;
- ``check``: every measured record (any run, any rank count) beside the model's
  prediction for it, with the relative error and whether the fit used it.

    python experiments/project_scaling.py
    python experiments/project_scaling.py --ranks-per-node 4 --out /tmp/scaling.jsonl
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import records  # noqa: E402
from experiments.records import RESULTS  # noqa: E402
from zipccl import scaling  # noqa: E402
from zipccl.costmodel import OPS  # noqa: E402

MiB = 1 << 20


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(RESULTS), help="folder holding collectives*.jsonl")
    ap.add_argument("--out", default=str(RESULTS / "scaling_projection.jsonl"))
    ap.add_argument("--sizes-mib", default="16,64,256,1024", help="per-rank sizes to project")
    ap.add_argument("--ranks", default="2,4,8,16,32,64")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--intra", default="nvlink")
    ap.add_argument("--inter", default="shm")
    ap.add_argument("--codec-variant", default="v2",
                    help="codec_gpu kernel variant the measured collectives used (v2 until the v3 kernels)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    coll = sorted(glob.glob(os.path.join(args.results, "collectives*.jsonl")))
    codec = sorted(glob.glob(os.path.join(args.results, "codec_gpu*.jsonl")))
    recs = records.load_records(coll)
    codec_records = records.load_records(codec)
    cal = records.calibrate(recs, codec_records, codec_variant=args.codec_variant)
    fitted = records.select_latest(recs)
    sizes = [int(float(s) * MiB) for s in args.sizes_mib.split(",") if s]
    ranks = [int(p) for p in args.ranks.split(",") if p]
    proj = scaling.project(cal, sizes=sizes, ranks=ranks, ranks_per_node=args.ranks_per_node,
                           intra=args.intra, inter=args.inter)
    checks = records.check(cal, recs, fitted)
    measured_ranks = sorted({r["nranks"] for r in recs if r.get("bench") == "collectives"})

    head = {"record": "inputs", "files": [os.path.relpath(p, args.results) for p in coll + codec],
            "collectives_records": len(recs), "codec_gpu_records": len(codec_records),
            "measured_ranks": measured_ranks, "calibrated_on": cal.source["machine"],
            "arrangements": {"ring": "p ranks on one flat link (each calibrated transport)",
                             "hierarchical": f"{args.ranks_per_node} ranks per node on {args.intra} "
                                             f"(native), nodes joined by {args.inter} (zipccl "
                                             f"compresses this stage)"},
            "note": "only 2-rank runs exist: every point above 2 ranks is a projection"
            if measured_ranks == [2] else "runs on more than 2 ranks are checked, not fitted"}
    out = [head] + cal.as_records() + [p.as_record() for p in proj] + checks
    with open(args.out, "w") as f:
        for r in out:
            f.write(json.dumps({"bench": "scaling_projection", **r}, sort_keys=True) + "\n")

    c = cal.codec
    print(f"calibrated on {', '.join(cal.source['runs'])}: {cal.source['codec_fit']}: codec encode "
          f"{c.encode_gbps:.0f} / decode {c.decode_gbps:.0f} GB/s, "
          f"reduction {c.reduce_gbps:.0f} GB/s, {1e6 * c.overhead:.0f} us per codec call, "
          f"overlap {cal.overlap:.2f}, {cal.chunks} chunk(s); fit rms error "
          f"{100 * cal.source['fit_rms_rel_err']:.1f}%")
    for name, lk in cal.links.items():
        print(f"  {name}: " + ", ".join(f"{op} {lk.bw(op):.1f} GB/s + {1e6 * lk.lat(op):.0f} us"
                                        for op in OPS) + f"; ratio {cal.ratio[name]:.4f}")
    show = [p for p in ranks if p in (2, 8, 16, 32, 64)]
    print(f"\npredicted speed-up at {sizes[-1] // MiB} MiB per rank, p = {show}")
    by = {(p.arrangement, p.transport, p.op, p.nbytes, p.nranks): p.speedup for p in proj}
    pp = {(p.arrangement, p.transport, p.op, p.nbytes, p.nranks): p.speedup_per_peer for p in proj}
    for arr, tr in sorted({(p.arrangement, p.transport) for p in proj}):
        for op in OPS:
            print(f"  {arr:12s} {tr:11s} {op:14s} "
                  + " ".join(f"{by[k]:5.2f}" if (k := (arr, tr, op, sizes[-1], p)) in by else "    -"
                             for p in show)
                  + "   per-peer calls: "
                  + " ".join(f"{pp[k]:5.2f}" if (k := (arr, tr, op, sizes[-1], p)) in pp else "    -"
                             for p in show))
    bad = [x for x in checks if x["in_fit"] and abs(x["rel_err"]) > 0.15]
    print(f"\n2-rank check: {len(checks)} measured points, {sum(x['in_fit'] for x in checks)} in the fit; "
          f"in-fit points off by more than 15%: {len(bad)}")
    for x in bad:
        print(f"  {x['link']:6s} {x['op']:14s} {x['variant']:6s} {x['per_rank_bytes'] // MiB:5d} MiB "
              f"measured {1e3 * x['measured_s']:.3f} ms, predicted {1e3 * x['predicted_s']:.3f} ms "
              f"({100 * x['rel_err']:+.0f}%)")
    print(f"wrote {len(out)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
