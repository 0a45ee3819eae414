"""The collectives on 1, 2 and 4 ranks: ``mpiexec -n N pytest tests/mpi/mpi_collectives.py``.

Each rank derives its expected output from seeds alone (see that file). Host
arrays run on 1, 2 and 4 ranks (four ranks on a two-core machine oversubscribe it);
the same cases on device arrays run on 2 ranks with CuPy, NCCL and the GPU codec
stood in for (``tests/mpi/with_fake_cupy.py``).
"""

from __future__ import annotations

import json
import os
import re
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


def pytest_command() -> list[str]:
    """``python -m pytest`` for a suite in other processes, each writing its case report
    (``tests/mpi/case_report.py``; ``report_env`` says where)."""
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "case_report",
            "-W", "ignore::RuntimeWarning"]


def report_env(env: dict[str, str], report_dir: Path) -> dict[str, str]:
    """``env`` with ``tests/mpi`` on the path (the case_report plugin) and its output directory."""
    env = dict(env, ZIPCCL_CASE_REPORT=str(report_dir))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "mpi"), env["PYTHONPATH"]])
    return env


def run_ranks(n: int, targets: list[str], report_dir: Path, timeout: float = TIMEOUT_S,
              args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The suites ``targets`` in one pytest run on n ranks under mpiexec (see ``check_cases``)."""
    cmd = [mpiexec(), "-n", str(n), *pytest_command(), *targets, *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=report_env(clean_env(), report_dir),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-4000:]
        pytest.fail(f"{n} ranks did not finish in {timeout} s (a hang?):\n{out!r}")


def _suite_part(report: dict, suite: str) -> dict:
    """The part of one rank's case report (``tests/mpi/case_report.py``) that is the cases of
    ``suite`` (a path relative to the repository, as in the node ids)."""
    def ours(node_id: str) -> bool:
        return node_id.removeprefix("collect:").split("::")[0] == suite

    lists = {key: [c for c in report[key] if ours(c)] for key in ("collected", "passed", "failed")}
    return {**report, **lists, "skipped": {c: why for c, why in report["skipped"].items() if ours(c)}}


def check_cases(report_dir: Path, ranks: int, r: subprocess.CompletedProcess, at_least: int,
                expect_skip=lambda case: None, suite: str | None = None) -> list[dict]:
    """The per-case reports of a suite run on ``ranks`` ranks (``tests/mpi/case_report.py``).

    Every rank wrote one; no case failed; at least ``at_least`` cases were selected (a case
    that disappears from collection is noticed); the skipped cases are exactly those that
    ``expect_skip(node_id)`` names, each for the reason it gives (a regular expression), and
    every other selected case passed. With ``suite`` (a job that ran several suites), all this
    of that suite's cases. Returns the reports.
    """
    tail = f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    missing = [k for k in range(ranks) if not (report_dir / f"rank{k}.json").exists()]
    assert not missing, f"ranks {missing} wrote no case report (exit {r.returncode}):\n{tail}"
    whole = [json.loads((report_dir / f"rank{k}.json").read_text()) for k in range(ranks)]
    reports = whole if suite is None else [_suite_part(rep, suite) for rep in whole]
    for k, rep in enumerate(reports):
        assert not rep["failed"], f"rank {k}: {len(rep['failed'])} failed: {rep['failed'][:20]}\n{tail}"
        assert len(rep["collected"]) >= at_least, \
            f"rank {k}: {len(rep['collected'])} cases selected, expected at least {at_least}"
        want_skipped = {c: expect_skip(c) for c in rep["collected"] if expect_skip(c)}
        assert sorted(rep["skipped"]) == sorted(want_skipped), (
            f"rank {k}: skipped unexpectedly: "
            f"{ {c: why for c, why in rep['skipped'].items() if c not in want_skipped} }; "
            f"ran though expected to skip: {sorted(set(want_skipped) - set(rep['skipped']))[:20]}")
        wrong = {c: why for c, why in rep["skipped"].items() if not re.search(want_skipped[c], why)}
        assert not wrong, f"rank {k}: skipped for another reason than expected: {wrong}"
        assert sorted(rep["passed"]) == sorted(set(rep["collected"]) - set(want_skipped)), \
            f"rank {k}: cases that neither passed nor skipped"
    others_failed = any(len(w["failed"]) > len(rep["failed"]) for w, rep in zip(whole, reports, strict=True))
    assert r.returncode == 0 or others_failed, \
        f"exit {r.returncode} with every case passed or skipped as expected:\n{tail}"
    return reports


#: cases each suite selects at least (on every rank): a floor, so that a case that stops being
#: collected is noticed; the exact set that must pass is the selected cases minus the stated skips
HOST_COLLECTIVE_CASES = 523
DEVICE_COLLECTIVE_CASES = 777  # the CuPy cases (tests/test_comm_gpu.py runs them on GPUs)
STAND_IN_CUPY_CASES = DEVICE_COLLECTIVE_CASES - 1  # less test_torch_tensors[cupy]
MISMATCH_CASES = 76
NO_HOST_WAIT_CASES = 11
DEVICE_SIM_CASES = 10


def collective_skips(ranks: int):
    """The host collective suite's stated skips on ``ranks`` ranks (``tests/mpi/mpi_collectives.py``)."""
    def why(case: str) -> str | None:
        if ranks == 1 and "::test_corrupted_frame_detected_everywhere[" in case:
            return "one rank sends no frames"
        if ranks != 2 and "::test_torch_tensors[" in case:
            return "importing torch on every rank is slow"
        return None
    return why


def mismatch_skips(case: str) -> str | None:
    """An agreed native call is not checked again, as documented (``tests/mpi/mpi_mismatch.py``)."""
    never_once = "never-None-first" in case
    if never_once and ("::test_agreed_call_against_another[" in case
                       or ("::test_one_rank_local_error[" in case and case.endswith("-True]"))):
        return "documented: agreed native calls are not checked again"
    return None


COLLECTIVES = "tests/mpi/mpi_collectives.py"
MISMATCH = "tests/mpi/mpi_mismatch.py"
HOST_CASES = "not cupy"  # of the collective suite (the CuPy ones: test_device_path_with_stand_in_cupy)


@pytest.fixture(scope="module")
def host_suites_on_2_ranks(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The collective suite's NumPy cases and the mismatch suite in one job of 2 ranks (one
    start-up of the ranks for both); each test checks its own suite's cases in its reports."""
    report_dir = tmp_path_factory.mktemp("host_suites")
    return report_dir, run_ranks(2, [COLLECTIVES, MISMATCH], report_dir,
                                 args=("-k", f"mpi_mismatch or ({HOST_CASES})"))


@pytest.mark.mpi
# one rank and four ranks: the slow tier (CI runs it after make test), for make test's time bound
@pytest.mark.parametrize("ranks", [pytest.param(1, marks=pytest.mark.slow), 2,
                                   pytest.param(4, marks=pytest.mark.slow)])
def test_collectives_under_mpiexec(ranks, tmp_path, request):
    """The NumPy cases (the CuPy ones: test_device_path_with_stand_in_cupy and test_comm_gpu.py)."""
    if ranks == 2:
        report_dir, r = request.getfixturevalue("host_suites_on_2_ranks")
    else:
        report_dir, r = tmp_path, run_ranks(ranks, [COLLECTIVES], tmp_path, args=("-k", HOST_CASES))
    check_cases(report_dir, ranks, r, HOST_COLLECTIVE_CASES, collective_skips(ranks), suite=COLLECTIVES)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_mismatches_raise_everywhere(ranks, tmp_path, request):
    """Different settings, sizes, dtypes, ops and counts: one CollectiveError on every rank, no hang."""
    if ranks == 2:
        report_dir, r = request.getfixturevalue("host_suites_on_2_ranks")
    else:
        report_dir, r = tmp_path, run_ranks(ranks, [MISMATCH], tmp_path, timeout=120)
    check_cases(report_dir, ranks, r, MISMATCH_CASES, mismatch_skips, suite=MISMATCH)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: make demo's job
def test_demo_is_bit_exact(ranks):
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "zipccl", "demo", "--limit", "400000",
           "--repeat", "1", "--host"]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "bit-exact: yes" in r.stdout
    assert "all-MiniLM-L6-v2" in r.stdout or "generated" in r.stdout


