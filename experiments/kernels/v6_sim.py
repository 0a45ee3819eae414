"""The command line and the frame check that the v6 variants share under the CUDA simulator."""

from __future__ import annotations

import argparse
import time

import numpy as np


def sim_main(check, doc: str, argv=None) -> int:
    """``--sizes-k K ...``: run ``check(sizes_k)`` (its exit status) under the simulator only."""
    from zipccl.kernels import compat

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--sizes-k", type=float, nargs="+", default=[9, 20])
    args = ap.parse_args(argv)
    if not compat.SIMULATOR:
        raise SystemExit("on a GPU, v6_bench.py checks and times this variant (see v6_round.sh)")
    t0 = time.perf_counter()
    rc = check(args.sizes_k)
    print(f"{time.perf_counter() - t0:.1f} s")
    return rc


def check_frames(name: str, inputs, reference, library, variant) -> int:
    """For each (label, bits) of ``inputs``, with and without a checksum: the ``variant``'s frame
    equals the ``reference``'s and the ``library``'s byte for byte (each a function of (bits,
    checksum, workspace); the reference's of (bits, checksum)). Returns 1 if any differs."""
    from zipccl import format as fmt
    from zipccl.codec import gpu_workspace

    bad = 0
    for label, x in inputs:
        for cs in (False, True):
            want = reference(x, cs)
            ws = gpu_workspace.Workspace(x.size)
            lib = library(x, cs, ws)
            got = variant(x, cs, ws)
            ok = np.array_equal(got[:want.size], want) and np.array_equal(got, lib)
            bad += not ok
            print(f"{name} {label} checksum={cs}: {'ok' if ok else 'DIFFERS'} "
                  f"(raw: {fmt.parse_header(want).raw})", flush=True)
    return 1 if bad else 0


def float_inputs(sizes_k, np_float, edge, every: int, seed: int):
    """(name, bit patterns) of a variant's simulator checks for FP16 or FP32 (``np_float``): at each
    size (k * 1024 values, odd k plus a few, so that the last tile is partial) N(0, 0.02) with the
    ``edge`` patterns (±0, ±inf, NaNs, subnormals, ...) and an escape in every tile; the same with
    every ``every``-th value random bits (escape-heavy); random bits (a RAW frame) at the first size."""
    bits = np.uint16 if np_float == np.float16 else np.uint32
    rng = np.random.default_rng(seed)
    edge = np.array(edge, bits)
    inf = 0x7C00 if bits == np.uint16 else 0x7F800000
    top = 1 << (8 * np.dtype(bits).itemsize)
    for k in sizes_k:
        n = int(k * 1024) + (3 if int(k) % 2 else 0)
        x = rng.normal(0, 0.02, n).astype(np_float).view(bits)
        x[::613] = inf
        x[3:3 + edge.size] = edge[: max(0, min(edge.size, n - 3))]
        yield f"n={n} gaussian", x
        y = x.copy()
        y[::every] = rng.integers(0, top, y[::every].size, dtype=np.uint64).astype(bits)
        yield f"n={n} escape-heavy", y
        if k == sizes_k[0]:
            yield f"n={n} random (RAW)", rng.integers(0, top, n, dtype=np.uint64).astype(bits)
