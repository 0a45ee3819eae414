"""The engine protocol: what the collective algorithms ask of the place the data lives.

The algorithms in ``collectives`` and ``exchange`` (and ``Communicator``, ``calibrate``
and the torch layer around them) never learn whether the data is a NumPy array coded
by the CPU codec or a CuPy array coded by the GPU codec: they call an *engine*, and
two implement this protocol, ``HostEngine`` (``host``) and ``DeviceEngine``
(``pipeline``). ``tests/test_engine.py`` checks that both have every method here
with a compatible signature.

An engine works on one *caller's stream*, set by ``set_stream`` at the start of every call;
every method enqueues its work there unless its docstring names another stream, and only
``sync`` and ``elapsed`` wait for the device. The slot exchange adds a transfer stream and a
decode stream, driven through the hooks below in the order drawn above them, so that round k
is on the wire while round k+1 is encoded and round k-1 decoded. On the host there are no
streams: every method has finished when it returns, and the stream hooks do nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..codebook import Codebook

Array = Any  # a 1-D array of the engine's kind: numpy.ndarray (host) or cupy.ndarray (device)


@runtime_checkable
class Engine(Protocol):
    """Buffers, codec, copies and the stated reduction of one kind of memory (host or device)."""

    device: bool  # True: arrays are device (CuPy) arrays and work goes on streams
    checksum: bool  # the frames this engine writes carry a checksum

    def set_stream(self, stream) -> None:
        """Make ``stream`` the caller's stream for the methods that follow (None: the current one).

        Called before anything else on every collective call; the host ignores it.
        """
        ...

    def workspace(self, role: str, nbytes: int) -> Array:
        """A uint8 scratch buffer of ``nbytes`` for ``role``, reused across calls (grown, never shrunk).

        The same role returns the same memory again, so a buffer must be done with
        (in stream order) before its role is asked for a different use. A new buffer is
        allocated and zeroed on the caller's stream, ordered before every later use.
        """
        ...

    def values_workspace(self, role: str, n: int, dtype=np.uint16) -> Array:
        """``workspace(role, itemsize * n)`` seen as ``n`` values of ``dtype`` (the collectives'
        element types: uint16 BF16 bit patterns, float32, float16)."""
        ...

    def encode(self, values: Array, out: Array, codebook: Codebook) -> int | None:
        """Encode ``values`` as one frame at the start of ``out`` with ``codebook``, on the
        caller's stream (calibration; the collectives use ``encode_slot``).

        Returns the frame length where the host knows it without waiting (host), else None
        (the length is in the frame's header). ``out`` holds at least
        ``slots.region_bytes(values.size, code) - slots.SLOT_HEADER`` bytes.
        """
        ...

    def decode(self, frame: Array, out: Array, slot: int = 0) -> None:
        """Decode one frame into ``out`` (of the frame's element type and count; a frame of
        another type is a corrupted one).

        Calibration's decode (the collectives use ``decode_frame``). The host raises
        ValueError on a bad frame at once; the device enqueues the decode on the
        caller's stream and keeps its error bits in workspace ``slot``.
        """
        ...

    def copy(self, dst: Array, src: Array) -> None:
        """``dst[...] = src``, on the caller's stream."""
        ...

    def reduce_sum(self, stack: Array, out: Array) -> None:
        """``out`` = ``reduction.reduce_sum`` of the rows of ``stack`` (p, m), bit for bit.

        On the caller's stream.
        """
        ...

    def divide(self, out: Array, p: int) -> None:
        """In place: AVG's division of the stated sum by ``p`` (``reduction.divide``), ordered
        after everything enqueued before it."""
        ...

    def reduce_cols(self, stage: Array, p: int, m: int, lo: int, hi: int, out: Array) -> None:
        """``out[lo:hi]`` = the stated reduction of columns [lo, hi) of ``stage`` seen as (p, m).

        Inside a slot exchange (between ``pipeline_begin`` and ``pipeline_finish``) on
        the decode stream, after the decodes enqueued so far; otherwise on the caller's
        stream.
        """
        ...

    def sync(self) -> None:
        """Wait until the caller's stream has finished its work (host: nothing to wait for)."""
        ...

    def held(self) -> list:
        """Every buffer the engine holds now: what a CUDA graph recorded on it must keep
        (``core.Core.replay``; host: none)."""
        ...

    def elapsed(self, call: Callable[[], object], repeat: int) -> float:
        """Seconds per call of the work ``call`` does, ``repeat`` calls in a row after one untimed.

        Device: CUDA events around the calls on the caller's stream (synchronises at the
        end); host: the wall clock.
        """
        ...

    # -- hooks of exchange.slot_exchange, called in this order:
    #
    #     pipeline_begin(rounds, p)
    #     encode_slot(...) for round 0's frames; spill-out on encode_stream(); encoded(0)
    #     for k in range(rounds):
    #         transfer_stream(k)                # round k's transfer goes there
    #         received(k)
    #         encode_slot(...) for round k+1; spill-out; encoded(k+1)
    #         spill-in on decode_stream(k); decode_frame(..., k) for round k's frames
    #     pipeline_finish(record)               # error bits recorded; the caller's stream waits for both
    #
    # The engine orders the three streams by events (the transport only needs
    # transfer_stream(k)); nothing here reads anything back to the host.
    def encode_slot(self, values: Array, region: Array, raw: bool = False) -> None:
        """Enqueue the frame of ``values`` into ``region[slots.SLOT_HEADER:]`` on the caller's
        stream, its codebook chosen from ``values`` (device: on the device, no host read).

        ``raw``: the codec is off, the frame is RAW (``exchange.raw_header`` and the values'
        bytes, copied; the region holds it: ``slots.region_bytes``)."""
        ...

    def encode_stream(self):
        """The stream the encodes run on (the caller's; host: None)."""
        ...

    def decode_stream(self, k: int):
        """The stream round ``k``'s decodes run on, ordered after its transfer (host: None)."""
        ...

    def pipeline_finish(self, record: Callable[[object, object], None] | None = None) -> None:
        """Close a slot exchange, reading nothing back: first ``record(stream, workspace)`` for
        every decode workspace the call used (what takes their error bits into the
        communicator's error word, on the stream given), then the caller's stream waits for
        every transfer, decode and recorded read (host: nothing to record, ``decode_frame``
        returned its errors)."""
        ...

    def pipeline_begin(self, rounds: int, p: int) -> None:
        """Start an exchange of ``rounds`` rounds with up to ``p`` frames each; matched by one
        ``pipeline_finish``."""
        ...

    def encoded(self, k: int) -> None:
        """Round ``k``'s encodes are all enqueued (device: an event on the caller's stream)."""
        ...

    def transfer_stream(self, k: int):
        """The stream round ``k``'s transfer goes on, already ordered after its encodes (host: None)."""
        ...

    def received(self, k: int) -> None:
        """Round ``k``'s transfer is enqueued on ``transfer_stream(k)``; its decodes may follow it."""
        ...

    def decode_frame(self, frame: Array, out: Array, k: int) -> str | None:
        """Decode one frame of round ``k`` into ``out``, ordered after round ``k``'s transfer.

        Device: enqueued on the decode stream; its error bits go into the workspaces
        ``pipeline_finish`` records. Returns an error in words where it is known at once
        (host), else None.
        """
        ...
