"""One rank failing ends the whole MPI job (``zipccl.tools.mpijob``): the demo and the experiments.

Each case starts ``mpiexec -n 2`` with one rank that raises while the other waits
in a collective, and requires the job to end, non-zero, well inside a timeout
(without the abort, the waiting rank never returns and the test times out).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from test_comm_mpi import ROOT, clean_env, mpiexec

from zipccl.tools.mpijob import run_main

TIMEOUT_S = 60


def run_job(*ranks: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run one command per rank (MPMD: ``mpiexec -n 1 A : -n 1 B``); fail on a hang."""
    cmd = [mpiexec()]
    for i, argv in enumerate(ranks):
        cmd += ([":"] if i else []) + ["-n", "1", *argv]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the job did not end in {TIMEOUT_S} s after one rank failed (a hang):\n"
                    f"{(e.stderr or b'')[-3000:]!r}")
    return r, time.perf_counter() - t0


def assert_rank_1_ended_the_job(r: subprocess.CompletedProcess, says: str) -> None:
    """The job failed because rank 1 failed, for its own reason, and rank 1 alone aborted it:
    rank 0 neither failed on its own nor got past the collective it waited in."""
    assert r.returncode != 0, r.stdout[-3000:]
    assert says in r.stderr, r.stderr[-3000:]
    aborted = re.findall(r"rank (\d+) of 2: aborting the MPI job", r.stderr)
    assert aborted == ["1"], f"abort lines of ranks {aborted}, expected rank 1's alone:\n{r.stderr[-3000:]}"
    assert PAST not in r.stdout and "bit-exact" not in r.stdout, r.stdout[-3000:]


PAST = "rank 0 got past the collective"

WAITER = """
import sys
from mpi4py import MPI
from zipccl.tools.mpijob import run_main

def main():
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 1:
        {fail}
    comm.Barrier()  # rank 0 waits here for a rank that never comes
    print("{past}", flush=True)
    return 0

sys.exit(run_main(main, MPI.COMM_WORLD))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("fail, says", [
    ("raise RuntimeError('rank 1 broke')", "RuntimeError: rank 1 broke"),
    ("raise SystemExit('check failed on rank 1')", "check failed on rank 1"),
])
def test_run_main_aborts_the_job(fail, says):
    script = WAITER.replace("{fail}", fail).replace("{past}", PAST)
    r, _ = run_job([sys.executable, "-c", script], [sys.executable, "-c", script])
    assert_rank_1_ended_the_job(r, says)


@pytest.mark.mpi
def test_demo_aborts_when_one_rank_raises():
    # Rank 1 runs the demo with a checkpoint loader that raises; rank 0 runs it normally
    # and waits for rank 1 in the demo's first collective.
    broken = ("import sys, zipccl.demo as d\n"
              "def load_values(limit):\n"
              "    raise OSError('rank 1 cannot read the checkpoint')\n"
              "d.load_values = load_values\n"
              "sys.exit(d.main(['--limit', '4096', '--host']))\n")
    r, _ = run_job([sys.executable, "-m", "zipccl", "demo", "--limit", "4096", "--host"],
                   [sys.executable, "-c", broken])
    assert_rank_1_ended_the_job(r, "rank 1 cannot read the checkpoint")


@pytest.mark.mpi
def test_experiment_aborts_when_one_rank_raises(tmp_path):
    # Rank 1 is given an impossible element count: it raises while rank 0 waits in the
    # round-trip check's allreduce.
    script = str(ROOT / "experiments" / "bench_cpu_mpi.py")
    common = ["--samples", "1", "--seconds", "0.01", "--calls", "1", "--out", str(tmp_path / "x")]
    r, _ = run_job([sys.executable, script, "--counts", "16", *common],
                   [sys.executable, script, "--counts", "-1", *common])
    assert_rank_1_ended_the_job(r, "uncaught exception: rank 1 of 2: aborting")
    assert not (tmp_path / "x").exists()


def test_one_rank_keeps_the_exception():
    from mpi4py import MPI

    def main():
        raise KeyError("alone")

    with pytest.raises(KeyError, match="alone"):
        run_main(main, MPI.COMM_SELF)
    assert run_main(lambda: 3, MPI.COMM_SELF) == 3
