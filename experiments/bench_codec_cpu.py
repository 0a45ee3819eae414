"""CPU codec throughput: the Numba fast path (``zipccl.codec.cpu``) beside the NumPy reference.

For each buffer (BF16 N(0, 0.02) of several sizes, and the bundled real checkpoint's
floating tensors cast to BF16 and concatenated) it first checks, on the very buffers
it will time, that the CPU frame is byte-identical to the reference frame and that
both decoders return the input bit for bit; then it times encode and decode (median
of several runs after warm-up) and writes one JSON record per (buffer, codec,
checksum setting) to ``experiments/results/codec_cpu.jsonl``. GB/s is BF16 input
bytes / seconds (``zipccl.metrics.algbw``), for both directions. The dev box is
shared, so every record also states the share of the machine's CPU that other
processes used while it was timed (``others_cpu_share_*``, from /proc/stat).

Under ``mpiexec -n N`` every rank runs the same measurements at the same time (a
barrier before each), as ranks that share a node do; each record names its rank
and the world size (the other ranks count as "others" in the CPU shares), and
rank 0 writes them all, to ``codec_cpu_mpi.jsonl``. Data, clock and record writer
come from ``experiments/harness.py``.

    python experiments/bench_codec_cpu.py                 # 1, 4, 16, 64, 256 MiB + checkpoint
    python experiments/bench_codec_cpu.py --sizes 64 --repeats 9 --out /tmp/x.jsonl
    mpiexec -n 2 python experiments/bench_codec_cpu.py --wait-quiet 120
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_records, checkpoint_bits, gaussian_bits, time_calls  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.codebook import Codebook  # noqa: E402
from zipccl.codec import cpu, cpu_threads, reference  # noqa: E402
from zipccl.metrics import algbw, compression_ratio  # noqa: E402

MACHINE = "2-core CPU dev box"
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_OUT = RESULTS / "codec_cpu.jsonl"  # one process
DEFAULT_OUT_MPI = RESULTS / "codec_cpu_mpi.jsonl"  # several ranks at once


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def transparent_hugepages() -> str:
    """The kernel's THP mode. Fresh output buffers are page-faulted on every call, and
    NumPy asks for huge pages (madvise) on large arrays, so this moves the numbers."""
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return "unknown"


def machine_info() -> dict:
    return {
        "machine": MACHINE, "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": _threading_layer(),
        "transparent_hugepage": transparent_hugepages(),
    }


def _threading_layer() -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel region has run yet
        return "not yet chosen"


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


def _busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), or None."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _own_sys_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def wait_until_quiet(max_wait_s: float, threshold: float = 0.05) -> float:
    """Sleep until other processes use < ``threshold`` of the machine over one second,
    or ``max_wait_s`` has passed; returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait_s:
        busy0 = _busy_cpu_s()
        time.sleep(1.0)
        busy1 = _busy_cpu_s()
        if busy0 is None or busy1 is None or (busy1 - busy0) < threshold * (os.cpu_count() or 1):
            break
    return round(time.perf_counter() - t0, 1)


