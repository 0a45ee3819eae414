"""Agreement: how a ``Communicator``'s ranks check that they make the same call.

Every rank must make the same calls in the same order with matching arguments; zipccl checks
this without paying for it on every call (docs/COLLECTIVES.md, "Agreement", says it in full):

1. the settings that change a call's path are agreed once, at construction;
2. a call's *signature* (op, dtype, memory, counts, reduction, settings) travels as a 64-bit
   hash in the *control row* every rank all-gathers; any difference raises on every rank;
3. compressed calls on device arrays agree a signature once, then make no host exchange; on
   host arrays every call sends the control row first;
4. native calls are agreed the first time their signature is seen, then run from a plan;
5. an all-to-all with per-peer counts exchanges its count matrix, unless ``recv_counts``
   lets it agree its decision once.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .base import CollectiveError

MAX_AGREED = 4096  # agreed signatures kept; then all are forgotten at once (the same call on every rank)


def sig_hash(sig: tuple) -> int:
    """A 64-bit hash of a signature, the same in every process (``hash`` is salted per process).

    >>> sig_hash(("all_gather", "bfloat16", 8)) == sig_hash(("all_gather", "bfloat16", 8))
    True
    """
    return int.from_bytes(hashlib.blake2b(repr(sig).encode(), digest_size=8).digest(), "little",
                          signed=True)


def describe(sig: tuple) -> str:
    """A signature in words, as failure messages name each rank's call.

    >>> describe(("all_gather", "bfloat16", False, 8, "settings"))
    'all_gather(bfloat16, False, 8)'
    """
    op, *common, _ = sig
    return f"{op}({', '.join(map(str, common))})"


def failure_message(info: list, header: str | None = None) -> str:
    """The one message every rank raises, built from every rank's (op, error, call, settings)."""
    ops = sorted({i[0] for i in info})
    head = header or (f"zipccl {ops[0]}" if len(ops) == 1 else "zipccl collective")
    errs = [(r, i[1]) for r, i in enumerate(info) if i[1]]
    if errs:
        return f"{head}: " + "; ".join(f"rank {r}: {e}" for r, e in errs)
    differ = len({i[3] for i in info}) > 1  # name the settings only where they differ
    calls = [" with ".join(filter(None, [i[2], i[3] if differ else ""])) for i in info]
    return f"{head}: ranks disagree on the call (" + "; ".join(
        f"rank {r}: {c}" for r, c in enumerate(calls)) + ")"


def count_matrix(ints: np.ndarray, p: int) -> list[list[int]]:
    """The all-to-all count matrix (row i: rank i's send counts) from every rank's control
    ints [send counts, recv counts (-1 each when left out), recv size], checked: raises the
    same CollectiveError on every rank (every rank computes it from the same table) if a
    rank's receive side does not match what its peers send."""
    matrix = [[int(c) for c in row[:p]] for row in ints]
    problems = []
    for i, row in enumerate(ints):
        rc = None if row[p] < 0 else [int(c) for c in row[p:2 * p]]
        rsize = int(row[2 * p])
        column = [matrix[j][i] for j in range(p)]
        if rc is None:
            if sum(column) != rsize:
                problems.append(f"rank {i}: recv holds {rsize} elements, peers send {sum(column)}")
        elif rc != column:
            problems.append(f"rank {i}: recv_counts {rc} but peers send {column}")
    if problems:
        raise CollectiveError("zipccl all_to_all: " + "; ".join(problems))
    return matrix


class Agreement:
    """One communicator's agreement state (module docstring): the control row over ``mpi``
    (an ``MPITransport`` of ``size`` ranks), the settings text, and what has been agreed.

    Every method that exchanges is collective: every rank calls it at the same point.
    """

    def __init__(self, mpi, size: int, settings: str = ""):
        self.mpi = mpi
        self.settings = settings  # the settings text: the end of every signature
        self.agreed: set = set()  # signatures agreed (module docstring, 4.)
        self.decisions: dict = {}  # per-peer-count all-to-all with recv_counts: agreed (5.)
        # the control row: [error flag, signature hash, 2p + 2 ints]
        self._row = np.zeros(4 + 2 * size, dtype=np.int64)
        self._table = np.zeros((size, 4 + 2 * size), dtype=np.int64)

    def reset(self, settings: str) -> None:
        """New settings: every agreed signature and decision is forgotten."""
        self.settings = settings
        self.agreed.clear()
        self.decisions.clear()

    def control(self, op: str, crc: int, err: str | None, ints=(), *, describe: str = "",
                header: str | None = None) -> np.ndarray:
        """The control row: all-gather [error flag, ``crc``, ``ints``].

        Returns a (size, 2 * size + 2) view of every rank's ints (valid until the next
        call), or raises the same CollectiveError on every rank if any rank reports an
        error or the hashes differ. ``describe`` is this rank's call in words.
        """
        row, table = self._row, self._table
        row[:] = 0
        row[0] = 1 if err else 0
        row[1] = crc
        row[2:2 + len(ints)] = ints
        self.mpi.allgather_ints(row, table)
        if table[:, 0].any() or (table[:, 1] != table[0, 1]).any():
            # every rank sees the same table: all take this branch together
            info = self.mpi.allgather_objects((op, err, describe, self.settings))
            raise CollectiveError(failure_message(info, header))
        return table[:, 2:]

    def agree(self, err: str | None, op: str = "collective") -> None:
        """Raise the same CollectiveError on every rank if any rank reports ``err``.

        One 8-byte all-reduce when all is well; the messages travel only on failure.
        """
        if self.mpi.any_flag(bool(err)):
            errs = self.mpi.allgather_objects(err)
            bad = [(r, e) for r, e in enumerate(errs) if e]
            raise CollectiveError(f"zipccl {op} failed: " + "; ".join(f"rank {r}: {e}" for r, e in bad))

    def remember(self, sig: tuple) -> bool:
        """Keep ``sig`` as agreed; True if every earlier one was forgotten first (at
        ``MAX_AGREED``: the same call on every rank, so all forget together; the caller's
        plans go with them)."""
        forgot = len(self.agreed) >= MAX_AGREED
        if forgot:
            self.agreed.clear()
        self.agreed.add(sig)
        return forgot

    def keep_decision(self, sig: tuple, decision) -> None:
        """Keep the agreed decision of a per-peer-count all-to-all signature (every rank: the
        same table, the same decision)."""
        if len(self.decisions) >= MAX_AGREED:
            self.decisions.clear()
        self.decisions[sig] = decision
