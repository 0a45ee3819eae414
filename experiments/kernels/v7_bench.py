"""Check, then time, round 4's variant v7b beside the library on one GPU, and the library's
BF16, FP32 and FP16 decoders.

* **FP16 decode**, the library's (``decode_fp16.decode_tiles16``, round 4's v7a; before its
  promotion v7a was timed here beside the one-value-per-lane decoder, ``262b87a^``): at each
  size N(0, 0.02²) FP16 data on the device, the library's frames (``encode_into``; the first
  checked byte for byte against the reference's up to 8 Mi values, the CPU codec's above); the
  decoder must give every timed buffer set back bit for bit with no error bits before it is
  timed.
* **v7b** (``v7b_encode32.py``, FP32 encode with two tiles a ticket), built as the library's FP32
  encoder is (8 blocks, all loads of a tile first) and two other ways (``V7B``): the library's
  FP32 frames checked against the reference's / CPU codec's first, then every v7b build's frame
  equal to the library's on every timed buffer set.
* v7c, the warp-a-tile BF16 / FP32 decoder, is the library's ``kernels/decode_warps.py`` since
  run 2; v7c and v7d (which lost) are in git at 5fd435a (``experiments/kernels/v7c_decode.py``,
  ``v7d_decode.py``).

Beside the library's decoders as called (``decode_into``, which picks one by size), its two
BF16 / FP32 decoders are timed forced (``decode.Plan(..., warps=False / True)``: the block
decoder, the warp-a-tile decoder of ``kernels/decode_warps.py``), on N(0, 0.02²) data
(``harness.gaussian_bits`` on the device; the library's first frame compared with the
reference's / CPU codec's: if it differs that is said and recorded, and the decoders are still
checked against the input bits). ``--skip fp16 v7b`` leaves out the FP16 decoders and the v7b
encoders.

"All results match, starting benchmarks": a variant that fails a check is reported and not
timed. Then device time per call: a replayed CUDA graph (median of ``--repeats``) and eager
(CUDA events around enqueued calls) for the library and the variants alike (the variants'
launches go through the library's lean route, ``plan.Step``, so eager compares like with like).
GB/s are of input (FP16 decode: the decoded bytes; FP32 encode: the FP32 bytes). One JSON record
per timing to ``--out`` (``harness.append_records``), naming the GPU (``card``: "an H200"); a
short table last (``--table`` prints it again from the saved records)::

    python experiments/kernels/v7_bench.py --sizes-mib 16 256 1024
    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v7_bench.py --check-only --sizes-k 2 9
    python experiments/kernels/v7_bench.py --table --since 20261202T000000

``--check-only`` needs no GPU: it runs both variants' simulator checks (the same as
``tests/test_kernel_variants_sim.py``). ``v6_round.sh`` runs this after the v6 bench.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import append_records  # noqa: E402

MiB = 1 << 20
RESULTS = HERE.parent / "results" / "kernel_variants_v7.jsonl"
# the library's decoders forced (decode.Plan's warps): the block decoder, the warp-a-tile one
LIBRARY_PATHS = {"library block decoder": False, "library warp decoder": True}
V7B = {"v7b encode (pairs, 8 blocks, ahead 4)": (8, 4), "v7b encode (pairs, 8 blocks, ahead 1)": (8, 1),
       "v7b encode (pairs, 6 blocks, ahead 4)": (6, 4)}


def table(paths, since: str) -> None:
    """Every timing of the kernel-variant records in ``paths`` from run ``since`` on: one row per
    (tree, type, mode, kernel), one column per size, GB/s of input."""
    recs = []
    for p in paths:
        if Path(p).exists():
            recs += [json.loads(line) for line in open(p) if line.strip()]
    recs = [r for r in recs if str(r.get("bench", "")).startswith("kernel_variants_v")
            and r.get("run_id", "") >= since]
    sizes = sorted({r["size_mib"] for r in recs})
    cards = sorted({r.get("card", r.get("gpu", "?")) for r in recs})
    print(f"{'tree':>4} {'type':>4} {'mode':>5} {'kernel':>38} " + " ".join(f"{m:>7g}" for m in sizes)
          + f"  GB/s of input ({', '.join(cards)})")

    def key(r):
        return r.get("tree", "tree"), r.get("dtype", "bf16"), r["mode"], r["variant"]

    for k in dict.fromkeys(key(r) for r in recs):
        got = {r["size_mib"]: r["gbps"] for r in recs if key(r) == k}
        print(f"{k[0]:>4} {k[1]:>4} {k[2]:>5} {k[3][:38]:>38} "
              + " ".join(f"{got.get(m, float('nan')):7.0f}" for m in sizes))


def check_only(sizes_k) -> int:
    """The variants' simulator checks (NUMBA_ENABLE_CUDASIM=1)."""
    import v6_sim
    import v7b_encode32

    return v6_sim.sim_main(v7b_encode32.check_sim, __doc__, ["--sizes-k", *map(str, sizes_k)])


