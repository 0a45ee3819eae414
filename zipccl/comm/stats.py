"""``Stats``: what a front end's calls moved, counted once per call by the core, per collective.

Every front end (``Communicator.stats``, ``zipccl.torch.Collectives.stats``, the torch
backend's ``stats()``) reads the same counter; a caller may pass one more ``Stats`` to count a
call in (``zipccl.torch``'s ``stats=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import ExchangeStats


@dataclass
class Stats:
    """What a set of calls moved, counted on this rank: bytes it sent, raw vs on the wire.

    The four counts are totals; ``by_op`` holds the same four per collective
    ("all_gather", "reduce_scatter", "all_to_all", "all_reduce": a compressed all-reduce
    counts as one all-reduce), and ``of(op)`` reads one (zeros for a collective not called):

    >>> s = Stats()
    >>> s.add(True, ExchangeStats(wire_bytes=70, raw_bytes=100), "all_gather")
    >>> s.add(False, ExchangeStats(wire_bytes=50, raw_bytes=50), "reduce_scatter")
    >>> s.calls, s.wire_bytes, s.of("all_gather").wire_bytes, s.of("reduce_scatter").compressed_calls
    (2, 120, 70, 0)
    >>> s.per_op()["all_gather"], s.of("all_to_all").calls
    ({'calls': 1, 'compressed_calls': 1, 'raw_bytes': 100, 'wire_bytes': 70}, 0)
    """

    calls: int = 0
    compressed_calls: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0
    by_op: dict[str, Stats] = field(default_factory=dict, repr=False)

    def add(self, compressed: bool, ex: ExchangeStats, op: str | None = None) -> None:
        self.calls += 1
        self.compressed_calls += int(compressed)
        self.raw_bytes += int(ex.raw_bytes)
        self.wire_bytes += int(ex.wire_bytes)
        if op is not None:
            self.by_op.setdefault(op, Stats()).add(compressed, ex)

    def of(self, op: str) -> Stats:
        """The counts of one collective (a new, empty ``Stats`` if it was never called)."""
        return self.by_op.get(op) or Stats()

    @property
    def ratio(self) -> float:
        """wire / raw bytes (1.0 when nothing was sent)."""
        return self.wire_bytes / self.raw_bytes if self.raw_bytes else 1.0

    def reset(self) -> None:
        self.calls = self.compressed_calls = self.raw_bytes = self.wire_bytes = 0
        self.by_op.clear()

    def as_dict(self) -> dict:
        """The four totals (``by_op`` left out: see ``per_op``)."""
        return {"calls": self.calls, "compressed_calls": self.compressed_calls,
                "raw_bytes": self.raw_bytes, "wire_bytes": self.wire_bytes}

    def per_op(self) -> dict[str, dict]:
        """``{collective: its four counts}`` for every collective called."""
        return {op: s.as_dict() for op, s in self.by_op.items()}
