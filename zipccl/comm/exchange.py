"""The slot exchange: the one compressed all-to-all of frames that never waits on the host.

Every compressed collective moves its messages through ``slot_exchange``, in rounds of ``chunk``
elements: each piece is encoded into a region (``engine.encode_slot``), a kernel writes the slot
headers and spills the tail of a frame longer than its slot (``Spills.launch_out``), one
transfer per round moves fixed-size slots whose byte count every rank computes alike, a kernel
checks the received headers and waits for spilled tails (``Spills.launch_in``), and the
receiver decodes from the slots (then reduces, ``on_chunk``). On a device engine round k's
transfer overlaps round k+1's encode and round k-1's decode, ordered by events only; errors
land in the channel's sticky error word, raised at the next call. ``channel.raw`` (policy "raw")
sends RAW frames through the same rounds. docs/COLLECTIVES.md, "The slot exchange", says more.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from .. import format as fmt
from ..arrays import address
from ..codec.gpu_workspace import Workspace
from ..format import errors
from ..format import slot as slots
from .base import CollectiveError, ExchangeStats, chunk_count, piece, value_code
from .capacity import CapacityRule, escape_room
from .engine import Engine


def slot_exchange(eng: Engine, tr, channel, send, sends: Sequence[tuple[int, int]], recv,
                  recvs: Sequence[tuple[int, int]], *, op: str, uniform: bool = False,
                  chunk: int = 0, max_count: int | None = None, shared: bool = False,
                  stream=None, on_chunk: Callable[[int, int], None] | None = None,
                  loopback: bool = False) -> ExchangeStats:
    """All-to-all of ``send``'s messages as slots (see the module docstring).

    Peer j's outgoing message is ``send[o:o+c]`` for ``(o, c) = sends[j]``; its incoming
    one lands in ``recv[o:o+c]`` for ``(o, c) = recvs[j]``; with ``shared`` every peer gets
    the same message (an all-gather). The message to self is copied, never coded.
    ``max_count``: with ``chunk`` > 0, the largest message between two ranks anywhere (all
    ranks pass the same; it fixes the number of rounds); with ``chunk`` = 0 (one round) this
    rank's largest is enough. ``loopback`` (one rank only): the message to self goes through
    a slot like a peer's (``Policy.loopback``). Returns this rank's byte counts (slots; spilled
    tails are counted by ``spills``).
    """
    p, me = tr.size, tr.rank
    code = value_code(send)
    isz = fmt.ITEMSIZE[code]
    stats = ExchangeStats()
    channel.check(op)
    channel.site(op, uniform)
    capacity = channel.capacity
    loop = loopback and p == 1
    if max_count is None:
        max_count = max([c for j, (_, c) in enumerate(sends) if j != me or loop]
                        + [c for j, (_, c) in enumerate(recvs) if j != me or loop] + [0])
    if chunk > 0:  # every rank passes the same max_count: the same rounds everywhere
        step, rounds = chunk, chunk_count(max_count, chunk)
    else:  # one round, also when this rank moves nothing (its peers still meet it there)
        step, rounds = max(max_count, 1), 1
    rounds = rounds if p > 1 or loop else 0

    o, c = recvs[me]
    if c and not loop:
        so, sc = sends[me]
        if sc != c:
            raise ValueError(f"rank {me} sends itself {sc} elements but expects {c}")
        if address(recv[o:o + c]) != address(send[so:so + sc]):  # in place: already there
            eng.copy(recv[o:o + c], send[so:so + sc])
    if p == 1 and not loop:
        if on_chunk is not None and c:
            on_chunk(0, c)
        return stats

    plan = _plan(p, -1 if loop else me, tuple(map(tuple, sends)), tuple(map(tuple, recvs)), shared,
                 step, rounds, code)
    sbuf = eng.workspace("slot_send", plan.s_total)
    rbuf = eng.workspace("slot_recv", plan.r_total)
    s_base, r_base = address(sbuf), address(rbuf)
    slot_of: dict[int, int] = {}  # this call's slot bytes by element count (the capacity rule)

    def slot(n: int) -> int:
        got = slot_of.get(n)
        if got is None:
            got = slot_of[n] = slots.slot_bytes(n, code, capacity(n, code))
        return got

    eng.pipeline_begin(rounds, p)
    seqs: list[int] = []
    failed = None

    def encode_round(k: int) -> None:
        for src, n, at, region in plan.encodes[k]:
            eng.encode_slot(send[src:src + n], sbuf[at:at + region], raw=channel.raw)
        out = [(j, s_base + at, slot(n), region, n) for j, at, region, n in plan.sends[k]]
        inn = [(j, r_base + at, slot(n), region, n) for j, at, region, n in plan.recvs[k]]
        seq = channel.begin(op, code, out, inn)
        channel.launch_out(seq, eng.encode_stream())
        seqs.append(seq)
        eng.encoded(k)

    encode_round(0)
    for k in range(rounds):
        s_len, s_dsp, r_len, r_dsp = [0] * p, [0] * p, [0] * p, [0] * p
        for j, at, _, n in plan.sends[k]:
            s_len[j], s_dsp[j] = slot(n), at
        for j, at, _, n in plan.recvs[k]:
            r_len[j], r_dsp[j] = slot(n), at
        if shared and uniform and plan.sends[k] and not loop:  # one slot, every peer, one size
            _, at, _, n = plan.sends[k][0]
            tr.alltoallv_shared(sbuf, slot(n), at, rbuf, r_len, r_dsp, eng.transfer_stream(k))
        else:
            tr.alltoallv(sbuf, s_len, s_dsp, rbuf, r_len, r_dsp, eng.transfer_stream(k))
        stats.wire_bytes += sum(s_len)
        stats.raw_bytes += plan.raw_bytes[k] * isz
        eng.received(k)
        if k + 1 < rounds:
            encode_round(k + 1)  # on the caller's stream while round k is on the wire
        channel.launch_in(seqs[k], eng.decode_stream(k))
        for at, end, lo, n, j in plan.decodes[k]:
            e = eng.decode_frame(rbuf[at + slots.SLOT_HEADER:end], recv[lo:lo + n], k)
            if e and failed is None:  # the host reports at once; the device into the error word
                failed = f"frame from rank {j}: {e}"
        lo, hi = plan.columns[k]
        if on_chunk is not None and hi > lo:
            on_chunk(lo, hi)
    eng.pipeline_finish(channel.record_error)
    if not eng.device:  # a host call has finished: what it found raises now
        channel.finished(op, failed)
    return stats


@lru_cache(maxsize=4096)
def raw_header(n: int, code: int = fmt.DTYPE_BF16):
    """The frame header of a RAW frame of ``n`` values of type ``code`` (no checksum): a
    function of n and the type alone, so the raw exchange writes it without reading the data.

    >>> fmt.parse_header(raw_header(4), buffer_len=fmt.HEADER_SIZE + 8).raw
    True
    """
    lay = fmt.Layout.for_count(int(n), code)
    return fmt.pack_header(fmt.Header(n=int(n), n_escapes=0, frame_len=lay.raw_size, flags=fmt.FLAG_RAW,
                                      codebook=tuple(range(fmt.CODEBOOK_SIZE)), shape=(int(n),),
                                      dtype=code))


@dataclass(frozen=True)
class _Plan:
    """Where every round's frames go: a pure function of the element counts (cached)."""

    s_total: int  # bytes of the send regions of all rounds
    r_total: int
    encodes: tuple  # per round: (first element in send, n, region offset, region bytes)
    sends: tuple  # per round: (peer, region offset, region bytes, n) of the frames sent
    recvs: tuple  # per round: the same for the frames received
    decodes: tuple  # per round: (region offset, region end, first element in recv, n, peer)
    raw_bytes: tuple  # per round: elements sent to the peers
    columns: tuple  # per round: (lo, hi) element range its decodes cover (reductions)


