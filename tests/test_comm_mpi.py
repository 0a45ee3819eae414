"""The collectives on 1, 2 and 4 ranks: ``mpiexec -n N pytest tests/mpi/mpi_collectives.py``.

Each rank derives its expected output from seeds alone (see that file). Host
arrays run on 1, 2 and 4 ranks (four ranks on a two-core machine oversubscribe it);
the same cases on device arrays run on 2 ranks with CuPy, NCCL and the GPU codec
stood in for (``tests/mpi/with_fake_cupy.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300


def mpiexec() -> str:
    """The mpiexec next to this Python (the mpich wheel's), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.fail("mpiexec not found: `make install` installs the mpich wheel that provides it")
    return found


def clean_env() -> dict[str, str]:
    """This environment minus any MPI launcher state (a parent that initialised MPI leaks PMI_*)."""
    # Only a process that is itself an MPI rank leaks launcher state; otherwise OMPI_MCA_*
    # settings are the machine's own configuration (e.g. how mpirun starts local ranks).
    is_rank = any(k in os.environ for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))
    launcher_state = ("PMI_", "PMIX_", "HYDRA_", "OMPI_", "MPI_LOCALRANKID") if is_rank else \
        ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher_state)}
    env.setdefault("NUMBA_NUM_THREADS", "1")  # ranks share the cores: no thread oversubscription
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_ranks(n: int, target: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "-W", "ignore::RuntimeWarning", target]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-4000:]
        pytest.fail(f"{n} ranks did not finish in {timeout} s (a hang?):\n{out!r}")


@pytest.mark.mpi
# more than two ranks: the slow tier (CI runs it after make test), for make test's time bound
@pytest.mark.parametrize("ranks", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
def test_collectives_under_mpiexec(ranks):
    r = run_ranks(ranks, "tests/mpi/mpi_collectives.py")
    assert r.returncode == 0, f"{ranks} ranks failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert "passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_mismatches_raise_everywhere(ranks):
    """Different settings, sizes, dtypes, ops and counts: one CollectiveError on every rank, no hang."""
    r = run_ranks(ranks, "tests/mpi/mpi_mismatch.py", timeout=120)
    assert r.returncode == 0, f"{ranks} ranks failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert "passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_demo_is_bit_exact(ranks):
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "zipccl", "demo", "--limit", "400000",
           "--repeat", "1", "--host"]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "bit-exact: yes" in r.stdout
    assert "all-MiniLM-L6-v2" in r.stdout or "generated" in r.stdout


def run_with_fake_cupy(n: int, args: list[str], sim: bool = False) -> subprocess.CompletedProcess:
    """``tests/mpi/with_fake_cupy.py`` on n ranks: GPU code paths with CuPy / NCCL stood in for."""
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT / "tests" / "mpi"),
                                         env["PYTHONPATH"]])
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(ROOT / "tests" / "mpi" / "with_fake_cupy.py"),
           *args]
    try:
        return subprocess.run(cmd, cwd=ROOT / "tests", env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"did not finish in {TIMEOUT_S} s (a hang?):\n{(e.stdout or b'')[-4000:]!r}")


@pytest.mark.mpi
def test_device_path_with_stand_in_cupy():
    """The collective tests' CuPy cases on 2 ranks with CuPy, NCCL and the GPU codec stood in for."""
    r = run_with_fake_cupy(2, ["--cpu-codec", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                               "ignore::RuntimeWarning", "mpi/mpi_collectives.py",
                               "-k", "cupy and not torch"])
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert "passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.mpi
def test_ranks_sharing_a_gpu_take_mpi_and_forced_nccl_says_why(monkeypatch):
    """Two ranks on one (stand-in) GPU: "auto" goes over MPI, staged, and logs one line;
    backend="nccl" raises a CollectiveError naming the fix on both ranks (tests/mpi/shared_gpu.py)."""
    monkeypatch.setenv("FAKE_CUPY_GPU_ID", "0000:19:00.0")
    r = run_with_fake_cupy(2, ["--cpu-codec", "mpi/shared_gpu.py"])
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.stdout.count("shared GPU ok") == 2, r.stdout


@pytest.mark.mpi
def test_compressed_device_calls_make_no_host_wait():
    """Steady-state compressed calls on (stand-in) device arrays: no synchronisation, no
    device-to-host read, no host agreement on the caller's thread (tests/mpi/mpi_no_host_wait.py)."""
    r = run_with_fake_cupy(2, ["--cpu-codec", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                               "ignore::RuntimeWarning", "mpi/mpi_no_host_wait.py"])
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert "passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.mpi
def test_bench_collectives_runs_through(tmp_path):
    """experiments/bench_collectives.py end to end on stand-ins: records written, all exact."""
    out = tmp_path / "bench.jsonl"
    r = run_with_fake_cupy(2, ["--cpu-codec", str(ROOT / "experiments" / "bench_collectives.py"),
                               "--link", "shm", "--sizes-mib", "0.0625,0.25", "--chunk-mib", "0.03125",
                               "--iters", "2", "--lat-iters", "1", "--warmup", "1", "--out", str(out),
                               "--host-sizes-mib", "0.0625", "--host-iters", "3",
                               "--chunk-sweep", "all_to_all:0.25", "--chunks-mib", "0.0625,0"])
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    main = [x for x in recs if x["bench"] == "collectives"]
    assert len(main) == 4 * 2 * 3 and all(x["exact"] for x in recs if "exact" in x)
    assert all("predicted_s" in x and x["predicted_s"] > 0 for x in main)
    assert sum(x["bench"] == "collectives_chunks" for x in recs) == 2
    assert sum(x["bench"] == "collectives_calibration" for x in recs) == 1
    host = [x for x in recs if x["bench"] == "collectives_host"]
    assert sorted(x["op"] for x in host) == sorted(["all_gather", "reduce_scatter", "all_to_all",
                                                    "all_reduce"])
    assert all(x["host_us_per_call"]["communicator"] > 0 for x in host)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bench_collectives_other_dtypes(tmp_path, dtype):
    """The benchmark on FP32 / FP16 data: compressed, checked against the stated sum, exact."""
    out = tmp_path / "bench.jsonl"
    r = run_with_fake_cupy(2, ["--cpu-codec", str(ROOT / "experiments" / "bench_collectives.py"),
                               "--link", "shm", "--dtype", dtype, "--sizes-mib", "0.25",
                               "--variants", "nccl,always", "--ops", "reduce_scatter,all_gather",
                               "--iters", "2", "--lat-iters", "1", "--warmup", "1", "--out", str(out),
                               "--host-sizes-mib", "0.0625", "--host-iters", "3"])
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    main = [x for x in recs if x["bench"] == "collectives"]
    assert len(main) == 2 * 2 and all(x["exact"] and x["dtype"] == dtype for x in main)
    zipped = [x for x in main if x["variant"] == "always"]
    assert all(x["compressed"] and x["wire_ratio"] < 0.95 for x in zipped)


@pytest.mark.mpi
@pytest.mark.slow
def test_device_engine_in_the_simulator():
    """DeviceEngine with the GPU codec's kernels in Numba's simulator, pipelined and two-phase."""
    r = run_with_fake_cupy(2, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                               "ignore::RuntimeWarning", "mpi/mpi_device_sim.py"], sim=True)
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert "passed" in r.stdout and "failed" not in r.stdout
