"""The host engine: NumPy buffers coded by the CPU codec, for host arrays over MPI.

``HostEngine`` implements ``engine.Engine`` for data in host memory; its device
counterpart is ``pipeline.DeviceEngine``. On the host there are no streams: every
method has finished when it returns, the pipeline hooks of
``exchange.slot_exchange`` run each round in order, and decode errors are returned
at once.
"""

from __future__ import annotations

import time

import numpy as np

from .. import format as fmt
from ..codebook import Codebook
from ..format.slot import SLOT_HEADER
from .base import value_code, value_patterns
from .exchange import raw_header
from .reduction import divide, reduce_sum


class HostEngine:
    """NumPy buffers and the CPU codec (``zipccl.codec.cpu``)."""

    device = False

    def __init__(self, checksum: bool = False):
        # codec.cpu imports Numba (about a second), which a Communicator of device arrays
        # never needs: it is loaded with the first host engine, not with this module.
        from ..codec import cpu

        self.codec = cpu
        self.checksum = bool(checksum)
        self._work: dict[str, np.ndarray] = {}

    def workspace(self, role: str, nbytes: int) -> np.ndarray:
        """A reusable uint8 scratch buffer of ``nbytes`` (grown, never shrunk)."""
        buf = self._work.get(role)
        if buf is None or buf.size < nbytes:
            buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
            self._work[role] = buf
        return buf[:nbytes]

    def values_workspace(self, role: str, n: int, dtype=np.uint16) -> np.ndarray:
        """``workspace(role, ...)`` seen as ``n`` values of ``dtype`` (uint16 BF16 bits by default)."""
        dt = np.dtype(dtype)
        return self.workspace(role, dt.itemsize * n).view(dt)

    def codebook(self, values: np.ndarray, fresh: bool = False) -> Codebook:
        code = value_code(values)
        return Codebook.from_sample(value_patterns(values), dtype=fmt.DTYPE_NAMES[code])

    def elapsed(self, call, repeat: int) -> float:
        """Seconds per call of ``call`` (after one untimed call), ``repeat`` calls in a row."""
        call()
        t0 = time.perf_counter()
        for _ in range(repeat):
            call()
        return (time.perf_counter() - t0) / repeat

    def encode(self, values: np.ndarray, out: np.ndarray, codebook: Codebook) -> int:
        """Encode ``values`` into the start of ``out``; returns the frame length."""
        frame = self.codec.encode(value_patterns(values), codebook, (values.size,), self.checksum,
                                  dtype=value_code(values))
        out[:frame.size] = frame
        return int(frame.size)

    def decode(self, frame: np.ndarray, out: np.ndarray, slot: int = 0) -> None:
        """Decode one frame into ``out`` (its element type, exactly its element count)."""
        bits, header = self.codec.decode(frame)
        code = value_code(out)
        if header.dtype != code:
            raise ValueError(f"corrupted zipccl frame: it holds {fmt.DTYPE_NAMES[header.dtype]} "
                             f"values, {fmt.DTYPE_NAMES[code]} expected")
        if bits.size != out.size:
            raise ValueError(f"frame holds {bits.size} elements, expected {out.size}")
        value_patterns(out)[:] = bits.reshape(-1)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        dst[...] = src

    def reduce_sum(self, stack: np.ndarray, out: np.ndarray) -> None:
        reduce_sum(stack, out)

    def divide(self, out: np.ndarray, p: int) -> None:
        """out = AVG's division of the stated sum by ``p`` (``reduction.divide``)."""
        divide(out, p)

    def reduce_cols(self, stage: np.ndarray, p: int, m: int, lo: int, hi: int,
                    out: np.ndarray) -> None:
        """out[lo:hi] = the stated reduction of columns [lo, hi) of ``stage`` seen as (p, m)."""
        reduce_sum(stage.reshape(p, m)[:, lo:hi], out[lo:hi])

    def set_stream(self, stream) -> None:
        pass

    def sync(self) -> None:
        pass

    def held(self) -> list:
        return []

    # -- hooks of ``slot_exchange``: on the host everything happens at once, in order ---------
    def pipeline_begin(self, rounds: int, p: int) -> None:
        """Start an exchange of ``rounds`` rounds with ``p`` frames each."""

    def encoded(self, k: int) -> None:
        """Round ``k``'s frames are all enqueued."""

    def transfer_stream(self, k: int):
        """The stream round ``k``'s transfer goes on (host: none)."""
        return None

    def received(self, k: int) -> None:
        """Round ``k``'s transfer is enqueued."""

    def decode_frame(self, frame: np.ndarray, out: np.ndarray, k: int) -> str | None:
        """Decode one frame of round ``k`` into ``out``; returns the error, if any, in words."""
        try:
            self.decode(frame, out)
        except ValueError as e:
            return str(e)
        return None

    def encode_slot(self, values: np.ndarray, region: np.ndarray, raw: bool = False) -> None:
        """Encode into ``region[SLOT_HEADER:]`` with the codebook of ``values``' sample
        (``raw``: a RAW frame, the values copied after ``exchange.raw_header``)."""
        if raw:
            at = SLOT_HEADER + fmt.HEADER_SIZE
            region[SLOT_HEADER:at] = raw_header(values.size, value_code(values))
            region[at:at + values.nbytes] = values.reshape(-1).view(np.uint8)
            return
        self.encode(values, region[SLOT_HEADER:], self.codebook(values))

    def encode_stream(self):
        return None

    def decode_stream(self, k: int):
        return None

    def pipeline_finish(self, record=None) -> None:
        """Nothing to record: ``decode_frame`` returned the host's decode errors."""