def run_with_fake_cupy(n: int, args: list[str], sim: bool = False,
                       report_dir: Path | None = None) -> subprocess.CompletedProcess:
    """``tests/mpi/with_fake_cupy.py`` on n ranks: GPU code paths with CuPy / NCCL stood in for.
    With ``report_dir``, ``args`` run pytest with the case report plugin (see ``check_cases``)."""
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT / "tests" / "mpi"),
                                         env["PYTHONPATH"]])
    if report_dir is not None:
        env = report_env(env, report_dir)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(ROOT / "tests" / "mpi" / "with_fake_cupy.py"),
           *args]
    try:
        return subprocess.run(cmd, cwd=ROOT / "tests", env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"did not finish in {TIMEOUT_S} s (a hang?):\n{(e.stdout or b'')[-4000:]!r}")


def run_suite_with_fake_cupy(n: int, targets: list[str], report_dir: Path, *args: str,
                             sim: bool = False) -> subprocess.CompletedProcess:
    """Suites of ``tests/mpi`` in one pytest run on n ranks, CuPy and NCCL stood in for (the
    GPU codec too unless ``sim``: then its kernels run in Numba's simulator)."""
    pytest_args = pytest_command()[1:]  # after the interpreter: "-m pytest ..."
    return run_with_fake_cupy(n, [*([] if sim else ["--cpu-codec"]), *pytest_args,
                                  *[str(ROOT / t) for t in targets], *args], sim=sim, report_dir=report_dir)


