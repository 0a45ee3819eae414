"""Run a script with ``fake_cupy`` as CuPy (and NCCL over MPI): a dry run of GPU code without a GPU.

    mpiexec -n 2 python tests/mpi/with_fake_cupy.py [--cpu-codec] SCRIPT [ARGS...]

``--cpu-codec`` stands ``fake_gpu_codec`` in for the GPU codec (its entry points on
the CPU codec: fast); without it the GPU codec's kernels run in Numba's simulator,
which needs ``NUMBA_ENABLE_CUDASIM=1`` and tiny messages. Either way the device
engine runs its one code path. Used to check that ``experiments/bench_collectives.py``
and the device cases of the collective tests run through before they go to a GPU
machine; the numbers it prints mean nothing.
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_cupy  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    fake_cupy.install()
    if args and args[0] == "--cpu-codec":
        args = args[1:]
        import fake_gpu_codec

        fake_gpu_codec.install()
    sys.argv = args
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(args[0], run_name="__main__")
