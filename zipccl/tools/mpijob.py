"""Entry points of MPI jobs: one rank that fails ends the whole job.

When one rank of an ``mpiexec`` job raises, it exits, and mpi4py's ``MPI_Finalize``
at exit waits for ranks that are themselves waiting for it in their next
collective: the job hangs instead of failing. ``run_main`` wraps a script's
``main()`` so that an exception (or ``SystemExit`` with an error) on any rank
prints its traceback, names the rank, and calls ``comm.Abort``: every process of
the job ends and ``mpiexec`` exits with a non-zero status, as under
``python -m mpi4py``. (Result records are written by the experiments' own
``harness.append_records``.)

Only entry points use this (``python -m zipccl demo``, ``experiments/*.py``); the
library itself never aborts a caller's job.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable

_FORWARD_S = 0.25  # seconds between the last words of a failing rank and the abort


def _abort(comm, message: str, code: int) -> None:
    """Say why on stderr (one write), give the launcher a moment to forward it, abort."""
    sys.stdout.flush()
    sys.stderr.write(f"{message}rank {comm.Get_rank()} of {comm.Get_size()}: "
                     f"aborting the MPI job\n")
    sys.stderr.flush()
    # mpiexec tears the job down at once, and output still in transit is lost (seen
    # with MPICH's Hydra: half a traceback).
    time.sleep(_FORWARD_S)
    comm.Abort(code)


def job_world():
    """The communicator of every process the launcher started: what an entry point runs on
    when its caller gives it none (the library's functions always take one)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def run_main(main: Callable[[], int | None], comm) -> int:
    """``main()``'s exit status; on an exception on this rank, abort every rank of ``comm``.

    A status that ``main`` *returns* is returned as it is (a script returns non-zero
    on all ranks alike, after agreeing); anything *raised* -- an exception, or
    ``SystemExit`` with a non-zero code or a message -- is this rank alone, so the
    job is aborted with status 1 (or the ``SystemExit`` code). With one rank nothing
    changes: the exception propagates.

    >>> from mpi4py import MPI
    >>> run_main(lambda: 0, MPI.COMM_SELF)
    0
    """
    if comm.Get_size() == 1:
        return int(main() or 0)
    try:
        return int(main() or 0)
    except SystemExit as e:
        if e.code is None or e.code == 0:
            raise
        message = "" if isinstance(e.code, int) else f"{e.code}\n"
        _abort(comm, f"{message}exited with an error: ", e.code if isinstance(e.code, int) else 1)
    except BaseException:  # noqa: BLE001 -- KeyboardInterrupt too: the other ranks must stop
        _abort(comm, f"{traceback.format_exc()}uncaught exception: ", 1)
    return 1  # not reached: Abort does not return