@lru_cache(maxsize=256)
def _plan(p: int, me: int, sends: tuple, recvs: tuple, shared: bool, step: int, rounds: int,
          code: int) -> _Plan:
    """The slot exchange's layout: one region per frame of every round, at offsets fixed by the
    element counts alone (every round has its own, so no round waits for another one's
    transfer or decode); an all-gather encodes one region per round for every peer."""
    encodes, out, inn, decodes, raw, columns = [], [], [], [], [], []
    s_at = r_at = 0
    for k in range(rounds):
        enc, snd, rcv, dec = [], [], [], []
        if shared:
            lo, n = piece(sends[me][1], step, k)
            region = slots.region_bytes(n, code)
            if n:
                enc.append((sends[me][0] + lo, n, s_at, region))
                snd = [(j, s_at, region, n) for j in range(p) if j != me]
            s_at += region
        else:
            for j, (o, c) in enumerate(sends):
                lo, n = piece(c, step, k)
                if j != me and n:
                    region = slots.region_bytes(n, code)
                    enc.append((o + lo, n, s_at, region))
                    snd.append((j, s_at, region, n))
                    s_at += region
        lo_k = hi_k = k * step
        for j, (o, c) in enumerate(recvs):
            plo, n = piece(c, step, k)
            hi_k = max(hi_k, plo + n)
            if j != me and n:
                region = slots.region_bytes(n, code)
                rcv.append((j, r_at, region, n))
                dec.append((r_at, r_at + region, o + plo, n, j))
                r_at += region
        encodes.append(tuple(enc))
        out.append(tuple(snd))
        inn.append(tuple(rcv))
        decodes.append(tuple(dec))
        raw.append(sum(n for _, _, _, n in snd))
        columns.append((lo_k, hi_k))
    return _Plan(s_at, r_at, tuple(encodes), tuple(out), tuple(inn), tuple(decodes), tuple(raw),
                 tuple(columns))


