"""Agreement: how a ``Communicator``'s ranks check that they make the same call.

Every rank must make the same calls in the same order with matching arguments.
zipccl checks this without paying for it on every call:

1. **Settings, once, at construction.** The constructor is collective: the
   ranks exchange every setting that changes the path a call takes (backend,
   policy and its thresholds and profile, chunk size, capacity, checksum, ``verify``) and
   raise the same ``CollectiveError`` on every rank if they differ. Changing
   ``policy`` or ``chunk`` later (``calibrate`` does), or entering and leaving
   ``Communicator.forcing``, must happen on every rank at the same point; a change
   drops every plan and agreed signature.
2. **A call's signature** is what all ranks must share: the operation, dtype,
   host or device memory, the element counts (all-to-all with per-peer counts:
   the count matrix), the reduction op, and the settings. The policy's decision is
   a function of it alone, so ranks that agree on the signature take the same
   path. Its 64-bit hash travels in the *control row*, a fixed-size int64 row
   every rank all-gathers over MPI: [error flag, signature hash, a few ints].
   Any error flag or differing hash makes every rank gather the messages and raise
   the same ``CollectiveError`` (each rank's own problem, or each rank's call).
   Every agreement exchange of every kind of call is this one control row, so
   ranks that disagree about the call still meet in the same MPI operation and
   none can hang there.
3. **Compressed calls** move fixed-size slots (``exchange.slot_exchange``), on host
   and device arrays alike. On device arrays they make no host exchange at all once
   their signature is agreed (the first time it is seen, like a native call; every
   call with ``verify="always"``); on host arrays, whose exchange blocks anyway, every
   call sends the control row first (one small all-gather), so a rank whose call
   differs from its peers' raises there with the others. On device arrays they keep
   NCCL's contract: they enqueue their work on the stream and return; errors found on the device (a frame that
   does not decode, a slot header naming another call) land in a sticky error word
   and raise ``CollectiveError`` at the next compressed call on that rank, or on
   every rank at ``synchronize()`` (docs/COLLECTIVES.md). On host arrays every step
   has run when the call returns, so what it found raises at once on the rank that
   found it (and, through the slot headers, on its peers at their next compressed
   call).
4. **Native calls** are agreed the first time their signature is seen on this
   communicator (one control row), then run from a *plan* (``plans``): the call's arguments
   looked up by the arrays' addresses, shapes, dtypes and the stream; on NCCL the
   plan is the NCCL call with its pointers packed, so an agreed native call costs a
   few dictionary lookups more than calling NCCL directly and moves the same bytes
   the same way. Agreed signatures are remembered in the same order on every rank
   (a correct program adds the same ones at the same calls), so ranks decide "new"
   or "seen" alike. The price, stated precisely: once a native signature is
   agreed, a rank that calls it while a peer calls something else is the caller's
   mistake exactly as it is with NCCL (the peers are not told; NCCL may hang). It
   is detected when the peer's call is a compressed one or one with a new
   signature, not when it is another agreed native call. ``verify="always"``
   sends the control row before every native call too (one small MPI round trip,
   like torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``), turning every mistake into a
   ``CollectiveError``.
5. **All-to-all with per-peer counts** exchanges its count matrix in the control
   row on every call on host arrays, and on device arrays when ``recv_counts`` is
   left out (this rank's receive counts are the other ranks' send counts). On device
   arrays with ``recv_counts`` given, as NCCL and MPI's all-to-all-v take them, a
   call makes no host exchange once its decision is agreed: the first such call of
   a dtype, on which every rank gives ``recv_counts``, exchanges the matrix and agrees
   the decision (the policy's, on the mean message size), later calls keep it (every
   rank must then keep giving them, or none), and counts that disagree between ranks are
   found in the slot headers (a sticky error, as in 3.) or, like NCCL's, not at all
   (a rank that expects more from itself than it sends raises alone; a native call
   with mismatched counts is the caller's mistake, as with NCCL).

``Agreement`` holds one communicator's side of this: the control row, the settings
text every signature ends with, and what has been agreed (signatures, and the
per-peer-count all-to-all decisions), bounded by ``MAX_AGREED``.
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
