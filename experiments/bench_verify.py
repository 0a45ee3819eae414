"""What ``verify="always"`` costs: the control row sent before every call, against ``"first"``.

``Communicator(verify="always")`` all-gathers one small int64 row (the call's signature hash
and a few ints) before every call, so that ranks making different calls raise the same
``CollectiveError`` instead of hanging; ``verify="first"`` does so only the first time a
signature is seen (docs/COLLECTIVES.md). This measures, under ``mpiexec`` on host arrays:

- ``control_row``: the row's all-gather alone (``Communicator``'s MPI transport), per call;
- ``all_gather``: an agreed native all-gather of ``--count`` BF16 values per rank
  (``policy="never"``), with ``verify="first"`` and ``"always"``: the difference is what
  the debug mode adds to a call whose own cost is small.

On device arrays the row is the same host all-gather before the call is enqueued (the
device work does not change), so ``control_row`` is what the mode adds to their host time.
Times are ``MPI.Wtime`` between barriers, slowest rank, median of ``--repeats``; outputs are
checked bit for bit first. Rank 0 appends one record per measurement to ``--out``.

    mpiexec -n 2 python -m mpi4py experiments/bench_verify.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_records, gaussian_bits, median_of  # noqa: E402

import zipccl  # noqa: E402

MACHINE = "2-core CPU dev box"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1024, help="BF16 values per rank (all-gather)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per timing")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="experiments/results/verify_cost.jsonl")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    me, p = world.Get_rank(), world.Get_size()
    x = gaussian_bits(args.count, seed=me).view(ml_dtypes.bfloat16)
    want = np.concatenate(world.allgather(x.view(np.uint16)))
    base = {"experiment": "verify_cost", "machine": MACHINE, "cpu_count": os.cpu_count(),
            "world": p, "count": args.count, "calls": args.calls, "repeats": args.repeats,
            "zipccl": zipccl.__version__, "note": args.note}
    records = []
    for verify in ("first", "always"):
        with zipccl.Communicator(world, policy="never", verify=verify) as c:
            out = np.zeros(p * args.count, ml_dtypes.bfloat16)
            c.all_gather(x, out)
            if not np.array_equal(out.view(np.uint16), want):
                raise SystemExit(f"rank {me}: all_gather gave wrong bits")
            med, all_t = median_of(args.repeats, lambda c=c, out=out: c.all_gather(x, out),
                                   args.calls, comm=world)
            records.append({**base, "what": "all_gather", "verify": verify,
                            "us_per_call": 1e6 * med,
                            "us_per_call_all": [1e6 * t for t in all_t]})
            if verify == "always":
                row = np.zeros(4 + 2 * p, np.int64)
                table = np.zeros((p, row.size), np.int64)
                med, all_t = median_of(args.repeats,
                                       lambda c=c, row=row, table=table: c.mpi.allgather_ints(row, table),
                                       args.calls, comm=world)
                records.append({**base, "what": "control_row", "verify": verify,
                                "us_per_call": 1e6 * med,
                                "us_per_call_all": [1e6 * t for t in all_t]})
    append_records(args.out, records, comm=world)
    if me == 0:
        for r in records:
            print(f"{r['what']:12s} verify={r['verify']:6s} {r['us_per_call']:8.2f} us/call")


if __name__ == "__main__":
    main()
