"""GPU codec throughput on one GPU: zipccl's kernels beside a device copy and baselines.

For each size (BF16 input bytes; N(0, 0.02) values made on the device, rounded to
nearest even) it first checks, on the buffers it will time, that the GPU frame is
byte-identical to the reference frame (NumPy reference up to 64 MiB, the CPU fast
path above, itself tested byte-identical) and that the GPU decoder returns the
input bit for bit; then it times, with CUDA events on one non-blocking stream:

* ``copy``: CuPy device-to-device copy of the input (the memory ceiling);
* ``naive``: a kernel that only splits each value into a sign-mantissa byte and
  an exponent byte (one element per thread);
* ``v2``, ``v3``, ``v3-cs``, ``v3-lb8`` (records of run 20261130T032816): the
  earlier library versions, run by this script as it was at commit 952f4b0
  (experiments/kernels/NOTES.md, "Which commit holds each version");
* ``api``: ``zipccl.compress`` / ``zipccl.decompress`` of a CuPy array with the
  default codebook (chosen on the device) and checksum: the calls users make, each
  synchronising once (eager only: they read a length / error bits back);
* ``v4``: the library kernels (``zipccl.kernels``: persistent blocks, 32-bit
  per-value work, byte-wide plane stores and loads, codes to exponents by byte
  permute) through ``encode_into`` / ``decode_into``, without and with checksum
  (``v4-cs``). These are the frames checked against the reference above.

Two timings per variant: ``graph`` replays a CUDA graph of K calls (device time,
launch gaps removed) and ``eager`` issues the calls from Python (what a caller
sees, host overhead included; the larger of host and device time). Inputs rotate
over K buffer sets so that small sizes are not served from L2. GB/s = BF16 input
bytes / seconds (``zipccl.metrics.algbw``), for encode and decode alike; the
median of ``--repeats`` runs is kept. ``host_us`` is the Python time to enqueue
one call. One JSON record per (size, op, variant, mode) goes to ``--out``. The
clock (CUDA events), the data and the record writer are ``experiments/harness.py``'s.

    python experiments/bench_codec.py --out $OUT/codec_gpu.jsonl
    python experiments/bench_codec.py --sizes 1 16 256 --repeats 3
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import append_records, gaussian_bits, median_of, time_calls  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.codebook import Codebook  # noqa: E402
from zipccl.metrics import algbw, compression_ratio  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "codec_gpu.jsonl"
MiB = 1 << 20
ROTATE_BYTES = 256 * MiB  # input bytes cycled through per timing loop (L2 is ~60 MB)


def machine_info(cp) -> dict:
    import numba
    import numba_cuda

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"machine": f"1 x {name}", "gpu": name, "sm_count": props["multiProcessorCount"],
            "platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__,
            "numba_cuda": getattr(numba_cuda, "__version__", "?"), "cupy": cp.__version__,
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion()}


class Timer:
    """CUDA-event timing of one call (``harness.time_calls``), eager and as a replayed graph of K calls."""

    def __init__(self, cp, stream, repeats: int):
        self.cp, self.stream, self.repeats = cp, stream, repeats

    def eager(self, calls: list, iters: int) -> tuple[float, float]:
        """(median seconds per call, Python seconds to enqueue one call)."""
        k = len(calls)

        def run_all():
            for c in calls:
                c()

        run_all()
        host = time_calls(run_all, stream=self.stream).host_s / k
        reps = max(1, iters // k)
        return median_of(self.repeats, run_all, reps, stream=self.stream)[0] / k, host

    def graph(self, calls: list, iters: int) -> float | None:
        try:
            self.stream.begin_capture()
            for c in calls:
                c()
            g = self.stream.end_capture()
        except Exception as e:  # noqa: BLE001 - report and go on without graph numbers
            print(f"  graph capture failed: {type(e).__name__}: {e}", flush=True)
            try:
                self.stream.end_capture()
            except Exception:  # noqa: BLE001
                pass
            return None
        g.launch(self.stream)
        reps = max(1, iters // len(calls))
        t, _ = median_of(self.repeats, lambda: g.launch(self.stream), reps, stream=self.stream)
        return t / len(calls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256, 512, 1024, 2048],
                    help="BF16 input sizes in MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--modes", nargs="+", choices=["graph", "eager"], default=["graph", "eager"],
                    help="timings to take (the copy is always timed both ways)")
    ap.add_argument("--variants", nargs="+",
                    default=["copy", "naive", "api", "v4", "v4-cs"])
    args = ap.parse_args(argv)

    import cupy as cp
    from naive_split import naive_split

    from zipccl.codec import cpu, gpu, gpu_workspace, reference
    from zipccl.kernels import runtime

    info = machine_info(cp)
    run_id = time.strftime("%Y%m%dT%H%M%S")
    print(f"{info['machine']}  numba-cuda {info['numba_cuda']}  cupy {info['cupy']}", flush=True)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()  # every CuPy operation below is ordered with the kernels
    nstream = runtime.stream(stream.ptr)
    timer = Timer(cp, stream, args.repeats)
    cb = Codebook.from_sigma(0.02)

    records: list[dict] = []
    table: list[tuple] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def bench_size(mib: float) -> None:
        nbytes = int(mib * MiB)
        n = nbytes // 2
        sets = max(1, min(64, math.ceil(ROTATE_BYTES / nbytes)))
        iters = max(2 * sets, min(2000, int(64 * 1024 * MiB / nbytes)))
        lay = fmt.Layout.for_count(n)
        bits = [gaussian_bits(n, seed=seed, xp=cp) for seed in range(sets)]
        frames = [cp.zeros(lay.raw_size, cp.uint8) for _ in range(sets)]
        frames_cs = [cp.zeros(lay.raw_size, cp.uint8) for _ in range(sets)]
        outs = [cp.zeros(n, cp.uint16) for _ in range(sets)]
        ws = gpu_workspace.Workspace(n)
        stream.synchronize()

        # ---- correctness on the timed buffers, before any timing
        t0 = time.perf_counter()
        host0 = cp.asnumpy(bits[0])
        for i in range(sets):
            gpu.encode_into(bits[i], frames[i], cb, stream, checksum=False, workspace=ws)
            gpu.encode_into(bits[i], frames_cs[i], cb, stream, checksum=True, workspace=ws)
        stream.synchronize()
        flen = int(cp.asnumpy(frames[0][fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8]).view("<i8")[0])
        flen_cs = int(cp.asnumpy(frames_cs[0][fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8]).view("<i8")[0])
        codec = reference if n <= 32 * MiB else cpu
        want = codec.encode(host0, cb, None, False)
        want_cs = codec.encode(host0, cb, None, True)
        if not (np.array_equal(cp.asnumpy(frames[0][:flen]), want)
                and np.array_equal(cp.asnumpy(frames_cs[0][:flen_cs]), want_cs)):
            raise SystemExit(f"{mib} MiB: GPU frame differs from the {codec.__name__} frame")
        wrong = 0
        for i in range(sets):
            for f in (frames[i], frames_cs[i]):
                outs[i].fill(0)
                gpu.decode_into(f, outs[i], stream, workspace=ws)
                if ws.last_error(stream):
                    raise SystemExit(f"{mib} MiB: decoder reports {ws.describe(ws.last_error())}")
                wrong += int(cp.count_nonzero(outs[i] != bits[i]))
        if wrong:
            raise SystemExit(f"{mib} MiB: {wrong} values decoded wrong")
        print(f"{mib:g} MiB: all results match ({codec.__name__} frame, {sets} buffer sets, "
              f"ratio {flen / nbytes:.4f}, check {time.perf_counter() - t0:.1f} s); timing",
              flush=True)

        # ---- timing
        def record(op, variant, mode, secs, host=None, ratio=None, extra=None):
            if secs is None:
                return
            rec = {"bench": "codec_gpu", "run_id": run_id, **info, "op": op, "variant": variant,
                   "mode": mode, "size_mib": mib, "n": n, "input_bytes": nbytes,
                   "buffer_sets": sets, "seconds": secs, "gbps": algbw(nbytes, secs),
                   "host_us": None if host is None else host * 1e6,
                   "ratio": ratio, "codebook": list(cb.exponents), "sigma": 0.02, **(extra or {})}
            if op == "copy":  # also the read + write bandwidth, the usual copy figure
                rec["rw_gbps"] = algbw(2 * nbytes, secs)
            records.append(rec)
            append_records(args.out, [rec])  # at once: a run cut short keeps what it measured
            table.append((mib, op, variant, mode, rec["gbps"], secs * 1e6,
                          rec["host_us"], ratio))

        def both(op, variant, calls, ratio=None):
            for c in calls[:2]:  # compile and load before any capture
                c()
            stream.synchronize()
            if "graph" in args.modes or op == "copy":
                g = timer.graph(calls, iters)
                record(op, variant, "graph", g, ratio=ratio)
            if "eager" in args.modes or op == "copy":
                e, host = timer.eager(calls, iters)
                record(op, variant, "eager", e, host=host, ratio=ratio)

        ratio = compression_ratio(flen, nbytes)
        if "copy" in args.variants:
            dst = [cp.empty(n, cp.uint16) for _ in range(sets)]

            def cp_call(i, d=dst):
                return lambda: cp.cuda.runtime.memcpyAsync(
                    d[i].data.ptr, bits[i].data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                    stream.ptr)

            both("copy", "cupy", [cp_call(i) for i in range(sets)])
            del dst
        if "naive" in args.variants:
            sm = [cp.empty(n, cp.uint8) for _ in range(sets)]
            ex = [cp.empty(n, cp.uint8) for _ in range(sets)]
            grid = min(132 * 32, max(1, n // 256))
            views = [(runtime.view(bits[i], n, np.uint16), runtime.view(sm[i], n, np.uint8),
                      runtime.view(ex[i], n, np.uint8)) for i in range(sets)]
            both("encode", "naive", [
                (lambda v=v: naive_split[grid, 256, nstream](v[0], n, v[1], v[2])) for v in views])
            del sm, ex, views
        if "v4" in args.variants:  # the library, as callers use it
            both("encode", "v4", [
                (lambda i=i: gpu.encode_into(bits[i], frames[i], cb, stream, workspace=ws))
                for i in range(sets)], ratio)
            both("decode", "v4", [
                (lambda i=i: gpu.decode_into(frames[i], outs[i], stream, workspace=ws))
                for i in range(sets)], ratio)
        if "v4-cs" in args.variants:
            both("encode", "v4-cs", [
                (lambda i=i: gpu.encode_into(bits[i], frames_cs[i], cb, stream, checksum=True,
                                             workspace=ws)) for i in range(sets)],
                 compression_ratio(flen_cs, nbytes))
            both("decode", "v4-cs", [
                (lambda i=i: gpu.decode_into(frames_cs[i], outs[i], stream, workspace=ws))
                for i in range(sets)], compression_ratio(flen_cs, nbytes))
        if "api" in args.variants:  # what users call: zipccl.compress / decompress of a CuPy array
            import zipccl

            api_frames = [zipccl.compress(bits[i], dtype="bfloat16", stream=stream) for i in range(sets)]
            want_api = codec.encode(host0, Codebook.from_sample(host0), None, True)
            if not np.array_equal(cp.asnumpy(api_frames[0]), want_api):
                raise SystemExit(f"{mib} MiB: zipccl.compress frame differs from the {codec.__name__} "
                                 "frame with the host's default codebook")
            for i in range(sets):
                if not cp.array_equal(zipccl.decompress(api_frames[i], stream=stream), bits[i]):
                    raise SystemExit(f"{mib} MiB: zipccl.decompress round trip {i} differs")
            api_ratio = compression_ratio(int(api_frames[0].size), nbytes)
            e, host = timer.eager([(lambda i=i: zipccl.compress(bits[i], dtype="bfloat16", stream=stream))
                                   for i in range(sets)], iters)
            record("compress", "api", "eager", e, host=host, ratio=api_ratio)
            e, host = timer.eager([(lambda i=i: zipccl.decompress(api_frames[i], stream=stream))
                                   for i in range(sets)], iters)
            record("decompress", "api", "eager", e, host=host, ratio=api_ratio)
            del api_frames
        # the timed buffers still hold correct frames and values
        stream.synchronize()
        for i in range(sets):
            if not cp.array_equal(outs[i], bits[i]):
                raise SystemExit(f"{mib} MiB: output {i} wrong after timing")
        if not np.array_equal(cp.asnumpy(frames[0][:flen]), want):
            raise SystemExit(f"{mib} MiB: frame 0 wrong after timing")
        cp.get_default_memory_pool().free_all_blocks()

    for mib in args.sizes:
        bench_size(mib)

    print(f"\n{'MiB':>6} {'op':>6} {'variant':>8} {'mode':>5} {'GB/s':>8} {'us':>9} {'host_us':>8} ratio")
    for mib, op, var, mode, gbps, us, host, ratio in table:
        print(f"{mib:6g} {op:>6} {var:>8} {mode:>5} {gbps:8.1f} {us:9.1f} "
              f"{'' if host is None else f'{host:8.1f}':>8} {'' if ratio is None else f'{ratio:.4f}'}")
    print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
