"""Device-side machinery of the collectives: CuPy buffers, the GPU codec, the streams.

``DeviceEngine`` is the device counterpart of ``host.HostEngine``: both
implement ``engine.Engine``, the methods the collective algorithms call, so the
algorithms never learn where the data lives. All device work is enqueued on the
caller's CUDA stream or on the engine's transfer and decode streams, ordered by events;
nothing on the collectives' path reads anything back (``elapsed``, for calibration,
is the one method that waits).

Buffers are reused across calls (grown, never shrunk), so a steady stream of
equal-sized collectives allocates nothing after the first call. The GPU codec
(``zipccl.codec.gpu``: ``encode_into`` / ``decode_into``) codes frames on the
device. Chunked pipelining across several streams builds on this engine.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from ..codebook import SAMPLE_SIZE, Codebook
from ..codec import gpu, gpu_workspace
from ..format.slot import SLOT_HEADER
from .base import value_code
from .exchange import raw_header
from .reduction import DEVICE_DIVIDE, DEVICE_PREAMBLE, DEVICE_SUM
from .transport import cupy_stream

_ALIGN = 16  # the GPU codec reads and writes values with 16-byte vector accesses
CODEBOOK_REFRESH = 16  # calls on one buffer between two sigma estimates
RAW_CHUNK = 256  # RAW frame headers per pinned chunk (``DeviceEngine._raw_header``)


class DeviceEngine:
    """CuPy buffers on the current device, the GPU codec, one stream per call."""

    device = True

    def __init__(self, checksum: bool = False):
        import cupy  # absent on machines without a GPU: loaded by the first device engine

        self.cp = cupy
        self.checksum = bool(checksum)
        self.gpu = gpu
        self.gpu_workspace = gpu_workspace
        self._work: dict[str, object] = {}
        self._sampled: dict[tuple[int, int], list] = {}  # FP16 on the slot path: _sampled_codebook
        self._stream = cupy.cuda.get_current_stream()
        self._reducers: dict[int, object] = {}
        self._encode_ws = None
        self._raw_headers: dict[tuple, object] = {}  # encode_slot(raw=True): pinned frame headers
        self._raw_chunk, self._raw_used = None, 0  # the pinned chunk new headers go into
        self._decode_ws: dict[int, object] = {}
        # slot_exchange: transfer and decode streams, events per round
        self._xfer = None
        self._dec = None
        self._ev_enc: list = []
        self._ev_recv: list = []
        self._ev_tail = None
        self._dec_ws = None
        self._dec_retired: list = []  # decode workspaces outgrown during the call in flight
        self._ev_start = None
        self._dec_round = -1
        self._dec_used = False
        self._in_pipeline = False

    def set_stream(self, stream) -> None:
        self._stream = cupy_stream(stream)

    def held(self) -> list:
        """Every buffer the engine holds now (what a graph recorded on it uses): device
        buffers, and the RAW headers' pinned host memory."""
        return [*self._work.values(), self._encode_ws, self._dec_ws, *self._dec_retired,
                *self._decode_ws.values(), *self._raw_headers.values()]

    def workspace(self, role: str, nbytes: int):
        """A reusable uint8 device buffer of ``nbytes`` (grown, never shrunk).

        Allocated and zeroed on this engine's stream, not on CuPy's current one (usually
        the legacy default stream, which non-blocking streams do not wait for): the
        zeroing is then ordered before every use (the caller's stream directly, the
        transfer and decode streams through the round events), and CuPy's pool, which
        ties a block to the stream it was allocated on, hands a grown-out buffer to a
        new allocation only in that stream's order, i.e. after the earlier calls'
        transfers and decodes (``pipeline_finish`` made the stream wait for them).
        """
        buf = self._work.get(role)
        if buf is None or buf.size < nbytes:
            self._work.pop(role, None)
            with self._stream:
                buf = self.cp.zeros(max(nbytes, 1), dtype=self.cp.uint8)
            self._work[role] = buf
        return buf[:nbytes]

    def values_workspace(self, role: str, n: int, dtype=np.uint16):
        dt = np.dtype(dtype)
        return self.workspace(role, dt.itemsize * n).view(dt)

    def _reduce(self, stack, p: int, m: int, out) -> None:
        """The stated sum's kernel for ``out``'s element type (compiled on first use)."""
        code = value_code(out)
        kernel = self._reducers.get(code)
        if kernel is None:
            params, results, body, name = DEVICE_SUM[code]
            kernel = self._reducers[code] = self.cp.ElementwiseKernel(
                params, results, body, name,
                preamble=DEVICE_PREAMBLE)
        if code == fmt.DTYPE_FP16:
            stack, out = stack.view(self.cp.uint16), out.view(self.cp.uint16)
        kernel(stack, np.int64(p), np.int64(m), out)

    def elapsed(self, call, repeat: int) -> float:
        """Seconds per call of the device work ``call`` enqueues on this engine's stream
        (CUDA events around ``repeat`` calls in a row, after one untimed call)."""
        call()
        start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record(self._stream)
        for _ in range(repeat):
            call()
        end.record(self._stream)
        end.synchronize()
        return self.cp.cuda.get_elapsed_time(start, end) / 1e3 / repeat

    def _aligned(self, a, role: str):
        """``a`` itself if 16-byte aligned (the GPU codec's vector loads), else a bounce buffer."""
        if a.data.ptr % _ALIGN == 0:
            return a, False
        return self.values_workspace(role, a.size, a.dtype), True

    def _decode_workspace(self, slot: int, n: int):
        """One codec workspace per decode slot, so each frame's error bits survive the others."""
        ws = self._decode_ws.get(slot)
        if ws is None or not ws.fits(n):
            ws = self._decode_ws[slot] = self.gpu_workspace.Workspace(max(n, 1 << 20))
        return ws

    def encode(self, values, out, codebook: Codebook) -> None:
        """Enqueue the encoding into the start of ``out``; its length is in the frame's header."""
        src, bounced = self._aligned(values, "bounce_in")
        if bounced:
            self.copy(src, values)
        if self._encode_ws is None or not self._encode_ws.fits(values.size):
            self._encode_ws = self.gpu_workspace.Workspace(max(int(values.size), 1 << 20))
        self.gpu.encode_into(src, out, codebook, self._stream, checksum=self.checksum,
                             workspace=self._encode_ws, **_typed(values))

    def decode(self, frame, out, slot: int = 0) -> None:
        """Enqueue the decode of one frame into ``out`` on the caller's stream (calibration;
        the collectives decode with ``decode_frame``); its error bits stay in the workspace."""
        dst, bounced = self._aligned(out, "bounce_out")
        ws = self._decode_workspace(slot, out.size)
        self.gpu.decode_into(frame, dst, self._stream, workspace=ws, **_typed(out))
        if bounced:
            self.copy(out, dst)

    def copy(self, dst, src) -> None:
        with self._stream:
            dst[...] = src

    def reduce_sum(self, stack, out) -> None:
        p, m = stack.shape
        if m == 0:
            return
        with self._stream:
            self._reduce(stack.reshape(-1), p, m, out)

    def divide(self, out, p: int) -> None:
        """out = AVG's division of the stated sum by ``p`` (``reduction.DEVICE_DIVIDE``), on the
        caller's stream."""
        if out.size == 0:
            return
        code = value_code(out)
        kernel = self._reducers.get(("divide", code))
        if kernel is None:
            params, results, body, name = DEVICE_DIVIDE[code]
            kernel = self._reducers[("divide", code)] = self.cp.ElementwiseKernel(
                params, results, body, name, preamble=DEVICE_PREAMBLE)
        v = out.view(self.cp.uint16) if code == fmt.DTYPE_FP16 else out
        with self._stream:
            kernel(v, np.float32(p), v)

    def reduce_cols(self, stage, p: int, m: int, lo: int, hi: int, out) -> None:
        """out[lo:hi] = the stated reduction of columns [lo, hi) of ``stage`` seen as (p, m).

        Inside a pipelined exchange it runs on the decode stream, right after the
        round's decodes; otherwise on the caller's stream.
        """
        if hi <= lo:
            return
        if self._in_pipeline and self._dec_round < 0:
            self._dec_after_caller()  # no round was received yet (one rank): stage is the caller's
        with (self._dec if self._in_pipeline else self._stream):
            # row r of the columns starts at stage[lo + r * m]: the kernel strides rows by m
            self._reduce(stage[lo:], p, m, out[lo:hi])

    # -- hooks of exchange.slot_exchange ------------------------------------------------------
    # Round k: encode (and spill-out) on the caller's stream, then event enc[k]; the transfer
    # stream waits for enc[k], moves the round, records recv[k]; the decode stream waits for
    # recv[k], runs the spill-in, decodes (and reduces). Buffers of different rounds never
    # overlap, so no round waits for another one's decode. The host reads nothing back.
    def pipeline_begin(self, rounds: int, p: int) -> None:
        cp = self.cp
        if self._xfer is None:
            self._xfer = cp.cuda.Stream(non_blocking=True)
            self._dec = cp.cuda.Stream(non_blocking=True)
            self._ev_tail = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
            self._ev_start = cp.cuda.Event(disable_timing=True)
        while len(self._ev_enc) < rounds:
            self._ev_enc.append(cp.cuda.Event(disable_timing=True))
            self._ev_recv.append(cp.cuda.Event(disable_timing=True))
        self._dec_round = -1
        self._dec_used = False
        self._dec_retired = []
        self._in_pipeline = True

    def _dec_after_caller(self) -> None:
        """Order the decode stream after everything enqueued on the caller's stream so far."""
        self._ev_start.record(self._stream)
        self._dec.wait_event(self._ev_start)

    def encoded(self, k: int) -> None:
        self._ev_enc[k].record(self._stream)

    def transfer_stream(self, k: int):
        self._xfer.wait_event(self._ev_enc[k])
        return self._xfer

    def received(self, k: int) -> None:
        self._ev_recv[k].record(self._xfer)

    def decode_frame(self, frame, out, k: int) -> str | None:
        """Enqueue one decode of round ``k`` on the decode stream; errors come at the end."""
        if self._dec_round != k:
            self._dec.wait_event(self._ev_recv[k])
            self._dec_round = k
        before = self._work.get("bounce_out")
        dst, bounced = self._aligned(out, "bounce_out")
        if bounced and self._work.get("bounce_out") is not before:
            self._dec_after_caller()  # the bounce buffer was just allocated (zeroed) on the caller's stream
        if self._dec_ws is None or not self._dec_ws.fits(out.size):
            if self._dec_ws is not None and self._dec_used:
                # decodes of this call are still queued on it: keep it, and its error bits
                self._dec_retired.append(self._dec_ws)
            self._dec_ws = self.gpu_workspace.Workspace(max(int(out.size), 1 << 20))
        self.gpu.decode_into(frame, dst, self._dec, workspace=self._dec_ws, **_typed(out))
        self._dec_used = True
        if bounced:
            with self._dec:
                out[...] = dst
        return None

    def _raw_header(self, key: tuple):
        """The RAW frame header of ``key`` (size, type) in pinned host memory, made once and
        kept while the engine lives: a copy enqueued earlier may read it at any time, so none
        is freed (headers share pinned chunks of ``RAW_CHUNK`` each)."""
        hdr = self._raw_headers.get(key)
        if hdr is None:
            h = raw_header(*key)
            if self._raw_chunk is None or self._raw_chunk.size - self._raw_used < h.nbytes:
                n = RAW_CHUNK * h.nbytes
                self._raw_chunk = np.frombuffer(self.cp.cuda.alloc_pinned_memory(n), np.uint8, n)
                self._raw_used = 0
            hdr = self._raw_chunk[self._raw_used:self._raw_used + h.nbytes]
            hdr[:] = h
            self._raw_used += h.nbytes
            self._raw_headers[key] = hdr
        return hdr

    def encode_slot(self, values, region, raw: bool = False) -> None:
        """Enqueue the frame of ``values`` into ``region[SLOT_HEADER:]``, its codebook chosen on
        the device from ``values`` (BF16, FP32; FP16 from a sample, ``_sampled_codebook``).
        ``raw``: a RAW frame, two copies (its header, from pinned host memory kept per size and
        type, then the values), no codec kernel."""
        if raw:
            hdr = self._raw_header((int(values.size), value_code(values)))
            at = SLOT_HEADER + hdr.size
            with self._stream:
                region[SLOT_HEADER:at].set(hdr, stream=self._stream)
                region[at:at + values.nbytes] = values.view(self.cp.uint8)
            return
        src, bounced = self._aligned(values, "bounce_in")
        if bounced:
            self.copy(src, values)
        if self._encode_ws is None or not self._encode_ws.fits(values.size):
            self._encode_ws = self.gpu_workspace.Workspace(max(int(values.size), 1 << 20))
        out = region[SLOT_HEADER:]
        if values.dtype == np.float16:
            self.gpu.encode_into(src, out, self._sampled_codebook(values), self._stream,
                                 checksum=self.checksum, workspace=self._encode_ws, **_typed(values))
        else:
            self.gpu.encode_chosen_into(src, out, self._stream, checksum=self.checksum,
                                        workspace=self._encode_ws)

    def _sampled_codebook(self, values) -> Codebook:
        """FP16's codebook on the slot path, with no host wait: the strided sample is copied to
        pinned memory on the stream (every ``CODEBOOK_REFRESH`` calls on a buffer) and taken in
        once that copy has finished (an event query, never a wait); until then the buffer's
        last codebook, at first ``from_sigma(0.02)``. A codebook a call or two old costs ratio,
        never bits (every frame carries its own)."""
        key = (int(values.data.ptr), int(values.size))
        st = self._sampled.get(key)
        if st is None:
            if len(self._sampled) >= 64:
                self._sampled.pop(next(iter(self._sampled)))
            pinned = np.frombuffer(self.cp.cuda.alloc_pinned_memory(2 * SAMPLE_SIZE), np.uint16,
                                   count=SAMPLE_SIZE)
            st = self._sampled[key] = [Codebook.from_sigma(0.02, fmt.DTYPE_FP16), None, pinned, 0, 0]
        cb, event, pinned, calls, count = st
        if event is not None and event.done:
            st[0] = cb = Codebook.from_sample(pinned[:count], dtype=fmt.DTYPE_FP16)
            st[1] = event = None
        st[3] = calls + 1
        if event is None and calls % CODEBOOK_REFRESH == 0:
            stride = max(1, int(values.size) // SAMPLE_SIZE)
            with self._stream:
                sample = values.view(self.cp.uint16)[::stride][:SAMPLE_SIZE].copy()
            sample.get(stream=self._stream, out=pinned[:sample.size], blocking=False)
            st[1] = self.cp.cuda.Event(disable_timing=True)
            st[1].record(self._stream)
            st[4] = int(sample.size)
        return cb

    def encode_stream(self):
        """The stream the encodes (and the spill-out kernel after them) run on: the caller's."""
        return self._stream

    def decode_stream(self, k: int):
        """The decode stream, ordered after round ``k``'s transfer."""
        if self._dec_round != k:
            self._dec.wait_event(self._ev_recv[k])
            self._dec_round = k
        return self._dec

    def pipeline_finish(self, record=None) -> None:
        """End the pipeline without reading anything back: ``record(decode stream, workspace)``
        for every decode workspace this call used (what takes their sticky error bits into the
        communicator's error word, enqueued on the decode stream), then the caller's stream
        waits for the transfer and decode streams, those reads included (a workspace retired
        here goes back to the pool in the caller's stream order, after them)."""
        self._in_pipeline = False
        if self._dec_used and record is not None:
            for ws in (*self._dec_retired, self._dec_ws):
                record(self._dec, ws)
        self._dec_retired = []
        x_done, d_done = self._ev_tail
        x_done.record(self._xfer)
        d_done.record(self._dec)
        self._stream.wait_event(x_done)
        self._stream.wait_event(d_done)

    def sync(self) -> None:
        self._stream.synchronize()


def _typed(values) -> dict:
    """The codec's ``dtype=`` for a collective's array: BF16 (uint16) and FP32 (float32) by
    their dtype alone; nothing else is passed, so BF16 calls keep the codec's fast path."""
    return {"dtype": "float16"} if values.dtype == np.float16 else {}
