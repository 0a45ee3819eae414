"""The call description: one collective call, whatever front end made it, and where it runs.

A front end (``Communicator``, ``zipccl.torch``) wraps its arguments (``args.wrap``) and asks
the collective's own file (``all_gather``, ``reduce_scatter``, ``all_to_all``, ``all_reduce``)
to describe the call; that file holds the one set of checks. The ``Call`` is then all the core
(``core.Core``) needs to decide, agree, plan, run and count it; ``Route`` is where it runs
(engine, transport, slot channel, stream, pipeline round). docs/ARCHITECTURE.md draws the path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .args import Arr, overlap, ptr_range

#: reductions zipccl computes itself (compressed, or natively where the transport has no BF16 sum)
CODED_REDUCTIONS = ("sum", "avg")


@dataclass(eq=False, slots=True)
class Call:
    """One collective call: op, arrays (``args.Arr``), per-peer element counts, reduction, stream.

    ``send_counts[j]`` / ``recv_counts[j]``: elements this rank sends to / receives from rank j
    (an all-gather sends its whole shard to each); ``largest``: the largest message between
    two ranks anywhere, where every rank knows it (None: unknown, so one pipeline round).
    """

    op: str
    send: Arr
    recv: Arr  # all_reduce: the buffer itself (``send is recv``)
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    reduce: str | None = None  # "sum", "avg" or another reduction (native only)
    uneven: bool = False  # per-peer counts, not equal blocks
    largest: int | None = None
    rank: int = 0
    nbytes: int = 0  # what the policy decides on (the send buffer's bytes unless set)
    stream: object = None
    # how send and recv share memory, worked out at first use: a kept call replays only on
    # the memory its plan key names, so it never changes
    _in_place: bool | None = field(default=None, init=False, repr=False)
    _overlap: bool | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.nbytes:
            self.nbytes = self.send.nbytes

    @property
    def code(self) -> int | None:
        """The frame element type the call moves compressed, or None (native only)."""
        if self.reduce is not None and self.reduce not in CODED_REDUCTIONS:
            return None
        return self.send.code

    @property
    def device(self) -> bool:
        return self.send.device

    @property
    def in_place(self) -> bool:
        """Send is exactly this rank's block of recv (NCCL's in-place form)."""
        v = self._in_place
        if v is None:
            v = self._in_place = self.send is self.recv or _own_block(self)
        return v

    @property
    def overlapping(self) -> bool:
        """Whether send and recv share memory (in-place calls, and any other overlap)."""
        v = self._overlap
        if v is None:
            v = self._overlap = overlap(self.send.data, self.recv.data)
        return v

    def sig(self, *extra) -> tuple:
        """What every rank must share about this call (``agreement``'s module docstring, 2.)."""
        counts = "per-peer counts" if self.uneven else self.send.size
        return (self.op, self.send.dtype, self.send.device, counts, self.reduce or "", *extra)


def _own_block(call: Call) -> bool:
    if call.op not in ("all_gather", "reduce_scatter") or not call.send.size:
        return False
    s0, r0 = ptr_range(call.send.data)[0], ptr_range(call.recv.data)[0]
    if call.op == "all_gather":
        return s0 == r0 + call.rank * call.send.nbytes
    return r0 == s0 + call.rank * call.recv.nbytes


@dataclass(eq=False, slots=True)
class Route:
    """Where a call runs: the engine (host or device memory), the transport, the slot channel of
    compressed calls, the stream and the elements per pipeline round (0: one round)."""

    eng: object
    tr: object
    channel: object = None
    stream: object = None
    chunk: int = 0
    loopback: bool = False  # one rank sends its message through a slot to itself


def raw_exchange(tr, send_bytes, sends: Sequence[tuple[int, int]], recv_bytes,
                 recvs: Sequence[tuple[int, int]], stream=None) -> None:
    """The uncompressed all-to-all of the same messages (byte offsets and counts)."""
    tr.alltoallv(send_bytes, [c for _, c in sends], [o for o, _ in sends],
                 recv_bytes, [c for _, c in recvs], [o for o, _ in recvs], stream)


def detached(call: Call, eng, send):
    """``send`` (the memory of ``call.send``) itself, or a copy of it if it overlaps the call's
    recv (in-place calls)."""
    if not call.overlapping:
        return send
    # an engine buffer, not a temporary: the device work reading it outlives this call's
    # Python frame, and a freed temporary goes back to CuPy's pool unordered with that work
    copy = eng.workspace("detach", send.nbytes).view(send.dtype)
    eng.copy(copy, send)
    return copy
