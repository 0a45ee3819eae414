"""CPU codec throughput: the Numba fast path (``zipccl.codec.cpu``) beside the NumPy reference.

For each buffer (BF16 N(0, 0.02) of several sizes, and the bundled real checkpoint's
floating tensors cast to BF16 and concatenated) it first checks, on the very buffers
it will time, that the CPU frame is byte-identical to the reference frame and that
both decoders return the input bit for bit; then it times encode and decode (median
of several runs after warm-up) and writes one JSON record per (buffer, codec,
checksum setting) to ``experiments/results/codec_cpu.jsonl``. GB/s is BF16 input
bytes / seconds (``zipccl.metrics.algbw``), for both directions.

    python experiments/bench_codec_cpu.py                 # 1, 4, 16, 64, 256 MiB + checkpoint
    python experiments/bench_codec_cpu.py --sizes 64 --repeats 9 --out /tmp/x.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numba
import numpy as np

from zipccl import format as fmt
from zipccl.arrays import to_bf16
from zipccl.checkpoints import default_checkpoint, is_floating, iter_tensors
from zipccl.codebook import Codebook
from zipccl.codec import cpu, reference
from zipccl.metrics import algbw, compression_ratio

MACHINE = "2-core CPU dev box"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "codec_cpu.jsonl"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    return {
        "machine": MACHINE, "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
    }


def gaussian(n: int, sigma: float = 0.02, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0.0, sigma, n).astype(np.float32)
    return to_bf16(x).view(np.uint16)


def checkpoint_bits() -> tuple[str, np.ndarray] | None:
    path = default_checkpoint()
    if path is None:
        return None
    parts = [to_bf16(a).view(np.uint16).reshape(-1) for _, a in iter_tensors(path)
             if is_floating(a)]
    return f"checkpoint {path.parent.parent.name} (all floating tensors, BF16)", \
        np.concatenate(parts)


def check(bits: np.ndarray, cb: Codebook, checksum: bool) -> np.ndarray:
    """CPU frame == reference frame, and both decoders recover ``bits`` from it."""
    f_cpu = cpu.encode(bits, cb, None, checksum)
    f_ref = reference.encode(bits, cb, None, checksum)
    if not np.array_equal(f_cpu, f_ref):
        bad = np.flatnonzero(f_cpu[:min(f_cpu.size, f_ref.size)] != f_ref[:min(f_cpu.size, f_ref.size)])
        raise SystemExit(f"CPU frame differs from the reference: lengths {f_cpu.size} vs "
                         f"{f_ref.size}, {bad.size} differing bytes")
    for codec in (cpu, reference):
        out, _ = codec.decode(f_cpu)
        wrong = int(np.count_nonzero(out.reshape(-1) != bits))
        if wrong:
            raise SystemExit(f"{codec.__name__} decode: {wrong} wrong elements")
    return f_cpu


def timed(fn, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256],
                    help="BF16 buffer sizes in MiB (Gaussian data)")
    ap.add_argument("--repeats", type=int, default=9, help="timed runs of the CPU codec")
    ap.add_argument("--ref-repeats", type=int, default=3, help="timed runs of the reference")
    ap.add_argument("--ref-max-mib", type=float, default=64,
                    help="largest buffer the (slow) reference is timed on")
    ap.add_argument("--no-checkpoint", action="store_true")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    info = machine_info()
    info["run"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")  # groups this invocation's records
    t0 = time.perf_counter()
    cpu.decode(cpu.encode(gaussian(1 << 16), Codebook.from_sigma(0.02)))
    info["first_call_s"] = round(time.perf_counter() - t0, 3)  # JIT compile or cache load

    buffers = [(f"gaussian sigma=0.02, {s:g} MiB", gaussian(int(s * (1 << 20)) // 2))
               for s in args.sizes]
    if not args.no_checkpoint and (ck := checkpoint_bits()) is not None:
        buffers.append(ck)

    # Correctness first, on the very buffers that are timed.
    codebooks = {}
    for name, bits in buffers:
        cb = Codebook.from_sample(bits)
        codebooks[name] = cb
        for checksum in (True, False):
            check(bits, cb, checksum)
    print(f"all results match ({len(buffers)} buffers, frames byte-identical, round trips "
          "bit-exact), starting benchmarks", flush=True)

    records = []
    for name, bits in buffers:
        cb = codebooks[name]
        nbytes = 2 * bits.size
        plan = [("cpu", cpu, True, args.repeats), ("cpu", cpu, False, args.repeats)]
        if nbytes <= args.ref_max_mib * (1 << 20):
            plan.append(("reference", reference, True, args.ref_repeats))
        for codec_name, codec, checksum, repeats in plan:
            frame = codec.encode(bits, cb, None, checksum)
            load = os.getloadavg()[0]
            enc = timed(lambda c=codec, x=bits, b=cb, k=checksum: c.encode(x, b, None, k), repeats,
                        warmup=1 if codec is reference else 2)
            dec = timed(lambda c=codec, f=frame: c.decode(f), repeats,
                        warmup=1 if codec is reference else 2)
            header = fmt.parse_header(frame)
            rec = {
                "experiment": "codec_cpu", **info, "data": name, "n": int(bits.size),
                "bf16_bytes": nbytes, "codec": codec_name, "checksum": checksum,
                "codebook": list(cb.exponents), "frame_bytes": int(frame.size),
                "raw_frame": header.raw, "n_escapes": header.n_escapes,
                "ratio": compression_ratio(frame.size, nbytes),
                "encode_s": float(np.median(enc)), "decode_s": float(np.median(dec)),
                "encode_GBps": algbw(nbytes, float(np.median(enc))),
                "decode_GBps": algbw(nbytes, float(np.median(dec))),
                "encode_times_s": [round(t, 6) for t in enc],
                "decode_times_s": [round(t, 6) for t in dec],
                "repeats": repeats, "loadavg_1min_before": round(load, 2),
                "checked": "frames byte-identical to reference; both decoders bit-exact",
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            records.append(rec)
            print(f"{name:>58s}  {codec_name:9s} cks={int(checksum)}  ratio {rec['ratio']:.4f}  "
                  f"enc {rec['encode_GBps']:7.3f} GB/s  dec {rec['decode_GBps']:7.3f} GB/s  "
                  f"(load {load:.2f})", flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    print(f"{len(records)} records appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
