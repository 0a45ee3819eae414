"""Spills: the tails of frames longer than their slots, moved beside the collective.

A compressed collective moves every frame as a fixed-size slot (``format.slot``); a frame that
does not fit spills the rest of its bytes, its tail. ``Spills`` moves tails without ever making
the caller's thread wait for the device or a peer (NCCL's contract): ``begin`` writes the
call's frame descriptors into a pinned, device-mapped call block; ``launch_out`` and
``launch_in`` enqueue the kernels (``kernels.spill``) that copy tails out and in; one progress
thread per ``Spills`` moves them over a host channel (``channels.MPIChannel``, ``TorchChannel``
in ``zipccl.torch.transport``) in call order. A stream waits only on the CPU, the CPU only on
device work enqueued before. Errors go into a sticky word in mapped memory that every slot
header then carries to the peers. With ``device=False`` (host arrays) the same steps run at
once in the caller's thread. The protocol, the deadlock rule and the error bits:
docs/COLLECTIVES.md, "Spills".
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from .. import format as fmt
from ..format import errors
from ..format import slot as slots
from ..kernels import spill as kern
from .channels import HostChannel
from .transport import stream_ptr

FRAME_FIELDS = ("peer", "region_ptr", "slot_bytes", "region_bytes", "n")
TAG_CALLS = 2048  # tags cycle over calls; MPI's non-overtaking order covers the wrap
TAG_FRAMES = 16  # and over the frames of one call toward one peer
_ALIGN = 128
# The progress thread's polling of mapped memory: from POLL_MIN_S, doubling to POLL_MAX_S. Every
# wake takes the GIL from the caller's thread, and only a spilled tail waits for it, so it starts
# slow (a spill then waits up to ~POLL_MAX_S longer; a call without one never waits for it).
# $ZIPCCL_SPILL_POLL_US sets the first interval (microseconds), read when a Spills is made.
POLL_MIN_S = 5e-5
POLL_MAX_S = 1e-3


def _poll_min_s() -> float:
    raw = os.environ.get("ZIPCCL_SPILL_POLL_US")
    if raw is None:
        return POLL_MIN_S
    try:
        us = float(raw)
    except ValueError:
        raise ValueError(f"ZIPCCL_SPILL_POLL_US must be a number of microseconds, got {raw!r}") from None
    if not 0 < us <= 1e6:
        raise ValueError(f"ZIPCCL_SPILL_POLL_US must be in (0, 1e6] microseconds, got {raw!r}")
    return us * 1e-6


def describe(bits: int) -> str:
    """The sticky error word in words (its low bits are the decode kernels', named by
    ``codec.gpu_workspace.Workspace.describe``).

    >>> describe(errors.ERR_SLOT_CALL | 4)
    'a peer made another call (operation, element type or element count differ); decode error bits 0x4'
    """
    words = [text for bit, text in errors.SLOT_ERRORS.items() if bits & bit]
    low = bits & 0xFFFF
    if low:
        words.append(f"decode error bits {low:#x}")
    return "; ".join(words) or "no error"


def _op_code(op) -> int:
    if isinstance(op, str):
        if op not in slots.OP_CODES:
            raise ValueError(f"unknown collective {op!r}; one of {sorted(slots.OP_CODES)}")
        return slots.OP_CODES[op]
    if int(op) not in slots.OP_CODES.values():
        raise ValueError(f"unknown collective op code {op}")
    return int(op)


def _ordinals(peers: np.ndarray) -> np.ndarray:
    """For each frame, how many frames before it in the list go to the same peer.

    >>> _ordinals(np.array([2, 1, 2, 2, 1])).tolist()
    [0, 0, 1, 2, 1]
    """
    k = np.zeros(peers.size, np.int64)
    if peers.size:
        order = np.argsort(peers, kind="stable")
        sp = peers[order]
        start = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
        lengths = np.diff(np.r_[start, sp.size])
        k[order] = np.arange(sp.size) - np.repeat(start, lengths)
    return k


class _Block:
    """One call block: pinned mapped host memory, and its counters on the device."""

    def __init__(self, owner: Spills, size: int):
        self.size = size
        self.mem, self.u8 = owner._pinned(size)
        self.ptr = int(self.u8.ctypes.data)
        self.words = self.u8[:8 * kern.HEADER_WORDS].view(np.uint64)
        self.counters, self.counters_ptr = owner._device_words(kern.COUNTERS)


class _Call:
    __slots__ = ("seq", "block", "send", "recv", "grid_out", "grid_in", "out_launched",
                 "in_launched", "sends", "done", "observe")

    def __init__(self, seq, block, send, recv, grid_out, grid_in):
        self.seq, self.block, self.send, self.recv = seq, block, send, recv
        self.grid_out, self.grid_in = grid_out, grid_in
        self.out_launched = self.in_launched = self.done = False
        self.observe = False
        self.sends: list = []


class Spills:
    """The spill machinery of one communicator: call blocks, the sticky error word, the
    progress thread and the host channel (``channels.MPIChannel``, or ``zipccl.torch``'s ``TorchChannel``).

    ``device``: the regions are device memory (of the device current at construction) and
    the steps are kernels on the given streams (CuPy); otherwise they are host memory and
    the steps run at once. ``entries``: call blocks kept for reuse; with a device more are
    made (and kept) while more calls are in flight, the pool doubling, on the host ``begin``
    waits instead.

    Per call, in this order: ``begin``, ``launch_out``, the transfer, ``launch_in``; the
    decodes then read the regions. Sequence numbers increase from call to call, alike on
    every rank. ``close()`` ends the thread once every begun call is handled.
    """

    def __init__(self, channel: HostChannel, *, device: bool, entries: int = 16):
        if entries < 1:
            raise ValueError(f"entries must be >= 1, got {entries}")
        self.channel = channel
        self.device = bool(device)
        self.entries = int(entries)
        self.rank, self.size = int(channel.rank), int(channel.size)
        self._poll_min = _poll_min_s()
        self._cp = None
        if self.device:
            import cupy

            self._cp = cupy
        self._ctrl_mem, ctrl = self._pinned(8 * kern.C_WORDS)
        self._ctrl = ctrl.view(np.uint64)
        self._ctrl[:] = 0
        self._ctrl_ptr = int(ctrl.ctypes.data)
        self._dev, self._dev_ptr = self._device_words(kern.DEV_WORDS)
        self._free: list[_Block] = []
        self._inflight: deque[_Call] = deque()  # begun, not yet retired, in call order
        self._calls: dict[int, _Call] = {}  # begun, kernels not all launched
        self._size_class = 0
        self._allocations = 0
        self._last_seq = 0
        self._sticky = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._sending: list[_Call] = []  # progress thread only: handled, sends in flight
        self._last_handled = 0  # progress thread only
        self._observed: dict[int, int] = {}  # seq -> largest escape count (begin(observe=True))
        self._layouts: dict[tuple, tuple] = {}  # begin's plan cache, by (op, dtype, frames)
        self._failure: BaseException | None = None
        self._closed = False
        self._launchers: dict = {}  # each spill kernel's launcher, by name (this device)

    # -- memory ------------------------------------------------------------------------------
    def _pinned(self, nbytes: int):
        """(owner, uint8 view) of ``nbytes`` of pinned mapped host memory, 128-byte aligned."""
        if self.device:
            mem = self._cp.cuda.alloc_pinned_memory(nbytes + _ALIGN)
            raw = np.frombuffer(mem, dtype=np.uint8, count=nbytes + _ALIGN)
        else:
            mem = raw = np.zeros(nbytes + _ALIGN, np.uint8)
        off = -int(raw.ctypes.data) % _ALIGN
        return mem, raw[off:off + nbytes]

    def _device_words(self, count: int):
        """(array, address) of ``count`` zeroed uint32 words in device memory."""
        if self.device:
            a = self._cp.zeros(count, dtype=self._cp.uint32)
            return a, int(a.data.ptr)
        a = np.zeros(count, np.uint32)
        return a, int(a.ctypes.data)

    def _take(self, need: int) -> _Block:
        """A free call block of at least ``need`` bytes; blocks share one grow-only size. With a
        device, a pool with none free doubles (as many new blocks as calls in flight hold), so
        that however deep the calls in flight get, it grows a few times, not at every new depth."""
        size = max(self._size_class, 1 << max(12, (need - 1).bit_length()))
        self._size_class = size
        for i in range(len(self._free) - 1, -1, -1):
            if self._free[i].size >= need:
                return self._free.pop(i)
        more = sum(1 for c in self._inflight if c.block.size >= size) if self.device else 0
        self._free.extend(_Block(self, size) for _ in range(more))
        self._allocations += 1 + more
        return _Block(self, size)

    def _retire(self) -> None:
        """Recycle the blocks of finished calls, oldest first (reads mapped memory, no wait).
        On the host (``device=False``, where every call blocks anyway) it also waits while
        ``entries`` calls are in flight, so that a progress thread lagging behind the
        caller cannot make the pool grow; with a device it never waits: more blocks are made."""
        delay = 1e-5
        while self._inflight:
            call = self._inflight[0]
            if not (call.done and int(call.block.words[kern.W_IN_FREE]) == call.seq):
                if self.device or len(self._inflight) < self.entries or not call.in_launched:
                    return
                self._check()
                time.sleep(delay)
                delay = min(2 * delay, 1e-3)
                continue
            self._inflight.popleft()
            # a device keeps every block of the current size: the pool ends as deep as the
            # calls in flight get, and a steady stream of calls allocates no pinned memory
            if call.block.size >= self._size_class and (self.device or len(self._free) < self.entries):
                self._free.append(call.block)

    def stats(self) -> dict:
        """Call blocks held (free and in flight), their pinned bytes, allocations so far."""
        blocks = self._free + [c.block for c in self._inflight]
        return {"blocks": len(blocks), "pinned_bytes": sum(b.size for b in blocks),
                "allocations": self._allocations, "in_flight": len(self._inflight)}

    # -- the API ---------------------------------------------------------------------------
    def begin(self, seq: int, op, dtype, sends: Sequence, recvs: Sequence, *,
              observe: bool = False) -> None:
        """Prepare call ``seq``: ``op`` (a name or code of ``slots.OP_CODES``), element type
        ``dtype``, and every frame this rank sends / receives as ``(peer, region_ptr,
        slot_bytes, region_bytes, n)``. A region holds the slot header, then the frame;
        ``region_ptr`` is its (16-byte aligned) address. Frames toward one peer are listed
        in the same order on the sender as on the receiver. Never waits. ``observe``: keep
        the call's largest escape count over every rank's frames for ``observed``.
        """
        if self._failure is not None:
            self._check()
        if self._closed:
            raise RuntimeError("Spills.begin after close()")
        seq = int(seq)
        if seq <= self._last_seq:
            raise ValueError(f"call sequence numbers increase: {seq} after {self._last_seq}")
        key = (op, dtype, tuple(map(tuple, sends)), tuple(map(tuple, recvs)))
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layout(op, dtype, sends, recvs)
            if len(self._layouts) >= 256:  # a plan cache: dropping it costs re-planning only
                self._layouts.clear()
            self._layouts[key] = lay
        op, code, ns, nr, recv_at, tails_at, need, template, ordinal, grids = lay
        if self._inflight and (self._inflight[0].done or not self.device):  # else: none to retire
            self._retire()
        block = self._take(need)

        w = block.words
        w[:] = 0
        w[kern.W_SEQ], w[kern.W_OP], w[kern.W_DTYPE] = seq, op, code
        w[kern.W_NSEND], w[kern.W_NRECV] = ns, nr
        w[kern.W_SEND_AT], w[kern.W_RECV_AT] = 8 * kern.HEADER_WORDS, recv_at
        descs = block.u8[8 * kern.HEADER_WORDS:tails_at].view(np.uint64)
        descs = descs[:kern.DESC_WORDS * (ns + nr)].reshape(ns + nr, kern.DESC_WORDS)
        descs[:] = template
        descs[:, kern.D_TAG] = (seq % TAG_CALLS) * TAG_FRAMES + ordinal
        call = _Call(seq, block, descs[:ns], descs[ns:], *grids)
        call.observe = bool(observe)
        self._last_seq = seq
        self._calls[seq] = call
        self._inflight.append(call)
        if self._thread is None:
            self._thread = threading.Thread(target=self._progress, daemon=True,
                                            name=f"zipccl-spills-rank{self.rank}")
            self._thread.start()
        self._queue.put(call)
        if self._failure is not None:  # failed meanwhile: nothing will raise this call's flag
            self._release()
            self._check()

    def _layout(self, op, dtype, sends: Sequence, recvs: Sequence) -> tuple:
        """A call block's layout for these frames, the same for every call that names them:
        (op, type code, sends, recvs, receive descriptors' offset, tails' offset, block bytes,
        the descriptors but their tags, the tags' frame ordinals, the kernels' grids)."""
        op, code = _op_code(op), fmt.dtype_code(dtype)
        s, r = self._frames(sends, "sends"), self._frames(recvs, "recvs")
        ns, nr = len(s), len(r)
        caps = np.concatenate([s[:, 3] - s[:, 2], r[:, 3] - r[:, 2]])
        recv_at = 8 * kern.HEADER_WORDS + 8 * kern.DESC_WORDS * ns
        tails_at = fmt.align(recv_at + 8 * kern.DESC_WORDS * nr)
        spans = (caps + _ALIGN - 1) // _ALIGN * _ALIGN
        tail_at = tails_at + np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64)
        template = np.zeros((ns + nr, kern.DESC_WORDS), np.uint64)
        both = np.concatenate([s, r])
        template[:, kern.D_REGION] = both[:, 1]
        template[:, kern.D_SLOT] = both[:, 2]
        template[:, kern.D_REGION_BYTES] = both[:, 3]
        template[:, kern.D_PEER] = both[:, 0]
        template[:, kern.D_N] = both[:, 4]
        template[:, kern.D_TAIL_AT] = tail_at
        template[:, kern.D_TAIL_CAP] = caps
        ordinal = (np.concatenate([_ordinals(s[:, 0]), _ordinals(r[:, 0])]) % TAG_FRAMES).astype(np.uint64)
        grids = (kern.blocks_for(int(caps[:ns].sum())), kern.blocks_for(int(caps[ns:].sum())))
        return op, code, ns, nr, recv_at, tails_at, int(tails_at + spans.sum()), template, ordinal, grids

    def _frames(self, frames: Sequence, what: str) -> np.ndarray:
        try:
            a = np.asarray(frames, dtype=np.int64).reshape(len(frames), -1) if len(frames) else \
                np.zeros((0, len(FRAME_FIELDS)), np.int64)
        except ValueError:
            a = np.zeros((0, 0), np.int64)
        if a.shape[1:] != (len(FRAME_FIELDS),):
            raise ValueError(f"Spills.begin {what}: frames are {FRAME_FIELDS} tuples of integers")
        peer, region, slot, rbytes, n = a.T
        bad = []
        if np.any((peer < 0) | (peer >= self.size) | ((peer == self.rank) & (self.size > 1))):
            # one rank may be its own peer: the loopback mode (``Policy.loopback``)
            bad.append(f"peers must be other ranks of 0..{self.size - 1} (this is rank {self.rank})")
        if np.any((region <= 0) | (region % 16 != 0)):
            bad.append("region addresses must be non-zero and 16-byte aligned")
        if np.any((slot < slots.SLOT_HEADER) | (slot % 16 != 0) | (rbytes < slot)):
            bad.append(f"slot_bytes must be >= {slots.SLOT_HEADER}, a multiple of 16 and "
                       "<= region_bytes")
        if np.any(n <= 0):
            bad.append("every frame holds n > 0 values")
        if bad:
            raise ValueError(f"Spills.begin {what} {FRAME_FIELDS}: " + "; ".join(bad))
        return a

    def _call(self, seq: int) -> _Call:
        if self._failure is not None:
            self._check()
        call = self._calls.get(int(seq))
        if call is None:
            raise ValueError(f"call {seq} was not begun (or its kernels were all launched)")
        return call

    def _launch(self, name: str, grid: int, args: tuple, stream) -> None:
        if not self.device:
            kern.HOST_TWINS[name](*args)
            return
        go = self._launchers.get(name)  # each kernel looked up once
        if go is None:
            from ..kernels.launch import words

            go = self._launchers[name] = words(kern.function(self._cp, name), kern.THREADS)
        go(grid, stream_ptr(stream), args)

    def launch_out(self, seq: int, stream=None) -> None:
        """Enqueue on ``stream`` (after the encodes of call ``seq``, before its transfer): the
        slot headers before the send frames, the tails out, the flag. Never waits."""
        call = self._call(seq)
        if call.out_launched:
            raise RuntimeError(f"launch_out({seq}) twice")
        self._launch("zipccl_spill_out", call.grid_out,
                     (call.block.ptr, self._ctrl_ptr, self._dev_ptr, call.block.counters_ptr, call.seq),
                     stream)
        call.out_launched = True

    def launch_in(self, seq: int, stream=None) -> None:
        """Enqueue on ``stream`` (after the transfer of call ``seq``, before its decodes): the
        header checks, the request, and for frames that spill the wait on the progress
        thread and the tails in. On the host (``device=False``) it returns with the tails in."""
        call = self._call(seq)
        if not call.out_launched:
            raise RuntimeError(f"launch_in({seq}) before launch_out({seq}): the progress thread "
                               "handles a call's sends before its receives")
        self._launch("zipccl_spill_in", call.grid_in,
                     (call.block.ptr, self._ctrl_ptr, self._dev_ptr, call.block.counters_ptr, call.seq),
                     stream)
        call.in_launched = True
        del self._calls[call.seq]

    def fed(self, seq: int) -> _Call:
        """Call ``seq``'s kernels run in a graph (``spill_sites.FedSite``): as ``launch_out``
        and ``launch_in`` both done."""
        call = self._calls.get(seq) if self._failure is None else None
        if call is None:
            call = self._call(seq)  # raises why
        call.out_launched = call.in_launched = True
        del self._calls[call.seq]
        return call

    def record_error(self, stream, bits_ptr: int) -> None:
        """Enqueue on ``stream`` an OR of the uint32 at device address ``bits_ptr`` (a decode
        workspace's error bits) into the sticky error word."""
        if self._failure is not None:
            self._check()
        self._launch("zipccl_spill_record", 1, (self._ctrl_ptr, self._dev_ptr, int(bits_ptr)), stream)

    def observed(self, seq: int) -> int | None:
        """The largest escape count over every rank's frames of call ``seq`` (begun with
        ``observe=True``), once the device has checked its received slot headers; None
        before that. Each value is returned once. A read of what the progress thread noted:
        no wait."""
        if self._failure is not None:
            self._check()
        return self._observed.pop(int(seq), None)

    def report(self, bits: int) -> None:
        """OR ``bits`` (found on the host) into this rank's error word, which every slot
        header it sends from now on carries to its peers."""
        self._ctrl[kern.C_HOST_ERR] |= np.uint64(bits)

    def error(self) -> int:
        """The sticky error word as far as the device has got (a read of mapped memory, no
        wait): every bit recorded on this rank or reported by a peer's slot header."""
        if self._failure is not None:
            self._check()
        self._sticky |= int(self._ctrl[kern.C_ERR]) | int(self._ctrl[kern.C_HOST_ERR])
        return self._sticky

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop the progress thread once every begun call is handled, then close the channel
        (a collective call for ``MPIChannel``, local for ``TorchChannel``). Call it after the
        calls' device work has run: a call whose kernels never run keeps the thread waiting
        (TimeoutError)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            if self._thread.is_alive():
                pending = [c.seq for c in list(self._inflight) if not c.done]
                raise TimeoutError(f"spill progress thread still handling calls {pending[:8]} "
                                   f"after {timeout} s (were their kernels launched and run?)")
        self._retire()
        self.channel.close()
        if self._failure is not None:
            self._check()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the progress thread ---------------------------------------------------------------
    def _check(self) -> None:
        """Raise the progress thread's failure (the steps test ``_failure`` inline first: a
        function call less per step when all is well)."""
        if self._failure is not None:
            raise RuntimeError(f"zipccl spill progress thread failed: {self._failure!r}") \
                from self._failure

    def _release(self) -> None:
        """After a failure: raise every pending call's flag so that no kernel waits forever."""
        self._ctrl[kern.C_HOST_ERR] |= np.uint64(errors.ERR_PROGRESS)
        for call in list(self._inflight):
            call.block.words[kern.W_IN_READY] = call.seq

    def _progress(self) -> None:
        try:
            while True:
                call = self._next()
                if call is None:
                    break
                self._handle(call)
            for call in self._sending:
                for h in call.sends:
                    h.wait()
                call.done = True
            self._sending.clear()
        except BaseException as e:  # kept for the caller's next call
            self._failure = e
            self._release()

    def _next(self) -> _Call | None:
        """The next begun call (None: closed); completes the sends in flight while it waits."""
        delay = self._poll_min
        while self._sending:
            try:
                return self._queue.get(timeout=delay)
            except queue.Empty:
                self._reap(wait_before=self._last_handled + 1 if delay >= POLL_MAX_S else 0)
                delay = min(2 * delay, POLL_MAX_S)
        return self._queue.get()

    def _reap(self, wait_before: int = 0) -> None:
        """Mark calls whose tails are all sent done: those the channel reports complete, and
        (waiting for them) those older than ``wait_before``. A send completes once the peer's
        thread receives it, which needs only device work enqueued before and tails this
        thread has already sent, so the wait cannot close a cycle. (gloo reports a send
        complete only once it was waited for.)"""
        for call in list(self._sending):
            if call.seq < wait_before:
                for h in call.sends:
                    h.wait()
            elif not all(h.test() for h in call.sends):
                continue
            call.done = True
            self._sending.remove(call)

    def _wait(self, words: np.ndarray, at: int, seq: int) -> None:
        delay = self._poll_min
        while int(words[at]) != seq:
            time.sleep(delay)
            delay = max(delay, min(2 * delay, POLL_MAX_S))

    def _handle(self, call: _Call) -> None:
        """One call: its tails out to the peers, then the tails it asked for in, then its flag."""
        call.sends = _move_tails(self.channel, call.block, call.seq, call.send, call.recv, self._wait,
                                 self._observed if call.observe else None)
        self._last_handled = call.seq
        self._sending.append(call)
        self._reap(wait_before=call.seq)


def _move_tails(channel: HostChannel, block, seq: int, send, recv, wait, observed: dict | None) -> list:
    """Call ``seq`` in ``block`` (descriptors ``send``, ``recv``): its tails out to the peers
    once the device wrote them, then (``observed[seq]``: the call's largest escape count) the
    tails it asked for in, then its flag. Returns the sends in flight."""
    wait(block.words, kern.W_OUT_READY, seq)
    sends = []
    for d in send:
        n = int(d[kern.D_TAIL_LEN])
        if n:
            at = int(d[kern.D_TAIL_AT])
            sends.append(channel.isend(block.u8[at:at + n], int(d[kern.D_PEER]), int(d[kern.D_TAG])))
    wait(block.words, kern.W_IN_REQUEST, seq)
    if observed is not None:
        observed[seq] = int(block.words[kern.W_MAX_ESC])
    for d in recv:
        n = int(d[kern.D_TAIL_LEN])
        if n:
            at = int(d[kern.D_TAIL_AT])
            # a tail longer than the block holds (ranks disagree; the kernel flagged it)
            # is still received, so the channel stays in step, and dropped
            out = block.u8[at:at + n] if n <= int(d[kern.D_TAIL_CAP]) else np.empty(n, np.uint8)
            channel.recv(out, int(d[kern.D_PEER]), int(d[kern.D_TAG]))
    block.words[kern.W_IN_READY] = seq
    return sends
