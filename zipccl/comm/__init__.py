"""Compressed collectives: ``Communicator`` over NCCL or MPI transports.

``transport`` moves bytes (NCCL, MPI direct or host-staged), ``collectives``
says what each collective moves and holds the stated reduction, ``exchange`` is the
one compressed exchange (fixed-size slots), ``slots`` / ``capacity`` size them and
``spill`` moves the frames that do not fit,
``engine`` declares what the algorithms ask of the memory the data lives in,
``host`` and ``pipeline`` implement it for host and device arrays, ``policy``
decides compressed or native per call, ``calibrate`` measures the profile it
follows, ``args`` normalises the arguments of every entry point, ``agreement``
checks that the ranks make the same call (the control row), ``plans`` keeps what each
call signature decided, ``communicator`` is the user-facing class. Importing this package does
not import mpi4py's MPI module or touch a GPU.
"""

from .base import CollectiveError
from .policy import Decision, Policy

__all__ = ["CollectiveError", "Decision", "Policy", "Communicator"]


def __getattr__(name):
    if name == "Communicator":
        from .communicator import Communicator
        return Communicator
    raise AttributeError(f"module 'zipccl.comm' has no attribute {name!r}")
