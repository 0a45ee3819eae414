"""The collectives on GPUs: ``mpirun -n 2 pytest tests/mpi/mpi_collectives.py -k cupy`` (NCCL and MPI).

The CuPy cases of the one collective suite (its NumPy cases run in ``make test``).

Needs CuPy and two CUDA devices for the collective suite (NCCL takes one GPU per rank; it
skips on one); run with ``make test-gpu`` / ``pytest -m gpu``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_comm_mpi import (
    DEVICE_COLLECTIVE_CASES,
    ROOT,
    TIMEOUT_S,
    check_cases,
    clean_env,
    mpiexec,
    pytest_command,
    report_env,
)


def launcher(n: int) -> list[str]:
    """mpirun/mpiexec for n ranks; Open MPI needs to be told it may run as root and oversubscribe."""
    exe = mpiexec()
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    version = r.stdout + r.stderr
    # Open MPI 4 prints "mpiexec (OpenRTE) 4.1.6", Open MPI 5 "mpiexec (Open MPI) 5.x"
    extra = (["--allow-run-as-root", "--oversubscribe"]
             if "Open MPI" in version or "OpenRTE" in version else [])
    return [exe, *extra, "-n", str(n)]


def gpus() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001
        return 0


@pytest.mark.gpu
@pytest.mark.mpi
def test_collectives_on_gpus(tmp_path):
    if gpus() == 0:
        pytest.skip("no CUDA device / CuPy")
    if gpus() < 2:  # the suite's device cases run over NCCL, which refuses two ranks on one GPU
        pytest.skip("needs 2 GPUs: NCCL takes one GPU per rank (one GPU: test_spill_gpu.py and "
                    "tests/torchdist/gpu_slots_check.py run the device paths over gloo)")
    cmd = launcher(2) + pytest_command() + ["tests/mpi/mpi_collectives.py", "-k", "cupy"]
    r = subprocess.run(cmd, cwd=ROOT, env=report_env(clean_env(), tmp_path), capture_output=True,
                       text=True, timeout=2 * TIMEOUT_S)  # every case of the suite on CuPy arrays
    check_cases(tmp_path, 2, r, DEVICE_COLLECTIVE_CASES)  # each case passed on both ranks, none skipped


@pytest.mark.gpu
@pytest.mark.mpi
def test_demo_on_gpus():
    if gpus() == 0:
        pytest.skip("no CUDA device / CuPy")
    cmd = launcher(2) + [sys.executable, "-m", "zipccl", "demo"]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    print(r.stdout)
    assert r.returncode == 0 and "bit-exact: yes" in r.stdout, f"{r.stdout}\n{r.stderr[-3000:]}"
