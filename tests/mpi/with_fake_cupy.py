"""Run a script with ``fake_cupy`` as CuPy (and NCCL over MPI): a dry run of GPU code without a GPU.

    mpiexec -n 2 python tests/mpi/with_fake_cupy.py [--host-codec] SCRIPT [ARGS...]

``--host-codec`` hides the GPU codec, so the device engine codes frames with the
CPU codec (fast; without it the kernels run in Numba's simulator, which needs
``NUMBA_ENABLE_CUDASIM=1`` and tiny messages). Used to check that
``experiments/bench_collectives.py`` and the GPU tests run through before they
go to a GPU machine; the numbers it prints mean nothing.
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_cupy  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--host-codec":
        args = args[1:]
        sys.modules["zipccl.codec.gpu"] = None  # ImportError: DeviceEngine falls back to the CPU codec
    fake_cupy.install()
    sys.argv = args
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(args[0], run_name="__main__")
