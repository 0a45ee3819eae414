"""Host cost of one kernel launch by route, and of the codec's eager calls, on one GPU.

The lean launch route (``zipccl/kernels/launch.py``) exists because Numba's
dispatcher costs tens to hundreds of µs of host time per launch. This script
times, for one small Numba kernel (4 array arguments and 2 integers, the shape of
zipccl's kernels), 2,000 launches back to back and one synchronisation, per route:

* ``numba-cupy``: the kernel called with CuPy arrays (Numba's dispatcher);
* ``numba-devarray``: called with Numba device arrays;
* ``cuda.core``: ``cuda.core.launch`` with the same 7-slots-per-array arguments;
* ``bindings``: ``cuda.bindings.driver.cuLaunchKernel`` with a packed ``void**``;
* ``ctypes``: ``cuLaunchKernel`` of libcuda through ctypes with the same packed array;
* ``graph``: a CuPy graph of 100 launches, replayed (per launch).

Then the host µs of the codec calls users make (``encode_into`` / ``decode_into``
with a workspace, ``zipccl.compress`` / ``decompress`` of a CuPy array) at 1 MiB,
split into their parts. Each result is checked (the kernel's output) before it is
timed. One JSON record per route. Clock, data and record writer: ``experiments/harness.py``.

    python experiments/bench_launch.py --out $OUT/launch.jsonl
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_records, gaussian_bits, time_calls  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "launch_gpu.jsonl"
LAUNCHES = 2000
BURST = 64  # launches per timed burst: far below the launch queue, so the host never waits


def host_us(call, stream, bursts: int = 30) -> float:
    """Median host µs of one call, over bursts of BURST calls that start on an idle GPU."""
    return statistics.median(time_calls(call, BURST, stream=stream).host_s for _ in range(bursts)) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    import ctypes

    import cupy as cp
    from cuda.bindings import driver
    from numba import cuda

    import zipccl
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, gpu_arrays, gpu_codebook, gpu_workspace
    from zipccl.kernels import launch as lr

    @cuda.jit
    def k_add(a, b, c, d, n, v):
        i = cuda.grid(1)
        if i < n:
            c[i] = a[i] + b[i] + v
            d[i] = 1

    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    info = {"bench": "launch", "machine": f"1 x {name}", "gpu": name,
            "python": platform.python_version(), "cupy": cp.__version__,
            "run_id": time.strftime("%Y%m%dT%H%M%S")}
    stream = cp.cuda.Stream(non_blocking=True)
    s = stream.ptr
    n = 256
    a, b = cp.arange(n, dtype=cp.int64), cp.ones(n, dtype=cp.int64)
    c, d = cp.zeros(n, cp.int64), cp.zeros(n, cp.int64)
    na, nb, nc, nd = (cuda.from_cuda_array_interface(x.__cuda_array_interface__, sync=False)
                      for x in (a, b, c, d))
    ns = cuda.external_stream(s)
    kern = lr.Kernel(k_add, (lr.array(np.int64),) * 4 + (lr.I64, lr.I64))
    func = kern.function(lr.current_device())
    params = lr.Params(kern, ((a.data.ptr, n), (b.data.ptr, n), (c.data.ptr, n), (d.data.ptr, n), n, 5))
    flat = [int(v) for v in params.vals]

    from cuda.core import Device, LaunchConfig
    from cuda.core import launch as core_launch
    dev = Device()
    dev.set_current()
    core_stream = dev.create_stream(stream)
    cfg = LaunchConfig(grid=1, block=256)
    core_kernel = k_add.overloads[kern.argtypes]._codelibrary.get_cufunc().kernel
    libcuda = ctypes.CDLL("libcuda.so.1")
    raw_launch = libcuda.cuLaunchKernel
    raw_launch.restype = ctypes.c_int
    raw_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    fint = int(func)

    routes = {
        "numba-cupy": lambda: k_add[1, 256, ns](a, b, c, d, n, 5),
        "numba-devarray": lambda: k_add[1, 256, ns](na, nb, nc, nd, n, 5),
        "cuda.core": lambda: core_launch(core_stream, cfg, core_kernel, *flat),
        "bindings": lambda: driver.cuLaunchKernel(func, 1, 1, 1, 256, 1, 1, 0, s, params.address, 0),
        "ctypes": lambda: raw_launch(fint, 1, 1, 1, 256, 1, 1, 0, s, params.address, None),
    }
    want = cp.asnumpy(a + b + 5)
    rows = []

    def write(rec: dict) -> None:
        append_records(args.out, [{**info, **rec}])

    for route, call in routes.items():
        c.fill(0)
        call()
        stream.synchronize()
        if not np.array_equal(cp.asnumpy(c), want):
            raise SystemExit(f"{route}: wrong result")
        for _ in range(50):
            call()
        us = host_us(call, stream)
        rows.append((route, us))
        write({"route": route, "host_us_per_launch": us})
    # graph replay of 100 direct launches
    stream.begin_capture()
    for _ in range(100):
        routes["ctypes"]()
    g = stream.end_capture()
    g.launch(stream)
    host = time_calls(lambda: g.launch(stream), LAUNCHES // 100, stream=stream).host_s / 100
    rows.append(("graph (per launch)", host * 1e6))
    write({"route": "graph", "host_us_per_launch": host * 1e6})

    # the codec calls users make, 1 MiB, host µs per call and its parts
    m = 1 << 19
    x = gaussian_bits(m, seed=0, xp=cp)
    cb = Codebook.from_sigma(0.02)
    frame = cp.zeros(zipccl.max_compressed_size(m), cp.uint8)
    out = cp.zeros(m, cp.uint16)
    ws = gpu_workspace.Workspace(m)
    parts = {
        "encode_into": lambda: gpu.encode_into(x, frame, cb, s, workspace=ws),
        "decode_into": lambda: gpu.decode_into(frame, out, s, workspace=ws),
        "_values": lambda: gpu_arrays._values(x),
        "current_device": lr.current_device,
        "stream_key": lambda: gpu_arrays._stream_key(stream),
        "compress (sync)": lambda: zipccl.compress(x, dtype="bfloat16", stream=stream),
    }
    f = zipccl.compress(x, dtype="bfloat16", stream=stream)
    parts["decompress (sync)"] = lambda: zipccl.decompress(f, stream=stream)
    if not cp.array_equal(parts["decompress (sync)"](), x):
        raise SystemExit("compress/decompress round trip differs")
    for what, call in parts.items():
        for _ in range(20):
            call()
        us = host_us(call, stream, bursts=10)
        rows.append((what, us))
        write({"route": what, "size_bytes": 2 * m, "host_us_per_call": us})
    # device time of the on-device codebook choice (events over back-to-back launches)
    xp = int(x.data.ptr)
    for _ in range(10):
        gpu_codebook._choose(xp, m, ws, s)
    us = time_calls(lambda: gpu_codebook._choose(xp, m, ws, s), 200, stream=stream).seconds * 1e6
    rows.append(("choose_codebook (device)", us))
    write({"route": "choose_codebook device us", "size_bytes": 2 * m, "device_us_per_call": us})
    # the same codec call through libcuda's cuLaunchKernel by ctypes instead of cuda.bindings
    via_bindings = lr._LAUNCH
    lr._LAUNCH = raw_launch
    us = host_us(parts["encode_into"], stream, bursts=10)
    lr._LAUNCH = via_bindings
    rows.append(("encode_into (ctypes)", us))
    write({"route": "encode_into (ctypes)", "size_bytes": 2 * m, "host_us_per_call": us})
    # where the host time of the synchronising calls goes
    import cProfile
    import pstats
    for what in ("encode_into", "compress (sync)", "decompress (sync)"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            parts[what]()
        prof.disable()
        stream.synchronize()
        print(f"--- profile of 200 x {what}")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    print(f"{info['machine']}")
    print(f"{'route / call':>22} {'host us':>9}")
    for route, us in rows:
        print(f"{route:>22} {us:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
