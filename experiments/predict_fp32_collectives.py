"""The cost model's prediction of FP32 collectives on a link, before they are measured.

The newest calibration profile of the link in ``results/collectives.jsonl`` (measured on BF16:
NCCL's fit, the compressed path's fixed costs per call and per round, the reduction's
speed) with its codec replaced by the FP32 codec as measured (``results/dtypes_gpu.jsonl``:
encode_into / decode_into at the largest size, the ratio there) and, to show what a faster
FP32 codec would buy, by the same ratio at the BF16 target speed (2,000 GB/s). No anchoring:
the profile's BF16 compressed measurements do not apply to FP32. One record per (codec, op,
size) goes to ``results/predict_fp32_collectives.jsonl``::

    python experiments/predict_fp32_collectives.py --link shm
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_records  # noqa: E402
from records import RESULTS, load_records  # noqa: E402

from zipccl.comm.policy import Profile  # noqa: E402

MiB = 1 << 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--link", default="shm")
    ap.add_argument("--ops", default="reduce_scatter,all_gather")
    ap.add_argument("--sizes-mib", default="64,256,1024", help="per-rank sizes (metrics convention)")
    ap.add_argument("--out", default=str(RESULTS / "predict_fp32_collectives.jsonl"))
    args = ap.parse_args(argv)
    cal = [r for r in load_records([RESULTS / "collectives.jsonl"])
           if r.get("bench") == "collectives_calibration" and r.get("link") == args.link]
    if not cal:
        raise SystemExit(f"no calibration of link {args.link!r} in collectives.jsonl")
    newest = max(cal, key=lambda r: r["run"])
    prof = Profile.from_json(json.dumps(newest["profile"]))
    gpu = [r for r in load_records([RESULTS / "dtypes_gpu.jsonl"]) if r.get("dtype") == "float32"]
    big = max(r["mib"] for r in gpu)
    enc = next(r for r in gpu if r["mib"] == big and r["variant"] == "encode_into")
    dec = next(r for r in gpu if r["mib"] == big and r["variant"] == "decode_into")
    codecs = {"fp32 codec as measured": dict(prof.codec, encode_gbps=enc["gbps"],
                                             decode_gbps=dec["gbps"], ratio=enc["ratio"]),
              "fp32 ratio at 2,000 GB/s": dict(prof.codec, encode_gbps=2000.0, decode_gbps=2000.0,
                                               ratio=enc["ratio"])}
    recs = []
    for label, codec in codecs.items():
        p = dataclasses.replace(prof, codec=codec, best_of=1,
                                measured={op: {"native": v.get("native", []), "compressed": []}
                                          for op, v in prof.measured.items()})
        for op in [o for o in args.ops.split(",") if o]:
            for mib in [int(s) for s in args.sizes_mib.split(",") if s]:
                nbytes = (prof.world if op == "reduce_scatter" else 1) * mib * MiB  # the policy's size
                pr = p.predict(op, nbytes)
                recs.append({"bench": "predict_fp32_collectives", "link": args.link, "op": op,
                             "per_rank_bytes": mib * MiB, "codec": label, "codec_params": codec,
                             "predicted_native_s": pr.native_s,
                             "predicted_compressed_s": pr.compressed_s,
                             "predicted_speedup": pr.native_s / pr.compressed_s,
                             "profile_run": newest["run"], "fp32_codec_run_mib": big,
                             "machine": newest.get("machine"),
                             "date": datetime.date.today().isoformat()})
                print(f"{args.link} {op:14s} {mib:5d} MiB  {label:26s} native "
                      f"{pr.native_s * 1e3:7.2f} ms  compressed {pr.compressed_s * 1e3:7.2f} ms  "
                      f"{pr.native_s / pr.compressed_s:.3f}x")
    append_records(args.out, recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
