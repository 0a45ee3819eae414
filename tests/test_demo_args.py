"""``python -m zipccl demo`` under mpiexec: bad arguments are usage errors, and the header counts
exactly the values it gathers.

Every job runs under ``mpiexec`` with a timeout, so a regression fails instead of hanging. The
job's two ways out with a usage error run under mpiexec: a bad number, before MPI starts, and
a limit too small for the ranks, after it; the parser's other bad numbers run in this process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_comm_mpi import ROOT, clean_env, mpiexec

from zipccl import demo as demo_cli

TIMEOUT_S = 120


def demo(ranks: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "zipccl", "demo", "--host", *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the demo did not end in {TIMEOUT_S} s:\n{(e.stderr or b'')[-3000:]!r}")


@pytest.mark.mpi
@pytest.mark.parametrize("args, says", [
    (["--limit", "1"], "--limit 1 gives some of the 2 ranks no values"),  # after MPI starts
    (["--repeat", "two"], "argument --repeat: 'two' is not an integer"),  # before
])
def test_bad_arguments_are_usage_errors(args, says):
    r = demo(2, *args)
    assert r.returncode == 2, f"{r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("args, says", [
    (["--limit", "0"], "argument --limit: must be at least 1, got 0"),
    (["--limit=-5"], "argument --limit: must be at least 1, got -5"),
    (["--repeat", "0"], "argument --repeat: must be at least 1, got 0"),
])
def test_bad_numbers_are_usage_errors(args, says, capsys):
    """The parser's other refusals (the job exits as for --repeat two, before MPI starts)."""
    with pytest.raises(SystemExit) as e:
        demo_cli.main(["--host", *args])
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.mpi
@pytest.mark.slow  # an MPI job of its own: the slow tier (CI runs it after make test)
def test_header_counts_the_values_it_gathers():
    """1003 values on 3 ranks: shards of 334, so 1002 values used, said in the header and the check."""
    r = demo(3, "--limit", "1003", "--repeat", "1")
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    head, last = r.stdout.splitlines()[0], r.stdout.splitlines()[-1]
    assert "1,002 values" in head and "1,003" not in head, head
    assert "bit-exact: yes" in last and "1,002 values on each of 3 rank(s)" in last, last
    assert "shard 334 values" in r.stdout
