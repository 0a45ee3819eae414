"""Host arrays under ``mpiexec``: the CPU codec and small compressed all-gathers when ranks share a node.

Every rank runs the same measurements at the same time (barriers in between), as in
a job whose ranks share one machine's cores:

- ``codec``: one ``zipccl.compress`` + ``zipccl.decompress`` of a host BF16 array
  (N(0, 0.02), a fixed sigma codebook) per call, at several element counts
  (1 element up to tens of MiB); every rank checks its round trip bit for bit first.
- ``all_gather``: ``--calls`` all-gathers of ``--ag-count`` values per rank through
  ``zipccl.Communicator`` (``policy="always"`` and ``"never"``), outputs checked bit
  for bit against every rank's seeded input.

Times are ``MPI.Wtime`` between barriers, slowest rank (``experiments/harness.py``,
which also makes the data and writes the records); one JSON record per
measurement (with the world size, the ranks on this node, the codec's threads per
call and the threading layer) is appended by rank 0 to ``--out``.

    mpiexec -n 2 python experiments/bench_cpu_mpi.py
    python experiments/bench_cpu_mpi.py --note "one process"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_records, gaussian_bits, time_calls  # noqa: E402

MACHINE = "2-core CPU dev box"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "experiments" / "results" / "cpu_mpi.jsonl"


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "zipccl"], cwd=ROOT,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+local changes in zipccl/" if dirty else "")


def bf16_values(n: int, seed: int) -> np.ndarray:
    return gaussian_bits(n, seed=seed).view(ml_dtypes.bfloat16)


def slowest(comm, fn, calls: int) -> float:
    """Seconds per call of ``fn`` on the slowest rank, ``calls`` calls in a row."""
    return time_calls(fn, calls, comm=comm).seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+",
                    default=[1, 4096, 1 << 16, 1 << 20, 1 << 24],
                    help="elements per compress + decompress")
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="least time per codec measurement (calls are repeated until then)")
    ap.add_argument("--samples", type=int, default=5, help="timed samples per measurement (median)")
    ap.add_argument("--ag-count", type=int, default=1000, help="values per rank per all-gather")
    ap.add_argument("--calls", type=int, default=500, help="all-gathers per sample")
    ap.add_argument("--note", default="", help="free text stored in every record")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    from mpi4py import MPI

    import zipccl
    from zipccl.codec import cpu_threads

    comm = MPI.COMM_WORLD  # an experiment's main() may name the world
    me, p = comm.Get_rank(), comm.Get_size()
    base = {
        "experiment": "cpu_mpi", "machine": MACHINE, "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "world_size": p, "zipccl_commit": git_commit(), "note": args.note,
        "codec_threads_large": cpu_threads.threads_per_call(1 << 30),
        "numba_threads": numba.get_num_threads(), "numba": numba.__version__,
        "numpy": np.__version__, "python": platform.python_version(),
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "run": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    records = []

    def record(**kw):
        rec = {**base, **kw, "threading_layer": numba.threading_layer()}
        records.append(rec)
        if me == 0:
            print(json.dumps({k: rec[k] for k in kw}), flush=True)

    # ------------------------------------------------------------------ codec
    cb = zipccl.Codebook.from_sigma(0.02)
    for n in args.counts:
        x = bf16_values(n, seed=me)
        y = zipccl.decompress(zipccl.compress(x, cb))
        ok = comm.allreduce(int(np.array_equal(x.view(np.uint16), y.view(np.uint16))), op=MPI.MIN)
        if not ok:
            raise SystemExit(f"round trip of {n} values not bit-exact")

        def call(x=x):
            zipccl.decompress(zipccl.compress(x, cb))

        one = slowest(comm, call, 1)
        calls = max(1, min(10_000, int(args.seconds / args.samples / max(one, 1e-6))))
        calls = comm.allreduce(calls, op=MPI.MIN)
        times = [slowest(comm, call, calls) for _ in range(args.samples)]
        record(what="codec", n=n, bf16_bytes=2 * n, calls_per_sample=calls,
               compress_decompress_s=statistics.median(times), samples_s=times,
               checked="every rank's round trip bit-exact")

    # ------------------------------------------------------------------ all-gather
    x = bf16_values(args.ag_count, seed=100 + me)
    expected = np.concatenate([bf16_values(args.ag_count, seed=100 + r) for r in range(p)])
    for policy in ("always", "never"):
        zc = zipccl.Communicator(comm, policy=policy)
        out = np.zeros(p * args.ag_count, dtype=ml_dtypes.bfloat16)
        zc.all_gather(x, out)
        times = [slowest(comm, lambda zc=zc, out=out: zc.all_gather(x, out), args.calls)
                 for _ in range(args.samples)]
        ok = comm.allreduce(int(np.array_equal(out.view(np.uint16), expected.view(np.uint16))),
                            op=MPI.MIN)
        if not ok:
            raise SystemExit(f"all_gather (policy={policy}) not bit-exact")
        record(what="all_gather", policy=policy, count_per_rank=args.ag_count,
               calls_per_sample=args.calls, call_s=statistics.median(times), samples_s=times,
               calls_s=args.calls * statistics.median(times),
               checked="every rank's output bit-exact (the timed buffers)")
        zc.close()

    if append_records(args.out, records, comm):  # rank 0's hold the slowest times
        print(f"{len(records)} records appended to {args.out}")
    return 0


if __name__ == "__main__":
    from mpi4py import MPI

    from zipccl.tools.mpijob import run_main

    sys.exit(run_main(main, MPI.COMM_WORLD))  # one rank failing ends the job