def warp_build_plan(plan, fp32: bool, bps: int, wave: str, n_blocks: int):
    """``plan`` (a library decode plan with the warp decoder) with its tile step's kernel
    replaced by the warp decoder built with ``bps`` resident blocks per multiprocessor and its
    first tiles by warp number (``wave`` "static") or all from the counter ("tickets")."""
    from zipccl.kernels import _common, decode_warps, launch
    from zipccl.kernels import plan as plans

    kern = launch.Kernel(decode_warps._tiles_kernel(fp32, bps, first_wave=wave == "static"),
                         (decode_warps.TILES32 if fp32 else decode_warps.TILES).argtypes)
    old = plan.steps[1]
    step = plans.Step.__new__(plans.Step)
    step.function = kern.function(plan.device)
    step.grid = _common.grid_size(-(-n_blocks // _common.WARPS), bps)
    step.params, step.first, step.second = old.params, old.first, old.second
    plan.steps = (plan.steps[0], step, *plan.steps[2:])
    return plan


def _commit() -> str | None:
    """The commit of the tree that runs: ``ZIPCCL_COMMIT`` where the caller names it (a copied
    tree's git metadata may be another's), else git's HEAD."""
    import os

    if os.environ.get("ZIPCCL_COMMIT"):
        return os.environ["ZIPCCL_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--label", default="tree")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--check-only", action="store_true", help="the simulator checks of the variants")
    ap.add_argument("--sizes-k", type=float, nargs="+", default=[2, 9], help="--check-only: Ki values")
    ap.add_argument("--skip", nargs="+", default=[], choices=["fp16", "v7b"],
                    help="sections not to run: the FP16 decoders, the v7b encoders")
    ap.add_argument("--warp-builds", nargs="+", default=[],
                    help="TYPE:BLOCKS:WAVE builds of the warp decoder to time too, e.g. bf16:6:static "
                         "fp32:6:tickets")
    ap.add_argument("--table", action="store_true", help="print the table of saved records and stop")
    ap.add_argument("--since", default="", help="--table: first run_id to show")
    ap.add_argument("--files", type=Path, nargs="+", default=[RESULTS.with_name("kernel_variants_v6.jsonl"),
                                                               RESULTS])
    args = ap.parse_args(argv)
    if args.table:
        table(args.files, args.since)
        return 0
    if args.check_only:
        return check_only(args.sizes_k)

    import cupy as cp

    import zipccl

    zipccl_dir = str(Path(zipccl.__file__).parent)  # before bench_codec, which puts the checkout first
    import v6_bench
    import v7b_encode32 as v7b
    from bench_codec import Timer, machine_info

    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import cpu, gpu, gpu_workspace, reference
    from zipccl.kernels import _common, decode, decode_fp16, runtime
    from zipccl.kernels.launch import device_pointer

    fp32 = fmt.DTYPE_FP32
    cb16 = Codebook.from_sigma(0.02, dtype="float16")
    cb32 = Codebook.from_sigma(0.02)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    timer = Timer(cp, stream, args.repeats)
    crc = runtime.crc_table()
    crc_ptr = device_pointer(crc)
    dev = cp.cuda.Device().id
    info = machine_info(cp)
    common = {"bench": "kernel_variants_v7", "run_id": time.strftime("%Y%m%dT%H%M%S"), **info,
              "card": "an H200" if "H200" in info["gpu"] else info["gpu"], "tree": args.label,
              "zipccl": zipccl.__version__, "zipccl_path": zipccl_dir, "commit": _commit()}
    print(f"zipccl from {zipccl_dir}; {common['card']}", flush=True)
    recs = []

    def timed(name, dtype, op, calls, mib, n, nbytes, sets, iters, ratio, checked, **build):
        base = {**common, "variant": name, "dtype": dtype, "op": op, "size_mib": mib, "n": n,
                "input_bytes": nbytes, "buffer_sets": sets, "ratio": ratio, "checked": checked, **build}
        for mode, secs in (("graph", timer.graph(calls, iters)), ("eager", timer.eager(calls, iters)[0])):
            if secs is not None:
                rec = {**base, "mode": mode, "seconds": secs, "gbps": nbytes / secs / 1e9}
                recs.append(rec)
                append_records(args.out, [rec])

    def run(calls):
        for c in calls:
            c()
        stream.synchronize()

    def first_frame_ok(label, calls, frame, want, codec) -> bool:
        return v6_bench.first_frame_equal(cp, stream, label, calls, frame, want, codec)

    def decoded(name, calls, outs, bits, ws) -> bool:
        return v6_bench.decodes_exactly(cp, stream, name, calls, outs, bits, ws)

    from harness import gaussian_bits

    cb16b = Codebook.from_sigma(0.02)
    def forced(kind, plan_cls, frames, outs, want, lay, mib, n, nbytes, sets, iters, ratio, chk, ws):
        """The library's two decoders forced (``LIBRARY_PATHS``), then the ``--warp-builds`` of
        type ``kind``, each checked (``outs`` against ``want``, bit patterns) and timed."""
        builds = [(name, warps, None) for name, warps in LIBRARY_PATHS.items()]
        builds += [(f"warp decoder, {bps} blocks/SM, {wave}", True, (int(bps), wave))
                   for t, bps, wave in (spec.split(":") for spec in args.warp_builds) if t == kind]
        for name, warps, build in builds:
            ps = [plan_cls(dev, f.data.ptr, f.nbytes, o.data.ptr, lay, ws.ptr, ws.count, _common.CRC_ZERO,
                           crc_ptr, crc.size, warps=warps) for f, o in zip(frames, outs, strict=True)]
            if build is not None:
                ps = [warp_build_plan(p, kind == "fp32", *build, lay.n_blocks) for p in ps]
            calls = [(lambda p=p: p.launch(stream.ptr)) for p in ps]
            if decoded(name, calls, outs, want, ws):
                timed(name, kind, "decode", calls, mib, n, nbytes, sets, iters, ratio, chk,
                      **({} if build is None else {"blocks_per_sm": build[0]}))

    for mib in args.sizes_mib:
        nbytes = int(mib * MiB)
        sets = max(1, min(16, math.ceil(256 * MiB / nbytes)))  # >= 256 MiB in all: no L2-resident reruns
        iters = max(2 * sets, min(200, int(8 * 1024 * MiB / nbytes)))
        ws = gpu_workspace.Workspace(nbytes // 2)

        # ---- BF16 decode: the library's, as called and each decoder forced, on the library's frames
        n = nbytes // 2
        codec = reference if n <= 8 * MiB else cpu
        lay = fmt.Layout.for_count(n)
        bits = [gaussian_bits(n, seed=300 + s, xp=cp, stream=stream) for s in range(sets)]
        frames = [cp.zeros(fmt.max_compressed_size(n), cp.uint8) for _ in range(sets)]
        outs = [cp.zeros(n, cp.uint16) for _ in range(sets)]
        stream.synchronize()
        want = codec.encode(cp.asnumpy(bits[0]), cb16b, None, False)
        enc = [(lambda b=b, f=f, w=ws: gpu.encode_into(b, f, cb16b, stream, workspace=w))
               for b, f in zip(bits, frames, strict=True)]
        # the decoders are checked against the input bits, so they are timed even if the library's
        # frame is not the CPU codec's (said, and named in the records' "checked")
        if first_frame_ok(f"{mib:g} MiB BF16", enc, frames[0], want, codec):
            chk = codec.__name__
        else:
            chk = f"input bits (the library frame differs from the {codec.__name__} frame)"
        ratio = v6_bench.frame_len(cp, fmt, frames[0]) / nbytes
        dec = [(lambda f=f, o=o, w=ws: gpu.decode_into(f, o, stream, workspace=w))
               for f, o in zip(frames, outs, strict=True)]
        if decoded("library BF16 decode", dec, outs, bits, ws):
            timed("library decode", "bf16", "decode", dec, mib, n, nbytes, sets, iters, ratio, chk)
        forced("bf16", decode.Plan, frames, outs, bits, lay, mib, n, nbytes, sets, iters, ratio, chk, ws)
        bits = frames = outs = enc = dec = calls = ps = None
        cp.get_default_memory_pool().free_all_blocks()

        # ---- FP16 decode: the library's, on the library's frames
        if "fp16" not in args.skip:
            n = nbytes // 2
            codec = reference if n <= 8 * MiB else cpu
            lay = fmt.Layout.for_count(n, fmt.DTYPE_FP16)
            rs = [cp.random.RandomState(100 + s) for s in range(sets)]
            bits = [r.normal(0, 0.02, n, dtype=cp.float32).astype(cp.float16).view(cp.uint16) for r in rs]
            frames = [cp.zeros(fmt.max_compressed_size(n, fmt.DTYPE_FP16), cp.uint8) for _ in range(sets)]
            outs = [cp.zeros(n, cp.uint16) for _ in range(sets)]
            stream.synchronize()  # the values are made on the stream; the host copy is not on it
            want = codec.encode(cp.asnumpy(bits[0]), cb16, None, False, dtype="float16")
            enc = [(lambda b=b, f=f, w=ws: gpu.encode_into(b, f, cb16, stream, workspace=w, dtype="float16"))
                   for b, f in zip(bits, frames, strict=True)]
            if first_frame_ok(f"{mib:g} MiB FP16", enc, frames[0], want, codec):
                ratio, chk = want.size / nbytes, codec.__name__
                dec = [(lambda f=f, o=o, w=ws: gpu.decode_into(f, o, stream, workspace=w, dtype="float16"))
                       for f, o in zip(frames, outs, strict=True)]
                if decoded("library FP16 decode", dec, outs, bits, ws):
                    timed("library decode", "fp16", "decode", dec, mib, n, nbytes, sets, iters, ratio, chk)
            bits = frames = outs = enc = dec = calls = ps = None
            cp.get_default_memory_pool().free_all_blocks()

        # ---- FP32 encode: the library's and v7b's
        n = nbytes // 4
        codec = reference if n <= 8 * MiB else cpu
        lay = fmt.Layout.for_count(n, fp32)
        cap = fmt.max_compressed_size(n, fp32)
        rs = [cp.random.RandomState(200 + s) for s in range(sets)]
        vals = [r.normal(0, 0.02, n, dtype=cp.float32) for r in rs]
        frames = [cp.zeros(cap, cp.uint8) for _ in range(sets)]
        stream.synchronize()
        want = codec.encode(cp.asnumpy(vals[0]).view(np.uint32), cb32, None, False, dtype=fp32)
        enc = [(lambda v=v, f=f, w=ws: gpu.encode_into(v, f, cb32, stream, workspace=w))
               for v, f in zip(vals, frames, strict=True)]
        if first_frame_ok(f"{mib:g} MiB FP32", enc, frames[0], want, codec):
            ratio, chk = want.size / nbytes, codec.__name__
            timed("library encode", "fp32", "encode", enc, mib, n, nbytes, sets, iters, ratio, chk)
            # FP32 decode: the library's, as called and each decoder forced, on these frames
            outs = [cp.zeros(n, cp.float32) for _ in range(sets)]
            dec = [(lambda f=f, o=o, w=ws: gpu.decode_into(f, o, stream, workspace=w))
                   for f, o in zip(frames, outs, strict=True)]
            obits = [o.view(cp.uint32) for o in outs]  # compared as bit patterns
            vbits = [v.view(cp.uint32) for v in vals]
            if decoded("library FP32 decode", dec, obits, vbits, ws):
                timed("library decode", "fp32", "decode", dec, mib, n, nbytes, sets, iters, ratio, chk)
            forced("fp32", decode_fp16.Plan, frames, obits, vbits, lay, mib, n, nbytes, sets, iters, ratio,
                   chk, ws)
            outs = obits = vbits = dec = None
            hdr, crc_base, cb64 = gpu_workspace._template(n, (n,), cb32.exponents, fp32)
            vframes = [cp.zeros(cap, cp.uint8) for _ in range(sets)]
            for name, (bps, ahead) in (V7B.items() if "v7b" not in args.skip else ()):
                kern = v7b.kernel(bps, ahead)
                ps = [v7b.plan(kern, dev, v.data.ptr, f.data.ptr, f.nbytes, ws.ptr, ws.count, lay, hdr,
                               crc_base, crc_ptr, crc.size, cb64, False)
                      for v, f in zip(vals, vframes, strict=True)]
                calls = [(lambda p=p: p.launch(stream.ptr)) for p in ps]
                for f in vframes:
                    f.fill(0)
                run(calls)
                ok = v6_bench.same_frames(cp, fmt, vframes, frames)
                said = "the library frame on every buffer set" if ok else "frames differ; not timed"
                print(f"  {name}: {said}", flush=True)
                if ok:
                    timed(name, "fp32", "encode", calls, mib, n, nbytes, sets, iters, ratio, "library frames",
                          blocks_per_sm=bps, ahead=ahead)
        vals = frames = vframes = enc = calls = ps = None
        cp.get_default_memory_pool().free_all_blocks()

    print(f"\n{len(recs)} timings; all that was timed was checked first\n")
    table([args.out], common["run_id"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
