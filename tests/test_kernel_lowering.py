"""Every Numba kernel of zipccl types and lowers for an H200 (sm_90) on a machine without a GPU.

Numba's CUDA simulator runs the kernels as Python, so it accepts code that the GPU build
refuses (a device function that returns a shared array it allocated, for one). This test
compiles each kernel of ``zipccl.kernels`` (every ``launch.Kernel``, with the argument types it
is launched with) through Numba's CUDA pipeline to LLVM IR, which needs neither a GPU nor the
CUDA toolkit. It runs in a process of its own: it tells Numba there is a device of compute
capability 9.0, which must not leak into other tests. Slow tier: about a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

MODULES = ("decode", "decode_fp16", "decode_warps", "encode", "encode_launch", "stats", "spill")

_LOWER = r"""
import importlib, json, sys
from numba.cuda.cudadrv import nvrtc
from numba.cuda import dispatcher
from numba.cuda.compiler import compile_cuda

class _Device:  # what the compiler asks of "the current device"
    compute_capability = (9, 0)

nvrtc.get_supported_ccs = lambda: ((9, 0),)
dispatcher.get_current_device = _Device
from zipccl.kernels import launch

result = {}
for mod in sys.argv[1:]:
    m = importlib.import_module(f"zipccl.kernels.{mod}")
    for name, k in sorted(vars(m).items()):
        if isinstance(k, launch.Kernel):
            try:
                cres = compile_cuda(k.dispatcher.py_func, None, k.argtypes, cc=(9, 0))
                result[f"{mod}.{name}"] = "ok" if cres.library.get_llvm_str() else "empty"
            except Exception as e:  # noqa: BLE001 -- reported by name below
                result[f"{mod}.{name}"] = f"{type(e).__name__}: {str(e)[:500]}"
print(json.dumps(result))
"""


def test_every_kernel_lowers_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, "-c", _LOWER, *MODULES], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(result) >= 10, f"too few kernels found: {sorted(result)}"
    failed = {k: v for k, v in result.items() if v != "ok"}
    assert not failed, json.dumps(failed, indent=1)
