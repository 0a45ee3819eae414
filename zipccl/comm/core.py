"""The core: the one path every front end's collective call takes.

A front end turns its arguments into a ``call.Call`` (through the collective's own file) and a
``call.Route``; the core decides compressed or native once per call signature (``Plan``), agrees
on it across ranks as ``Link`` says, runs it through the collective's file and counts it in its
one ``Stats``. ``Communicator`` and ``zipccl.torch.Collectives`` each hold one ``Core``.
docs/ARCHITECTURE.md draws the path; ``agreement``'s docstring says what is agreed when.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import format as fmt
from . import all_gather, all_reduce, all_to_all, reduce_scatter
from .agreement import Agreement, describe, sig_hash
from .base import ExchangeStats, chunk_elements
from .call import Call, Route
from .host import HostEngine
from .plans import Plan, Plans
from .policy import Decision, Policy
from .stats import Stats

#: the collectives by name: each file fills the same interface (describe, run, bind)
COLLECTIVES = {m.OP: m for m in (all_gather, reduce_scatter, all_to_all, all_reduce)}
DEFAULT_CHUNK_BYTES = 64 << 20  # bytes per message per pipeline round (see experiments/README.md)


def chunk_of_bytes(chunk_bytes: int) -> int:
    """BF16 elements per pipeline round for ``chunk_bytes``, whole escape blocks (0: one round)."""
    if chunk_bytes < 0:
        raise ValueError(f"chunk_bytes must be >= 0, got {chunk_bytes}")
    return 0 if chunk_bytes == 0 else max(fmt.BLOCK, chunk_bytes // 2 // fmt.BLOCK * fmt.BLOCK)


@dataclass(eq=False)
class Link:
    """One group of ranks as the core sees it: its control-row agreement and how often to agree
    (``verify``: "first" per signature, or "always")."""

    agreement: Agreement
    verify: str = "first"


class Core:
    """Settings, engines, plans and ``Stats`` of one front end; ``run`` is the call path."""

    def __init__(self, policy: Policy, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 checksum: bool = False, capacity=None):
        from .capacity import as_config

        self.policy = policy
        self.chunk = chunk_of_bytes(int(chunk_bytes))  # BF16 elements per round
        self.checksum = bool(checksum)
        self.capacity = as_config(capacity)
        self.force: bool | None = None  # calibration: compressed / native whatever the policy says
        self.stats = Stats()
        self.plans = Plans()
        self.last_decision: Decision | None = None
        self.last_stats: ExchangeStats | None = None
        self._host: HostEngine | None = None
        self._device: dict[int, object] = {}
        self._channels: dict = {}

    # -- where a call runs ---------------------------------------------------------------------
    def engine(self, device: bool, stream=None, index: int = 0):
        """The host engine, or the device engine of GPU ``index`` set to ``stream``."""
        if not device:
            if self._host is None:
                self._host = HostEngine(checksum=self.checksum)
            return self._host
        eng = self._device.get(index)
        if eng is None:
            from .pipeline import DeviceEngine

            eng = self._device[index] = DeviceEngine(checksum=self.checksum)
        eng.set_stream(stream)
        return eng

    def channel(self, key, spills, decision: Decision):
        """The slot channel of compressed calls under ``key`` (made at the first one, which every
        rank makes at the same point; ``spills()`` makes its spill channel)."""
        ch = self._channels.get(key)
        if ch is None:
            from .capacity import CapacityRule
            from .exchange import SlotChannel

            ch = self._channels[key] = SlotChannel(spills(), CapacityRule(self.capacity))
        ch.raw = decision.raw  # policy "raw": this call's frames go RAW
        return ch

    def channels(self) -> dict:
        return self._channels

    def close_channels(self, timeout: float | None = None) -> None:
        """Close every slot channel (their spill threads) and forget them."""
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            if timeout is None:
                ch.close()
            else:
                ch.spills.close(timeout=timeout)

    def route(self, call: Call, decision: Decision, eng, tr, channel=None) -> Route:
        """Where ``call`` runs as ``decision`` says (its chunk for the type; loopback on one rank)."""
        return Route(eng, tr, channel, call.stream, chunk_elements(self.chunk, _itemsize(call)),
                     loopback=decision.loopback and tr.size == 1)

    # -- deciding and agreeing, once per signature ------------------------------------------------
    def decide(self, call: Call, world: int, policy: Policy | None = None) -> Decision:
        """Compressed or native for ``call`` (``force`` first: calibration's forced BF16 calls)."""
        if self.force is not None and call.send.bf16 and world > 1:
            d = Decision(call.op, call.nbytes, self.force, "calibration")
        elif call.code is None and call.send.code is not None:  # a coded type, another reduction
            d = Decision(call.op, call.nbytes, False, f"op={call.reduce!r}: zipccl computes sum and "
                                                      f"avg; {call.reduce} is the transport's own")
        else:
            dtype = call.send.dtype if call.code is not None else None
            d = (policy or self.policy).decide(call.op, call.nbytes, dtype=dtype,
                                               device=call.device, world=world)
        self.last_decision = d
        return d

    def plan(self, key, call: Call, link: Link, world: int, policy: Policy | None = None) -> Plan:
        """The plan of ``call``'s signature: found under ``key`` or decided now and kept."""
        plan = self.plans.get(key) if key is not None else None
        if plan is not None:
            self.last_decision = plan.decision
            return plan
        sig = call.sig(link.agreement.settings)
        d = self.decide(call, world, policy)
        plan = Plan(sig, sig_hash(sig), d, bool(call.code is not None and d.compress))
        self.plans.add(key, plan)
        return plan

    def agree(self, plan: Plan, link: Link, device: bool) -> None:
        """The control row for ``plan``'s signature where due: the first time it is seen, every
        call with ``verify="always"``, and every compressed call on host memory (whose exchange
        blocks anyway)."""
        ag = link.agreement
        if plan.sig not in ag.agreed or link.verify == "always" or (plan.compress and not device):
            ag.control(plan.sig[0], plan.crc, None, describe=describe(plan.sig))
            if ag.remember(plan.sig):  # all agreed signatures forgotten: their plans too
                self.plans.clear()

    # -- running and counting -------------------------------------------------------------------
    def run(self, call: Call, route: Route, compress: bool, extra: Stats | None = None) -> ExchangeStats:
        """Run ``call`` through its collective's file and count it."""
        st = COLLECTIVES[call.op].run(call, route, compress)
        self.count(call.op, compress, st, extra)
        return st

    def count(self, op: str, compress: bool, st: ExchangeStats, extra: Stats | None = None) -> None:
        self.stats.add(compress, st, op)
        if extra is not None:
            extra.add(compress, st, op)
        self.last_stats = st


def _itemsize(call: Call) -> int:
    return int(np.dtype(call.send.data.dtype).itemsize)