NO_HOST_WAIT = "tests/mpi/mpi_no_host_wait.py"
STAND_IN_CASES = "cupy and not torch"  # of the collective suite


@pytest.fixture(scope="module")
def device_suites_on_2_ranks(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The collective suite's CuPy cases and the no-host-wait suite in one job of 2 ranks with
    CuPy, NCCL and the GPU codec stood in for (one start-up of the ranks for both)."""
    report_dir = tmp_path_factory.mktemp("device_suites")
    return report_dir, run_suite_with_fake_cupy(2, [COLLECTIVES, NO_HOST_WAIT], report_dir,
                                                "-k", f"mpi_no_host_wait or ({STAND_IN_CASES})")


@pytest.mark.mpi
def test_device_path_with_stand_in_cupy(device_suites_on_2_ranks):
    """The collective tests' CuPy cases on 2 ranks with CuPy, NCCL and the GPU codec stood in for."""
    report_dir, r = device_suites_on_2_ranks
    check_cases(report_dir, 2, r, STAND_IN_CUPY_CASES, suite=COLLECTIVES)


@pytest.mark.mpi
def test_ranks_sharing_a_gpu_take_mpi_and_forced_nccl_says_why(monkeypatch):
    """Two ranks on one (stand-in) GPU: "auto" goes over MPI, staged, and logs one line;
    backend="nccl" raises a CollectiveError naming the fix on both ranks (tests/mpi/shared_gpu.py)."""
    monkeypatch.setenv("FAKE_CUPY_GPU_ID", "0000:19:00.0")
    r = run_with_fake_cupy(2, ["--cpu-codec", "mpi/shared_gpu.py"])
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.stdout.count("shared GPU ok") == 2, r.stdout


@pytest.mark.mpi
def test_compressed_device_calls_make_no_host_wait(device_suites_on_2_ranks):
    """Steady-state compressed calls on (stand-in) device arrays: no synchronisation, no
    device-to-host read, no host agreement on the caller's thread (tests/mpi/mpi_no_host_wait.py)."""
    report_dir, r = device_suites_on_2_ranks
    check_cases(report_dir, 2, r, NO_HOST_WAIT_CASES, suite=NO_HOST_WAIT)


@pytest.mark.mpi
@pytest.mark.slow  # a benchmark run through end to end: the slow tier (CI runs it)
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
@pytest.mark.slow
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
def test_device_engine_in_the_simulator(tmp_path):
    """DeviceEngine with the GPU codec's kernels in Numba's simulator, pipelined and two-phase."""
    r = run_suite_with_fake_cupy(2, ["tests/mpi/mpi_device_sim.py"], tmp_path, sim=True)
    check_cases(tmp_path, 2, r, DEVICE_SIM_CASES)
