"""Kernel version 4 on a GPU: the benchmark, then the library's GPU tests, in one call.

One process, so that every kernel is compiled once:

1. ``experiments/bench_codec.py`` on the given sizes and variants (it checks every
   variant on its timed buffers against the reference / CPU frame before timing);
2. ``tests/test_gpu_codec.py`` (odd sizes, edge corpus, all 65,536 bit patterns,
   random data, corrupted frames, CUDA graph replay, CuPy / torch / Numba arrays)
   with ``zipccl.kernels.encode.launch`` / ``decode.launch`` replaced by the
   launchers of experiments/kernels/v4_*.py. This is how v4 was checked before it
   was promoted (run 20261130T040001); since then the library kernels are v4, so
   step 2 checks the same code either way.

    python experiments/kernels/v4_gpu_check.py --out $OUT/codec_gpu.jsonl --sizes 16 256 1024
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for p in (ROOT, HERE, ROOT / "experiments", ROOT / "tests"):
    sys.path.insert(0, str(p))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", nargs="+", default=["16", "256", "1024"])
    ap.add_argument("--variants", nargs="+", default=["copy", "v3", "v4", "v4-cs"])
    ap.add_argument("--repeats", default="3")
    ap.add_argument("--modes", nargs="+", default=["graph"])
    ap.add_argument("--skip-tests", action="store_true")
    args = ap.parse_args(argv)

    import bench_codec
    import pytest
    import v4_decode
    import v4_encode

    from zipccl.kernels import decode, encode

    try:
        rc = bench_codec.main(["--sizes", *args.sizes, "--variants", *args.variants, "--modes",
                               *args.modes, "--repeats", args.repeats, "--out", str(args.out)])
    except SystemExit as e:  # a failed check: still run the tests, for the diagnosis
        print(f"benchmark stopped: {e}", flush=True)
        rc = 1
    if args.skip_tests:
        return rc
    rc_bench = rc
    t0 = time.perf_counter()
    lib = encode.launch, decode.launch
    encode.launch, decode.launch = v4_encode.launch, v4_decode.launch
    try:
        rc = pytest.main(["-q", "-x", "-m", "gpu", "-p", "no:cacheprovider", "-k", "not one_gib",
                          str(ROOT / "tests" / "test_gpu_codec.py")])
    finally:
        encode.launch, decode.launch = lib
    print(f"v4 under tests/test_gpu_codec.py: pytest exit code {int(rc)} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return int(rc) or rc_bench


if __name__ == "__main__":
    sys.exit(main())
