"""The GPU codec's no-sync entry points on the CPU codec, for device-path tests without a GPU.

``zipccl.comm.pipeline.DeviceEngine`` codes frames with ``zipccl.codec.gpu``
(``encode_into`` / ``decode_into``) and ``zipccl.codec.gpu_workspace`` (``Workspace``).
With ``fake_cupy`` as CuPy the real kernels run only in Numba's simulator, which takes
minutes for a few thousand values (``mpi_device_sim.py`` does that, marked slow).
``install()`` puts this module in their place: the same signatures and workspace
semantics (the frame length is read from the header the encoder wrote, decode errors land
in the workspace's error slots and are read back later), with the bytes made by
``zipccl.codec.cpu``, which writes the same frames. So the device engine runs exactly its
GPU code path.

``track`` is called with every operation's stream and the byte ranges it reads
and writes (``stream_order.py`` checks them for happens-before); by default it
does nothing.
"""

from __future__ import annotations

import sys

import numpy as np

from zipccl import format as fmt
from zipccl.codebook import choose_codebook
from zipccl.codec import cpu
from zipccl.format import errors
from zipccl.kernels import _common


def track(stream, what: str, reads=(), writes=(), host_waits: bool = False) -> None:
    """Hook: one device operation on ``stream`` touching (lo, hi) byte ranges (default: nothing)."""


def _span(a) -> tuple[int, int]:
    lo = np.asarray(a).__array_interface__["data"][0]
    return lo, lo + np.asarray(a).nbytes


class Workspace:
    """Like ``codec.gpu_workspace.Workspace``: counters the kernels update, error bits they leave."""

    def __init__(self, max_elements: int):
        self.max_blocks = max(1, -(-int(max_elements) // fmt.BLOCK))
        self.array = np.zeros(_common.WS_STATUS + self.max_blocks, np.int64)

    def fits(self, n: int) -> bool:
        return -(-int(n) // fmt.BLOCK) <= self.max_blocks

    def _slots(self, stream=None) -> np.ndarray:
        track(stream, "workspace read-back", reads=[_span(self.array)], host_waits=True)
        return self.array[:_common.WS_SLOTS].copy()

    def last_error(self, stream=None) -> int:
        return int(self._slots(stream)[_common.WS_ERR_LAST])

    def sticky_error(self, stream=None) -> int:
        return int(self._slots(stream)[_common.WS_ERR_STICKY])

    def last_frame_len(self, stream=None) -> int:
        return int(self._slots(stream)[_common.WS_FLEN])

    @staticmethod
    def describe(bits: int) -> str:
        return errors.describe(bits, errors.FRAME_ERRORS)


def _code(values, dtype) -> int:
    """The element type the real codec reads from ``values`` (``element_code``'s rules)."""
    if dtype is not None:
        return fmt.dtype_code(dtype)
    return fmt.DTYPE_FP32 if np.asarray(values).dtype.itemsize == 4 else fmt.DTYPE_BF16


def _patterns(values, code: int) -> np.ndarray:
    return np.asarray(values).view(np.uint32 if code == fmt.DTYPE_FP32 else np.uint16)


def encode_into(bits, out, codebook, stream=None, checksum=False, shape=None, workspace=None,
                dtype=None):
    track(stream, "encode kernels", reads=[_span(bits), _span(workspace.array)],
          writes=[_span(out), _span(workspace.array)])
    code = _code(bits, dtype)
    frame = cpu.encode(_patterns(bits, code), codebook, (bits.size,), checksum, dtype=code)
    np.asarray(out)[:frame.size] = frame
    workspace.array[_common.WS_FLEN] = frame.size


def encode_chosen_into(bits, out, stream=None, checksum=False, shape=None, workspace=None,
                       dtype=None):
    """The device's codebook choice is ``choose_codebook`` of the strided sample, bit for bit."""
    code = _code(bits, dtype)
    if code == fmt.DTYPE_FP16:
        raise ValueError("the device codebook choice covers BF16 and FP32; FP16 needs a codebook")
    cb = choose_codebook(_patterns(bits, code), dtype=code).codebook
    encode_into(bits, out, cb, stream, checksum, shape, workspace, dtype)


def decode_into(frame, out, stream=None, workspace=None, dtype=None):
    track(stream, "decode kernels", reads=[_span(frame), _span(workspace.array)],
          writes=[_span(out), _span(workspace.array)])
    f = np.asarray(frame)
    err = 0
    try:
        h = fmt.parse_header(f)
        code = _code(out, dtype)
        if h.dtype != code:
            raise ValueError("element type")  # the kernels' header check (ERR_HEADER)
        bits, _ = cpu.decode(f[:h.frame_len])
        if bits.size != out.size:
            raise ValueError("element count")
        _patterns(out, code)[...] = bits.reshape(-1)
    except ValueError as e:
        err = errors.ERR_CHECKSUM if "checksum" in str(e) else errors.ERR_HEADER
    workspace.array[_common.WS_ERR_LAST] = err
    workspace.array[_common.WS_ERR_STICKY] |= err


def install():
    """Make ``zipccl.codec.gpu`` and ``zipccl.codec.gpu_workspace`` this module (before the
    device engine imports them)."""
    import zipccl.codec

    mod = sys.modules[__name__]
    for name in ("gpu", "gpu_workspace"):
        sys.modules[f"zipccl.codec.{name}"] = mod
        setattr(zipccl.codec, name, mod)
    return mod
