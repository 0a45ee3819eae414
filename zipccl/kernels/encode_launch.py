"""The encoder's host side: the grids and arguments of ``encode``'s two kernels, by both routes.

``launch`` / ``launch_wide`` (BF16 / FP32 and FP16) enqueue them through Numba's dispatcher: the
CUDA simulator's route, and the numbered kernel versions' in experiments/kernels/. ``Plan`` /
``WidePlan`` are the lean route's (``launch.py``, ``plan.py``): built once per buffer set, their
parameters packed once, then pointed at each call's buffers and launched. ``TILES``,
``TILES32``, ``TILES16`` and ``FINISH`` are the kernels' ``launch.Kernel`` entries, which
``python -m zipccl warmup`` builds ahead.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from . import compat
from . import launch as launch_route
from . import plan as plans
from ._common import TPB, grid_size
from .encode import PER_TICKET, encode_finish, encode_tiles, encode_tiles16, encode_tiles32
from .layout import FP32, LAY_FIELDS, WIDE_FIELDS, finish_tuple, layout_tuple, wide_tuple

# grid of encode_finish: enough to copy a RAW frame at memory speed (2 under the simulator,
# where every block costs 128 Python threads, and 2 still exercises the last-block hand-off)
FINISH_MAX_BLOCKS = 2 if compat.SIMULATOR else 1024


def launch(x32, x16, out8, out32, out64, ws, lay: fmt.Layout, hdr: tuple[int, ...], crc_base: int,
           crc_tab, cb64: int, checksum: bool, stream, tiles_kernel=None,
           per_ticket: int = PER_TICKET[fmt.DTYPE_BF16]) -> None:
    """Enqueue the encoder for the ``lay.n`` values of ``x16`` (``x32``: the first n & ~7 of
    them as uint32) into ``out8`` (``out32`` / ``out64``: the same bytes as uint32 / int64).

    ``hdr`` is the header template (16 little-endian int64 words, with n_escapes,
    frame_len, checksum, flags and CRC zero) and ``crc_base`` the CRC-32 of its first
    124 bytes; ``cb64`` the codebook's 7 exponents as little-endian bytes. Nothing here
    synchronises. ``tiles_kernel``: another tile kernel of ``encode_tiles``' arguments (the
    versions in experiments/kernels/), which codes ``per_ticket`` escape blocks per ticket and
    status word.
    """
    lt = layout_tuple(lay)
    do_cs = 1 if checksum else 0
    force_raw = 1 if lay.static_size > lay.raw_size else 0
    tiles = 0
    if lay.n_blocks and not force_raw:
        tiles = -(-lay.n_blocks // per_ticket)
        (tiles_kernel or encode_tiles)[grid_size(tiles), TPB, stream](x32, x16, out8, out32, out64, ws, lt,
                                                                      cb64, do_cs)
    blocks = max(1, min(FINISH_MAX_BLOCKS, (lay.n + 8 * TPB - 1) // (8 * TPB)))
    encode_finish[blocks, TPB, stream](x32, x16, out8, out32, out64, ws, lt, hdr, crc_base, crc_tab,
                                       force_raw, do_cs, tiles, 1 if cb64 < 0 else 0)


# -- the lean route (see launch.py): compiled once per device, launched from packed parameters --
_A = launch_route.array
TILES = launch_route.Kernel(encode_tiles, (_A(np.uint32), _A(np.uint16), _A(np.uint8), _A(np.uint32),
                                           _A(np.int64), _A(np.int64), launch_route.int_tuple(LAY_FIELDS),
                                           launch_route.I64, launch_route.I64))
TILES32 = launch_route.Kernel(encode_tiles32, (_A(np.uint32), _A(np.uint16), _A(np.uint8), _A(np.uint32),
                                               _A(np.int64), _A(np.int64),
                                               launch_route.int_tuple(WIDE_FIELDS), launch_route.I64,
                                               launch_route.I64))
FINISH = launch_route.Kernel(encode_finish, (_A(np.uint32), _A(np.uint16), _A(np.uint8), _A(np.uint32),
                                             _A(np.int64), _A(np.int64), launch_route.int_tuple(LAY_FIELDS),
                                             launch_route.int_tuple(16), launch_route.I64, _A(np.int64),
                                             launch_route.I64, launch_route.I64, launch_route.I64,
                                             launch_route.I64))
TILES16 = launch_route.Kernel(encode_tiles16, TILES32.argtypes)


class Plan(plans.Plan):
    """The launches of one encode with everything but the stream fixed: the values at
    ``x_ptr`` (n of them), the frame buffer ``out_ptr`` (``out_nbytes``), the workspace,
    the header template, codebook and checksum flag. Built once per buffer set
    (``codec/gpu_workspace.py`` caches it); ``launch(stream)`` is two driver calls,
    ``retarget(x_ptr, out_ptr)`` points it at other buffers of the same sizes.
    """

    __slots__ = ()

    def __init__(self, device: int, x_ptr: int, out_ptr: int, out_nbytes: int, ws_ptr: int,
                 ws_count: int, lay: fmt.Layout, hdr: tuple[int, ...], crc_base: int, crc_ptr: int,
                 crc_count: int, cb64: int, checksum: bool):
        n = lay.n
        lt = layout_tuple(lay)
        do_cs = 1 if checksum else 0
        force_raw = 1 if lay.static_size > lay.raw_size else 0
        bufs = ((x_ptr, (n & ~7) // 2), (x_ptr, n), (out_ptr, out_nbytes), (out_ptr, out_nbytes // 4),
                (out_ptr, out_nbytes // 8), (ws_ptr, ws_count))
        steps = []
        tiles = 0
        if lay.n_blocks and not force_raw:  # both kernels take (x32, x16, out8, out32, out64, ...)
            tiles = -(-lay.n_blocks // PER_TICKET[fmt.DTYPE_BF16])  # tickets = status words
            steps.append(plans.Step(TILES, device, grid_size(tiles), (*bufs, lt, cb64, do_cs), (0, 1),
                                    (2, 3, 4)))
        finish_grid = max(1, min(FINISH_MAX_BLOCKS, (n + 8 * TPB - 1) // (8 * TPB)))
        steps.append(plans.Step(FINISH, device, finish_grid, (*bufs, lt, hdr, crc_base, (crc_ptr, crc_count),
                                                              force_raw, do_cs, tiles, 1 if cb64 < 0 else 0),
                                (0, 1), (2, 3, 4)))
        super().__init__(device, tuple(steps))

# ---------------------------------------------------------------- FP32 and FP16 frames
# The same two kernels: the tile kernel's FP32 or FP16 build, then ``encode_finish`` with
# ``finish_tuple`` (the value count in 2-byte units: an FP32 RAW frame copies 4n bytes).


def finish_blocks(lay: fmt.Layout) -> int:
    """Blocks of ``encode_finish`` for a frame of any type (its RAW copy at memory speed)."""
    units = finish_tuple(lay)[0]
    return max(1, min(FINISH_MAX_BLOCKS, (units + 8 * TPB - 1) // (8 * TPB)))


def launch_wide(x32, x16, xu32, xu16, out8, out32, out64, ws, lay: fmt.Layout, hdr, crc_base: int,
                crc_tab, cb64: int, checksum: bool, stream) -> None:
    """``launch`` of an FP32 or FP16 frame (``lay.dtype``) through Numba's dispatcher (the
    simulator's route). ``x32`` / ``x16``: the n values as uint32 (FP32) / uint16 (FP16), the
    other one empty; ``xu32`` / ``xu16``: the same bytes as uint32 / uint16 (``finish_tuple``'s
    units: FP16's words, the RAW copy, FP32's tail); ``out*``: the frame buffer as uint8 / 32 / int64.
    """
    do_cs = 1 if checksum else 0
    raw = 1 if lay.static_size > lay.raw_size else 0
    tiles = 0
    if lay.n_blocks and not raw:
        kernel, xa, xb = (encode_tiles32, x32, xu16) if lay.dtype == FP32 else (encode_tiles16, xu32, x16)
        kernel[grid_size(lay.n_blocks), TPB, stream](xa, xb, out8, out32, out64, ws, wide_tuple(lay), cb64,
                                                     do_cs)
        tiles = lay.n_blocks
    encode_finish[finish_blocks(lay), TPB, stream](xu32, xu16, out8, out32, out64, ws, finish_tuple(lay), hdr,
                                                   crc_base, crc_tab, raw, do_cs, tiles, 1 if cb64 < 0 else 0)


class WidePlan(plans.Plan):
    """``Plan`` of an FP32 or FP16 frame (``lay.dtype``): the tile kernel's FP32 or FP16 build,
    then ``encode_finish`` with ``finish_tuple``."""

    __slots__ = ()

    def __init__(self, device: int, x_ptr: int, out_ptr: int, out_nbytes: int, ws_ptr: int,
                 ws_count: int, lay: fmt.Layout, hdr: tuple[int, ...], crc_base: int, crc_ptr: int,
                 crc_count: int, cb64: int, checksum: bool):
        n = lay.n
        units = n * fmt.ITEMSIZE[lay.dtype] // 2
        do_cs = 1 if checksum else 0
        raw = 1 if lay.static_size > lay.raw_size else 0
        out = ((out_ptr, out_nbytes), (out_ptr, out_nbytes // 4), (out_ptr, out_nbytes // 8))
        ws = (ws_ptr, ws_count)
        words = ((x_ptr, (units & ~7) // 2), (x_ptr, units))  # the values as uint32 / uint16
        steps = []
        tiles = 0
        if lay.n_blocks and not raw:
            kernel, xs = (TILES32, ((x_ptr, n), (x_ptr, 2 * n))) if lay.dtype == FP32 else (TILES16, words)
            args = (*xs, *out, ws, wide_tuple(lay), cb64, do_cs)
            steps.append(plans.Step(kernel, device, grid_size(lay.n_blocks), args, (0, 1), (2, 3, 4)))
            tiles = lay.n_blocks
        steps.append(plans.Step(FINISH, device, finish_blocks(lay), (
            *words, *out, ws, finish_tuple(lay), hdr, crc_base, (crc_ptr, crc_count), raw, do_cs, tiles,
            1 if cb64 < 0 else 0), (0, 1), (2, 3, 4)))
        super().__init__(device, tuple(steps))
