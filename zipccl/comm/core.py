"""The core: the one path every front end's collective call takes.

A front end (a ``Front``: ``Communicator``, ``zipccl.torch.Collectives``) hands ``Core.call``
a plan key read cheaply from its arguments and a way to describe the call (the collective's
own file: a ``call.Call``). The core replays the plan kept under the key, or describes,
decides compressed or native once per signature (``Plan``), agrees across ranks as ``Link``
says, routes (engine, transport, slot channel), runs through the collective's file and
counts in its one ``Stats``. The front end answers only what is its own (``Front``'s hooks).
docs/ARCHITECTURE.md draws the path; ``agreement``'s docstring says what is agreed when.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace

import numpy as np

from .. import format as fmt
from . import all_gather, all_reduce, all_to_all, reduce_scatter
from .agreement import Agreement, describe, sig_hash
from .args import no_bf16_reduction, unowned
from .base import CollectiveError, ExchangeStats, chunk_elements
from .call import CODED_REDUCTIONS, Call, Route
from .host import HostEngine
from .plans import Plan, Plans
from .policy import NOT_CODED, Decision, Policy
from .stats import Stats
from .transport import stream_ptr

#: the collectives by name: each file fills the same interface (describe, run, bind)
COLLECTIVES = {m.OP: m for m in (all_gather, reduce_scatter, all_to_all, all_reduce)}
DEFAULT_CHUNK_BYTES = 64 << 20  # bytes per message per pipeline round (see experiments/README.md)
_UNSEEN = object()  # ``Core.call``'s plan when the front end has not looked it up


def chunk_of_bytes(chunk_bytes: int) -> int:
    """BF16 elements per pipeline round for ``chunk_bytes``, whole escape blocks (0: one round)."""
    if chunk_bytes < 0:
        raise ValueError(f"chunk_bytes must be >= 0, got {chunk_bytes}")
    return 0 if chunk_bytes == 0 else max(fmt.BLOCK, chunk_bytes // 2 // fmt.BLOCK * fmt.BLOCK)


@dataclass(eq=False)
class Link:
    """One group of ranks as the core sees it: its control-row agreement, how often to agree
    (``verify``: "first" per signature, or "always") and whether native calls on host memory
    agree their signature (``native_host``; torch's own collectives check their calls)."""

    agreement: Agreement
    verify: str = "first"
    native_host: bool = True


class Front:
    """A front end of the one path: its ``Core`` (``_core``), what every front end reads of it,
    and the hooks ``Core.call`` asks about one call (``ctx``: the front end's own value for the
    call, passed through: a stream, a group and tensor)."""

    _core: Core

    @property
    def policy(self) -> Policy:
        return self._core.policy

    @property
    def stats(self) -> Stats:
        """What this front end's calls moved, per collective (``comm.stats.Stats``)."""
        return self._core.stats

    @property
    def last_decision(self) -> Decision | None:
        """The policy's decision for the last call."""
        return self._core.last_decision

    @property
    def capacity(self):
        return self._core.capacity

    @property
    def chunk(self) -> int:
        """Elements per message per pipeline round of the compressed path (0: one round)."""
        return self._core.chunk

    def described(self, op: str, describe, ctx) -> Call:
        """The call ``describe()`` gives (the collective file's checks raise here)."""
        return describe()

    def link(self, call: Call, ctx) -> tuple[Link, int, Policy | None]:
        """(link, ranks, policy: None for the core's own) of ``call``; sets ``call.stream``."""
        raise NotImplementedError

    def where(self, call: Call, ctx):
        """(engine, transport) ``call`` runs on, set to its stream (set up at first use)."""
        raise NotImplementedError

    def capturing(self, call: Call, ctx) -> bool:
        """Whether the stream of ``call`` (on device memory) is being captured into a CUDA graph."""
        return False

    def graph(self, call: Call, ctx, record):
        """``record(stream)`` captured as a CUDA graph on a stream of the front end's own
        (``stream``: its raw handle; the call's own may be the legacy default stream, which
        cannot be captured), without waiting: a function that launches the graph on the
        stream of ``call``, or None where the front end cannot."""
        return None

    def spills(self, eng, ctx):
        """(key, maker) of the spill channel of compressed calls on ``eng``'s memory."""
        raise NotImplementedError


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
        # a kept compressed call over a transport that records into graphs is replayed as one
        self.graphs = os.environ.get("ZIPCCL_GRAPHS", "1") != "0"
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

    def close_channels(self, timeout: float | None = 60.0) -> None:
        """Close every slot channel (their spill threads, the captures' too) and forget them."""
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close(timeout=timeout)

    def route(self, call: Call, decision: Decision, eng, tr) -> Route:
        """Where ``call`` runs as ``decision`` says (its chunk for the type; loopback on one rank)."""
        return Route(eng, tr, None, call.stream, chunk_elements(self.chunk, _itemsize(call)),
                     loopback=decision.loopback and tr.size == 1)

    # -- the one path ---------------------------------------------------------------------------
    def call(self, front: Front, op: str, key, describe, ctx=None, extra: Stats | None = None, *,
             native=None, decided: Decision | None = None, agreed: bool = False, settle=None,
             plan=_UNSEEN):
        """One collective call of ``front``: replayed from the plan kept under ``key`` (a
        compressed call's kept call and route, the memory its key names being the caller's and
        alive; an agreed native call's bound transport call), or described
        (``front.described``), planned, agreed, routed, run and counted.

        ``native``: the front end's own uncompressed call (torch's function), run in place of
        the collective file's native path; ``decided``: a decision the front end made alike on
        every rank (``agreed``: and agreed the call itself); ``settle(nbytes)``: the maximum of
        ``nbytes`` over ranks, for per-peer counts under "auto" (``settled``). ``extra``: one
        more ``Stats`` to count the call in; ``plan``: what the front end found kept under
        ``key`` (None: nothing), where it looked already. A compressed call with a key and equal
        blocks is kept in its plan and replayed. Returns what ``native`` returned, else None.
        """
        if plan is _UNSEEN:
            plan = self.plans.get(key) if key is not None else None
        if plan is not None and plan.call is not None:  # compressed, kept: its call and route
            self.kept(front, plan, ctx, extra)
            return None
        if plan is not None and plan.run is not None:  # native, agreed: the bound transport call
            plan.run()
            self.last_decision = plan.decision
            self.count(op, False, plan.stats, extra)
            return None
        call = front.described(op, describe, ctx)
        link, world, policy = front.link(call, ctx)
        if settle is not None:
            decided = self.settled(call, link, world, policy, settle)
        if decided is None:
            plan = self.plan(key, call, link, world, policy)
        else:
            sig = call.sig(link.agreement.settings)
            plan = Plan(sig, sig_hash(sig), decided, bool(call.code is not None and decided.compress))
            self.last_decision = decided
        if plan.compress and call.device and front.capturing(call, ctx):
            # agreed and set up by a call before the capture, or refused
            eng, tr = front.where(call, ctx)
            route = self.route(call, plan.decision, eng, tr)
            route = self.captured(call, plan, link, route, self._channels.get(front.spills(eng, ctx)[0]))
            route.channel.parent.raw = plan.decision.raw
            self.run(call, route, True, extra)
            return None
        if not agreed and (plan.compress or call.device or key is None or link.native_host):
            self.agree(plan, link, call.device)
        if native is not None and not plan.compress:
            work = native()
            raw = native_bytes(call, world)
            self.count(op, False, ExchangeStats(raw, raw), extra)
            return work
        eng, tr = front.where(call, ctx)
        route = self.route(call, plan.decision, eng, tr)
        if plan.compress:
            route.channel = self.channel(*front.spills(eng, ctx), plan.decision)
            self.run(call, route, True, extra)
            if key is not None and decided is None and not call.uneven:
                _keep(plan, call, route, link)
            return None
        if call.send.bf16 and call.code is None and not tr.own_reduction:
            # the same on every rank: the signature is agreed and the transport is every rank's
            raise CollectiveError(f"zipccl {op}: {no_bf16_reduction(call.reduce, tr.name)}")
        bound = COLLECTIVES[op].bind(call, route)
        st = self.run(call, route, False, extra)
        if plan.stats is None:
            plan.stats = st
        self.plans.bind(key, plan, bound,
                        agreed=link.verify == "first" and plan.sig in link.agreement.agreed)
        return None

    def kept(self, front: Front, plan: Plan, ctx, extra: Stats | None = None) -> None:
        """The kept compressed call of ``plan``: inside a capture on its stream, recorded into
        it (``captured``); else agreed where due, then launched as its graph where it has one
        (``launch_graph``), or recorded as one at its second call on a device (``replay``), or run."""
        call, route = plan.call, plan.route
        device = call.send.device
        self.last_decision = plan.decision
        if device and front.capturing(call, ctx):
            route = self.captured(call, plan, plan.link, route, route.channel)
        else:
            link = plan.link  # ``agree``'s condition, inline: a kept call is compressed
            if plan.sig not in link.agreement.agreed or link.verify == "always" or not device:
                self.agree(plan, link, device)
            if device and plan.graph and self.launch_graph(plan, extra):
                return
        plan.route.channel.raw = plan.decision.raw  # the channel is shared between plans
        if device:
            front.where(call, ctx)  # the engine on the call's stream
            if plan.graph is None and route is plan.route:
                self.replay(front, plan, ctx, extra)
                return
            # else: not a graph, or its feed is full this time: the call as it is
        self.run(call, route, True, extra)

    def launch_graph(self, plan: Plan, extra: Stats | None = None) -> bool:
        """Launch the graph of ``plan`` (``exchange.SlotChannel.launch_graph``); False where the
        call must run as it is this time: its feed is full, or the capacity rule resized a slot
        (the graph is then retired, launches in flight keep it, and the call recorded again)."""
        launch, sites, uniform, st, _ = plan.graph
        why = plan.route.channel.launch_graph(plan.call.op, uniform, sites, launch)
        if why is None:
            self.count(plan.call.op, True, st, extra)
            return True
        if why == "resized":
            plan.retired.append(plan.graph)
            plan.graph = None
        return False

    def native_call(self, op: str, nbytes: int, why: str, run, extra: Stats | None = None):
        """A call zipccl does not code (``refusal``'s NATIVE ``why``): the front end's own
        ``run()``, decided native and counted."""
        self.last_decision = Decision(op, nbytes, False, why)
        work = run()
        self.count(op, False, ExchangeStats(nbytes, nbytes), extra)
        return work

    # -- deciding and agreeing, once per signature ------------------------------------------------
    def decide(self, call: Call, world: int, policy: Policy | None = None) -> Decision:
        """Compressed or native for ``call`` (``force`` first: calibration's forced BF16 calls)."""
        if self.force is not None and call.send.bf16 and world > 1:
            d = Decision(call.op, call.nbytes, self.force, "calibration")
        elif (why := not_coded(call.send.code is not None, call.reduce)) is not None:
            d = Decision(call.op, call.nbytes, False, why)
        else:
            d = (policy or self.policy).decide(call.op, call.nbytes, dtype=call.send.dtype,
                                               device=call.device, world=world)
        self.last_decision = d
        return d

    def settled(self, call: Call, link: Link, world: int, policy: Policy | None, largest) -> Decision:
        """The decision of a per-peer-count call, the same on every rank although the counts
        differ: the first such call of a link and type decides on the largest size over its
        ranks (``largest(nbytes)``: one small all-reduce), and that decision holds from then on."""
        ag = link.agreement
        sig = call.sig(ag.settings)
        d = ag.decisions.get(sig)
        if d is None:
            call.nbytes = largest(call.nbytes)
            d = self.decide(call, world, policy)
            ag.keep_decision(sig, d)
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

    def captured(self, call: Call, plan: Plan, link: Link, route: Route, channel) -> Route:
        """``route`` for ``call`` inside the CUDA graph capture on its stream: its slot
        ``channel``'s sites of that capture (``exchange.CapturedChannel``). Refused with
        CollectiveError, before anything is enqueued and alike on every rank that captures,
        where a replay could not run it: a transport that cannot be captured, FP16 (its
        codebook comes from a host-side sample), or a signature not agreed and set up by a
        call outside the capture (the agreement and the first buffers wait for the device)."""
        why = None
        if not getattr(route.tr, "capturable", False):
            why = (f"the {route.tr.name} transport cannot be captured (only NCCL records into "
                   f"a CUDA graph)")
        elif call.send.code == fmt.DTYPE_FP16:
            why = "an FP16 call's codebook comes from a host-side sample, which a replay cannot renew"
        elif channel is None or plan.sig not in link.agreement.agreed or link.verify != "first":
            why = ("its signature must be agreed and its buffers made by a call outside the "
                   "capture first (run the step once before capturing it, as CUDA graphs ask), "
                   "with verify='first'")
        if why is not None:
            raise CollectiveError(f"zipccl {call.op}: a compressed call cannot be captured here: "
                                  f"{why}; or call it with policy='never' inside the capture")
        from ..kernels.launch import capture_id  # numba.cuda: device calls only

        return replace(route, channel=channel.captured(capture_id(stream_ptr(call.stream))))

    def replay(self, front: Front, plan: Plan, ctx, extra: Stats | None = None) -> None:
        """Record the kept call of ``plan`` as a CUDA graph and launch it (where graphs are on,
        the transport records into them, the type is not FP16, whose codebook comes from a
        host-side sample, and the front end can capture; else run it and never try again),
        recorded on a capture stream of the front end's own and launched on the call's stream
        (the legacy default stream too): its rounds' spills fed by the host at every launch
        (``exchange.RecordingChannel``), its slot sizes those of this call, its bytes counted at
        every launch."""
        call, route = plan.call, plan.route
        plan.graph = False  # also when the capture fails: this plan then runs as it is
        if not (self.graphs and getattr(route.tr, "capturable", False)) or call.send.code == fmt.DTYPE_FP16:
            self.run(call, route, True, extra)
            return
        from .exchange import RecordingChannel

        rec = replace(route, channel=RecordingChannel(route.channel))
        got = []

        def record(stream) -> None:  # the call's work on the capture stream, then its own again
            route.eng.set_stream(stream)
            try:
                got.append(COLLECTIVES[call.op].run(call, replace(rec, stream=stream), True))
            finally:
                route.eng.set_stream(call.stream)

        try:
            launch = front.graph(call, ctx, record)
        except Exception as e:  # noqa: BLE001 -- nothing of it ran: the call runs as it is
            warnings.warn(f"zipccl {call.op}: recording the call as a CUDA graph failed ({e}); "
                          f"it runs without one", RuntimeWarning, stacklevel=4)
            launch = None
        if launch is None:
            self.run(call, route, True, extra)
            return
        # the graph holds the engine's buffers it reads and writes: an engine that outgrows one
        # drops it, and the graph must keep it
        plan.graph = (launch, tuple(rec.channel.begun), rec.channel.uniform, got[0], route.eng.held())
        if route.channel.launch_graph(call.op, rec.channel.uniform, plan.graph[1], launch) is not None:
            plan.graph = False  # (cannot be: this call sized the slots, its feed is empty)
            self.run(call, route, True, extra)
            return
        self.count(call.op, True, got[0], extra)

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


NATIVE, INVALID = "native", "invalid"  # why zipccl does not take a call (``refusal``)
CODED_TYPES = frozenset(fmt.DTYPE_NAMES.values())  # the types zipccl codes, by name


def refusal(op: str, p: int, dtypes, reduce: str | None, send_n: int, recv_n: int,
            send_counts=None, recv_counts=None, *, problem: str | None = None):
    """Whether zipccl takes a call of ``op`` on ``p`` ranks: None where it does, else
    (NATIVE, why): a type or reduction zipccl does not code (``dtypes``: every argument's type
    name; ``reduce``: the reduction's name), for the transport's own collective unchanged; or
    (INVALID, why): arguments that form no such call (``send_n`` / ``recv_n`` elements, the
    per-peer counts where given; ``problem``: what the front end found wrong translating its
    arguments: several devices, a layout, split sizes). The one decision of the
    front ends that may hand a call elsewhere: ``zipccl.torch`` (NATIVE: torch's own function;
    INVALID: the collective's ``describe`` raises) and the torch backend (either: the inner group).

    >>> refusal("all_gather", 2, ["bfloat16", "bfloat16"], None, 4, 8) is None
    True
    >>> refusal("reduce_scatter", 2, ["bfloat16", "bfloat16"], "max", 8, 4)[0]
    'native'
    """
    first = dtypes[0]
    why = not_coded(first in CODED_TYPES and dtypes.count(first) == len(dtypes), reduce)
    if why is not None:
        return NATIVE, why
    if problem is not None:
        return INVALID, problem
    why = COLLECTIVES[op].mismatch(p, send_n, recv_n, send_counts, recv_counts)
    return None if why is None else (INVALID, why)


def not_coded(coded: bool, reduce: str | None) -> str | None:
    """Why a call stays native, where zipccl does not code it (``coded``: its type is one zipccl
    codes; ``reduce``: its reduction's name, None for none), else None: the one decision of
    ``refusal`` (front ends that may hand a call elsewhere) and ``Core.decide`` (the core)."""
    if not coded:
        return NOT_CODED
    if reduce is not None and reduce not in CODED_REDUCTIONS:
        return own_reduction(reduce)
    return None


def own_reduction(reduce: str) -> str:
    """Why a call with reduction ``reduce`` stays native."""
    return f"op={reduce!r}: zipccl computes sum and avg; {reduce} is the transport's own"


def native_bytes(call: Call, p: int) -> int:
    """Bytes this rank sends in the native form of ``call`` on ``p`` ranks."""
    if call.op == "all_reduce":
        return 2 * call.send.nbytes * (p - 1) // max(p, 1)
    return call.send.data.itemsize * (sum(call.send_counts) - call.send_counts[call.rank])


def _keep(plan: Plan, call: Call, route: Route, link: Link) -> None:
    """Keep a compressed call in its plan for replay, over its memory without its owners."""
    send = unowned(call.send)
    call.recv = send if call.recv is call.send else unowned(call.recv)
    call.send = send
    plan.call, plan.route, plan.link = call, route, link


def _itemsize(call: Call) -> int:
    return int(np.dtype(call.send.data.dtype).itemsize)
