"""``zipccl warmup``: compile every GPU kernel zipccl launches, once, for this machine's GPU.

Every Numba kernel of the codec (each element type, both decoders, the codebook choice) is
loaded from the kernel cache or compiled and written there (``zipccl.kernels.cache``; where
it lives: ``--where``), then the CUDA C spill kernels are built into CuPy's own cache when
CuPy is installed. Afterwards a fresh process's first compressed call loads cubins instead of
compiling for seconds. One progress line per kernel goes to stderr, the summary to stdout.

A machine without a GPU (or the CUDA simulator) has nothing to compile for: the command says
so in one line and exits 2. (Numba needs the device's architecture, and this cache keeps
linked cubins for it, so nothing is compiled ahead for a GPU that is not there.)

Exit status: 0 every kernel is ready, 1 one failed to build, 2 no GPU or a usage error.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None, prog: str = "zipccl warmup") -> int:
    """Run the command; return its exit status."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0].split(": ", 1)[1])
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--clear", action="store_true",
                    help="delete zipccl's cached kernels (every version) before building")
    ap.add_argument("--where", action="store_true",
                    help="print the cache folders and exit (needs no GPU)")
    args = ap.parse_args(argv)

    from .kernels import cache

    if args.where:
        state = "on" if cache.enabled() else f"off ({cache.ENV_ENABLE}=0)"
        print(f"zipccl kernel cache: {cache.directory()} ({state}; override with {cache.ENV_DIR})")
        print(f"CuPy kernel cache (spill kernels): {cache.cupy_cache_dir()} (CUPY_CACHE_DIR)")
        return 0
    if args.clear:
        n = cache.clear()
        print(f"{prog}: removed {n} files from {cache.directory()}", file=sys.stderr)
    count, why = cache.gpu_count()
    if count == 0:
        print(f"{prog}: no CUDA GPU to compile for ({why}); nothing done", file=sys.stderr)
        return 2
    if not 0 <= args.device < count:
        print(f"{prog}: error: --device {args.device}: this machine has {count} CUDA device(s)",
              file=sys.stderr)
        return 2
    if not cache.enabled():
        print(f"{prog}: note: {cache.ENV_ENABLE}=0: the kernels are compiled but not kept",
              file=sys.stderr)

    def report(i: int, total: int, name: str, how: str, seconds: float) -> None:
        print(f"[{i:2d}/{total}] {name}: {how} ({seconds:.1f} s)", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        counts = cache.build_all(args.device, report)
    except Exception as e:  # a kernel that does not build: say which error, exit 1
        print(f"{prog}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    from .kernels import launch

    arch = cache.arch_name(launch.compute_capability(args.device))
    parts = ", ".join(f"{n} {how}" for how, n in sorted(counts.items()))
    print(f"{sum(counts.values())} Numba kernels for {arch} ready in {time.perf_counter() - t0:.1f} s "
          f"({parts}); cache: {cache.directory() if cache.enabled() else 'off'}")
    return 0
