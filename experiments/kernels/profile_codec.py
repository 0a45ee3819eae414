"""The codec kernels' launches for Nsight Compute: per size, one encode and one decode of
N(0, 0.02) BF16 data through the library's plans (``codec.gpu.encode_into`` /
``decode_into``, no checksum), each twice (the first call compiles and loads; both are
profiled, read the second), and with ``--v5 AHEAD:BLOCKS`` the v5 encoder once more, with
``--v7c MODULE:BLOCKS`` (``v7c:8``, ``v7d:6``) that warp-a-tile decoder (its scan and tile
kernels) twice on the same frame.

    ncu --clock-control none --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section SchedulerStats --section LaunchStats \\
        --section MemoryWorkloadAnalysis -k regex:'(en|de)code_|scan_counts' \\
        python experiments/kernels/profile_codec.py --sizes-mib 16 256

``experiments/kernels/profile_ncu.sh`` runs exactly that and writes the text reports.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 256])
    ap.add_argument("--v5", default=None, help="AHEAD:BLOCKS_PER_SM of a v5 encoder to launch too")
    ap.add_argument("--v7c", default=None, help="MODULE:BLOCKS_PER_SM of a v7c / v7d decoder to launch too")
    args = ap.parse_args(argv)

    import cupy as cp
    from harness import gaussian_bits

    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu
    from zipccl.kernels import runtime

    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    cb = Codebook.from_sigma(0.02)
    for mib in args.sizes_mib:
        n = int(mib * (1 << 20)) // 2
        lay = fmt.Layout.for_count(n)
        x = gaussian_bits(n, seed=0, xp=cp)
        frame = cp.zeros(lay.raw_size, cp.uint8)
        out = cp.zeros(n, cp.uint16)
        ws = gpu.Workspace(n)
        for _ in range(2):
            gpu.encode_into(x, frame, cb, stream, workspace=ws)
            gpu.decode_into(frame, out, stream, workspace=ws)
        stream.synchronize()
        if not cp.array_equal(out, x):
            raise SystemExit(f"{mib} MiB: round trip differs")
        if args.v5:
            import v5_check
            import v5_encode

            ahead, bps = (int(v) for v in args.v5.split(":"))
            k = v5_encode.make_encode_tiles(ahead, bps)
            hdr, crc_base, cb64 = gpu._template(n, (n,), cb.exponents)
            f2 = cp.zeros_like(frame)
            v5_check.launch_v5(k, bps, v5_check.views(x, f2, n, lay, ws), lay, cb64, 0, hdr, crc_base,
                               runtime.stream(stream.ptr))
            stream.synchronize()
            if not cp.array_equal(f2, frame):
                raise SystemExit(f"{mib} MiB: v5 frame differs from v4's")
        if args.v7c:
            import importlib

            import v7c_decode as v7c

            mod, bps = args.v7c.split(":")
            dec = importlib.import_module(f"{mod}_decode").build(int(bps))
            aux = cp.zeros(v7c.AUX_SIZE, cp.int64)
            o2 = cp.zeros_like(out)
            for _ in range(2):
                v7c.decode_frame(frame, n, ws, aux, o2, stream, kernel=dec, blocks_per_sm=int(bps))
            stream.synchronize()
            if not cp.array_equal(o2, x) or ws.last_error(stream):
                raise SystemExit(f"{mib} MiB: v7c output differs")
        print(f"{mib:g} MiB: {n} values, round trip exact, error bits {ws.last_error(stream)}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
