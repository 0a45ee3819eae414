"""Shared test fixtures: the edge corpus, seeded generators and the CUDA simulator switch.

Everything a test compares is a bit pattern (uint16), never a float.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

collect_ignore = ["mpi", "torchdist"]  # scripts that mpiexec / torchrun start, not modules to import

#: True when Numba's CUDA simulator is on (``make test-sim``, or the simulator step of
#: ``make test``). It must be on before numba.cuda is first imported, so the kernel tests
#: run in a pytest process of their own, each case under its own name.
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

#: Marks a test that runs only under the simulator (skipped in the plain pytest run). The
#: Makefile's SIM_TESTS names every file that uses it (``tests/test_makefile.py`` checks).
simulator_only = pytest.mark.skipif(not SIMULATOR, reason="a kernel case: runs under the CUDA simulator "
                                    "(make test runs the quick ones, make test-sim all)")


#: True under ``make test-gpu`` (``ZIPCCL_REQUIRE_GPU=1``): the GPU tests were promised a GPU, so
#: a missing or broken CuPy, driver or device fails the run with its cause instead of skipping.
REQUIRE_GPU = os.environ.get("ZIPCCL_REQUIRE_GPU") == "1"

#: The one skip a GPU test may still take there: a stated need for another number of GPUs than the
#: machine has ("needs 2 GPUs: ...", or "needs exactly one GPU ..." for the shared-GPU cases).
MORE_GPUS_SKIP = re.compile(r"^needs (\d+ GPUs|exactly one GPU)")


def gpu_problem() -> str | None:
    """Why the GPU tests cannot run here (CuPy, the driver, the device, Numba's CUDA target,
    torch's CUDA build), or None when a CuPy and a Numba computation ran on the device."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
        if int(cupy.arange(4, dtype=cupy.int32).sum()) != 6:
            return "CuPy computed a wrong sum on the device"
    except Exception as e:  # noqa: BLE001 -- any failure here is the cause to report
        return f"CuPy cannot run on a CUDA device: {type(e).__name__}: {e}"
    try:
        from numba import cuda

        if not cuda.is_available():
            return "numba.cuda sees no CUDA device (driver or numba-cuda missing)"
    except Exception as e:  # noqa: BLE001
        return f"numba.cuda does not load: {type(e).__name__}: {e}"
    try:
        import torch

        if not torch.cuda.is_available():
            return f"torch {torch.__version__} sees no CUDA device (a CPU-only build?)"
    except Exception as e:  # noqa: BLE001
        return f"torch does not load: {type(e).__name__}: {e}"
    return None


#: What compiles every Numba loop of the CPU codec (zipccl/codec/cpu_loops.py, ``cache=True``): BF16,
#: FP16 and FP32 frames both ways, and a RAW frame over 2 MiB (its checksum's parallel sum).
_COMPILE_CPU_CODEC = """
import numpy as np
import zipccl
rng = np.random.default_rng(0)
x = rng.normal(0, 0.02, 3 * 4096 + 5).astype(np.float32)
for bits, dtype in (((x.view(np.uint32) >> 16).astype(np.uint16), "bfloat16"),
                    (x.astype(np.float16).view(np.uint16), "float16"), (x.view(np.uint32), "float32"),
                    (rng.integers(0, 1 << 16, (1 << 21) + 17, dtype=np.uint16), "bfloat16")):
    zipccl.decompress(zipccl.compress(bits, dtype=dtype))
"""
_codec_compiler: subprocess.Popen | None = None


def _start_compiling_the_cpu_codec() -> None:
    """On a checkout whose CPU codec was never compiled (a fresh clone), compile it in a
    process of its own while this one collects, on the core collection leaves idle: Numba's
    cache (zipccl/codec/__pycache__) then holds it when the first test calls it (~10 s of
    compilation otherwise on that test). The first test waits for it (``pytest_runtest_setup``).
    The simulator's runs skip it (make test compiled it in its first step)."""
    global _codec_compiler
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if SIMULATOR or glob.glob(os.path.join(root, "zipccl", "codec", "__pycache__", "cpu_loops.*.nbi")):
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    _codec_compiler = subprocess.Popen([sys.executable, "-c", _COMPILE_CPU_CODEC], cwd=root, env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_sessionstart(session):
    if REQUIRE_GPU:
        problem = gpu_problem()
        if problem:
            pytest.exit(f"ZIPCCL_REQUIRE_GPU=1 (make test-gpu) but the GPU tests cannot run: {problem}",
                        returncode=1)
    _start_compiling_the_cpu_codec()


def _codec_compiled(timeout: float) -> None:
    """Wait for the compiling process at most ``timeout`` s, then stop it if it still runs."""
    global _codec_compiler
    if _codec_compiler is None:
        return
    try:
        _codec_compiler.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass  # a test that needs the codec then compiles what is missing, as without it
    if _codec_compiler.poll() is None:
        _codec_compiler.kill()
        _codec_compiler.wait()
    _codec_compiler = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _codec_compiled(timeout=300)


def pytest_sessionfinish(session):
    _codec_compiled(timeout=0)  # a run with no test (--collect-only) does not wait for it


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``ZIPCCL_REQUIRE_GPU=1`` a GPU test that skips fails, naming the skip's reason
    (a ``pytest.importorskip("cupy")``, a caught driver error), unless it needs more GPUs."""
    outcome = yield
    rep = outcome.get_result()
    if not (REQUIRE_GPU and rep.skipped and item.get_closest_marker("gpu")) or hasattr(rep, "wasxfail"):
        return
    longrepr = rep.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    if MORE_GPUS_SKIP.match(reason):
        return
    rep.outcome = "failed"
    rep.longrepr = f"a GPU test skipped under ZIPCCL_REQUIRE_GPU=1 (make test-gpu): {reason}"


def need_torch():
    """torch, which the development install includes (``make install``): where it is missing,
    every torch test fails saying so, rather than skipping."""
    try:
        import torch
    except ImportError as e:
        pytest.fail(f"torch is not installed ({e}): `make install` installs the CPU wheel (docs/TORCH.md)",
                    pytrace=False)
    return torch


@pytest.fixture(scope="session")
def torch_installed():
    """``need_torch`` for a whole module: ``pytestmark = pytest.mark.usefixtures("torch_installed")``."""
    return need_torch()


@pytest.fixture(scope="session")
def torch_rank_results(tmp_path_factory) -> list[dict]:
    """Each rank's ``{check: {"ok", "detail"}}`` from ``tests/torchdist/ranks.py``: two gloo ranks
    that run the zipccl.torch checks (tests/test_torch.py) and the MoE checks (tests/test_moe.py),
    started once per session: two interpreters importing torch, for both files."""
    need_torch()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchdist"))
    import ranks

    out = tmp_path_factory.mktemp("torch_ranks")
    ranks.launch(str(out), 2)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def long_under_simulator(test):
    """Mark ``test`` slow where the simulator runs it (seconds to tens of seconds there: it
    runs in ``make test-sim`` and ``make test-slow``, not ``make test``); on a GPU it is not."""
    return pytest.mark.slow(test) if SIMULATOR else test


def edge_corpus() -> np.ndarray:
    """BF16 bit patterns that break careless codecs, as one uint16 array."""
    specials = [
        0x0000, 0x8000,  # +0, -0
        0x7F80, 0xFF80,  # +inf, -inf
        0x7FC0, 0xFFC0, 0x7F81, 0x7FFF, 0xFF81, 0xFFFF, 0x7FA5,  # NaNs, several payloads
        0x0001, 0x8001, 0x007F, 0x807F, 0x0040,  # subnormals
        0x0080, 0x8080,  # smallest normals (exponent 1)
        0x7F7F, 0xFF7F,  # largest finite (exponent 254)
        0x3F80, 0xBF80, 0x3C00,  # 1.0, -1.0, 2^-7
    ]
    rng = np.random.default_rng(1234)
    all_escape = (rng.integers(0, 2, 4096) << 15 | np.full(4096, 0xFE) << 7
                  | rng.integers(0, 128, 4096)).astype(np.uint16)  # a whole block of exponent 254
    random_bits = rng.integers(0, 1 << 16, 5000, dtype=np.uint16)
    return np.concatenate([np.array(specials, dtype=np.uint16), all_escape, random_bits,
                           np.array(specials[::-1], dtype=np.uint16)])


def gaussian_bits(n: int, sigma: float = 0.02, seed: int = 0) -> np.ndarray:
    """Bit patterns of n BF16 values drawn from N(0, sigma^2) (round to nearest even)."""
    import ml_dtypes

    x = np.random.default_rng(seed).normal(0.0, sigma, n).astype(np.float32)
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)


@pytest.fixture
def corpus() -> np.ndarray:
    return edge_corpus()
