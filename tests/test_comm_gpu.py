"""The Communicator's collectives on GPU arrays: the CuPy cases of the one collective suite
(``tests/mpi/mpi_collectives.py``; its NumPy cases run in ``make test``), one test here per
test function there, run with ``make test-gpu`` / ``pytest -m gpu``.

- One GPU: ``mpiexec -n 2`` ranks share it and the Communicators move device arrays over MPI
  (``backend="mpi"``: staged through host memory unless MPI is CUDA-aware, which the
  transport detects): every test function of the suite written over a Communicator setting
  (``zc``), on its CuPy-over-MPI settings (``-k cupy-mpi``: pipelined in rounds, and native).
- Two GPUs: the whole CuPy suite, NCCL included (NCCL takes one GPU per rank: it refuses two
  ranks on one GPU).
- The demo on GPU arrays: over MPI on one GPU, over NCCL on two.

The ranks run once per module, each writing a JUnit file; a test here fails if any of its
function's cases failed on any rank, and skips (with the cases' own reason) only if every one
of them skipped.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

import pytest
from test_comm_mpi import (
    ROOT,
    TIMEOUT_S,
    clean_env,
    mpiexec,
)

SUITE = ROOT / "tests" / "mpi" / "mpi_collectives.py"


def suite_functions(fixture: str) -> list[str]:
    """The suite's test functions that take ``fixture`` (read from its source: nothing imported)."""
    tree = ast.parse(SUITE.read_text())
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
            and fixture in [a.arg for a in f.args.args]]


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
    """CUDA devices CuPy sees; a test of this module skips with the cause when there is none."""
    try:
        import cupy
    except ImportError as e:
        pytest.skip(f"CuPy is not installed ({e})")
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"no CUDA device: {e}")


def run_suite(out, select: str, timeout: float) -> dict:
    """The suite's cases matching ``-k select`` on 2 ranks; {function: {"passed": [...],
    "failed": [(case, message)], "skipped": [(case, reason)]}} over both ranks' JUnit files."""
    junit = f"{out}/rank${{OMPI_COMM_WORLD_RANK:-$PMI_RANK}}.xml"
    inner = (f"exec {sys.executable} -m pytest -q -p no:cacheprovider -W ignore::RuntimeWarning "
             f"{SUITE} -k '{select}' --junitxml={junit}")
    try:
        r = subprocess.run(launcher(2) + ["sh", "-c", inner], cwd=ROOT, env=clean_env(),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the ranks did not finish in {timeout} s (a hang?):\n{(e.stdout or b'')[-4000:]!r}")
    files = sorted(out.glob("rank*.xml"))
    assert len(files) == 2, \
        f"{len(files)} JUnit files (rc {r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-3000:]}"
    cases: dict = defaultdict(lambda: {"passed": [], "failed": [], "skipped": []})
    for rank, path in enumerate(files):
        for tc in ET.parse(path).getroot().iter("testcase"):
            name = tc.get("name", "")
            entry = cases[name.split("[")[0]]
            bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            if bad is not None:
                entry["failed"].append((f"rank {rank} {name}", (bad.get("message") or "")[:300]))
            elif tc.find("skipped") is not None:
                entry["skipped"].append((f"rank {rank} {name}", tc.find("skipped").get("message", "")))
            else:
                entry["passed"].append(f"rank {rank} {name}")
    cases["__run__"] = {"rc": r.returncode, "tail": r.stdout[-3000:] + r.stderr[-2000:]}
    return cases


def assert_function(cases: dict, name: str) -> None:
    """Every case of ``name`` passed on every rank (skip only if all of them skipped)."""
    entry = cases.get(name)
    assert entry is not None, f"no case of {name} ran (-k selected none?)\n{cases['__run__']['tail']}"
    assert not entry["failed"], "\n".join(f"{c}: {m}" for c, m in entry["failed"][:10])
    if not entry["passed"]:
        reasons = sorted({m for _, m in entry["skipped"]})
        pytest.skip(f"every case of {name} skipped: {reasons}")


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    if gpus() < 1:
        pytest.skip("no CUDA device")
    return run_suite(tmp_path_factory.mktemp("mpi_one_gpu"), "cupy-mpi", 2 * TIMEOUT_S)


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("name", suite_functions("zc"))
def test_collectives_over_mpi_on_one_gpu(one_gpu, name):
    """Two ranks on one GPU, CuPy arrays, ``Communicator(backend="mpi")``: this function's
    cases of the suite pass on both ranks."""
    assert_function(one_gpu, name)


@pytest.mark.gpu
@pytest.mark.mpi
def test_one_gpu_run_exited_cleanly(one_gpu):
    assert one_gpu["__run__"]["rc"] == 0, one_gpu["__run__"]["tail"]


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    if gpus() < 2:  # the suite's device cases run over NCCL too, which refuses two ranks on one GPU
        pytest.skip("needs 2 GPUs: NCCL takes one GPU per rank and refuses two ranks on one "
                    "(one GPU: test_collectives_over_mpi_on_one_gpu and tests/test_torch_gpu.py)")
    return run_suite(tmp_path_factory.mktemp("mpi_two_gpus"), "cupy", 2 * TIMEOUT_S)


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("name", suite_functions("zc") + suite_functions("place"))
def test_collectives_on_two_gpus(two_gpus, name):
    """Every CuPy case of the suite, NCCL and MPI, one GPU per rank."""
    assert_function(two_gpus, name)


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("backend, need", [("mpi", 1), ("auto", 1), ("auto", 2)],
                         ids=["mpi", "auto_one_gpu", "auto_two_gpus"])
def test_demo_on_gpus(backend, need):
    """``python -m zipccl demo`` on 2 ranks with GPU arrays: bit-exact. ``backend="mpi"``: over
    MPI wherever; ``auto`` on one GPU: both ranks on it over MPI, and the demo says why; ``auto``
    on two GPUs: one each, NCCL."""
    n = gpus()
    if n < need:
        pytest.skip("needs 2 GPUs: NCCL takes one GPU per rank and refuses two ranks on one")
    if backend == "auto" and need == 1 and n != 1:
        pytest.skip("needs exactly one GPU (two ranks sharing it)")
    cmd = launcher(2) + [sys.executable, "-m", "zipccl", "demo", "--backend", backend]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    print(r.stdout)
    assert r.returncode == 0 and "bit-exact: yes" in r.stdout, f"{r.stdout}\n{r.stderr[-3000:]}"
    assert "GPU arrays" in r.stdout, r.stdout
    if backend == "auto" and n < 2:  # two ranks share the GPU: MPI, and the demo says why
        assert "transport mpi" in r.stdout and "NCCL cannot run there" in r.stdout, r.stdout
    elif backend == "auto":
        assert "transport nccl" in r.stdout, r.stdout


@pytest.mark.gpu
@pytest.mark.mpi
def test_demo_forced_nccl_on_one_gpu_says_what_to_change():
    if gpus() != 1:
        pytest.skip("needs exactly one GPU (two ranks sharing it)")
    cmd = launcher(2) + [sys.executable, "-m", "zipccl", "demo", "--backend", "nccl", "--limit", "100000"]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert r.returncode == 2, f"{r.stdout}\n{r.stderr[-3000:]}"
    assert 'backend="nccl" cannot run here' in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
