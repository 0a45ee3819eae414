"""Plans: what the core decides once per call signature and replays afterwards.

A *plan* holds a call signature (``agreement``'s module docstring, 2.), its 64-bit hash
(the one the control row carries), the policy's decision and what replays it: for an agreed
native call with ``verify="first"``, the transport call with its arguments packed (``run``);
for a compressed call, its described call and route. Then the call's lookup by its key (the
arrays' identity and the stream, read by the front end) is the whole call. Plans are local:
dropping them costs re-planning only, never a different exchange, so ``Plans`` simply drops
all of them at ``MAX_PLANS`` (and a front end drops them whenever its settings change or its
agreed signatures are forgotten).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .base import ExchangeStats
from .policy import Decision

MAX_PLANS = 256  # plans kept per communicator; then all are dropped (local: costs re-planning only)


@dataclass(eq=False)
class Plan:
    """What one call signature needs, decided once: the agreed hash, the decision, the bound call."""

    sig: tuple  # what every rank must share (see the agreement module's docstring)
    crc: int  # its 64-bit hash, the one carried in the control row
    decision: Decision
    compress: bool  # the compressed exchange (else the native collective)
    run: Callable[[], None] | None = None  # a native call with its arguments packed: the whole call
    stats: ExchangeStats | None = None  # bytes a native call moves
    call: object = None  # a compressed call kept for replay (``call.Call``), its route and link
    route: object = None
    link: object = None
    # the kept call recorded as a CUDA graph: (launch, its sites, uniform, its ExchangeStats,
    # the buffers it holds); False where it cannot be (``Core.replay``)
    graph: object = None
    retired: list = field(default_factory=list)  # earlier graphs, kept for launches in flight


class Plans(dict):
    """Plan key -> ``Plan`` (a dict, so that the steady-state lookup is one ``get``).

    >>> plans = Plans()
    >>> d = Decision("all_reduce", 16, False, "")
    >>> p = Plan(("all_reduce", "float32", False, 4, "sum", ""), 1, d, False)
    >>> plans.add("key", p)
    >>> plans.bind("key", p, lambda: None, agreed=True)
    >>> plans.get("key").run is not None
    True
    """

    def add(self, key, plan: Plan) -> None:
        """Keep ``plan`` under ``key`` (None: arguments that have no key, nothing kept)."""
        if key is not None:
            if len(self) >= MAX_PLANS:
                self.clear()
            self[key] = plan

    def bind(self, key, plan: Plan, run: Callable[[], None] | None, *, agreed: bool) -> None:
        """Keep a native plan's bound call ``run`` for the next calls, where it may replace them:
        ``agreed`` (its signature is agreed and ``verify="first"``) and ``plan`` is the one
        kept under ``key``."""
        if key is not None and run is not None and agreed and self.get(key) is plan:
            plan.run = run
