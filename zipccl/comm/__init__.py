"""Compressed collectives: the one call path (``core``) and the mpi4py front end (``Communicator``).

``call`` describes a call, ``all_gather`` / ``reduce_scatter`` / ``all_to_all`` / ``all_reduce``
each hold one collective (its checks, its messages, its native form), ``core`` decides, plans,
agrees, runs and counts, ``exchange`` is the one compressed exchange over ``transport``.
docs/ARCHITECTURE.md lists every module. Importing this package does not import mpi4py's MPI
module or touch a GPU.
"""

from .base import CollectiveError
from .policy import Decision, Policy

__all__ = ["CollectiveError", "Decision", "Policy", "Communicator"]


def __getattr__(name):
    if name == "Communicator":
        from .communicator import Communicator
        return Communicator
    raise AttributeError(f"module 'zipccl.comm' has no attribute {name!r}")
