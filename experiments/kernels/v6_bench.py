"""Check, then time, the library's kernels and the v6 variants on one GPU: BF16 and FP16.

For each size, BF16: N(0, 0.02²) data on the device; the library's frame (``encode_into``)
checked against the reference's (up to 8 Mi values) or the CPU codec's byte for byte; every
encoder variant's frame (v6b; ``tile``: the tile kernel with one tile a ticket, the library's
BF16 loop before v6c) checked equal to the library's on every timed buffer set; every decoder
(the library's, v6a) checked to give the input back bit for bit with no error bits on every
timed buffer set ("all results match, starting benchmarks"). FP16 likewise: the library's FP16
frame against the reference's / CPU codec's, its decoder bit for bit on every set.
A variant that fails its check is reported and not timed. Then device time per call: a
replayed CUDA graph (median of ``--repeats``), and eager (CUDA events around enqueued calls,
the library's plan route) beside it; the public ``zipccl.compress`` / ``decompress`` (eager,
each call synchronises, checksum on, codebook chosen on the device) as the headline. The
variants launch through Numba's dispatcher, whose host cost would swamp an eager number, so
they are timed in graph replay only. One JSON record per timing to ``--out``
(``harness.append_records``); a short table last.

``--label`` names the tree the library kernels come from (``v6_round.sh`` runs this on this
tree's ``zipccl/`` and on a base commit's); ``--variants none`` times the library alone (a
base tree has no v6 variants)::

    python experiments/kernels/v6_bench.py --sizes-mib 16 256 1024 --label tree
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import append_records, gaussian_bits  # noqa: E402

MiB = 1 << 20
RESULTS = HERE.parent / "results" / "kernel_variants_v6.jsonl"
ALL = ["v6a", "v6b", "tile", "fp16", "api", "eager"]


def frame_len(cp, fmt, f) -> int:
    return int(cp.asnumpy(f[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8]).view(np.int64)[0])


def same_frames(cp, fmt, got, want) -> bool:
    """Every frame of ``got`` equals its ``want`` up to the frame length (byte for byte)."""
    for g, w in zip(got, want, strict=True):
        n = frame_len(cp, fmt, w)
        if frame_len(cp, fmt, g) != n or not bool(cp.array_equal(g[:n], w[:n])):
            return False
    return True


def first_frame_equal(cp, stream, label, calls, frame, want, codec) -> bool:
    """Run ``calls`` on ``stream``; the first buffer set's frame equals ``want`` (``codec``'s)."""
    for c in calls:
        c()
    stream.synchronize()
    ok = bool(np.array_equal(cp.asnumpy(frame[:want.size]), want))
    said = "equals" if ok else "DIFFERS from"
    print(f"{label}: library frame {said} the {codec.__name__} frame", flush=True)
    return ok


def decodes_exactly(cp, stream, name, calls, outs, bits, ws) -> bool:
    """Run the decoder ``calls`` into the zeroed ``outs``: every one equals its ``bits`` bit for bit
    and the workspace ``ws`` holds no error bits."""
    for o in outs:
        o.fill(0)
    for c in calls:
        c()
    stream.synchronize()
    err = ws.last_error(stream)
    ok = err == 0 and all(bool(cp.array_equal(o, b)) for o, b in zip(outs, bits, strict=True))
    said = "bit exact on every buffer set" if ok else f"output differs (error bits {err}); not timed"
    print(f"  {name}: {said}", flush=True)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--label", default="tree")
    ap.add_argument("--variants", nargs="+", default=ALL, help=f"any of {ALL}, or none")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    import cupy as cp

    import zipccl

    # zipccl before bench_codec, which puts this checkout's root first on the path: the base run
    # (v6_round.sh) must time the zipccl that PYTHONPATH names
    zipccl_dir = str(Path(zipccl.__file__).parent)
    from bench_codec import Timer, machine_info

    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import cpu, gpu, gpu_workspace, reference
    from zipccl.kernels import runtime

    want_v = set(args.variants) - {"none"}
    if want_v & {"v6a"}:
        import v6_scan
    if want_v & {"v6b", "tile"}:
        import v6b_encode

        from zipccl.kernels import encode, encode_launch

        one_tile = encode._tiles_kernel(fmt.DTYPE_BF16, per_ticket=1)  # the library's loop before v6c
        variants = {"v6b": ("v6b encode (one barrier)", v6b_encode.launch),
                    "tile": ("encode, one tile a ticket (v5)",
                             lambda *a: encode_launch.launch(*a, tiles_kernel=one_tile, per_ticket=1))}
    cb = Codebook.from_sigma(0.02)
    cb16 = Codebook.from_sigma(0.02, dtype="float16")
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    timer, nstream = Timer(cp, stream, args.repeats), runtime.stream(stream.ptr)
    info = machine_info(cp)
    common = {"bench": "kernel_variants_v6", "run_id": time.strftime("%Y%m%dT%H%M%S"), **info,
              "card": "an H200" if "H200" in info["gpu"] else info["gpu"], "tree": args.label,
              "zipccl": zipccl.__version__, "zipccl_path": zipccl_dir}
    print(f"zipccl from {common['zipccl_path']}", flush=True)
    recs = []

    def record(name, dtype, mib, n, nbytes, sets, secs, ratio, checked, mode):
        if secs is None:
            return
        rec = {**common, "variant": name, "dtype": dtype, "mode": mode,
               "op": "decode" if ("decode" in name or "decompress" in name) else "encode",
               "size_mib": mib, "n": n, "input_bytes": nbytes, "buffer_sets": sets, "seconds": secs,
               "gbps": nbytes / secs / 1e9, "ratio": ratio, "checked": checked}
        recs.append(rec)
        append_records(args.out, [rec])

    def timed(name, dtype, calls, mib, n, nbytes, sets, iters, ratio, checked, eager=True):
        record(name, dtype, mib, n, nbytes, sets, timer.graph(calls, iters), ratio, checked, "graph")
        if eager and "eager" in want_v:
            record(name, dtype, mib, n, nbytes, sets, timer.eager(calls, iters)[0], ratio, checked, "eager")

    def first_frame_ok(label, calls, frame, want, codec) -> bool:
        return first_frame_equal(cp, stream, label, calls, frame, want, codec)

    def decoded(name, calls, outs, bits, ws) -> bool:
        return decodes_exactly(cp, stream, name, calls, outs, bits, ws)

    for mib in args.sizes_mib:
        nbytes = int(mib * MiB)
        n, lay = nbytes // 2, fmt.Layout.for_count(nbytes // 2)
        # buffer sets: at least 256 MiB in all (no L2-resident reruns); graph replays: ~8 GiB
        sets = max(1, min(16, math.ceil(256 * MiB / nbytes)))
        iters = max(2 * sets, min(200, int(8 * 1024 * MiB / nbytes)))
        cap = fmt.max_compressed_size(n)
        codec = reference if n <= 8 * MiB else cpu

        # ---- BF16
        bits = [gaussian_bits(n, seed=s, xp=cp) for s in range(sets)]
        frames = [cp.zeros(cap, cp.uint8) for _ in range(sets)]
        outs = [cp.zeros(n, cp.uint16) for _ in range(sets)]
        ws = gpu_workspace.Workspace(n)
        stream.synchronize()  # the values are made on the stream; the host copy below is not on it
        want = codec.encode(cp.asnumpy(bits[0]), cb, None, False)
        enc = [(lambda b=b, f=f, w=ws: gpu.encode_into(b, f, cb, stream, workspace=w))
               for b, f in zip(bits, frames, strict=True)]
        if not first_frame_ok(f"{mib:g} MiB BF16", enc, frames[0], want, codec):
            return 1
        ratio = want.size / nbytes
        chk = codec.__name__
        timed("library encode", "bf16", enc, mib, n, nbytes, sets, iters, ratio, chk)
        dec = [(lambda f=f, o=o, w=ws: gpu.decode_into(f, o, stream, workspace=w))
               for f, o in zip(frames, outs, strict=True)]
        if decoded("library decode", dec, outs, bits, ws):
            timed("library decode", "bf16", dec, mib, n, nbytes, sets, iters, ratio, chk)
        if "v6a" in want_v:
            views = [v6_scan._views(frames[i], outs[i], n, cap) for i in range(sets)]
            calls = [(lambda v=v, w=ws, la=lay: v6_scan.launch(*v, w.array, la, nstream)) for v in views]
            if decoded("v6a decode", calls, outs, bits, ws):
                timed("v6a decode (scanned prefixes)", "bf16", calls, mib, n, nbytes, sets, iters, ratio, chk,
                      eager=False)
        if want_v & {"v6b", "tile"}:
            vframes = [cp.zeros(cap, cp.uint8) for _ in range(sets)]
            for key, (name, launcher) in variants.items():
                if key not in want_v:
                    continue
                calls = [(lambda b=b, f=f, m=launcher, w=ws:
                          v6b_encode.encode_frame(m, b, cb.exponents, False, w, nstream, f))
                         for b, f in zip(bits, vframes, strict=True)]
                for f in vframes:
                    f.fill(0)
                for c in calls:
                    c()
                stream.synchronize()
                if not same_frames(cp, fmt, vframes, frames):
                    print(f"  {name}: frames differ from the library's; not timed", flush=True)
                    continue
                timed(name, "bf16", calls, mib, n, nbytes, sets, iters, ratio, "library frames", eager=False)
            vframes = None
        if "api" in want_v:
            comp = [zipccl.compress(b, dtype="bfloat16", stream=stream) for b in bits]
            back = [zipccl.decompress(f, stream=stream) for f in comp]
            if all(bool(cp.array_equal(r.view(cp.uint16).reshape(-1), b))
                   for r, b in zip(back, bits, strict=True)):
                api_ratio = comp[0].size / nbytes
                cc = [(lambda b=b: zipccl.compress(b, dtype="bfloat16", stream=stream)) for b in bits]
                dc = [(lambda f=f: zipccl.decompress(f, stream=stream)) for f in comp]
                for name, cs in (("compress (public)", cc), ("decompress (public)", dc)):
                    secs = timer.eager(cs, iters)[0]
                    record(name, "bf16", mib, n, nbytes, sets, secs, api_ratio, "round trip", "eager")
            else:
                print(f"  {mib:g} MiB public compress/decompress: round trip differs; not timed", flush=True)
            comp = back = None
        bits = frames = outs = enc = dec = calls = None
        cp.get_default_memory_pool().free_all_blocks()

        # ---- FP16: the library's encoder (the tile kernel's FP16 build) and decoder
        if "fp16" not in want_v:
            continue
        cap16 = fmt.max_compressed_size(n, fmt.DTYPE_FP16)
        rs = [cp.random.RandomState(100 + s) for s in range(sets)]
        bits = [r.normal(0, 0.02, n, dtype=cp.float32).astype(cp.float16).view(cp.uint16) for r in rs]
        frames = [cp.zeros(cap16, cp.uint8) for _ in range(sets)]
        outs = [cp.zeros(n, cp.uint16) for _ in range(sets)]
        stream.synchronize()
        want = codec.encode(cp.asnumpy(bits[0]), cb16, None, False, dtype="float16")
        enc = [(lambda b=b, f=f, w=ws: gpu.encode_into(b, f, cb16, stream, workspace=w, dtype="float16"))
               for b, f in zip(bits, frames, strict=True)]
        if first_frame_ok(f"{mib:g} MiB FP16", enc, frames[0], want, codec):
            ratio = want.size / nbytes
            chk = codec.__name__
            timed("library encode", "fp16", enc, mib, n, nbytes, sets, iters, ratio, chk)
            dec = [(lambda f=f, o=o, w=ws: gpu.decode_into(f, o, stream, workspace=w, dtype="float16"))
                   for f, o in zip(frames, outs, strict=True)]
            if decoded("library FP16 decode", dec, outs, bits, ws):
                timed("library decode", "fp16", dec, mib, n, nbytes, sets, iters, ratio, chk)
        bits = frames = outs = enc = dec = None
        cp.get_default_memory_pool().free_all_blocks()

    print(f"\n{len(recs)} timings; all that was timed was checked first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
