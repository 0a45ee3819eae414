"""The codec kernels' launches for Nsight Compute: per size, one encode and one decode of
N(0, 0.02) BF16 data through the library's plans (``codec.gpu.encode_into`` /
``decode_into``, no checksum), each twice (the first call compiles and loads; both are
profiled, read the second); with ``--decoders`` both of the library's BF16 decoders, forced
(``decode.Plan(..., warps=False / True)``: the block decoder, the warp-a-tile decoder), twice
each on the same frame. (The runs that launched the v5 encoder too, ``--v5 AHEAD:BLOCKS``,
used this script as it was at commit 952f4b0: experiments/kernels/NOTES.md.)

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

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def decoder_views(runtime, frame, out, n: int, lay):
    """The decoder's views of ``frame`` (uint8 / uint32 / int64) and ``out`` (uint32 / uint16)."""
    nb = int(frame.size)
    v = runtime.view
    return (v(frame, nb, np.uint8), v(frame, nb // 4, np.uint32), v(frame, nb // 8, np.int64),
            v(out, (n & ~7) // 2, np.uint32), v(out, n, np.uint16))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 256])
    ap.add_argument("--decoders", action="store_true", help="both BF16 decoders forced, as well")
    args = ap.parse_args(argv)

    import cupy as cp
    from harness import gaussian_bits

    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, gpu_workspace
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
        ws = gpu_workspace.Workspace(n)
        for _ in range(2):
            gpu.encode_into(x, frame, cb, stream, workspace=ws)
            gpu.decode_into(frame, out, stream, workspace=ws)
        stream.synchronize()
        if not cp.array_equal(out, x):
            raise SystemExit(f"{mib} MiB: round trip differs")
        if args.decoders:
            from zipccl.kernels import _common, decode

            o2 = cp.zeros_like(out)
            for warps in (False, True):
                for _ in range(2):
                    o2.fill(0)
                    decode.launch(*decoder_views(runtime, frame, o2, n, lay), ws.array, lay, _common.CRC_ZERO,
                                  runtime.crc_table(), runtime.stream(stream.ptr), warps=warps)
                stream.synchronize()
                if not cp.array_equal(o2, x) or ws.last_error(stream):
                    which = "warp" if warps else "block"
                    raise SystemExit(f"{mib} MiB: the {which} decoder's output differs")
        print(f"{mib:g} MiB: {n} values, round trip exact, error bits {ws.last_error(stream)}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
