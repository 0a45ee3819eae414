"""Captured spill sites: the spill path of compressed calls recorded in a CUDA graph.

A replayed graph launches the same kernels with the same arguments every time, so a captured
call can take nothing from the host per call: no sequence number, no call block. Each
captured call is a *site* with its own words and a ring of call blocks; the take kernel
(``kernels.spill``, ``zipccl_spill_take``) numbers the site's calls on the device and picks
the block, and one progress thread per capture moves the tails as ``spill.Spills`` does for
eager calls. docs/COLLECTIVES.md, "CUDA graphs", says what a capture needs and keeps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from ..format import errors
from ..kernels import spill as kern
from .channels import HostChannel
from .spill import POLL_MAX_S, TAG_CALLS, TAG_FRAMES, Spills, _move_tails
from .transport import stream_ptr

#: what closed captures' kernels may still touch, should their graphs be replayed (one entry
#: per capture, for the process's life)
AFTER_CLOSE: list = []


class _Stopped(Exception):
    """``Sites.close`` while the progress thread waited for a replay."""


class _RingBlock:
    """A call block of a captured site: pinned mapped host memory, its layout written once."""

    def __init__(self, owner: Spills, size: int, lay: tuple):
        op, code, ns, nr, recv_at, tails_at, _, template, ordinal, _ = lay
        self.mem, self.u8 = owner._pinned(size)
        self.u8[:] = 0
        self.ptr = int(self.u8.ctypes.data)
        self.words = self.u8[:8 * kern.HEADER_WORDS].view(np.uint64)
        w = self.words
        w[kern.W_OP], w[kern.W_DTYPE], w[kern.W_NSEND], w[kern.W_NRECV] = op, code, ns, nr
        w[kern.W_SEND_AT], w[kern.W_RECV_AT] = 8 * kern.HEADER_WORDS, recv_at
        descs = self.u8[8 * kern.HEADER_WORDS:tails_at].view(np.uint64)
        descs = descs[:kern.DESC_WORDS * (ns + nr)].reshape(ns + nr, kern.DESC_WORDS)
        descs[:] = template
        self.send, self.recv = descs[:ns], descs[ns:]


class _Site:
    """One call site of a captured graph: its words (pinned, read by the kernels), its ring of
    call blocks, its kernels' counters and grids, and its tags."""

    def __init__(self, owner: Sites, index: int, lay: tuple):
        sp = owner.spills
        self.index = index
        _site_memory(self, sp, lay)
        self.blocks = [_RingBlock(sp, lay[6], lay) for _ in range(owner.ring)]
        self.words[kern.S_RING] = owner.ring
        self.words[kern.S_BLOCKS:kern.S_BLOCKS + owner.ring] = [b.ptr for b in self.blocks]
        tags = (index % TAG_CALLS) * TAG_FRAMES + lay[8]  # the site's tags: the same every replay
        for b in self.blocks:
            b.send[:, kern.D_TAG] = tags[:len(b.send)]
            b.recv[:, kern.D_TAG] = tags[len(b.send):]


