"""Device-side machinery of the collectives: CuPy buffers, the GPU codec, the stream.

``DeviceEngine`` is the device counterpart of ``collectives.HostEngine``: the
collective algorithms call the same methods (``workspace``, ``encode``,
``read_header``, ``decode``, ``reduce_sum``, ``copy``, ``sync``) and never learn
where the data lives. All device work is enqueued on the caller's CUDA stream;
the only host synchronisations are the ones the two-phase exchange needs (frame
lengths are read from headers before the escape phase).

Buffers are reused across calls (grown, never shrunk), so a steady stream of
equal-sized collectives allocates nothing after the first call. The GPU codec
(``zipccl.codec.gpu``: ``encode_into`` / ``decode_into``) codes frames on the
device; where it is missing, frames are coded on the host by the CPU codec
(correct, slow) so that device arrays always work. Chunked pipelining across
several streams builds on this engine.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from ..codebook import SAMPLE_SIZE, Codebook

_ALIGN = 16  # the GPU codec reads and writes values with 16-byte vector accesses
CODEBOOK_REFRESH = 16  # calls on one buffer between two sigma estimates

# One FP32 accumulation per element in rank order, one rounding: the definition of
# collectives.reduce_sum_bf16, on the device. __fadd_rn keeps the compiler from fusing.
_REDUCE_SRC = r"""
float acc = __uint_as_float(((unsigned int)stack[i]) << 16);
for (long long r = 1; r < p; ++r) {
    acc = __fadd_rn(acc, __uint_as_float(((unsigned int)stack[r * m + i]) << 16));
}
unsigned int u = __float_as_uint(acc);
out = isnan(acc) ? (unsigned short)0x7FC0
                 : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
