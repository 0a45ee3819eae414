"""Where the time of the public ``zipccl.compress`` / ``zipccl.decompress`` of a device array goes.

For each size (BF16 N(0, 0.02) values on the device, buffer sets rotating over 256 MiB as in
``bench_peers.py``) the script first checks that every ``compress`` frame decompresses to its
input bit for bit and equals the frame ``encode_into`` writes with the same codebook and the
checksum, then times on one non-blocking CuPy stream:

* ``e2e``: the public call, back to back, each one synchronising as it must: wall-clock
  microseconds per call (``perf_counter``) and CUDA-event microseconds of the same loop;
  also ``decompress`` with ``out=``.
* ``device``: the device work of one call alone (CUDA events around the kernels and the
  small device-to-host copies, enqueued behind a 256 MiB copy so that no launch gap is
  counted): codebook choice, encoder (checksum on, codebook from the device: what
  ``compress`` runs) and the plan path's encoder (checksum off, codebook given: what
  ``encode_into`` in ``bench_peers`` runs), decoder of a checksummed frame, the copies.
* ``host``: the host cost of each step of ``codec/gpu.py``'s calls, timed alone in loops
  with ``perf_counter`` (no synchronisation inside the loop where the step has none): the
  argument checks, the output allocation, the workspace and plan lookups with their
  launches, a small device-to-host read on an idle stream (a synchronisation's round
  trip), the header parse (on a steady-state decompress only ``header_check``, the bytes
  compared with the kept header; ``format.parse_header`` runs when they differ), the
  decoder of a kept call (``launch_decode_kept``), the final slice.

``exposed = e2e - device``: the per-call cost on top of the device work. One JSON record per
(size, op, part) goes to ``--out``, each naming the machine.

``--count-calls`` times nothing: it counts the zipccl Python functions one steady-state call
enters (``sys.setprofile``; the third call of a signature), with its kernel launches and host
waits, per op (part ``python_calls``). On a GPU it runs the real path; under
``NUMBA_ENABLE_CUDASIM=1`` it runs the GPU's host path (the plan route, ``tests/mpi/fake_cupy.py``
as CuPy) with the simulator's launch and reads standing in for the driver's (not counted).

    python experiments/bench_api_overhead.py --out $OUT/api_overhead.jsonl
    NUMBA_ENABLE_CUDASIM=1 python experiments/bench_api_overhead.py --count-calls --label ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_codec import machine_info  # noqa: E402
from harness import gaussian_bits  # noqa: E402

from zipccl.metrics import algbw  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "api_overhead.jsonl"
MiB = 1 << 20
ROTATE_BYTES = 256 * MiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--label", default="", help="what code is measured (saved in each record)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--count-calls", action="store_true",
                    help="count zipccl's Python calls per steady-state call (no timing)")
    ap.add_argument("--count-n", type=int, default=0,
                    help="values per tensor for --count-calls (default: 16 MiB of BF16; 9000 "
                         "under the simulator)")
    args = ap.parse_args(argv)
    if args.count_calls:
        return count_calls(args)

    import cupy as cp

    import zipccl
    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, gpu_arrays, gpu_codebook, gpu_route, gpu_workspace

    info = machine_info(cp)
    info["machine"] = f"{cp.cuda.runtime.getDeviceCount()} x {info['gpu']} (one used)"
    run_id = time.strftime("%Y%m%dT%H%M%S")
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    launch = gpu_route._launch()
    pinned = launch.pinned()
    busy_src = cp.zeros(ROTATE_BYTES, cp.uint8)
    busy_dst = cp.empty_like(busy_src)
    rows: list[tuple] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fh = args.out.open("a")

    def record(mib, op, part, us, extra=None):
        rec = {"bench": "api_overhead", "run_id": run_id, "label": args.label, **info,
               "size_mib": mib, "op": op, "part": part, "us": us, **(extra or {})}
        fh.write(json.dumps(rec) + "\n")
        fh.flush()
        rows.append((mib, op, part, us, (extra or {}).get("gbps")))

    def host_us(fn, k: int) -> float:
        """Median over repeats of the host microseconds per call of ``fn`` (k calls a loop)."""
        ts = []
        for _ in range(args.repeats):
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            ts.append((time.perf_counter() - t0) / k * 1e6)
            stream.synchronize()
        return statistics.median(ts)

    def e2e_us(calls, k: int) -> tuple[float, float]:
        """(wall-clock, CUDA-event) microseconds per call of the synchronising ``calls``."""
        walls, evs = [], []
        for _ in range(args.repeats):
            stream.synchronize()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            t0 = time.perf_counter()
            for i in range(k):
                calls[i % len(calls)]()
            walls.append((time.perf_counter() - t0) / k * 1e6)
            end.record(stream)
            end.synchronize()
            evs.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / k)
        return statistics.median(walls), statistics.median(evs)

    def device_us(enqueue, k: int = 1) -> float:
        """CUDA-event microseconds of k ``enqueue()`` on a busy stream (no launch gaps)."""
        ts = []
        for _ in range(args.repeats):
            stream.synchronize()
            busy_dst.data.copy_from_device_async(busy_src.data, busy_src.nbytes, stream)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            for _ in range(k):
                enqueue()
            end.record(stream)
            end.synchronize()
            ts.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / k)
        return statistics.median(ts)

    def one_size(mib: float) -> None:
        nbytes = int(mib * MiB)
        n = nbytes // 2
        sets = max(1, min(64, math.ceil(ROTATE_BYTES / nbytes)))
        bits = [gaussian_bits(n, seed=seed, xp=cp) for seed in range(sets)]
        stream.synchronize()

        # -- check: round trips, and compress == encode_into with the same codebook + checksum
        frames = [zipccl.compress(b, dtype="bfloat16", stream=stream) for b in bits]
        outs = [zipccl.decompress(f, stream=stream) for f in frames]
        bad = sum(int(not cp.array_equal(o, b)) for o, b in zip(outs, bits, strict=True))
        cb = Codebook(tuple(int(e) for e in cp.asnumpy(frames[0][fmt.CODEBOOK_AT:fmt.CODEBOOK_AT + 7])))
        ref = cp.zeros(zipccl.max_compressed_size(n), cp.uint8)
        gpu.encode_into(bits[0], ref, cb, stream, checksum=True)
        bad += int(not cp.array_equal(ref[:frames[0].size], frames[0]))
        o2 = cp.empty(n, cp.uint16)
        bad += int(not cp.array_equal(zipccl.decompress(frames[-1], out=o2, stream=stream), bits[-1]))
        if bad:
            raise SystemExit(f"{mib} MiB: {bad} checks failed; nothing timed")
        ratio = float(sum(f.size for f in frames)) / len(frames) / nbytes
        k = max(2 * sets, min(2000, int(0.2 / max(4 * nbytes / 1.0e12, 40e-6))))

        # -- end to end
        comp = [(lambda b=b: zipccl.compress(b, dtype="bfloat16", stream=stream)) for b in bits]
        dec = [(lambda f=f: zipccl.decompress(f, stream=stream)) for f in frames]
        dec_out = [(lambda f=f, o=o: zipccl.decompress(f, out=o, stream=stream))
                   for f, o in zip(frames, outs, strict=True)]
        for op, calls in (("compress", comp), ("decompress", dec), ("decompress_out", dec_out)):
            calls[0]()
            wall, ev = e2e_us(calls, k)
            record(mib, op, "e2e", wall, {"event_us": ev, "gbps": algbw(nbytes, wall * 1e-6),
                                          "ratio": ratio})

        # -- device work of one call
        s = stream.ptr
        x_ptr = bits[0].data.ptr
        buf = cp.empty(fmt.Layout.for_count(n).raw_size, cp.uint8)
        o_ptr, o_bytes = buf.data.ptr, buf.nbytes
        ws = gpu_workspace.default_workspace(s, n)
        f_ptr, f_bytes = frames[0].data.ptr, frames[0].nbytes
        dst = outs[0]

        def choose():
            gpu_codebook._choose(x_ptr, n, ws, s)

        def enc_api():
            gpu._encode(x_ptr, n, o_ptr, o_bytes, None, s, True, (n,), ws)

        def enc_plan():
            gpu._encode(x_ptr, n, o_ptr, o_bytes, cb.exponents, s, False, (n,), ws)

        def read8():
            launch.check(launch._driver().cuMemcpyDtoHAsync(pinned.ptr, o_ptr + fmt.FRAME_LEN_AT, 8, s),
                         "cuMemcpyDtoHAsync")

        def read128():
            launch.check(launch._driver().cuMemcpyDtoHAsync(pinned.ptr, f_ptr, 128, s),
                         "cuMemcpyDtoHAsync")

        def decode():
            gpu._decode(f_ptr, f_bytes, dst.data.ptr, n, s, ws)

        def compress_chain():
            choose()
            enc_api()
            read8()

        for part, fn in (("choose", choose), ("encode_api", enc_api), ("encode_plan", enc_plan),
                         ("read8", read8), ("compress_chain", compress_chain),
                         ("decode_cs", decode), ("read128", read128)):
            fn()
            record(mib, "device", part, device_us(fn, 4))

        # -- host cost of each step
        x = bits[0]
        raw_size = fmt.Layout.for_count(n).raw_size
        steps = {
            "is_device_array": lambda: zipccl.arrays.is_device_array(x),
            "typed_view": lambda: gpu_arrays._typed_view(x, "bfloat16"),
            "values": lambda: gpu_arrays._values(x),
            "alloc_frame": lambda: gpu_arrays._empty_like_framework(x, raw_size, "u8"),
            "alloc_values": lambda: gpu_arrays._empty_like_framework(x, (n,), "bf16"),
            "workspace": lambda: gpu_workspace.default_workspace(s, n),
            "launch_choose": choose,
            "launch_encode": enc_api,
            "launch_decode": decode,
            "parse_header": lambda: fmt.parse_header(pinned.array[:128], buffer_len=f_bytes),
            "header_check": lambda: pinned.array[gpu._TAIL].tobytes() == kept.tail and
            len(set(pinned.array[gpu._CODEBOOK].tobytes())) == fmt.CODEBOOK_SIZE,
            "launch_decode_kept": lambda: gpu._decode_kept(kept, f_ptr, f_bytes, dst.data.ptr, s),
            "slice": lambda: buf[:f_bytes],
        }
        kept = gpu._decoder_kept(f_ptr, f_bytes, n, fmt.DTYPE_BF16, s)
        read128()
        stream.synchronize()
        kept.tail = pinned.array[gpu._TAIL].tobytes()
        for part, fn in steps.items():
            fn()
            kk = 200 if part.startswith("launch") else 2000
            record(mib, "host", part, host_us(fn, kk))
        stream.synchronize()
        record(mib, "host", "read_roundtrip", host_us(lambda: pinned.read(f_ptr, 128, s), 2000))
        print(f"  {mib:g} MiB done", flush=True)

    for mib in args.sizes:
        one_size(mib)
        cp.get_default_memory_pool().free_all_blocks()
    fh.close()
    print(f"\n{'MiB':>6} {'op':>15} {'part':>16} {'us':>9} {'GB/s':>8}")
    for mib, op, part, us, gbps in rows:
        print(f"{mib:6g} {op:>15} {part:>16} {us:9.1f} {'' if gbps is None else f'{gbps:8.1f}'}")
    print(f"wrote {len(rows)} records to {args.out}")
    print("steady-state calls reuse their signature's kept call: host parts workspace, launch_encode "
          "and launch_decode are first-call costs now; header_check and launch_decode_kept replace "
          "parse_header and launch_decode in decompress")
    return 0


SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
COUNT_OPS = ("compress", "compress_fp32", "compress_sigma", "decompress", "decompress_fresh",
             "decompress_out", "decompress_fp32")


def python_calls(call) -> tuple[int, int, int, dict]:
    """(zipccl Python calls, kernel launches, host waits, calls per function) of one ``call()``.

    A launch is an entry into ``kernels/launch.py``'s ``launch``; a host wait one into a
    pinned reader's ``read`` / ``read_two``. Under the simulator what runs beneath the
    stand-ins of the driver (``simlaunch.launch_packed``, ``gpu_route._SimReads``) is
    not zipccl's host path on a GPU and is left out.
    """
    root = str(Path(__file__).resolve().parent.parent / "zipccl") + os.sep
    by: dict[str, int] = {}
    launches, waits, below = [0], [0], [None]  # below: the stand-in frame whose callees are hidden

    def prof(frame, event, arg):
        if below[0] is not None:
            if event == "return" and frame is below[0]:
                below[0] = None
            return
        if event != "call" or not frame.f_code.co_filename.startswith(root):
            return
        co = frame.f_code
        name, file = co.co_name, co.co_filename[len(root):]
        if file == f"kernels{os.sep}simlaunch.py":  # cuLaunchKernel's stand-in: C on a GPU
            below[0] = frame
            return
        by[f"{file}:{name}"] = by.get(f"{file}:{name}", 0) + 1
        if name == "launch" and file == f"kernels{os.sep}launch.py":
            launches[0] += 1
        if name in ("read", "read_two"):
            waits[0] += 1
            if file == f"codec{os.sep}gpu_route.py":  # the simulator's reads
                below[0] = frame

    sys.setprofile(prof)
    try:
        call()
    finally:
        sys.setprofile(None)
    return sum(by.values()), launches[0], waits[0], dict(sorted(by.items()))


def count_calls(args) -> int:
    """``--count-calls``: each op of ``COUNT_OPS``, checked, called twice, then counted."""
    if SIM:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "mpi"))
        import fake_cupy

        fake_cupy.install()
    import contextlib

    import cupy as cp
    import numpy as np

    import zipccl
    from zipccl.codec import gpu_route

    n = args.count_n or (9000 if SIM else 8 * MiB)
    route = "simulator: the GPU's plan route, stand-in CuPy" if SIM else "gpu"
    info = {"machine": "CUDA simulator" if SIM else f"1 x {cp.cuda.runtime.getDeviceProperties(0)['name']}",
            "platform": platform.platform(), "python": platform.python_version(), "route": route}
    run_id = time.strftime("%Y%m%dT%H%M%S")
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    host = [(rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            for _ in range(4)]
    bits = [cp.asarray(h) for h in host]
    wide = [cp.asarray(rng.normal(0, 1e-3, n).astype(np.float32)) for _ in range(3)]
    frames = [zipccl.compress(b, dtype="bfloat16", stream=stream) for b in bits]
    f32 = zipccl.compress(wide[0], stream=stream)
    out = cp.empty(n, cp.uint16)
    fresh = iter(frames[1:])
    ops = {
        "compress": lambda: zipccl.compress(bits[0], dtype="bfloat16", stream=stream),
        "compress_fp32": lambda: zipccl.compress(wide[0], stream=stream),
        "compress_sigma": lambda: zipccl.compress(bits[0], sigma=0.02, dtype="bfloat16", stream=stream),
        "decompress": lambda: zipccl.decompress(frames[0], stream=stream),
        "decompress_fresh": lambda: zipccl.decompress(next(fresh), stream=stream),  # a new frame each call
        "decompress_out": lambda: zipccl.decompress(frames[0], out=out, stream=stream),
        "decompress_fp32": lambda: zipccl.decompress(f32, stream=stream),
    }
    def same(a, b) -> bool:  # bits, never values
        a, b = cp.asnumpy(a), cp.asnumpy(b)
        return a.dtype.itemsize == b.dtype.itemsize and np.array_equal(a.view(f"u{a.itemsize}"),
                                                                       b.view(f"u{b.itemsize}"))

    checks = {"compress": lambda y: same(y, frames[0]), "compress_fp32": lambda y: same(y, f32),
              "decompress": lambda y: same(y, bits[0]), "decompress_fresh": lambda y: same(y, bits[3]),
              "decompress_out": lambda y: same(y, bits[0]), "decompress_fp32": lambda y: same(y, wide[0])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with (gpu_route.plans_under_simulator() if SIM else contextlib.nullcontext()), args.out.open("a") as fh:
        print(f"{'op':>18} {'calls':>6} {'launches':>9} {'waits':>6}")
        for op in COUNT_OPS:
            fn = ops[op]
            for _ in range(2):
                fn()
            box: list = []
            calls, launches, waits, by = python_calls(lambda fn=fn, box=box: box.append(fn()))
            if not checks.get(op, lambda y: True)(box[0]):
                raise SystemExit(f"{op}: a wrong result")
            rec = {"bench": "api_overhead", "run_id": run_id, "label": args.label, **info, "n": n,
                   "op": op, "part": "python_calls", "calls": calls, "launches": launches,
                   "host_waits": waits, "by_function": by}
            fh.write(json.dumps(rec) + "\n")
            print(f"{op:>18} {calls:6d} {launches:9d} {waits:6d}")
    print(f"appended {len(COUNT_OPS)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
