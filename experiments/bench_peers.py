"""zipccl beside the GPU codec peers, one process, the same buffers: DietGPU's float codec and
nvCOMP's ANS and Bitcomp, on BF16 at 1 to 1,024 MiB.

For each kind of data (``gaussian``: N(0, 0.02) values rounded to BF16 on the device;
``checkpoint``: the BF16 bit patterns of the bundled real checkpoint's floating tensors, a
``.npy`` of uint16 given by ``--checkpoint``, repeated with a rotation per buffer set to fill
larger sizes) and each size, every codec first round-trips every buffer set it will be timed
on and the result is compared with the input bit for bit (a codec that fails is reported and
not timed); then each is timed eager with CUDA events on one non-blocking stream
(``bench_codec.Timer``: the calls issued from Python, host overhead included), inputs
rotating over buffer sets so that small sizes are not served from L2:

* ``zipccl-api``: ``zipccl.compress`` / ``zipccl.decompress`` of a CuPy array (codebook
  chosen on the device, checksum on): what a user calls; each call synchronises once.
* ``zipccl``: ``codec.gpu.encode_into`` / ``decode_into`` into preallocated buffers
  (the codebook ``compress`` chose for the first buffer set, no checksum), eager and as a
  replayed CUDA graph.
* ``dietgpu``: DietGPU's float codec (BF16, ANS probability bits 10, its default), built from
  its public source for sm_90 into a plain shared library with C entry points
  (``--dietgpu``; see experiments/README.md), preallocated outputs and temporary memory.
* ``nvcomp-ans`` (data type ``<f2``) and ``nvcomp-bitcomp`` (``<u2``, lossless): nvCOMP's
  Python API (wheels ``nvidia-nvcomp-cu13``, ``nvidia-libnvcomp-cu13``), default chunking,
  on the same stream.

GB/s = BF16 input bytes / seconds for both directions; ratio = compressed / input bytes.
One JSON record per (data, size, codec, op, mode) goes to ``--out``.

    python experiments/bench_peers.py --out $OUT/codec_peers.jsonl \\
        --dietgpu .peers/libdietgpu_bf16.so --checkpoint .peers/ckpt_bf16.npy
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_codec import Timer, machine_info  # noqa: E402
from harness import append_records, gaussian_bits  # noqa: E402

from zipccl.metrics import algbw  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "codec_peers.jsonl"
MiB = 1 << 20
ROTATE_BYTES = 256 * MiB


class DietGpu:
    """DietGPU's BF16 float codec through the C entry points of ``libdietgpu_bf16.so``."""

    def __init__(self, cp, path: Path, stream, temp_bytes: int):
        lib = ctypes.CDLL(str(path))
        lib.dg_new.restype = ctypes.c_void_p
        lib.dg_new.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
        lib.dg_max_size.restype = ctypes.c_uint
        lib.dg_max_size.argtypes = (ctypes.c_uint,)
        lib.dg_compress.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_void_p)
        lib.dg_decompress.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        self.cp, self.lib, self.stream = cp, lib, stream
        self.temp = cp.empty(temp_bytes, cp.uint8)
        self.res = lib.dg_new(cp.cuda.Device().id, self.temp.data.ptr, temp_bytes)
        self.size = cp.zeros(1, cp.uint32)
        self.ok = cp.zeros(1, cp.uint8)
        self.dsize = cp.zeros(1, cp.uint32)

    def max_size(self, n: int) -> int:
        return int(self.lib.dg_max_size(n))

    def compress(self, x, out) -> None:
        self.lib.dg_compress(self.res, x.data.ptr, x.size, out.data.ptr, self.size.data.ptr,
                             self.stream.ptr)

    def decompress(self, comp, out) -> None:
        self.lib.dg_decompress(self.res, comp.data.ptr, out.data.ptr, out.size, self.ok.data.ptr,
                               self.dsize.data.ptr, self.stream.ptr)