class Sites:
    """The spills of the compressed calls captured in one CUDA graph (``SlotChannel.captured``).

    A replayed graph launches the same kernels with the same arguments every time, so nothing
    can come from the host per call: every captured call is a *site* with its own words and a
    ring of ``ring`` call blocks; ``zipccl_spill_take`` numbers the site's calls on the device
    and picks the block (``kernels.spill``). The graph's calls run in the same order at every
    replay and on every rank (a capture records them in the order the host made them), so the
    progress thread, with a host channel of its own, handles site 0, 1, ... of replay 1, then of
    replay 2, ..., each as ``Spills`` handles an eager call: tails out, tails in, the flag. A
    block goes back to its site once the sends of its call completed (``W_HOST_FREE``); the
    take kernel of a call waits for that on the CPU, never on later GPU work. Errors go into
    ``spills``' sticky word. ``close()`` stops the thread (replays after it would wait forever:
    close once the graph is no longer replayed).
    """

    def __init__(self, spills: Spills, channel: HostChannel, *, ring: int = 2):
        if not 2 <= ring <= kern.RING_MAX:
            raise ValueError(f"ring must be in [2, {kern.RING_MAX}], got {ring}")
        self.spills = spills
        self.channel = channel
        self.ring = int(ring)
        self.device = spills.device
        self._sites: list[_Site] = []
        self._thread: threading.Thread | None = None
        self._stop = False
        self._failure: BaseException | None = None

    def begin(self, op, dtype, sends: Sequence, recvs: Sequence) -> _Site:
        """A new site for a captured call of these frames (``Spills.begin``'s arguments but the
        sequence number): its blocks allocated and laid out. Never waits for the device."""
        self.spills._check()
        if self._stop:
            raise RuntimeError("Sites.begin after close()")
        lay = self.spills._layout(op, dtype, sends, recvs)
        with _allocating(self.device):
            site = _Site(self, len(self._sites), lay)
        self._sites.append(site)
        if self._thread is None:
            self._thread = threading.Thread(target=self._progress, daemon=True,
                                            name=f"zipccl-spill-sites-rank{self.spills.rank}")
            self._thread.start()
        return site

    def launch_out(self, site: _Site, stream=None) -> None:
        launch_out(self.spills, site, stream)

    def launch_in(self, site: _Site, stream=None) -> None:
        launch_in(self.spills, site, stream)

    def stats(self) -> dict:
        """Sites captured, their call blocks and pinned bytes."""
        blocks = [b for s in self._sites for b in s.blocks]
        return {"sites": len(self._sites), "blocks": len(blocks),
                "pinned_bytes": sum(b.u8.size for b in blocks)}

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop the progress thread (after the sends of the call it handled last), close the
        channel; raise what the thread failed with. The user's graph may still be replayed
        (a misuse): its kernels then find ``ERR_PROGRESS`` and wait for nothing, and the memory
        they read and write stays allocated (``AFTER_CLOSE``), so a replay never hangs and
        never writes into memory given back; its spilled tails are lost, and the error word
        says so."""
        if self._stop:
            return
        self._stop = True
        sp = self.spills
        AFTER_CLOSE.append((self._sites, sp._ctrl_mem, sp._dev))
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"captured spill sites' progress thread still running after "
                                   f"{timeout} s (a call's sends not received by its peer?)")
        self.channel.close()
        sp.report(errors.ERR_PROGRESS)
        if self._failure is not None:
            raise RuntimeError(f"zipccl spill sites' progress thread failed: {self._failure!r}") \
                from self._failure

    def _wait(self, words: np.ndarray, at: int, seq: int) -> None:
        delay = self.spills._poll_min
        while int(words[at]) != seq:
            if self._stop:
                raise _Stopped
            time.sleep(delay)
            delay = max(delay, min(2 * delay, POLL_MAX_S))

    def _progress(self) -> None:
        last = None  # (block, seq, sends) handled last: its block is freed after the next one
        try:
            gen = 0
            while True:
                gen += 1
                i = 0
                while i < len(self._sites):  # the list is complete before the first replay
                    b = self._sites[i].blocks[gen % self.ring]
                    sends = _move_tails(self.channel, b, gen, b.send, b.recv, self._wait, None)
                    if last is not None:
                        _free(*last)
                    last = (b, gen, sends)
                    i += 1
        except _Stopped:
            if last is not None:
                _free(*last)
        except BaseException as e:  # kept for close(); the kernels stop waiting for this thread
            self._failure = e
            self.spills.report(errors.ERR_PROGRESS)


def _free(block: _RingBlock, seq: int, sends: list) -> None:
    """The block's call ``seq`` done once its sends completed: the take kernel may reuse it."""
    for h in sends:
        h.wait()
    block.words[kern.W_HOST_FREE] = seq


