"""Time the library's BF16 encoder and decoder, and the v6 variants, on one GPU (graph replay).

For each size: N(0, 0.02²) BF16 data on the device, the library's frame (``encode_into``)
checked against the CPU codec's frame byte for byte, every decoder checked to give the input
back bit for bit with no error bits on every timed buffer set ("all results match, starting
benchmarks"), then device time per call of a replayed CUDA graph (median of ``--repeats``).
A variant that fails its check is reported and not timed. One JSON record per timing to
``--out`` (``harness.append_records``); a short table last.

``--label`` names the tree the library kernels come from (``v6_round.sh`` runs this once on
the base commit's ``zipccl/`` and once on this tree's); ``--variants none`` times the library
alone (a base tree has no v6 variants)::

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--label", default="tree")
    ap.add_argument("--variants", nargs="+", default=["v6a"], help="v6a, or none")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    import cupy as cp
    from bench_codec import Timer, machine_info

    import zipccl
    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import cpu, gpu, reference
    from zipccl.kernels import runtime

    variants = [v for v in args.variants if v != "none"]
    if variants:
        import v6_scan
    cb = Codebook.from_sigma(0.02)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    timer, nstream = Timer(cp, stream, args.repeats), runtime.stream(stream.ptr)
    common = {"bench": "kernel_variants_v6", "run_id": time.strftime("%Y%m%dT%H%M%S"), **machine_info(cp),
              "tree": args.label, "zipccl": zipccl.__version__, "mode": "graph"}
    recs, rows = [], []
    for mib in args.sizes_mib:
        nbytes = int(mib * MiB)
        n, lay = nbytes // 2, fmt.Layout.for_count(nbytes // 2)
        # buffer sets: at least 256 MiB in all (no L2-resident reruns); graph replays: ~8 GiB
        sets = max(1, min(16, math.ceil(256 * MiB / nbytes)))
        iters = max(2 * sets, min(200, int(8 * 1024 * MiB / nbytes)))
        bits = [gaussian_bits(n, seed=s, xp=cp) for s in range(sets)]
        cap = fmt.max_compressed_size(n)
        frames = [cp.zeros(cap, cp.uint8) for _ in range(sets)]
        outs = [cp.zeros(n, cp.uint16) for _ in range(sets)]
        ws = gpu.Workspace(n)
        codec = reference if n <= 8 * MiB else cpu
        want = codec.encode(cp.asnumpy(bits[0]), cb, None, False)
        enc = [(lambda b=b, f=f, w=ws: gpu.encode_into(b, f, cb, stream, workspace=w))
               for b, f in zip(bits, frames, strict=True)]
        for c in enc:
            c()
        stream.synchronize()
        ok = bool(np.array_equal(cp.asnumpy(frames[0][:want.size]), want))
        print(f"{mib:g} MiB: library frame {'equals' if ok else 'DIFFERS from'} the {codec.__name__} frame",
              flush=True)
        if not ok:
            return 1

        calls = {"library encode": enc,
                 "library decode": [(lambda f=f, o=o, w=ws: gpu.decode_into(f, o, stream, workspace=w))
                                    for f, o in zip(frames, outs, strict=True)]}
        if "v6a" in variants:
            views = [v6_scan._views(frames[i], outs[i], n, cap) for i in range(sets)]
            calls["v6a decode (scanned prefixes)"] = [
                (lambda v=v, a=ws.array, la=lay: v6_scan.launch(*v, a, la, nstream)) for v in views]
        for name, cs in calls.items():
            if "decode" in name:  # every buffer set decoded bit for bit, no error bits
                for o in outs:
                    o.fill(0)
                for c in cs:
                    c()
                stream.synchronize()
                err = ws.last_error(stream)
                same = err == 0 and all(bool(cp.array_equal(o, b)) for o, b in zip(outs, bits, strict=True))
                if not same:
                    print(f"{mib:g} MiB {name}: output differs (error bits {err}); not timed", flush=True)
                    continue
            secs = timer.graph(cs, iters)
            if secs is None:
                continue
            recs.append({**common, "variant": name, "op": "encode" if "encode" in name else "decode",
                         "size_mib": mib, "n": n, "input_bytes": nbytes, "buffer_sets": sets,
                         "seconds": secs, "gbps": nbytes / secs / 1e9, "ratio": want.size / nbytes,
                         "checked": codec.__name__})
            rows.append((args.label, mib, name, nbytes / secs / 1e9))
        bits = frames = outs = calls = enc = None
        cp.get_default_memory_pool().free_all_blocks()
    append_records(args.out, recs)
    print(f"\n{'tree':>8} {'MiB':>6} {'kernel':>32} {'GB/s':>8}")
    for label, mib, name, g in rows:
        print(f"{label:>8} {mib:6g} {name:>32} {g:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
