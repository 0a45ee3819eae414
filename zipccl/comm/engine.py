"""The engine protocol: what the collective algorithms ask of the place the data lives.

The algorithms in ``collectives`` (and ``Communicator``, ``calibrate`` and the torch
layer around them) never learn whether the data is a NumPy array coded by the CPU
codec or a CuPy array coded by the GPU codec: they call an *engine*, and two
implement this protocol, ``HostEngine`` (``host``) and ``DeviceEngine``
(``pipeline``). ``tests/test_engine.py`` checks that both have every method here
with a compatible signature.

Streams and synchronisation
---------------------------
An engine works on one *caller's stream*, set by ``set_stream`` at the start of
every call. Everything an engine method does is enqueued on that stream unless its
docstring names another, and a method returns without waiting for the device
unless its docstring says it synchronises. On the host there are no streams: every
method has finished when it returns, and the stream hooks do nothing.

The pipelined exchange (``collectives.chunked_exchange``) adds two streams of the
engine's own, a transfer stream and a decode stream, and drives them through the
``pipeline_*`` hooks in this order::

    pipeline_begin(rounds, p)
    encode_frame(...) for round 0's frames; encoded(0)
    for k in range(rounds):
        frame_lengths(k)                  # the host waits for round k's encodes, nothing else
        transfer_stream(k)                # round k's transfer goes there
        received(k)
        encode_frame(...) for round k+1; encoded(k+1)
        decode_frame(..., k) for round k's frames
    pipeline_end()                        # always, also when the exchange fails

so that round k is on the wire while round k+1 is encoded and round k-1 decoded.
The engine orders the three streams by events; the transport only needs
``transfer_stream(k)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..codebook import Codebook
from ..format import Header

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

    def codebook(self, values: Array, fresh: bool = False) -> Codebook:
        """The codebook to encode ``values`` with (``Codebook.from_sample`` of a strided sample,
        for their element type).

        May reuse an earlier one for the same buffer (a stale codebook costs ratio, never
        bits); ``fresh=True`` samples anew. On the device, sampling waits for the
        caller's stream (a few KiB copied to the host).
        """
        ...

    def encode(self, values: Array, out: Array, codebook: Codebook) -> int | None:
        """Encode ``values`` as one frame at the start of ``out``, on the caller's stream.

        Returns the frame length when the host knows it without waiting, or None: the
        length is then read from the frame's header (``read_headers``). ``out`` holds
        at least ``collectives.slot_size(values.size, code)`` bytes.
        """
        ...

    def read_headers(self, items: Sequence[tuple[Array, int, int]]) -> list[Header | str]:
        """Parse the frame header at each (buffer, offset, capacity): a Header, or why it is invalid.

        Synchronises: waits for the caller's stream once, for all the headers together.
        """
        ...

    def decode(self, frame: Array, out: Array, slot: int = 0) -> None:
        """Decode one frame into ``out`` (of the frame's element type and count; a frame of
        another type is a corrupted one).

        The host raises ValueError on a bad frame at once; the device enqueues the
        decode on the caller's stream and reports errors through ``decode_errors``,
        one error record per ``slot`` (frames decoded before the same check use
        different slots).
        """
        ...

    def decode_errors(self) -> str | None:
        """The first error of the decodes since the last call, in words (None: all good).

        For decodes that report late (device): waits for the caller's stream once. The
        host's decodes raised already, so it returns None.
        """
        ...

    def copy(self, dst: Array, src: Array) -> None:
        """``dst[...] = src``, on the caller's stream."""
        ...

    def reduce_sum(self, stack: Array, out: Array) -> None:
        """``out`` = ``collectives.reduce_sum`` of the rows of ``stack`` (p, m), bit for bit.

        On the caller's stream.
        """
        ...

    def reduce_cols(self, stage: Array, p: int, m: int, lo: int, hi: int, out: Array) -> None:
        """``out[lo:hi]`` = the stated reduction of columns [lo, hi) of ``stage`` seen as (p, m).

        Inside a pipelined exchange (between ``pipeline_begin`` and ``pipeline_end``) on
        the decode stream, after the decodes enqueued so far; otherwise on the caller's
        stream.
        """
        ...

    def sync(self) -> None:
        """Wait until the caller's stream has finished its work (host: nothing to wait for)."""
        ...

    def elapsed(self, call: Callable[[], object], repeat: int) -> float:
        """Seconds per call of the work ``call`` does, ``repeat`` calls in a row after one untimed.

        Device: CUDA events around the calls on the caller's stream (synchronises at the
        end); host: the wall clock.
        """
        ...

    # -- hooks of exchange.slot_exchange: the pipeline hooks above and below, and these -------
    def encode_slot(self, values: Array, region: Array) -> None:
        """Enqueue the frame of ``values`` into ``region[slots.SLOT_HEADER:]`` on the caller's
        stream, its codebook chosen from ``values`` (device: on the device, no host read)."""
        ...

    def encode_stream(self):
        """The stream the encodes run on (the caller's; host: None)."""
        ...

    def decode_stream(self, k: int):
        """The stream round ``k``'s decodes run on, ordered after its transfer (host: None)."""
        ...

    def pipeline_finish(self) -> list:
        """Close a slot exchange: order the caller's stream after every transfer and decode,
        reading nothing back. Returns (stream, decode workspace) pairs whose error bits the
        communicator's error word takes in (host: none; its decodes raise at once)."""
        ...

    # -- hooks of collectives.chunked_exchange (order: see the module docstring) ----------------
    def pipeline_begin(self, rounds: int, p: int) -> None:
        """Start an exchange of ``rounds`` rounds with ``p`` frame slots each (slot k * p + j).

        Every ``pipeline_begin`` is matched by one ``pipeline_end``, also on failure.
        """
        ...

    def encode_frame(self, values: Array, out: Array, codebook: Codebook, idx: int) -> None:
        """Enqueue one frame's encoding into the start of ``out`` on the caller's stream.

        Its length becomes ``frame_lengths(k)[idx]`` (device: copied into pinned memory
        by the same stream, so no wait here).
        """
        ...

    def encoded(self, k: int) -> None:
        """Round ``k``'s encodes are all enqueued (device: an event on the caller's stream)."""
        ...

    def frame_lengths(self, k: int) -> np.ndarray:
        """Lengths (int64, by slot index) of the frames encoded so far, round ``k``'s included.

        Synchronises with round ``k``'s encodes only: the one host wait of a round,
        never on transfers or decodes.
        """
        ...

    def transfer_stream(self, k: int):
        """The stream round ``k``'s transfer goes on, already ordered after its encodes (host: None)."""
        ...

    def received(self, k: int) -> None:
        """Round ``k``'s transfer is enqueued on ``transfer_stream(k)``; its decodes may follow it."""
        ...

    def decode_frame(self, frame: Array, out: Array, k: int) -> str | None:
        """Decode one frame of round ``k`` into ``out``, ordered after round ``k``'s transfer.

        Device: enqueued on the decode stream; errors come from ``pipeline_end``. Returns
        an error in words where it is known at once (host), else None.
        """
        ...

    def pipeline_end(self) -> str | None:
        """Close the exchange: order the caller's stream after every transfer and decode.

        Returns the first decode error that reports late, in words (None: all good);
        the device waits for its decode stream once, for the error bits, and only if it
        decoded anything.
        """
        ...