def checkpoint_sets(cp, path: Path, n: int, sets: int):
    """``sets`` buffers of n values cut from the checkpoint's bits, each rotated differently."""
    base = cp.asarray(np.load(path).astype(np.uint16))
    reps = math.ceil((n + sets * 7919) / base.size) + 1
    tiled = cp.tile(base, reps)
    return [tiled[i * 7919: i * 7919 + n].copy() for i in range(sets)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 16, 64, 256, 1024])
    ap.add_argument("--data", nargs="+", choices=["gaussian", "checkpoint"],
                    default=["gaussian", "checkpoint"])
    ap.add_argument("--codecs", nargs="+", default=["zipccl-api", "zipccl", "dietgpu", "nvcomp-ans",
                                                    "nvcomp-bitcomp"])
    ap.add_argument("--dietgpu", type=Path, default=Path(".peers/libdietgpu_bf16.so"))
    ap.add_argument("--checkpoint", type=Path, default=Path(".peers/ckpt_bf16.npy"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.15, help="target time of one timed loop")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    import cupy as cp

    import zipccl
    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, gpu_workspace

    info = machine_info(cp)
    run_id = time.strftime("%Y%m%dT%H%M%S")
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    timer = Timer(cp, stream, args.repeats)
    codecs = list(args.codecs)
    dg = None
    if "dietgpu" in codecs:
        try:
            dg = DietGpu(cp, args.dietgpu, stream, 1 << 30)
        except OSError as e:
            print(f"dietgpu not available: {e}", flush=True)
            codecs.remove("dietgpu")
    nvc = None
    if any(c.startswith("nvcomp") for c in codecs):
        try:
            from nvidia import nvcomp as nvc
        except ImportError as e:
            print(f"nvcomp not available: {e}", flush=True)
            codecs = [c for c in codecs if not c.startswith("nvcomp")]
    if "checkpoint" in args.data and not args.checkpoint.is_file():
        print(f"no checkpoint bits at {args.checkpoint}: gaussian only", flush=True)
        args.data = [d for d in args.data if d != "checkpoint"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table: list[tuple] = []

    def one_size(kind: str, mib: float) -> None:
        nbytes = int(mib * MiB)
        n = nbytes // 2
        sets = max(1, min(64, math.ceil(ROTATE_BYTES / nbytes)))
        if kind == "gaussian":
            bits = [gaussian_bits(n, seed=seed, xp=cp) for seed in range(sets)]
        else:
            bits = checkpoint_sets(cp, args.checkpoint, n, sets)
        stream.synchronize()

        def record(codec, op, mode, secs, ratio, extra=None):
            if secs is None:
                return
            rec = {"bench": "codec_peers", "run_id": run_id, **info, "data": kind, "codec": codec,
                   "op": op, "mode": mode, "size_mib": mib, "n": n, "input_bytes": nbytes,
                   "buffer_sets": sets, "seconds": secs, "gbps": algbw(nbytes, secs), "ratio": ratio,
                   "exact": True, **(extra or {})}
            append_records(args.out, [rec])  # at once: a run cut short keeps what it measured
            table.append((kind, mib, codec, op, mode, rec["gbps"], ratio))

        def iters_for(call) -> int:
            call()
            stream.synchronize()
            t0 = time.perf_counter()
            call()
            stream.synchronize()
            dt = max(time.perf_counter() - t0, 1e-6)
            return max(2 * sets, min(4000, int(args.seconds / dt)))

        def eager(codec, op, calls, ratio, extra=None):
            it = iters_for(calls[0])
            secs, host = timer.eager(calls, it)
            record(codec, op, "eager", secs, ratio, {"host_us": host * 1e6, **(extra or {})})
            return it

        def failed(codec, what):
            print(f"  {kind} {mib:g} MiB: {codec}: {what}; not timed", flush=True)

        if "zipccl-api" in codecs:
            frames = [zipccl.compress(b, dtype="bfloat16", stream=stream) for b in bits]
            bad = sum(int(not cp.array_equal(zipccl.decompress(f, stream=stream), b))
                      for f, b in zip(frames, bits, strict=True))
            if bad:
                failed("zipccl-api", f"{bad} round trips differ")
            else:
                ratio = float(np.mean([f.size for f in frames])) / nbytes
                eager("zipccl-api", "compress", [(lambda b=b: zipccl.compress(b, dtype="bfloat16",
                                                                              stream=stream))
                                                 for b in bits], ratio)
                eager("zipccl-api", "decompress", [(lambda f=f: zipccl.decompress(f, stream=stream))
                                                   for f in frames], ratio)
            del frames
        if "zipccl" in codecs:
            # the codebook compress chose on the device for the first buffer (its frame header)
            f0 = zipccl.compress(bits[0], dtype="bfloat16", stream=stream)
            cb = Codebook(tuple(int(e) for e in cp.asnumpy(f0[fmt.CODEBOOK_AT:fmt.CODEBOOK_AT + 7])))
            del f0
            ws = gpu_workspace.Workspace(n)
            size = zipccl.max_compressed_size(n)
            frames = [cp.zeros(size, cp.uint8) for _ in bits]
            outs = [cp.zeros(n, cp.uint16) for _ in bits]
            for b, f, o in zip(bits, frames, outs, strict=True):
                gpu.encode_into(b, f, cb, stream, checksum=False, workspace=ws)
                gpu.decode_into(f, o, stream, workspace=ws)
            bad = sum(int(not cp.array_equal(o, b)) for o, b in zip(outs, bits, strict=True))
            err = ws.last_error(stream)
            if bad or err:
                failed("zipccl", f"{bad} round trips differ, error bits {err}")
            else:
                flen = int(cp.asnumpy(frames[0][fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8]).view("<i8")[0])
                ratio = flen / nbytes
                enc = [(lambda b=b, f=f: gpu.encode_into(b, f, cb, stream, checksum=False,
                                                         workspace=ws))
                       for b, f in zip(bits, frames, strict=True)]
                dec = [(lambda f=f, o=o: gpu.decode_into(f, o, stream, workspace=ws))
                       for f, o in zip(frames, outs, strict=True)]
                it = eager("zipccl", "compress", enc, ratio)
                record("zipccl", "compress", "graph", timer.graph(enc, it), ratio)
                it = eager("zipccl", "decompress", dec, ratio)
                record("zipccl", "decompress", "graph", timer.graph(dec, it), ratio)
                bad = sum(int(not cp.array_equal(o, b)) for o, b in zip(outs, bits, strict=True))
                if bad:
                    raise SystemExit(f"{kind} {mib} MiB: zipccl outputs wrong after timing")
            del frames, outs, ws
        if "dietgpu" in codecs:
            cap = dg.max_size(n)
            comps = [cp.zeros(cap, cp.uint8) for _ in bits]
            outs = [cp.zeros(n, cp.uint16) for _ in bits]
            sizes = []
            bad = 0
            for b, c, o in zip(bits, comps, outs, strict=True):
                dg.compress(b, c)
                sizes.append(int(dg.size.get(stream=stream)[0]))
                dg.decompress(c, o)
                stream.synchronize()
                bad += int(not cp.array_equal(o, b)) + int(dg.ok.get(stream=stream)[0] == 0)
            if bad:
                failed("dietgpu", f"{bad} round trips differ or report failure")
            else:
                ratio = float(np.mean(sizes)) / nbytes
                eager("dietgpu", "compress", [(lambda b=b, c=c: dg.compress(b, c))
                                              for b, c in zip(bits, comps, strict=True)], ratio)
                eager("dietgpu", "decompress", [(lambda c=c, o=o: dg.decompress(c, o))
                                                for c, o in zip(comps, outs, strict=True)], ratio)
            del comps, outs
        for name, algo, dtype in (("nvcomp-ans", "ANS", "<f2"), ("nvcomp-bitcomp", "Bitcomp", "<u2")):
            if name not in codecs:
                continue
            try:
                codec = nvc.Codec(algorithm=algo, data_type=dtype, cuda_stream=stream.ptr)
                arrs = [nvc.as_array(b.view(cp.float16) if dtype == "<f2" else b) for b in bits]
                comps = [codec.encode(a) for a in arrs]
                bad = 0
                for b, c in zip(bits, comps, strict=True):
                    d = cp.asarray(codec.decode(c, data_type=dtype)).view(cp.uint16).reshape(-1)
                    bad += int(d.size != n or not cp.array_equal(d, b))
                sizes = [int(c.buffer_size) for c in comps]
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not timed
                failed(name, f"{type(e).__name__}: {e}")
                continue
            if bad:
                failed(name, f"{bad} round trips differ")
                continue
            ratio = float(np.mean(sizes)) / nbytes
            eager(name, "compress", [(lambda a=a, k=codec: k.encode(a)) for a in arrs], ratio)
            eager(name, "decompress", [(lambda c=c, k=codec, t=dtype: k.decode(c, data_type=t))
                                       for c in comps], ratio)
            del arrs, comps, codec
        del bits
        cp.get_default_memory_pool().free_all_blocks()
        print(f"  {kind} {mib:g} MiB done", flush=True)

    for kind in args.data:
        for mib in args.sizes:
            one_size(kind, mib)

    print(f"\n{'data':>10} {'MiB':>6} {'codec':>15} {'op':>10} {'mode':>5} {'GB/s':>8} ratio")
    for kind, mib, codec, op, mode, gbps, ratio in table:
        print(f"{kind:>10} {mib:6g} {codec:>15} {op:>10} {mode:>5} {gbps:8.1f} {ratio:.4f}")
    print(f"wrote {len(table)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