def timed(fn, repeats: int, warmup: int, min_seconds: float = 0.5,
          max_runs: int = 500) -> tuple[list[float], float | None, float]:
    """Wall times of at least ``repeats`` calls (more, up to ``max_runs``, until the
    timed calls add up to ``min_seconds``) after ``warmup`` calls; the share of the
    machine's CPU that *other* processes used meanwhile (0 = the timings had the box to
    themselves; /proc/stat ticks are 10 ms, hence the minimum duration); and the kernel
    (system) CPU seconds this process spent per wall second (page faults of the fresh
    output buffers, mostly)."""
    for _ in range(warmup):
        fn()
    out = []
    busy0, own0, sys0, wall0 = _busy_cpu_s(), _own_cpu_s(), _own_sys_s(), time.perf_counter()
    while len(out) < repeats or (sum(out) < min_seconds and len(out) < max_runs):
        out.append(time_calls(fn).seconds)
    busy1, own1, sys1 = _busy_cpu_s(), _own_cpu_s(), _own_sys_s()
    wall = time.perf_counter() - wall0
    sys_share = round((sys1 - sys0) / wall, 3)
    if busy0 is None or busy1 is None:
        return out, None, sys_share
    others = max(0.0, (busy1 - busy0) - (own1 - own0))
    return out, round(min(1.0, others / (wall * (os.cpu_count() or 1))), 3), sys_share


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256],
                    help="BF16 buffer sizes in MiB (Gaussian data)")
    ap.add_argument("--repeats", type=int, default=9,
                    help="least timed runs of the CPU codec (more on small buffers, for >= 0.5 s)")
    ap.add_argument("--ref-repeats", type=int, default=3, help="timed runs of the reference")
    ap.add_argument("--ref-max-mib", type=float, default=64,
                    help="largest buffer the (slow) reference is timed on")
    ap.add_argument("--no-checkpoint", action="store_true")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="before each measurement, wait up to this long for other processes "
                         "to leave the CPUs idle (shared machines)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"default: {DEFAULT_OUT.name}, or {DEFAULT_OUT_MPI.name} under mpiexec -n N > 1")
    args = ap.parse_args(argv)

    from mpi4py import MPI

    comm = MPI.COMM_WORLD  # an experiment's main() may name the world
    me = comm.Get_rank()
    if args.out is None:
        args.out = DEFAULT_OUT if comm.Get_size() == 1 else DEFAULT_OUT_MPI

    t0 = time.perf_counter()
    cpu.decode(cpu.encode(gaussian_bits(1 << 16), Codebook.from_sigma(0.02)))
    first_call_s = round(time.perf_counter() - t0, 3)  # JIT compile or cache load
    info = machine_info()
    info["run"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")  # groups this invocation's records
    info["first_call_s"] = first_call_s
    info["world_size"] = comm.Get_size()
    info["rank"] = me
    # threads of one large call (the codec shares the node's cores among its ranks)
    info["codec_threads_large"] = cpu_threads.threads_per_call(1 << 30)
    info["run"] = comm.bcast(info["run"])

    buffers = [(f"gaussian sigma=0.02, {s:g} MiB", gaussian_bits(int(s * (1 << 20)) // 2))
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
    comm.Barrier()
    if me == 0:
        print(f"all results match ({len(buffers)} buffers, frames byte-identical, round trips "
              f"bit-exact, {comm.Get_size()} rank(s)), starting benchmarks", flush=True)

    records = []
    for name, bits in buffers:
        cb = codebooks[name]
        nbytes = 2 * bits.size
        plan = [("cpu", cpu, True, args.repeats), ("cpu", cpu, False, args.repeats)]
        if nbytes <= args.ref_max_mib * (1 << 20):
            plan.append(("reference", reference, True, args.ref_repeats))
        for codec_name, codec, checksum, repeats in plan:
            frame = codec.encode(bits, cb, None, checksum)
            waited = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else 0.0
            load = os.getloadavg()[0]
            comm.Barrier()
            enc, enc_others, enc_sys = timed(
                lambda c=codec, x=bits, b=cb, k=checksum: c.encode(x, b, None, k),
                repeats, warmup=1 if codec is reference else 2)
            comm.Barrier()
            dec, dec_others, dec_sys = timed(lambda c=codec, f=frame: c.decode(f), repeats,
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
                "encode_runs": len(enc), "decode_runs": len(dec), "loadavg_1min_before": round(load, 2),
                "waited_for_quiet_s": waited,
                "others_cpu_share_encode": enc_others, "others_cpu_share_decode": dec_others,
                "own_sys_cpu_per_s_encode": enc_sys, "own_sys_cpu_per_s_decode": dec_sys,
                "checked": "frames byte-identical to reference; both decoders bit-exact",
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            records.append(rec)
            if me == 0:
                print(f"{name:>58s}  {codec_name:9s} cks={int(checksum)}  ratio {rec['ratio']:.4f}  "
                  f"enc {rec['encode_GBps']:7.3f} GB/s  dec {rec['decode_GBps']:7.3f} GB/s  "
                  f"(others' CPU {enc_others}, {dec_others}; own sys {enc_sys}, {dec_sys})",
                  flush=True)

    if append_records(args.out, records, comm, every_rank=True):  # every rank's, from rank 0
        print(f"{comm.Get_size() * len(records)} records appended to {args.out}")
    return 0


if __name__ == "__main__":
    from mpi4py import MPI

    from zipccl.tools.mpijob import run_main

    sys.exit(run_main(main, MPI.COMM_WORLD))  # one rank failing ends the job
