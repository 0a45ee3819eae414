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
from collections.abc import Callable

from .kernels import cache

# the modules that define the library's Numba kernels (``launch.Kernel``s)
KERNEL_MODULES = ("encode_launch", "decode", "decode_fp16", "decode_warps", "stats")


def library_kernels() -> tuple:
    """Every ``launch.Kernel`` of the library's kernel modules (importing them)."""
    import importlib

    from .kernels import launch

    for m in KERNEL_MODULES:
        importlib.import_module(f"zipccl.kernels.{m}")
    prefix = "zipccl.kernels."
    return tuple(k for k in launch.kernels() if k.dispatcher.py_func.__module__.startswith(prefix))


def spill_kernel_names() -> tuple[str, ...]:
    """The ``__global__`` functions of the CUDA C spill kernels."""
    import re

    from .kernels import spill

    return tuple(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(",
                            spill.source()))


def build_all(device: int, report: Callable[[int, int, str, str, float], None]) -> dict[str, int]:
    """Load or compile every library kernel on ``device`` (made current), then the CuPy spill
    kernels when CuPy is installed. ``report(i, total, name, how, seconds)`` after each; returns
    how many of each ``how``. Raises what a compilation raises."""
    import time

    cache.select_device(device)
    from .kernels import launch

    todo = library_kernels()
    spill_names: tuple[str, ...] = ()
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        spill_names = spill_kernel_names()
    total = len(todo) + (1 if spill_names else 0)
    counts: dict[str, int] = {}
    dev = launch.current_device()
    for i, k in enumerate(todo, 1):
        t0 = time.perf_counter()
        k.function(dev)
        how = k.origin.get(dev, "loaded")
        counts[how] = counts.get(how, 0) + 1
        report(i, total, f"{k.name} ({', '.join(str(t) for t in k.argtypes[:2])}, ...)", how,
               time.perf_counter() - t0)
    if spill_names:
        from .kernels import spill

        t0 = time.perf_counter()
        with cupy.cuda.Device(device):
            for name in spill_names:
                spill.function(cupy, name)
        report(total, total, f"spill kernels ({len(spill_names)}, CUDA C through CuPy)",
               f"CuPy's cache {cache.cupy_cache_dir(cupy)}", time.perf_counter() - t0)
    return counts


def main(argv: list[str] | None = None, prog: str = "zipccl warmup") -> int:
    """Run the command; return its exit status."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0].split(": ", 1)[1])
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--clear", action="store_true",
                    help="delete zipccl's cached kernels (every version) before building")
    ap.add_argument("--where", action="store_true",
                    help="print the cache folders and exit (needs no GPU)")
    args = ap.parse_args(argv)

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
        counts = build_all(args.device, report)
    except Exception as e:  # a kernel that does not build: say which error, exit 1
        print(f"{prog}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    from .kernels import launch

    arch = cache.arch_name(launch.compute_capability(args.device))
    parts = ", ".join(f"{n} {how}" for how, n in sorted(counts.items()))
    print(f"{sum(counts.values())} Numba kernels for {arch} ready in {time.perf_counter() - t0:.1f} s "
          f"({parts}); cache: {cache.directory() if cache.enabled() else 'off'}")
    return 0
