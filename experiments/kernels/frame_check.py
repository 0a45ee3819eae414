"""Where a GPU frame and the CPU codecs' frames of the same BF16 values part, on one GPU.

For each size and seed: N(0, 0.02²) BF16 values made on the device (``harness.gaussian_bits``,
on a non-blocking stream, then synchronised), the library's frame (``codec.gpu.encode_into``
with the codebook of sigma 0.02, no checksum), the CPU codec's and the NumPy reference's frames
of the same values copied to the host. Prints the three frames' lengths, whether each pair is
equal, and for a pair that differs the first differing byte, the frame section it falls in
(header, sign-mantissa bytes, code plane k, escape counts, escapes) and the tile it belongs to;
then whether the reference decoder gives the values back from the library's frame, bit for
bit. ``--no-sync`` copies the values to the host without synchronising the stream first (the
order v7_bench.py's first run used)::

    python experiments/kernels/frame_check.py --sizes-mib 256 --seeds 300 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

MiB = 1 << 20


def section(lay, i: int) -> str:
    """The frame section of byte offset i of a coded frame of layout ``lay``, and its tile."""
    from zipccl import format as fmt

    if i < fmt.HEADER_SIZE:
        return f"header byte {i}"
    if i < lay.planes_offset:
        v = i - fmt.HEADER_SIZE
        return f"sign-mantissa byte of value {v} (tile {v // fmt.BLOCK})"
    if i < lay.counts_offset:
        k, q = divmod(i - lay.planes_offset, lay.plane_stride)
        return f"code plane {k}, byte {q} (tile {8 * q // fmt.BLOCK})"
    if i < lay.escapes_offset:
        return f"escape count of tile {(i - lay.counts_offset) // 4}"
    return f"escape {i - lay.escapes_offset}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[256])
    ap.add_argument("--seeds", type=int, nargs="+", default=[300, 0])
    ap.add_argument("--no-sync", action="store_true")
    args = ap.parse_args(argv)

    import cupy as cp
    from harness import gaussian_bits

    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import cpu, gpu, reference

    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    cb = Codebook.from_sigma(0.02)
    bad = 0
    for mib in args.sizes_mib:
        n = int(mib * MiB) // 2
        lay = fmt.Layout.for_count(n)
        for seed in args.seeds:
            x = gaussian_bits(n, seed=seed, xp=cp, stream=stream)
            if not args.no_sync:
                stream.synchronize()
            xh = cp.asnumpy(x)
            frame = cp.zeros(fmt.max_compressed_size(n), cp.uint8)
            gpu.encode_into(x, frame, cb, stream)
            stream.synchronize()
            g = cp.asnumpy(frame)
            g = g[:int(g[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8].view("<i8")[0])]
            c = cpu.encode(xh, cb, None, False)
            r = reference.encode(xh, cb, None, False)
            xs = cp.asnumpy(x)  # the values again, after the stream's work
            same = "equals" if np.array_equal(xh, xs) else "DIFFERS from"
            print(f"{mib:g} MiB seed {seed}: frame lengths gpu {g.size}, cpu {c.size}, reference {r.size}; "
                  f"host copy {same} a later copy", flush=True)
            for name, a, b in (("gpu/cpu", g, c), ("gpu/reference", g, r), ("cpu/reference", c, r)):
                if a.size == b.size and np.array_equal(a, b):
                    print(f"  {name}: equal")
                    continue
                bad += 1
                m = min(a.size, b.size)
                d = np.flatnonzero(a[:m] != b[:m])
                first = int(d[0]) if d.size else m
                print(f"  {name}: DIFFER ({d.size} bytes of the common {m}); first at {first}: "
                      f"{section(lay, first)}")
            try:
                back, _ = reference.decode(g)
                ok = np.array_equal(back.reshape(-1), xs)
            except ValueError as e:
                ok = False
                print(f"  reference decode of the gpu frame refused it: {e}")
            print(f"  reference decode of the gpu frame: {'the values, bit for bit' if ok else 'DIFFERS'}",
                  flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
