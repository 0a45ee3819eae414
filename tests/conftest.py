"""Shared test fixtures: the edge corpus, seeded generators and the CUDA simulator switch.

Everything a test compares is a bit pattern (uint16), never a float.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

collect_ignore = ["mpi", "torchdist"]  # scripts that mpiexec / torchrun start, not modules to import

#: True in the interpreter that ``run_under_simulator`` starts (NUMBA_ENABLE_CUDASIM=1).
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

#: Marks a test that runs only under the simulator (outside, ``run_under_simulator`` runs it).
simulator_only = pytest.mark.skipif(not SIMULATOR,
                                    reason="runs in the simulator subprocess (test_under_simulator)")


def run_under_simulator(test_file: str, timeout: float = 600) -> None:
    """Run the tests of ``test_file`` in a new interpreter with Numba's CUDA simulator on.

    The simulator must be switched on before numba.cuda is first imported, so it gets a
    process of its own and the rest of the suite never sees it. GPU-marked tests are
    deselected there. Fails with that run's output unless every selected test passed and
    at least one ran (the caller itself is skipped there, so a skip is expected too).
    """
    if SIMULATOR:
        pytest.skip("already under the simulator")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-m", "not gpu and not slow and not mpi", "-W", "ignore::RuntimeWarning",
                        str(Path(test_file).resolve())],
                       env=env, cwd=root, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "skipped" in r.stdout and "failed" not in r.stdout, r.stdout


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
