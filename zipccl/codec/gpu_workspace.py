"""Workspaces and the per-signature plan cache of the GPU codec.

A ``Workspace`` is the device scratch of the look-back scan and the counters (8 bytes per 4096
values + 256 bytes). One serves any number of calls in stream order; two streams running at once
need two. Calls that pass none use the one cached per (device, stream), grown on demand.

A call's plan (``kernels/plan.py``) is built once per signature: sizes, workspace, codebook,
flags and shape, with the header template ``_template``. Later calls with the same signature
only point the plan at their buffers and launch it.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

from .. import format as fmt
from ..format import errors
from .gpu_arrays import _stream_key
from .gpu_route import _common_slots, _current_device, _device_pointer, _kernels, _launch


class Workspace:
    """Device scratch for the look-back scan and the counters of a sequence of calls.

    >>> ws = Workspace(1 << 20)  # needs a GPU  # doctest: +SKIP
    """

    def __init__(self, max_elements: int):
        runtime = _kernels()[3]
        self.max_blocks = max(1, -(-int(max_elements) // fmt.BLOCK))
        self.array = runtime.new_workspace_array(self.max_blocks)
        self.device = runtime.current_device_id()
        self.count = _common_slots() + self.max_blocks
        self.ptr = _device_pointer(self.array)

    def fits(self, n: int) -> bool:
        return -(-int(n) // fmt.BLOCK) <= self.max_blocks

    def _slots(self, stream=None) -> np.ndarray:
        """The counter slots, on the host (waits for ``stream``: a synchronisation)."""
        _common, _, _, runtime, _ = _kernels()
        if runtime.SIMULATOR:
            return runtime.to_host(self.array, _common.WS_SLOTS, runtime.stream(stream))
        raw = _launch().pinned().read(self.ptr, 8 * _common.WS_SLOTS, _stream_key(stream))
        return raw.view(np.int64).copy()

    def sticky_error(self, stream=None) -> int:
        """OR of the error bits of every decode on this workspace since it was made. Synchronises."""
        return int(self._slots(stream)[_kernels()[0].WS_ERR_STICKY])

    def last_error(self, stream=None) -> int:
        """Error bits of the last decode on this workspace (0 = valid). Synchronises."""
        return int(self._slots(stream)[_kernels()[0].WS_ERR_LAST])

    def last_frame_len(self, stream=None) -> int:
        """Length of the last frame encoded with this workspace. Synchronises."""
        return int(self._slots(stream)[_kernels()[0].WS_FLEN])

    @staticmethod
    def describe(bits: int) -> str:
        """The error bits of ``last_error`` in words."""
        return errors.describe(bits, errors.FRAME_ERRORS)


_WORKSPACES: dict[tuple[int, int], Workspace] = {}


def default_workspace(stream, n: int) -> Workspace:
    """The cached workspace of (current device, stream), grown to hold n values."""
    key = (_current_device(), _stream_key(stream))
    ws = _WORKSPACES.get(key)
    if ws is None or not ws.fits(n):
        ws = _WORKSPACES[key] = Workspace(max(n, fmt.BLOCK * 256))
    return ws


@lru_cache(maxsize=512)
def _template(n: int, shape: tuple[int, ...], exponents: tuple[int, ...] | None,
              dtype: int = fmt.DTYPE_BF16):
    """(16 header words with n_escapes, frame_len, checksum, flags and CRC left 0, CRC-32 of
    its first 124 bytes, codebook as int). ``exponents=None``: the codebook is chosen on
    the device; its bytes are left 0 here (the encoder fills them in and in the CRC) and
    the codebook int is -1, which tells the encoder to read it from the workspace."""
    h = fmt.Header(n=n, n_escapes=0, frame_len=0, flags=0,
                   codebook=tuple(range(fmt.CODEBOOK_SIZE)) if exponents is None else exponents,
                   shape=shape, dtype=dtype)
    raw = bytearray(h.pack())
    raw[fmt.HEADER_SIZE - 4:] = bytes(4)
    cb64 = -1
    if exponents is None:
        at = _CODEBOOK_AT
        raw[at:at + fmt.CODEBOOK_SIZE] = bytes(fmt.CODEBOOK_SIZE)
    else:
        cb64 = int.from_bytes(bytes(exponents), "little")
    words = tuple(int(w) for w in np.frombuffer(bytes(raw), dtype="<i8"))
    return words, zlib.crc32(bytes(raw[:fmt.HEADER_SIZE - 4])), cb64


_CODEBOOK_AT = fmt.CODEBOOK_AT


# Plans of the lean launch route, keyed by what a launch's grid and parameters depend on
# besides the buffers' addresses (sizes, workspace and so device, codebook, flags, shape): a call
# retargets the plan at its buffers (a few slot writes) and launches it. A plan holds its
# workspace, so a workspace's memory is never reused while a plan points at it. Plans are
# shared by every caller of the same key: a call retargets and launches without yielding,
# so calls from one thread at a time (or on different workspaces) never see each other's
# pointers.
_PLANS: dict[tuple, object] = {}
_MAX_PLANS = 4096


def _remember(key: tuple, plan):
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def launch_kept(key: tuple, make, a_ptr: int, b_ptr: int, stream: int) -> None:
    """Launch the plan kept under ``key`` (``make()`` builds it the first time) from ``a_ptr``
    (values or frame) to ``b_ptr`` on ``stream``."""
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember(key, make())
    plan.retarget(a_ptr, b_ptr)
    plan.launch(stream)


def _check_workspace(ws: Workspace, n: int, lay: fmt.Layout) -> None:
    if not ws.fits(n):
        raise ValueError(f"workspace holds {ws.max_blocks} blocks; {n} values need {lay.n_blocks}")


# What the public compress / decompress keep per signature (``gpu.py``'s ``_Kept``: the
# workspace, the plans, the output's size and kind, the header a frame is checked against),
# keyed by the argument kinds, sizes, stream, device and whether ``out=`` was given. A call
# that finds its key only takes its buffers' pointers, allocates its output and launches.
_CALLS: dict[tuple, object] = {}


def _keep(key: tuple, kept):
    if len(_CALLS) >= _MAX_PLANS:
        _CALLS.clear()
    _CALLS[key] = kept
    return kept


def _first_slots(plan) -> tuple:
    """(parameter values, item-count slot, itemsize) of every array argument that names a
    plan's first buffer (a decoder's frame, seen as words of 1, 2, 4 or 8 bytes). An array
    argument is packed as ``launch.Params`` says: count, itemsize, pointer, shape, stride; its
    shape slot follows the pointer."""
    return tuple((step.params.vals, slot - 2, int(step.params.vals[slot - 1]))
                 for step in plan.steps for slot in step.first)


def _resize_first(slots: tuple, nbytes: int) -> None:
    """Point the arguments ``_first_slots`` found at a first buffer of ``nbytes`` bytes (a
    plan of a private owner only: a shared plan's key names its sizes)."""
    for vals, at, item in slots:
        vals[at] = vals[at + 3] = nbytes // item
