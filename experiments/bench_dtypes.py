"""FP32 and FP16 frames: the FP16 layout choice, ratios on real tensors, GPU throughput.

Three subcommands, each writing JSON-lines records under ``experiments/results/``:

``layouts``  (CPU) the FP16 layouts considered (docs/FORMAT.md), on N(0, sigma^2) cast to
    FP16 at several sigma and on the bundled real checkpoint cast to FP16, against the
    entropy limit of a coder that keeps the 11 sign-mantissa bits raw and codes the
    5-bit exponent alone: 11 + H(exponent) bits per value. Each layout's size is
    counted from the exponent histogram with its best (top-k) codebook: the 3-bit code
    with 7 entries (what the format does: 14 bits + 8 per escape), a 2-bit code with 3
    entries (13 + 8 per escape), a 4-bit code with 15 entries (15 + 8 per escape); the
    3-bit code's real frame (default codebook, all headers and padding) beside them.
    -> ``results/dtypes_fp16_layouts.jsonl``
``ratios``   (CPU) frame sizes of the real checkpoint as FP32 (as stored) and cast to
    FP16, per tensor and in total, with the entropy limits, through ``zipccl.compress``
    with its default codebook; every round trip checked bit for bit.
    -> ``results/dtypes_ratios.jsonl``  (the training run's FP32 gradients and AdamW
    moments: ``capture_training.py --fp32`` -> ``results/dtypes_training_fp32.jsonl``)
``gpu``      (one GPU) FP32 and FP16 throughput at 16 / 256 / 1024 MiB of input, through
    the eager public API (``zipccl.compress`` / ``decompress`` on CuPy arrays, one
    synchronisation each) and ``encode_into`` / ``decode_into`` (no synchronisation,
    plans cached); each buffer is first checked bit for bit against the reference codec
    (frame of its first 1 Mi values) and the input (round trip). GB/s is input bytes / seconds (CUDA events,
    median of the repeats). -> ``results/dtypes_gpu.jsonl``

    python experiments/bench_dtypes.py layouts
    python experiments/bench_dtypes.py ratios
    python experiments/bench_dtypes.py gpu --sizes 16,256,1024
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import zipccl
from zipccl import format as fmt
from zipccl.checkpoints import default_checkpoint, is_floating, iter_tensors
from zipccl.codebook import exponent_entropy, exponent_histogram
from zipccl.metrics import algbw

RESULTS = Path(__file__).resolve().parent / "results"
# the kernels being measured (experiments/kernels/NOTES.md; the wide v2 records of FP32 are
# results/dtypes_gpu_wide_v2.jsonl)
KERNEL = ("FP32: the BF16 tile kernels' FP32 build (encode v5 / decode v4 bodies); "
          "FP16: encode the tile kernel's FP16 build (encode.py), decode on the BF16 decoder's tile "
          "structure, 8 values a lane a round (decode_fp16.py, round 4's v7a)")
SIGMAS = (1e-5, 1e-4, 1e-3, 0.02, 1.0, 100.0)
GAUSS_N = 1 << 20


def _machine_cpu() -> dict:
    import os
    return {"machine": f"{os.cpu_count()}-core CPU dev box", "python": platform.python_version(),
            "numpy": np.__version__, "zipccl": zipccl.__version__}


def fp16_layout_sizes(bits16: np.ndarray) -> dict:
    """Bits per value of each FP16 layout, from the exponent histogram (best top-k codebook)."""
    hist = exponent_histogram(bits16, fmt.DTYPE_FP16)[:32].astype(np.float64)
    p = np.sort(hist / max(1.0, hist.sum()))[::-1]
    ent = exponent_entropy(hist)
    return {"entropy_bits": ent, "limit_bits": 11 + ent,
            "code3_top7_bits": 14 + 8 * (1 - p[:7].sum()),
            "code2_top3_bits": 13 + 8 * (1 - p[:3].sum()),
            "code4_top15_bits": 15 + 8 * (1 - p[:15].sum())}


def _fp16_record(data: str, bits16: np.ndarray, extra: dict) -> dict:
    x = bits16.view(np.float16)
    frame = zipccl.compress(x)
    back = zipccl.decompress(frame)
    if not np.array_equal(back.view(np.uint16), bits16):
        raise AssertionError(f"{data}: FP16 round trip is not bit-exact")
    sizes = fp16_layout_sizes(bits16)
    rec = {"bench": "fp16_layouts", "data": data, "n": int(bits16.size), **extra,
           "codec_ratio": frame.size / (2 * bits16.size), "bit_exact": True}
    rec.update({k.replace("_bits", "_ratio"): v / 16 for k, v in sizes.items()
                if k != "entropy_bits"})
    rec["exponent_entropy_bits"] = sizes["entropy_bits"]
    return rec


def checkpoint_tensors():
    path = default_checkpoint()
    if path is None:
        raise SystemExit("the real checkpoint is not installed (make install)")
    return [(name, np.asarray(a, dtype=np.float32).reshape(-1)) for name, a in iter_tensors(path)
            if is_floating(a)]


def cmd_layouts(args) -> list[dict]:
    rng = np.random.default_rng(0)
    recs = []
    for sigma in SIGMAS:
        bits = rng.normal(0, sigma, GAUSS_N).astype(np.float16).view(np.uint16)
        recs.append(_fp16_record(f"gaussian sigma={sigma:g}", bits, {"sigma": sigma}))
    tensors = checkpoint_tensors()
    allbits = np.concatenate([t.astype(np.float16).view(np.uint16) for _, t in tensors])
    recs.append(_fp16_record("all-MiniLM-L6-v2 as FP16 (all tensors, concatenated)", allbits,
                             {"tensors": len(tensors)}))
    return recs


def cmd_ratios(args) -> list[dict]:
    recs = []
    totals = {"float32": [0, 0], "float16": [0, 0]}
    for name, t in checkpoint_tensors():
        for dt, cast in (("float32", t), ("float16", t.astype(np.float16))):
            frame = zipccl.compress(cast)
            back = zipccl.decompress(frame)
            ok = np.array_equal(back.view(np.uint8), cast.view(np.uint8))
            if not ok:
                raise AssertionError(f"{name} {dt}: round trip is not bit-exact")
            code = fmt.dtype_code(dt)
            ent = exponent_entropy(exponent_histogram(cast.view(np.uint32 if dt == "float32"
                                                                else np.uint16), code))
            keep = 24 if dt == "float32" else 11
            recs.append({"bench": "checkpoint_ratio", "data": "all-MiniLM-L6-v2", "tensor": name,
                         "dtype": dt, "n": int(t.size), "frame_bytes": int(frame.size),
                         "ratio": frame.size / cast.nbytes, "exponent_entropy_bits": ent,
                         "entropy_limit_ratio": (keep + ent) / (8 * cast.itemsize),
                         "bit_exact": True})
            totals[dt][0] += int(frame.size)
            totals[dt][1] += int(cast.nbytes)
    for dt, (fb, ib) in totals.items():
        recs.append({"bench": "checkpoint_ratio_total", "data": "all-MiniLM-L6-v2", "dtype": dt,
                     "frame_bytes": fb, "input_bytes": ib, "ratio": fb / ib})
    return recs


# ---------------------------------------------------------------- GPU


def _timed(cp, stream, fn, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn`` on ``stream`` (CUDA events), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(ts))


def _gpu_case(cp, dt: str, mib: int, stream, args, common: dict) -> list[dict]:
    """Check, then time, one (dtype, size): four variants, one record each."""
    from zipccl.codec import gpu, gpu_codebook, gpu_workspace, reference

    code = fmt.dtype_code(dt)
    item = fmt.ITEMSIZE[code]
    as_bits = np.uint32 if item == 4 else np.uint16
    n = (mib << 20) // item
    x = (cp.random.default_rng(1).standard_normal(n, dtype=cp.float32) * 0.02).astype(dt)
    cp.cuda.Device().synchronize()  # x is written on the legacy stream; ``stream`` does not wait for it
    with stream:
        # correct first: the GPU frame of the first 1 Mi values is the reference codec's, and
        # the whole buffer round-trips bit for bit
        small = x[: min(n, 1 << 20)]
        host = cp.asnumpy(small).view(as_bits)
        f_cpu = reference.encode(host, zipccl.Codebook.from_sample(host, dtype=code), host.shape,
                                 True, dtype=code)
        same_frame = bool(np.array_equal(cp.asnumpy(zipccl.compress(small)), f_cpu))
        frame = zipccl.compress(x)
        bit_exact = bool(cp.array_equal(zipccl.decompress(frame).view(cp.uint8), x.view(cp.uint8)))
        ratio = frame.size / x.nbytes
        cb = gpu_codebook.sample_codebook(x)
        out = cp.empty(fmt.max_compressed_size(n, code), cp.uint8)
        back = cp.empty_like(x)
        ws = gpu_workspace.Workspace(n)
        variants = {
            "compress": lambda: zipccl.compress(x, stream=stream),
            "decompress": lambda: zipccl.decompress(frame, stream=stream),
            "encode_into": lambda: gpu.encode_into(x, out, cb, stream=stream, workspace=ws),
            "decode_into": lambda: gpu.decode_into(out, back, stream=stream, workspace=ws),
        }
        recs = []
        for vname, fn in variants.items():
            t = _timed(cp, stream, fn, args.warmup, args.repeats)
            wrong = 0
            if vname == "decode_into":
                err = ws.last_error(stream)
                wrong = int(cp.count_nonzero(back.view(cp.uint8) != x.view(cp.uint8))) + err
            recs.append({"bench": "dtypes_gpu", **common, "kernel": KERNEL, "dtype": dt, "mib": mib, "n": n,
                         "variant": vname, "seconds": t, "gbps": algbw(x.nbytes, t), "ratio": ratio,
                         "frame_equals_cpu": same_frame, "bit_exact": bit_exact,
                         "wrong_values": wrong, "repeats": args.repeats})
    return recs


def cmd_gpu(args) -> list[dict]:
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    common = {"machine": "an H200", "gpu": name, "cupy": cp.__version__,
              "python": platform.python_version(), "zipccl": zipccl.__version__}
    stream = cp.cuda.Stream(non_blocking=True)
    recs = []
    for dt in args.dtypes.split(","):
        for mib in (int(s) for s in args.sizes.split(",")):
            recs += _gpu_case(cp, dt, mib, stream, args, common)
            cp.get_default_memory_pool().free_all_blocks()
    print(f"{'dtype':8} {'MiB':>5} {'variant':12} {'GB/s':>8} {'ratio':>6} ok", file=sys.stderr)
    for r in recs:
        ok = r["frame_equals_cpu"] and r["bit_exact"] and not r["wrong_values"]
        print(f"{r['dtype']:8} {r['mib']:5d} {r['variant']:12} {r['gbps']:8.0f} {r['ratio']:6.3f} "
              f"{'yes' if ok else 'NO'}", file=sys.stderr)
    return recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("layouts", help="FP16 layout alternatives (CPU)")
    sub.add_parser("ratios", help="checkpoint ratios as FP32 and FP16 (CPU)")
    g = sub.add_parser("gpu", help="GPU throughput")
    g.add_argument("--sizes", default="16,256,1024", help="MiB of input, comma-separated")
    g.add_argument("--dtypes", default="float32,float16")
    g.add_argument("--repeats", type=int, default=10)
    g.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    t0 = time.time()
    recs = {"layouts": cmd_layouts, "ratios": cmd_ratios, "gpu": cmd_gpu}[args.cmd](args)
    out = args.out or RESULTS / {"layouts": "dtypes_fp16_layouts.jsonl", "ratios": "dtypes_ratios.jsonl",
                                 "gpu": "dtypes_gpu.jsonl"}[args.cmd]
    machine = {} if args.cmd == "gpu" else _machine_cpu()
    with open(out, "w") as f:
        for r in recs:
            print(json.dumps({**machine, **r}), file=f)
    print(f"wrote {len(recs)} records to {out} in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