"""


def _gpu_codec():
    """``zipccl.codec.gpu`` if it provides the no-sync entry points, else None."""
    try:
        from ..codec import gpu
    except ImportError:
        return None
    if hasattr(gpu, "encode_into") and hasattr(gpu, "decode_into"):
        return gpu
    return None


class DeviceEngine:
    """CuPy buffers on the current device, GPU codec (or host-codec fallback), one stream per call."""

    device = True

    def __init__(self, checksum: bool = False):
        import cupy

        self.cp = cupy
        self.checksum = bool(checksum)
        self.gpu = _gpu_codec()
        self._work: dict[str, object] = {}
        self._probe = np.zeros(0, dtype=np.uint8)
        self._pinned = None
        self._codebooks: dict[tuple[int, int], list] = {}
        self._stream = cupy.cuda.get_current_stream()
        self._reduce = cupy.ElementwiseKernel(
            "raw uint16 stack, int64 p, int64 m", "uint16 out", _REDUCE_SRC,
            "zipccl_reduce_sum_bf16")
        self._encode_ws = None
        self._decode_ws: dict[int, object] = {}
        self._used_ws: list[tuple[int, object]] = []

    @property
    def codec_name(self) -> str:
        return "gpu" if self.gpu is not None else "cpu (host fallback)"

    def set_stream(self, stream) -> None:
        from .transport import cupy_stream

        self._stream = cupy_stream(stream)

    def workspace(self, role: str, nbytes: int):
        buf = self._work.get(role)
        if buf is None or buf.size < nbytes:
            buf = self.cp.zeros(max(nbytes, 1), dtype=self.cp.uint8)
            self._work[role] = buf
        return buf[:nbytes]

    def bits_workspace(self, role: str, n: int):
        return self.workspace(role, 2 * n).view(self.cp.uint16)

    def codebook(self, bits) -> Codebook:
        """``Codebook.from_sample`` of a strided sample copied to the host (a few KiB).

        Reading the sample is a synchronisation, so the codebook of a buffer (same
        address and size) is reused for ``CODEBOOK_REFRESH`` calls, as training
        reuses its communication buffers; a stale codebook costs ratio, never bits.
        """
        key = (int(bits.data.ptr), int(bits.size))
        hit = self._codebooks.get(key)
        if hit is not None and hit[1] < CODEBOOK_REFRESH:
            hit[1] += 1
            return hit[0]
        n = int(bits.size)
        stride = max(1, n // SAMPLE_SIZE)
        sample = self.cp.asnumpy(bits[::stride][:SAMPLE_SIZE], stream=self._stream)
        cb = Codebook.from_sample(sample)
        if len(self._codebooks) >= 64:
            self._codebooks.pop(next(iter(self._codebooks)))
        self._codebooks[key] = [cb, 1]
        return cb

    def _aligned(self, a, role: str):
        """``a`` itself if 16-byte aligned (the GPU codec's vector loads), else a bounce buffer."""
        if a.data.ptr % _ALIGN == 0:
            return a, False
        return self.bits_workspace(role, a.size), True

    def _decode_workspace(self, slot: int, n: int):
        """One codec workspace per decode slot, so each frame's error bits survive the others."""
        ws = self._decode_ws.get(slot)
        if ws is None or not ws.fits(n):
            ws = self._decode_ws[slot] = self.gpu.Workspace(max(n, 1 << 20))
        return ws

    def encode(self, bits, out, codebook: Codebook) -> int | None:
        """Encode into the start of ``out``; None means "read the length from the header"."""
        if self.gpu is not None:
            src, bounced = self._aligned(bits, "bounce_in")
            if bounced:
                self.copy(src, bits)
            if self._encode_ws is None or not self._encode_ws.fits(bits.size):
                self._encode_ws = self.gpu.Workspace(max(int(bits.size), 1 << 20))
            self.gpu.encode_into(src, out, codebook, self._stream, checksum=self.checksum,
                                 workspace=self._encode_ws)
            return None
        from ..codec import cpu

        host = self.cp.asnumpy(bits, stream=self._stream)
        self._stream.synchronize()
        frame = cpu.encode(host, codebook, (host.size,), self.checksum)
        out[:frame.size].set(frame, stream=self._stream)
        return int(frame.size)

    def read_headers(self, items) -> list:
        """Headers at each (buffer, offset, capacity): all copied to pinned memory, one sync.

        Returns a Header, or the reason as a str for an invalid one.
        """
        if not items:
            return []
        hs = fmt.HEADER_SIZE
        pinned = self._pinned_headers(len(items) * hs)
        for i, (buf, offset, _) in enumerate(items):
            buf[offset:offset + hs].get(stream=self._stream, out=pinned[i * hs:(i + 1) * hs],
                                        blocking=False)
        self._stream.synchronize()
        out = []
        for i, (_, _, capacity) in enumerate(items):
            if self._probe.size < capacity:
                self._probe = np.zeros(capacity, dtype=np.uint8)  # calloc'd: untouched pages are free
            probe = self._probe[:capacity]
            probe[:hs] = pinned[i * hs:(i + 1) * hs]
            try:
                out.append(fmt.parse_header(probe))
            except ValueError as e:
                out.append(str(e))
        return out

    def _pinned_headers(self, nbytes: int) -> np.ndarray:
        if self._pinned is None or self._pinned.size < nbytes:
            mem = self.cp.cuda.alloc_pinned_memory(max(nbytes, 4096))
            self._pinned = np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 4096))
        return self._pinned

    def decode(self, frame, out, slot: int = 0) -> None:
        """Decode one frame into ``out``; device errors are read by ``decode_errors``."""
        if self.gpu is not None:
            dst, bounced = self._aligned(out, "bounce_out")
            ws = self._decode_workspace(slot, out.size)
            self.gpu.decode_into(frame, dst, self._stream, workspace=ws)
            self._used_ws.append((slot, ws))
            if bounced:
                self.copy(out, dst)
            return
        from ..codec import cpu

        host = self.cp.asnumpy(frame, stream=self._stream)
        self._stream.synchronize()
        bits, _ = cpu.decode(host)
        if bits.size != out.size:
            raise ValueError(f"frame holds {bits.size} elements, expected {out.size}")
        out.set(bits.reshape(-1), stream=self._stream)

    def decode_errors(self) -> str | None:
        """Error bits of this call's device decodes (one synchronisation), in words."""
        used, self._used_ws = self._used_ws, []
        if not used:
            return None
        self._stream.synchronize()
        for slot, ws in used:
            bits = ws.last_error(self._stream)
            if bits:
                return f"frame from rank {slot}: corrupted zipccl frame: {ws.describe(bits)}"
        return None

    def copy(self, dst, src) -> None:
        with self._stream:
            dst[...] = src

    def reduce_sum(self, stack, out) -> None:
        p, m = stack.shape
        if m == 0:
            return
        with self._stream:
            self._reduce(stack.reshape(-1), np.int64(p), np.int64(m), out)

    def sync(self) -> None:
        self._stream.synchronize()