def launch_out(sp: Spills, site, stream=None) -> None:
    """Enqueue the site's next call (the take kernel) and its spill-out kernel; on a device,
    first the zeroing of the site's counters (``_counters``), recorded with them: the launches
    reset the counters themselves, so a replay finds them zero anyway."""
    if sp.device:
        sp._cp.cuda.runtime.memsetAsync(site.counters_ptr, 0, 4 * kern.COUNTERS, stream_ptr(stream))
    sp._launch("zipccl_spill_take", 1, (site.ptr, sp._ctrl_ptr), stream)
    sp._launch("zipccl_spill_out", site.grid_out,
               (site.ptr, sp._ctrl_ptr, sp._dev_ptr, site.counters_ptr, 0), stream)


def launch_in(sp: Spills, site, stream=None) -> None:
    """Enqueue the site's spill-in kernel (its call's header checks, tails in)."""
    sp._launch("zipccl_spill_in", site.grid_in,
               (site.ptr, sp._ctrl_ptr, sp._dev_ptr, site.counters_ptr, 0), stream)


def _site_memory(site, sp: Spills, lay: tuple) -> None:
    """A site's words (pinned, zeroed, read by the kernels: ``mem``, ``words``, ``ptr``), its
    kernels' counters (``_counters``) and grids, from its calls' block layout ``lay``."""
    site.mem, raw = sp._pinned(8 * kern.SITE_WORDS)
    site.words = raw.view(np.uint64)
    site.words[:] = 0
    site.ptr = int(raw.ctypes.data)
    site.counters, site.counters_ptr = _counters(sp)
    site.grid_out, site.grid_in = lay[9]


def _counters(sp: Spills):
    """(array, address) of a site's kernel counters: zeroed host words, or device words left
    unset here (no stream work during a capture, no wait): ``launch_out`` zeroes them on the
    call's stream."""
    if not sp.device:
        return sp._device_words(kern.COUNTERS)
    a = sp._cp.empty(kern.COUNTERS, dtype=sp._cp.uint32)
    return a, int(a.data.ptr)


def _allocating(device: bool):
    """Allocations during a capture (``kernels.launch.relaxed_capture`` on a device)."""
    if not device:
        return contextlib.nullcontext()
    from ..kernels.launch import relaxed_capture

    return relaxed_capture()


class FedSite:
    """A call site of zipccl's own graph of a kept call (``core.Core.replay``), fed by the host.

    Each launch of the graph is an eager call to the spill path: the host numbers it and takes
    its call block as for any call (``SlotChannel.begin``, ``Spills.begin``), so every rank sees
    the same calls whether it launches a graph or runs the call; ``feed`` writes the block and
    number where the graph's take kernel reads them (one of ``FEED_MAX`` entries, by launch
    count). An entry is reused only once the device has started the call that read it: with
    ``FEED_MAX - 1`` launches not yet started, ``room()`` says no and the call runs as it is.
    """

    def __init__(self, spills: Spills, op, code: int, out, inn):
        self.spills, self.op, self.code = spills, op, code
        self.out, self.inn = tuple(map(tuple, out)), tuple(map(tuple, inn))
        with _allocating(spills.device):
            _site_memory(self, spills, spills._layout(op, code, self.out, self.inn))  # S_RING 0: fed
        self.launches = 0
        self._fed: deque = deque()  # calls fed, not yet seen started on the device
        self.sized = None  # (rule, its changes, RAW) when its slot sizes last matched the rule

    def room(self) -> bool:
        """Whether an entry is free for the next launch (a read of mapped memory, no wait)."""
        fed = self._fed
        while fed and (fed[0].done or int(fed[0].block.words[kern.W_OUT_READY]) == fed[0].seq):
            fed.popleft()
        return len(fed) < kern.FEED_MAX - 1

    def feed(self, seq: int) -> None:
        """The next launch is call ``seq`` (begun): its block and number for the take kernel."""
        call = self.spills.fed(seq)
        self.launches += 1
        at = kern.S_FEED + 2 * (self.launches % kern.FEED_MAX)
        self.words[at], self.words[at + 1] = call.block.ptr, seq
        self._fed.append(call)