class SlotChannel:
    """A communicator's slot machinery: the call numbering, the spill path (``spill.Spills``),
    the sticky error word and the capacity rule (``capacity.CapacityRule``).

    Every rank numbers its compressed rounds alike (the same calls in the same order, as NCCL
    requires), so ``seq`` names the same round everywhere. The capacity of a round's slots
    follows its call site (op, element count, type): the rule observes, for each earlier
    round of uniform frames (all-gather, reduce-scatter, equal all-to-all), the largest escape
    count over every rank's frames, which every rank learns alike from the slot headers it
    received (``Spills.observed``). A round's observation is used ``lag`` rounds later, when
    its device work has long finished; only a host that runs more than ``lag`` rounds ahead of
    its device waits for it (``capacity_waits`` counts those waits).

    ``raw`` (set by the caller from the call's ``Decision.raw`` before the exchange): the
    round's frames are RAW and every slot holds a whole RAW frame (``escape_room``), so
    nothing spills.
    """

    def __init__(self, spills, rule=None, *, lag: int = 256):
        self.spills = spills
        self.rule = CapacityRule() if rule is None else rule
        self.lag = int(lag)
        self.seq = 0
        self.capacity_waits = 0
        self.failed: str | None = None
        self._pending: deque = deque()  # (seq, site, n, code) of rounds to observe
        self._site = None
        self.raw = False
        self._captures: dict[int, CapturedChannel] = {}  # by CUDA graph capture id

    def captured(self, capture: int) -> CapturedChannel:
        """This channel's calls inside the CUDA graph capture ``capture`` (made at its first
        compressed call, which every rank makes at the same point of the same capture)."""
        got = self._captures.get(capture)
        if got is None:
            from .spill_sites import Sites

            got = self._captures[capture] = CapturedChannel(
                self, Sites(self.spills, self.spills.channel.twin()))
        return got

    def check(self, op: str) -> None:
        """Raise the sticky error of an earlier call (a read of mapped memory, no wait)."""
        if self.failed is not None:
            raise CollectiveError(f"zipccl {op}: this communicator failed earlier: {self.failed}")
        text = self.error_text()
        if text:
            where = " on the device" if self.spills.device else ""
            raise CollectiveError(f"zipccl {op}: an earlier compressed call on this communicator "
                                  f"failed{where}: {text}")

    def error_text(self) -> str | None:
        """The sticky error word in words, or None (a read of mapped memory, no wait)."""
        bits = int(self.spills.error())
        if not bits:
            return None  # every call's path: one read of mapped memory, nothing else
        words = [text for bit, text in errors.SLOT_ERRORS.items() if bits & bit]
        if bits & 0xFFFF:
            words.insert(0, f"corrupted zipccl frame: {Workspace.describe(bits & 0xFFFF)}")
        return f"{'; '.join(words)} (error word 0x{bits:08x})"

    def finished(self, op: str, failed: str | None) -> None:
        """After a host call (whose steps have all run): raise what it found, a frame that
        did not decode (``failed``, which also goes into the error word, so that every slot
        header this rank sends from now on reports it to its peers) or a received slot
        header that did not match the call."""
        if failed is not None:
            self.spills.report(errors.ERR_HOST_DECODE)
            raise CollectiveError(f"zipccl {op}: {failed}")
        text = self.error_text()
        if text:
            raise CollectiveError(f"zipccl {op}: {text}")

    def fail(self, message: str) -> None:
        """Mark the channel failed (every rank agreed on it): every later call raises."""
        self.failed = message

    def capacity(self, n: int, code: int) -> int:
        """Escape bytes reserved in each slot of ``n`` values of the round being planned."""
        if self.raw:
            return escape_room(n, code)
        return self.rule.capacity(self._site + (n, code), n, code)

    def site(self, op: str, uniform: bool) -> None:
        """Name the call whose rounds come next: ``uniform`` = every frame of a round has
        the same element count on every rank (its observations are the same everywhere)."""
        self._site = (op, uniform)

    def begin(self, op: str, code: int, out, inn) -> int:
        """Number the next round and hand its frames, (peer, region address, slot bytes,
        region bytes, n), to the spill path; returns its sequence number."""
        if self._pending and self._pending[0][0] <= self.seq + 1 - self.lag:
            self._observe_until(self.seq + 1 - self.lag)
        self.seq += 1
        observe = bool(self._site is not None and self._site[1] and out and inn)
        self.spills.begin(self.seq, op, code, out, inn, observe=observe)
        if observe:
            n = out[0][4]
            self._pending.append((self.seq, self._site + (n, code), n, code))
        return self.seq

    def _observe_until(self, last: int) -> None:
        while self._pending and self._pending[0][0] <= last:
            seq, site, n, code = self._pending.popleft()
            got = self.spills.observed(seq)
            if got is None:
                self.capacity_waits += 1
                delay = 1e-5
                while got is None:  # the device is more than `lag` rounds behind this host
                    time.sleep(delay)
                    delay = min(2 * delay, 1e-3)
                    got = self.spills.observed(seq)
            self.rule.observe(site, n, code, int(got))

    def launch_out(self, seq: int, stream) -> None:
        self.spills.launch_out(seq, stream)

    def launch_in(self, seq: int, stream) -> None:
        self.spills.launch_in(seq, stream)

    def record_error(self, stream, ws) -> None:
        # kernels._common imports numba.cuda: loaded by the device engine's first call only.
        from ..kernels._common import WS_ERR_STICKY

        base = int(getattr(ws, "ptr", 0) or 0) or address(ws.array)
        self.spills.record_error(stream, base + 8 * WS_ERR_STICKY)

    def launch_graph(self, op: str, uniform: bool, sites, launch) -> str | None:
        """One launch of zipccl's own graph of a call (``RecordingChannel``): each of its
        rounds ``sites`` numbered and given a call block as an eager round is (``begin``), fed
        to the graph, then ``launch()``: None. With nothing done: "resized" where the capacity
        rule now sizes a slot otherwise (record the call again), "full" where a feed is full
        (the host is far ahead of the device: run this call as it is). A site's slot sizes are
        compared with the rule's only when the rule or the RAW setting changed since they
        last matched (``sized``); the error word is read inline (``check`` where it is set)."""
        if self.failed is not None or self.spills.error():
            self.check(op)
        self._site = (op, uniform)
        stamp = (id(self.rule), self.rule.changes, self.raw)
        for s in sites:
            if s.sized != stamp:
                for _, _, slot, _, n in s.out:
                    if slot != slots.slot_bytes(n, s.code, self.capacity(n, s.code)):
                        return "resized"
                s.sized = stamp
            if not s.room():
                return "full"
        for s in sites:
            s.feed(self.begin(op, s.code, s.out, s.inn))
        launch()
        return None

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop the progress threads, close the host channels: the eager calls' once every
        begun call is handled, then the captures' (whose graphs must no longer be replayed:
        from then on their kernels wait for nothing, ``spill_sites.Sites.close``)."""
        captures, self._captures = list(self._captures.values()), {}
        try:
            self.spills.close(timeout=timeout)
        finally:
            for c in captures:
                c.sites.close(timeout=timeout)


class CapturedChannel:
    """A slot channel's calls captured in one CUDA graph: the channel's capacity rule (as it
    stands at the capture: a replay cannot change a slot's size), error word and RAW setting,
    with the spills of captured sites (``spill_sites.Sites``) in place of numbered calls. A replay
    runs the rounds as captured; nothing is observed for the capacity rule."""

    def __init__(self, parent: SlotChannel, sites):
        self.parent, self.sites = parent, sites
        self.begun: list = []  # the sites of this capture, in order

    @property
    def raw(self) -> bool:
        return self.parent.raw

    def check(self, op: str) -> None:
        self.parent.check(op)

    def site(self, op: str, uniform: bool) -> None:
        self.parent.site(op, uniform)

    def capacity(self, n: int, code: int) -> int:
        return self.parent.capacity(n, code)

    def begin(self, op: str, code: int, out, inn):
        """A captured site for the round's frames (in place of a sequence number)."""
        site = self.sites.begin(op, code, out, inn)
        self.begun.append(site)
        return site

    def launch_out(self, site, stream) -> None:
        self.sites.launch_out(site, stream)

    def launch_in(self, site, stream) -> None:
        self.sites.launch_in(site, stream)

    def record_error(self, stream, ws) -> None:
        self.parent.record_error(stream, ws)


class RecordingChannel(CapturedChannel):
    """A slot channel's call being recorded as zipccl's own CUDA graph (``core.Core.replay``):
    each round a ``spill_sites.FedSite``, whose call block and number the host gives every
    launch (``SlotChannel.launch_graph``), so that a launch is, to the spill path and to the
    peers, the same call as an eager one."""

    def __init__(self, parent: SlotChannel):
        super().__init__(parent, None)
        self.uniform = False

    def site(self, op: str, uniform: bool) -> None:
        self.uniform = uniform
        self.parent.site(op, uniform)

    def begin(self, op: str, code: int, out, inn):
        from .spill_sites import FedSite

        site = FedSite(self.parent.spills, op, code, out, inn)
        self.begun.append(site)
        return site

    def launch_out(self, site, stream) -> None:
        from .spill_sites import launch_out

        launch_out(self.parent.spills, site, stream)

    def launch_in(self, site, stream) -> None:
        from .spill_sites import launch_in

        launch_in(self.parent.spills, site, stream)
