"""GPU decoder of BF16 and FP32 frames (the block decoder): a zipccl frame -> its values,
accepting exactly what ``codec.reference.decode`` accepts, never writing outside the output.

Two launches, no host synchronisation: ``decode_tiles`` (``decode_tiles32`` for FP32), a
persistent grid whose blocks decode a tile each from the ticket counter and place its escapes
by the look-back scan, then ``decode_finish`` (FP32: ``decode_fp16.wide_finish``), one block
that checks the header CRC, the escape total and the payload checksum, publishes the call's
error bits and readies the workspace for the next call. Large frames take the warp decoder
(``decode_warps``). How a tile is decoded and why: docs/KERNELS.md, "The block decoder"; the
versions that led here and their measurements: experiments/kernels/NOTES.md.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from ..format.errors import ERR_CHECKSUM, ERR_HEADER, ERR_HEADER_CRC, ERR_TOTAL
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from . import decode_tile as parts
from . import decode_warps as dw
from . import launch as launch_route
from . import plan as plans
from ._common import (
    BLOCKS_PER_SM,
    LOW32,
    TPB,
    WS_CSUM,
    WS_ERR,
    advance_epoch,
    block_escapes,
    block_ticket,
    decoder_resolve,
    dev,
    exclusive_scan8,
    flush_checksum,
    grid_size,
    publish_errors,
    warp_sum,
    warp_xor,
)
from .compat import atomic_read, wrap64
from .decode_tile import FP32_BLOCKS_PER_SM, FP32_LO_AHEAD
from .layout import LAY_FIELDS, MAGIC_BF16, WIDE_FIELDS, header_ok, layout_fields, layout_tuple


def _tiles_kernel(fp32: bool, lo_ahead: int = 2, blocks_per_sm: int = BLOCKS_PER_SM,
                  scanned: bool = False):
    """The tile kernel for BF16 output (``fp32`` False) or FP32 output (True; module
    docstring, "FP32"). ``fp32`` is a compile-time constant: each kernel holds only its path.
    ``lo_ahead`` (FP32): how many rounds' low halves are loaded before the stores of the first
    of them (1, 2 or 4); ``blocks_per_sm``: the launch bounds' resident blocks (8: at most 64
    registers); ``scanned``: the tiles' escape prefixes were written to the status words by a
    scan of the stored counts launched before (experiments/kernels/v6_scan.py), so no tile
    publishes or looks back. experiments/kernels/NOTES.md compares them."""
    magic, lo_of, code, patch = parts.tile_parts(fp32, lo_ahead)
    first_tile = parts.block_start(magic, scanned)
    per_ticket = 8 if fp32 else 4  # RAW copy: 16-byte units per thread and tile

    @dev
    def raw_tiles(f8, f32, out32, out16, ws, smem, tile, tid, n_blocks, units, do_cs):
        """Whether the frame is RAW (smem[3], from ``block_start``); if so, copy the tiles taken
        from the ticket counter, 4096 values per ticket."""
        if smem[3] == 0:
            return False
        cs = np.int64(0)
        while tile < n_blocks:
            g = tile * (TPB * per_ticket) + tid
            for _ in range(per_ticket):
                cs = parts.raw_unit(f8, f32, out32, out16, g, units, do_cs, cs)
                g += TPB
            tile = block_ticket(ws, smem, tid)
        if do_cs:
            flush_checksum(ws, cs, tid & 31)
        return True

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def decode_tiles(f8, f32, f64, out32, out16, ws, lay):
        """Decode tiles taken from the ticket counter, or copy a RAW frame (docs/KERNELS.md,
        "The block decoder")."""
        n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
        lo_off = lo_of(lay)
        units = 2 * n if fp32 else n  # the RAW payload in 2-byte units
        spread = cuda.shared.array(256, dtype=np.uint32)
        smem = cuda.shared.array(16, dtype=np.int64)
        if not first_tile(f8, f32, f64, ws, lay, spread, smem):
            return  # the header does not fit: write nothing
        tile, epoch, nesc, do_cs, tid, lane, warp = parts.block_state(smem)
        if raw_tiles(f8, f32, out32, out16, ws, smem, tile, tid, n_blocks, units, do_cs):
            return

        cs = np.int64(0)
        cba, cbb = parts.codebook_words(smem[6])
        err = np.int64(0)
        ra, rb, rc, rd = parts.load_tile(f8, f64, tile if tile < n_blocks else 0, warp, lane, n, planes_off,
                                    stride, pwords)
        while tile < n_blocks:
            cnt = smem[7]
            craw = smem[8]
            g = tile * 512 + warp * 128 + lane
            escm, cntp, cs = code(ra, rb, rc, rd, g, spread, cba, cbb, f8, f32, out32, out16, lo_off,
                                  planes_off, stride, pwords, do_cs, cs)
            ex, w0t, w1t, w2t, w3t = exclusive_scan8(cntp, lane)
            woff, btot = block_escapes(smem, 9, warp, lane, w0t, w1t, w2t, w3t)  # A
            if warp == 0:
                err, cs = decoder_resolve(f32, ws, smem, 13, tile, epoch, lane, btot, cnt, craw, nesc, n,
                                          n_blocks, counts_off, do_cs, cs, err, scanned)
            cuda.syncthreads()  # B: this tile's prefix; the next tile's ticket and count
            prefix = smem[13]
            nxt = smem[0]
            if nxt < n_blocks:  # the next tile's loads go out before this tile's escapes
                ra, rb, rc, rd = parts.load_tile(f8, f64, nxt, warp, lane, n, planes_off, stride, pwords)
            cs, err = patch(f8, out16, escm, ex, w0t, w1t, w2t, prefix + woff, g, eo, nesc, do_cs, cs, err)
            tile = nxt
        if err != 0:
            cuda.atomic.or_(ws, WS_ERR, err)
        if do_cs:
            flush_checksum(ws, cs, lane)

    return decode_tiles


decode_tiles = _tiles_kernel(False)
decode_tiles32 = _tiles_kernel(True, FP32_LO_AHEAD, FP32_BLOCKS_PER_SM)


@cuda.jit
def decode_finish(f8, f32, f64, ws, lay, crc_zero, crc_tab):
    """Header CRC, escape total, payload checksum; publish the call's errors (one block)."""
    n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
    smem = cuda.shared.array(8, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    ok, raw, nesc, has_cs = header_ok(f64, f8.shape[0], lay, MAGIC_BF16)
    err = np.int64(0)
    if not ok:
        err = ERR_HEADER
    # payload bytes no tile reads: the padding of the static part
    cs = np.int64(0)
    if ok and raw == 0 and has_cs != 0:
        regions_lo0 = fmt.HEADER_SIZE + ((n + 7) & ~np.int64(7))
        i = regions_lo0 + 4 * tid
        if i < planes_off:
            cs = wrap64(cs + np.int64(f32[i >> 2]) * (2 * ((i - fmt.HEADER_SIZE) >> 2) + 1))
        for k in range(3):
            i = planes_off + k * stride + 4 * pwords + 4 * tid
            if i < planes_off + (k + 1) * stride:
                cs = wrap64(cs + np.int64(f32[i >> 2]) * (2 * ((i - fmt.HEADER_SIZE) >> 2) + 1))
        i = counts_off + 4 * n_blocks + 4 * tid
        if i < eo:
            cs = wrap64(cs + np.int64(f32[i >> 2]) * (2 * ((i - fmt.HEADER_SIZE) >> 2) + 1))
    # CRC-32 of header bytes 0..123: bit i (i < 992) by thread i % 128, all loads at once
    crc = np.int64(0)
    for k in range(8):
        i = tid + TPB * k
        if i < 992:
            crc ^= crc_tab[i] & -((f64[i >> 6] >> (i & 63)) & 1)
    crc = warp_xor(crc)
    cs = warp_sum(cs)
    if lane == 0:
        smem[warp] = cs
        smem[4 + warp] = crc
    cuda.syncthreads()
    if tid < 32:
        crc = smem[4] ^ smem[5] ^ smem[6] ^ smem[7] ^ crc_zero
        v = np.int64(0)
        if lane < 8:
            v = atomic_read(ws, WS_CSUM + lane)
        total = warp_sum(v)
        if lane == 0:
            if crc != ((f64[15] >> 32) & LOW32):
                err |= ERR_HEADER_CRC
            if ok and has_cs != 0:
                total = wrap64(total + smem[0] + smem[1] + smem[2] + smem[3])
                if total != f64[4]:
                    err |= ERR_CHECKSUM
            if ok and raw == 0 and n_blocks == 0 and nesc != 0:
                err |= ERR_TOTAL
        publish_errors(ws, err, lane)
    advance_epoch(ws, tid)


def launch(f8, f32, f64, out32, out16, ws, lay: fmt.Layout, crc_zero: int, crc_tab, stream,
           warps: bool | None = None) -> None:
    """Enqueue the decoder of the frame in ``f8`` (``f32`` / ``f64``: its first whole
    uint32 / int64 words) into the ``lay.n`` values of ``out16`` (``out32``: the first
    n & ~7 of them as uint32). Errors land in the workspace (``_common.WS_ERR_LAST``);
    nothing here synchronises. ``warps``: the warp-a-tile decoder (``decode_warps``) or this
    module's block decoder; None: ``decode_warps.use_warps`` decides by the tile count.
    """
    lt = layout_tuple(lay)
    if lay.n_blocks:
        if dw.chosen(lay.n_blocks, False, warps):
            dw.launch(f8, f32, f64, out32, out16, ws, lt, lay.n_blocks, False, stream)
        else:
            decode_tiles[grid_size(lay.n_blocks), TPB, stream](f8, f32, f64, out32, out16, ws, lt)
    decode_finish[1, TPB, stream](f8, f32, f64, ws, lt, crc_zero, crc_tab)


# -- the lean route (see launch.py): compiled once per device, launched from packed parameters --
_A = launch_route.array
TILES = launch_route.Kernel(decode_tiles, (_A(np.uint8), _A(np.uint32), _A(np.int64), _A(np.uint32),
                                           _A(np.uint16), _A(np.int64), launch_route.int_tuple(LAY_FIELDS)))
TILES32 = launch_route.Kernel(decode_tiles32, (_A(np.uint8), _A(np.uint32), _A(np.int64), _A(np.uint32),
                                               _A(np.uint16), _A(np.int64),
                                               launch_route.int_tuple(WIDE_FIELDS)))
FINISH = launch_route.Kernel(decode_finish, (_A(np.uint8), _A(np.uint32), _A(np.int64), _A(np.int64),
                                             launch_route.int_tuple(LAY_FIELDS), launch_route.I64,
                                             _A(np.int64)))


class Plan(plans.Plan):
    """The launches of one decode with everything but the stream fixed: the frame buffer
    ``f_ptr`` (``f_nbytes``), the n output values at ``out_ptr`` and the workspace. Built
    once per buffer set; ``launch(stream)`` is two driver calls (three for the warp-a-tile
    decoder: ``warps`` as in ``launch``), ``retarget(f_ptr, out_ptr)`` points it at other
    buffers of the same sizes.
    """

    __slots__ = ()

    def __init__(self, device: int, f_ptr: int, f_nbytes: int, out_ptr: int, lay: fmt.Layout,
                 ws_ptr: int, ws_count: int, crc_zero: int, crc_ptr: int, crc_count: int,
                 warps: bool | None = None):
        steps = self.steps_of(device, f_ptr, f_nbytes, out_ptr, lay, (ws_ptr, ws_count), crc_zero,
                              (crc_ptr, crc_count), warps)
        super().__init__(device, tuple(steps))

    @staticmethod
    def steps_of(device: int, f_ptr: int, f_nbytes: int, out_ptr: int, lay: fmt.Layout, ws, crc_zero: int,
                 crc, warps: bool | None) -> list[plans.Step]:
        """The plan's steps (``ws``, ``crc``: the workspace and the CRC table as (pointer, count))."""
        n = lay.n
        lt = layout_tuple(lay)
        frame = ((f_ptr, f_nbytes), (f_ptr, f_nbytes // 4), (f_ptr, f_nbytes // 8))
        outs = ((out_ptr, (n & ~7) // 2), (out_ptr, n))
        steps = []
        if dw.chosen(lay.n_blocks, False, warps):
            steps.extend(dw.steps(device, frame, outs, ws, lt, lay.n_blocks, False))
        elif lay.n_blocks:  # both kernels start with the frame (f8, f32, f64); then (out32, out16)
            steps.append(plans.Step(TILES, device, grid_size(lay.n_blocks), (*frame, *outs, ws, lt),
                                    (0, 1, 2), (3, 4)))
        steps.append(plans.Step(FINISH, device, 1, (*frame, ws, lt, crc_zero, crc), (0, 1, 2), ()))
        return steps
