"""zipccl's Python calls per kept compressed call on device arrays, counted without a GPU.

    NUMBA_ENABLE_CUDASIM=1 mpiexec -n 1 python tests/mpi/with_fake_cupy.py \
        experiments/calls_sim.py --out experiments/results/calls_sim.jsonl --label LABEL

One rank, ``Communicator`` over the stand-in NCCL in loopback mode (the whole compressed path
through a slot to itself), BF16, CuPy arrays of the stand-in (``tests/mpi/fake_cupy.py``), the
GPU codec's kernels in Numba's simulator, launched by the plan route a GPU takes
(``codec.gpu_route.plans_under_simulator``, ``kernels/simlaunch.py`` standing in for the
driver). After a few warm calls, one more call runs under
``sys.setprofile``: every Python function of zipccl entered on the caller's thread is counted,
by file and function. Functions that exist only because there is no GPU (the spill kernels'
NumPy twins in ``kernels/spill.py``, the simulator's launch route ``kernels/simlaunch.py`` and
``kernels/compat.py``, ``kernels/runtime.py``'s host views) are counted apart
(``sim_only_calls``), so ``calls`` is the path a GPU runs; ``bench_host_path.py`` counts the
same on an H200 (``zipccl_py_calls``), where time can be measured too. Counts only: no time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

SIM_ONLY = ("kernels/spill.py", "kernels/simlaunch.py", "kernels/compat.py", "kernels/runtime.py")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--n", type=int, default=1 << 15, help="elements per rank")
    args = ap.parse_args(argv)
    import cupy
    from mpi4py import MPI

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run_path does not
    from bench_host_path import python_calls  # the H200 bench's count, the same way

    import zipccl
    from zipccl.codec.gpu_route import plans_under_simulator
    from zipccl.comm.policy import Policy

    if getattr(cupy, "__version__", "") != "fake":
        raise SystemExit("run under tests/mpi/with_fake_cupy.py (the stand-in CuPy)")
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.normal(0, 0.02, args.n).astype(np.float32).view(np.uint32).astype(np.uint16))
    out = cupy.empty(args.n, np.uint16)
    recs, stamp = [], time.strftime("%Y%m%dT%H%M%S")
    with zipccl.Communicator(MPI.COMM_WORLD, backend="nccl",
                             policy=Policy("always", loopback=True)) as c, plans_under_simulator():
        calls = {"all_gather": lambda: c.all_gather(x, out, dtype="bfloat16"),
                 "reduce_scatter": lambda: c.reduce_scatter(x, out, dtype="bfloat16"),
                 "all_to_all": lambda: c.all_to_all(x, out, dtype="bfloat16")}
        for op, call in calls.items():
            for _ in range(4):
                call()
            by: dict[str, int] = {}
            python_calls(call, by)
            sim = sum(v for k, v in by.items() if k.startswith(SIM_ONLY))
            recs.append({"bench": "calls_sim", "op": op, "n": args.n, "dtype": "bfloat16",
                         "calls": sum(by.values()) - sim, "sim_only_calls": sim,
                         "by_function": {k: v for k, v in sorted(by.items()) if not k.startswith(SIM_ONLY)},
                         "route": "plan", "label": args.label, "commit": os.environ.get("ZIPCCL_COMMIT", ""),
                         "machine": "CPU box, Numba's CUDA simulator, stand-in CuPy and NCCL, one rank",
                         "run": stamp})
            print(f"{op:15s} zipccl calls {recs[-1]['calls']:4d} (+{sim} that exist only without a GPU)")
    if args.out:
        with open(args.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
