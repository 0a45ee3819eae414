"""GPU encoder kernels: BF16, FP32 or FP16 values -> a zipccl frame, byte-identical to
``codec.reference.encode``.

Two kernels, no host synchronisation. ``encode_tiles`` (its FP32 and FP16 builds:
``encode_tiles32``, ``encode_tiles16``; all made by ``_tiles_kernel``) is a persistent grid whose
blocks take tiles from the workspace's ticket counter, code them (``encode_tile``) and place
each tile's escapes after a decoupled look-back; BF16 takes two tiles a ticket. ``encode_finish``
decides RAW, writes a RAW frame or zeroes the padding, then writes the header and its CRC and
resets the workspace. Every position is a sum of counts, never the order of atomics, so the
frame is deterministic.

The design, step by step: docs/GPU_CODEC.md, "The encoder". Their grids and launches (both
routes): ``encode_launch``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from . import compat
from ._common import (
    BLOCKS_PER_SM,
    LOW32,
    TPB,
    WS_CODEBOOK,
    WS_CSUM,
    WS_CSUM_RAW,
    WS_DONE,
    WS_FLEN,
    WS_NESC,
    WS_STATUS,
    WS_TICKET,
    advance_epoch,
    block_escapes,
    byte_checksum,
    count_checksum,
    dev,
    encoder_resolve,
    first_ticket,
    flush_checksum,
    store_count,
    take_ticket,
    tile_prefix,
    warp_offsets,
    warp_sum,
    warp_xor,
    zero_padding,
)
from .compat import atomic_read, cp_wait0, load16, store16, wrap64
from .encode_tile import (
    TILE_WORDS,
    _code_half,
    _code_tile,
    _escapes,
    _fill_tables,
    _issue,
    _tile_words,
)
from .layout import FP16, FP32, lay_lo, lay_no_lo, layout_fields

STAGE_WORDS = 2 * TILE_WORDS  # two staging buffers per block (16 KiB of shared memory)
PER_TICKET = {fmt.DTYPE_BF16: 2, fmt.DTYPE_FP32: 1, fmt.DTYPE_FP16: 1}  # escape blocks a ticket
FP16_PLANES = fmt.N_PLANES[FP16]  # code planes and raw bit planes of an FP16 frame


@dev
def _pair_resolve(ws, out32, smem, pair, epoch, lane, c0, c1, counts_off, n_blocks, do_cs, cs):
    """Warp 0: store both tiles' escape counts, publish the pair's (status word ``pair``),
    resolve its prefix by the look-back into smem[10], take the next ticket into smem[0]."""
    t1 = 2 * pair + 1
    if t1 < n_blocks and lane == 0:
        out32[(counts_off >> 2) + t1] = c1
        if do_cs:
            cs = wrap64(cs + count_checksum(c1, counts_off, t1))
    cs = store_count(ws, out32, t1 - 1, pair, epoch, lane, c0, c0 + c1, counts_off, do_cs, cs)
    prefix = tile_prefix(ws, pair, epoch, lane, c0 + c1)
    if lane == 0:
        smem[10] = prefix
        smem[0] = take_ticket(ws)
    return cs


@dev
def _pair_loop(ws, stage, lut, rlut, pl, smem, x32, x16, out8, out32, out64, lay, pair, epoch, warp, lane,
               do_cs):
    """BF16 (docs/GPU_CODEC.md, "BF16 pairs"): code pairs of tiles from the ticket counter until none is
    left, from ``pair`` (the block's first ticket); returns the lane's checksum terms."""
    n, _, _, counts_off, eo, raw_size, _, n_blocks = layout_fields(lay)
    n_pairs = (n_blocks + 1) >> 1
    _issue(stage, 0, x32, n, 2 * pair, n_blocks, warp, lane)
    _issue(stage, 1, x32, n, 2 * pair + 1, n_blocks, warp, lane)
    cs = np.int64(0)
    while pair < n_pairs:
        cp_wait0()  # this lane's copies of the pair have landed (it reads only those)
        escm0, ex0, a0, a1, a2, a3, tcs0, g0, full0, sb0 = _code_half(
            2 * pair, 0, stage, lut, rlut, pl, x32, x16, out8, out32, out64, lay, warp, lane, do_cs)
        escm1, ex1, b0, b1, b2, b3, tcs1, g1, full1, sb1 = _code_half(
            2 * pair + 1, 1, stage, lut, rlut, pl, x32, x16, out8, out32, out64, lay, warp, lane, do_cs)
        if do_cs:
            cs = wrap64(cs + tcs0 + tcs1)
        if lane == 0:
            smem[2 + warp] = np.int64(a0 + a1 + a2 + a3)
        woff1, btot1 = block_escapes(smem, 6, warp, lane, b0, b1, b2, b3)  # A: both tiles' warp totals
        woff0, btot0 = warp_offsets(smem, 2, warp)
        if warp == 0:
            cs = _pair_resolve(ws, out32, smem, pair, epoch, lane, btot0, btot1, counts_off, n_blocks, do_cs,
                               cs)
        cuda.syncthreads()  # B: the pair's prefix, the next ticket
        prefix = eo + smem[10]
        nxt = smem[0]
        cs = _escapes(fmt.DTYPE_BF16, escm0, ex0, a0, a1, a2, prefix + woff0, out8, raw_size, stage, sb0, x32,
                      x16, g0, full0, do_cs, cs)
        _issue(stage, 0, x32, n, 2 * nxt, n_blocks, warp, lane)  # the next pair's copies, once read
        cs = _escapes(fmt.DTYPE_BF16, escm1, ex1, b0, b1, b2, prefix + btot0 + woff1, out8, raw_size, stage,
                      sb1, x32, x16, g1, full1, do_cs, cs)
        _issue(stage, 1, x32, n, 2 * nxt + 1, n_blocks, warp, lane)
        pair = nxt
    cp_wait0()
    return cs


@dev
def _type_padding(dt, out8, n, planes_off, stride, pwords, counts_off, n_blocks, eo, lo_off, tid):
    """Block 0 of an FP32 or FP16 tile kernel: the padding runs ``encode_finish`` (given
    ``finish_tuple``) does not zero: FP32 after the sign-mantissa words and after the counts
    (it zeroes the plane gaps and the run after the low halves), FP16 every run (its 6 planes)."""
    if dt == FP32:
        zero_padding(out8, fmt.HEADER_SIZE + ((n + 7) & ~np.int64(7)), planes_off, stride, pwords, 0,
                     counts_off + 4 * n_blocks, lo_off, tid)
    else:
        zero_padding(out8, fmt.HEADER_SIZE + n, planes_off, stride, pwords, FP16_PLANES,
                     counts_off + 4 * n_blocks, eo, tid)


def _tiles_kernel(dt: int, ahead: int = 4, blocks_per_sm: int = BLOCKS_PER_SM, per_ticket: int | None = None):
    """The tile kernel for input of element type ``dt`` (``format.DTYPE_*``: BF16, FP32 (docs/GPU_CODEC.md,
    "FP32") or FP16 (the tables of ``_fp16_entries``)), a compile-time constant, so
    each kernel holds only its own path. ``ahead`` (FP32): 4 = all of a tile's loads before its
    first store, 1 = each round's loads after the stores of the round before;
    ``blocks_per_sm``: the launch bounds' resident blocks (8: at most 64 registers);
    ``per_ticket``: escape blocks a ticket (2: BF16's pairs, the default for BF16; 1: one tile a
    ticket, every type's). experiments/kernels/NOTES.md compares them."""
    per_ticket = per_ticket or PER_TICKET[dt]
    assert ahead in (1, 4) and dt in (fmt.DTYPE_BF16, FP32, FP16) and per_ticket in (1, 2)
    assert per_ticket == 1 or dt == fmt.DTYPE_BF16, "pairs of tiles: BF16 only"
    pairs = per_ticket == 2
    fp32 = dt == FP32
    stage_words = 4 if fp32 else STAGE_WORDS  # FP32 tiles are not staged
    plane_words = 4 * (192 if dt == FP16 else 96)  # per warp: 3 (FP16: 6) planes x 128 B
    lo_of = lay_lo if fp32 else lay_no_lo
    rlut_size = 256 if dt == FP16 else 1  # FP16's raw-bit table

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def encode_tiles(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
        """Code tiles taken from the ticket counter until none is left (docs/GPU_CODEC.md)."""
        n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks = layout_fields(lay)
        lo_off = lo_of(lay)
        lut = cuda.shared.array(256, dtype=np.uint32)
        rlut = cuda.shared.array(rlut_size, dtype=np.uint32)
        stage = cuda.shared.array(stage_words, dtype=np.uint32, alignment=16)
        pl = cuda.shared.array(plane_words, dtype=np.uint32, alignment=16)
        smem = cuda.shared.array(12, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        warp = tid >> 5
        if cb64 < 0:  # the codebook was chosen on the device (stats.choose_codebook)
            cb64 = ws[WS_CODEBOOK]
        _fill_tables(dt, lut, rlut, tid, cb64)
        first_ticket(ws, smem, tid)
        if dt != fmt.DTYPE_BF16 and cuda.blockIdx.x == 0:
            _type_padding(dt, out8, n, planes_off, stride, pwords, counts_off, n_blocks, eo, lo_off, tid)
        cuda.syncthreads()
        tile = smem[0]
        epoch = smem[1]
        cs = np.int64(0)
        if pairs:
            cs = _pair_loop(ws, stage, lut, rlut, pl, smem, x32, x16, out8, out32, out64, lay, tile, epoch,
                            warp, lane, do_cs)
            tile = n_blocks  # done
        elif not fp32:
            _issue(stage, 0, x32, n, tile, n_blocks, warp, lane)
        slot = 0
        while tile < n_blocks:
            g = tile * 512 + warp * 128 + lane
            full = (tile + 1) * fmt.BLOCK <= n
            if not fp32:
                cp_wait0()  # this lane's copies of this tile have landed (it reads only those)
            sb = slot * TILE_WORDS + 4 * (warp * 128 + lane)
            wd, lcs = _tile_words(dt, ahead, stage, sb, x32, x16, out8, out32, n, tile, g, warp, lane, lo_off,
                                  full, do_cs)
            escm, ex, w0t, w1t, w2t, w3t, tcs = _code_tile(dt, wd, lut, rlut, pl, out8, out32, out64, tile,
                                                           g, warp, lane, full, planes_off, stride, pwords,
                                                           do_cs)
            if do_cs:
                cs = wrap64(cs + lcs + tcs)
            woff, btot = block_escapes(smem, 2, warp, lane, w0t, w1t, w2t, w3t)  # A
            if warp == 0:
                cs = encoder_resolve(ws, out32, smem, 6, tile, epoch, lane, btot, counts_off, do_cs, cs)
            cuda.syncthreads()  # B: this tile's prefix, the next tile's ticket
            prefix = smem[6]
            nxt = smem[0]
            if not fp32:
                _issue(stage, slot ^ 1, x32, n, nxt, n_blocks, warp, lane)  # the next tile's copies
            cs = _escapes(dt, escm, ex, w0t, w1t, w2t, eo + prefix + woff, out8, raw_size, stage, sb, x32,
                          x16, g, full, do_cs, cs)
            tile = nxt
            slot ^= 1
        if not fp32:
            cp_wait0()
        if do_cs:
            flush_checksum(ws, cs, lane)

    return encode_tiles


encode_tiles = _tiles_kernel(fmt.DTYPE_BF16)
encode_tiles32 = _tiles_kernel(FP32)
encode_tiles16 = _tiles_kernel(FP16)


@cuda.jit
def encode_finish(x32, x16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, force_raw, do_cs,
                  tiles, cb_dev):
    """RAW decision and RAW copy, zero padding, header (docs/GPU_CODEC.md, "The encoder")."""
    n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks = layout_fields(lay)
    smem = cuda.shared.array(2, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    bid = np.int64(cuda.blockIdx.x)
    nblk = np.int64(cuda.gridDim.x)
    lane = tid & 31
    n_esc = np.int64(0)
    raw = force_raw
    if tiles > 0 and force_raw == 0:
        n_esc = ws[WS_STATUS + tiles - 1] & LOW32
        if eo + n_esc > raw_size:
            raw = 1
    cs = np.int64(0)
    if raw != 0:
        groups = n >> 3
        g = bid * TPB + tid
        while g < groups:
            v0, v1, v2, v3 = load16(x32, g)
            store16(out32, (fmt.HEADER_SIZE >> 4) + g, v0, v1, v2, v3)
            if do_cs:
                i = 4 * g
                cs = wrap64(cs + np.int64(v0) * (2 * i + 1) + np.int64(v1) * (2 * i + 3)
                            + np.int64(v2) * (2 * i + 5) + np.int64(v3) * (2 * i + 7))
            g += nblk * TPB
        if bid == 0 and tid < (n & 7):
            e = (n & ~np.int64(7)) + tid
            v = np.int64(x16[e])
            q = 2 * e
            out8[fmt.HEADER_SIZE + q] = v & 0xFF
            out8[fmt.HEADER_SIZE + q + 1] = (v >> 8) & 0xFF
            if do_cs:
                cs = wrap64(cs + byte_checksum(v & 0xFF, q) + byte_checksum((v >> 8) & 0xFF, q + 1))
        if do_cs:
            cs = warp_sum(cs)
            if lane == 0:
                cuda.atomic.add(ws, WS_CSUM_RAW + (bid & 7), cs)
    elif bid != 0:
        return  # a coded frame: block 0 alone writes the padding and the header
    else:
        # padding bytes: each region is shorter than ALIGN (128) bytes
        zero_padding(out8, fmt.HEADER_SIZE + ((n + 7) & ~np.int64(7)), planes_off, stride, pwords, 3,
                     counts_off + 4 * n_blocks, eo, tid)
    if raw != 0:  # every block copied a part: the last one to finish writes the header
        cuda.threadfence()
        cuda.syncthreads()
        if tid == 0:
            smem[0] = cuda.atomic.add(ws, WS_DONE, 1)
        cuda.syncthreads()
        if smem[0] != nblk - 1:
            return
    else:
        cuda.syncthreads()  # block 0: padding stored before the header says the frame is done
    if tid < 32:
        v = np.int64(0)
        if do_cs and lane < 8:
            if raw != 0:
                v = atomic_read(ws, WS_CSUM_RAW + lane)
            else:
                v = atomic_read(ws, WS_CSUM + lane)
        csum = warp_sum(v)
        flags = raw | (do_cs << 1)
        nesc_f = n_esc
        flen = eo + n_esc
        if raw != 0:
            nesc_f = 0
            flen = raw_size
        crc = np.int64(0)
        cbv = np.int64(0)
        nbits = 208
        if cb_dev != 0:  # header bytes 40..46 hold the codebook chosen on the device
            cbv = ws[WS_CODEBOOK]
            nbits = 264
        for i in range(lane, nbits, 32):
            if i < 16:
                bit = (flags >> i) & 1
                idx = 48 + i  # header byte 6 = flags
            elif i < 208:
                j = i - 16
                f = j >> 6
                val = csum
                if f == 0:
                    val = nesc_f
                elif f == 1:
                    val = flen
                bit = (val >> (j & 63)) & 1
                idx = 128 + j  # header bytes 16..39 = n_escapes, frame_len, checksum
            else:
                bit = (cbv >> (i - 208)) & 1
                idx = 320 + (i - 208)  # header bytes 40..46 = codebook
            if bit != 0:
                crc ^= crc_tab[idx]
        crc = warp_xor(crc) ^ crc_base
        if lane < 16:
            w = hdr[lane]
            if lane == 0:
                w = w | (flags << 48)
            elif lane == 2:
                w = nesc_f
            elif lane == 3:
                w = flen
            elif lane == 4:
                w = csum
            elif lane == 5:
                w = w | cbv  # the template's codebook bytes are zero when cb_dev
            elif lane == 15:
                w = (w & LOW32) | wrap64(crc << 32)
            out64[lane] = w
        if lane < 8:
            ws[WS_CSUM + lane] = 0
            ws[WS_CSUM_RAW + lane] = 0
        if lane == 0:
            ws[WS_TICKET] = 0
            ws[WS_DONE] = 0
            ws[WS_NESC] = nesc_f
            ws[WS_FLEN] = flen
    advance_epoch(ws, tid)
