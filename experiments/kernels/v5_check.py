"""Check the v5 encoder byte for byte, and on a GPU time it against the library encoder (v4
until the v5 promotion; records name it "v4" before, "library" after).

Under the CUDA simulator (small sizes, NumPy arrays):

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v5_check.py --sizes-k 9 20 33

On a GPU: the same check against the reference / CPU frames on every timed buffer set,
then CUDA-graph replay timings (device time) of v4 (``codec.gpu.encode_into``) and each
v5 configuration (``--configs ahead:blocks_per_sm``), one JSON record each to ``--out``:

    python experiments/kernels/v5_check.py --sizes-mib 16 256 1024 --out $OUT/codec_gpu_v5.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import v5_encode as v5  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.codebook import Codebook  # noqa: E402
from zipccl.codec import cpu, gpu, gpu_workspace, reference  # noqa: E402
from zipccl.kernels import compat, encode, encode_launch, layout, runtime  # noqa: E402
from zipccl.kernels._common import TPB  # noqa: E402

MiB = 1 << 20


def views(xb, fb, n, lay, ws):
    return (runtime.view(xb, (n & ~7) // 2, np.uint32), runtime.view(xb, n, np.uint16),
            runtime.view(fb, lay.raw_size, np.uint8), runtime.view(fb, lay.raw_size // 4, np.uint32),
            runtime.view(fb, lay.raw_size // 8, np.int64), ws.array, layout.layout_tuple(lay))


def launch_v5(kernel, bps, a, lay, cb64, cs, hdr, crc_base, stream):
    kernel[v5.grid(lay.n_blocks, bps, kernel), TPB, stream](*a, cb64, cs)
    blocks = max(1, min(encode_launch.FINISH_MAX_BLOCKS, (lay.n + 8 * TPB - 1) // (8 * TPB)))
    encode.encode_finish[blocks, TPB, stream](*a, hdr, crc_base, runtime.crc_table(), 0, cs,
                                              lay.n_blocks, 0)


def parse_configs(items):
    return [tuple(int(v) for v in c.split(":")) for c in items]


def sim_main(args) -> int:
    cb = Codebook.from_sigma(0.02)
    rng = np.random.default_rng(1)
    bad = 0
    for ahead, bps in parse_configs(args.configs):
        kernel = v5.make_encode_tiles(ahead, bps)
        for k in args.sizes_k:
            n = int(k * 1024) + (7 if k % 2 else 0)
            x = (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            x[::997] = 0x7F80  # some escapes
            for cs in (0, 1):
                lay = fmt.Layout.for_count(n)
                fb = np.full(lay.raw_size, 0xAB, np.uint8)
                ws = gpu_workspace.Workspace(n)
                hdr, crc_base, cb64 = gpu_workspace._template(n, (n,), cb.exponents)
                launch_v5(kernel, bps, views(x, fb, n, lay, ws), lay, cb64, cs, hdr, crc_base, 0)
                want = reference.encode(x, cb, None, bool(cs))
                ok = np.array_equal(fb[:want.size], want)
                bad += not ok
                print(f"v5 ahead={ahead} n={n} checksum={cs}: {'ok' if ok else 'DIFFERS'}", flush=True)
    return 1 if bad else 0


def gpu_main(args) -> int:
    import cupy as cp
    from bench_codec import Timer, machine_info
    from harness import gaussian_bits

    info = machine_info(cp)
    run_id = time.strftime("%Y%m%dT%H%M%S")
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    nstream = runtime.stream(stream.ptr)
    timer = Timer(cp, stream, args.repeats)
    cb = Codebook.from_sigma(0.02)
    configs = parse_configs(args.configs)
    kernels = {c: v5.make_encode_tiles(*c[:2], with_lookback=len(c) < 3) for c in configs}
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def one_size(mib, fh):
        nbytes = int(mib * MiB)
        n = nbytes // 2
        lay = fmt.Layout.for_count(n)
        sets = max(1, min(64, math.ceil(256 * MiB / nbytes)))
        iters = max(2 * sets, min(400, int(16 * 1024 * MiB / nbytes)))
        bits = [gaussian_bits(n, seed=seed, xp=cp) for seed in range(sets)]
        frames = [cp.zeros(lay.raw_size, cp.uint8) for _ in range(sets)]
        ws = gpu_workspace.Workspace(n)
        hdr, crc_base, cb64 = gpu_workspace._template(n, (n,), cb.exponents)
        codec = reference if n <= 8 * MiB else cpu
        want = codec.encode(cp.asnumpy(bits[0]), cb, None, False)
        results = {}
        for variant in ["v4", *configs]:
            for f in frames:
                f.fill(0xAB)
            if variant == "v4":
                calls = [(lambda i=i: gpu.encode_into(bits[i], frames[i], cb, stream, workspace=ws))
                         for i in range(sets)]
                name = "library"  # v4 until commit 38af8e3, then the v5 encoder (tickets)
            else:
                k = kernels[variant]
                a = [views(bits[i], frames[i], n, lay, ws) for i in range(sets)]
                calls = [(lambda ai=ai, k=k, bps=variant[1]:
                          launch_v5(k, bps, ai, lay, cb64, 0, hdr, crc_base, nstream)) for ai in a]
                name = f"v5-a{variant[0]}-b{variant[1]}" + ("-nolookback" if len(variant) > 2 else "")
            try:
                for c in calls:
                    c()
                stream.synchronize()
            except Exception as e:  # noqa: BLE001 - report a variant that does not build or run
                print(f"{mib:g} MiB {name}: {type(e).__name__}: {e}", flush=True)
                continue
            ablation = variant != "v4" and len(variant) > 2
            if not ablation and not np.array_equal(cp.asnumpy(frames[0][:want.size]), want):
                print(f"{mib:g} MiB {name}: frame differs from the {codec.__name__} frame; not timed",
                      flush=True)
                continue
            if variant != "v4" and not ablation:  # every set against v4's frames (set 0: above)
                ref = [cp.full_like(f, 0xAB) for f in frames]
                for i in range(sets):
                    gpu.encode_into(bits[i], ref[i], cb, stream, workspace=ws)
                stream.synchronize()
                if any(not cp.array_equal(r, f) for r, f in zip(ref, frames, strict=True)):
                    print(f"{mib:g} MiB {name}: a buffer set differs from v4; not timed", flush=True)
                    continue
                del ref
            secs = timer.graph(calls, iters)
            if secs is None:
                continue
            results[name] = secs
            rec = {"bench": "codec_gpu_v5", "run_id": run_id, **info, "op": "encode",
                   "variant": name, "mode": "graph", "size_mib": mib, "n": n, "input_bytes": nbytes,
                   "buffer_sets": sets, "seconds": secs, "gbps": nbytes / secs / 1e9,
                   "ratio": want.size / nbytes,
                   "checked": "ablation: frames not valid, timing only" if ablation else codec.__name__}
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            rows.append((mib, name, nbytes / secs / 1e9))
        cp.get_default_memory_pool().free_all_blocks()

    with args.out.open("a") as fh:
        for mib in args.sizes_mib:
            one_size(mib, fh)

    print(f"\n{'MiB':>6} {'variant':>12} {'GB/s':>8}")
    for mib, name, gbps in rows:
        print(f"{mib:6g} {name:>12} {gbps:8.1f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-k", type=float, nargs="+", default=[9, 20])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--configs", nargs="+", default=["1:8", "2:8", "2:6"],
                    help="AHEAD:BLOCKS_PER_SM[:0] (a third field: the no-look-back ablation)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE.parent / "results" / "codec_gpu_v5.jsonl")
    args = ap.parse_args(argv)
    return sim_main(args) if compat.SIMULATOR else gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
