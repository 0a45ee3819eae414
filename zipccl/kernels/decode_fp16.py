"""GPU decoder for FP16 frames, the finishing kernel of FP32 and FP16 frames and their launch
plan; accepts exactly what ``codec.reference.decode`` accepts and never writes outside the
output.

FP16 takes two launches, no host synchronisation, as BF16 does: ``decode_tiles16`` (the block
decoder's structure with FP16's bits: three code planes and three raw bit planes), then
``wide_finish`` (header CRC, escape total, payload checksum, error bits, the next epoch), which
also finishes FP32 frames after ``decode.decode_tiles32``. How and why: docs/KERNELS.md, "The
FP16 decoder"; the versions and their measurements: experiments/kernels/NOTES.md.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from ..format.errors import (
    ERR_CHECKSUM,
    ERR_ESCAPE_RANGE,
    ERR_ESCAPE_VALUE,
    ERR_HEADER,
    ERR_HEADER_CRC,
    ERR_TOTAL,
)
from . import _common as common
from . import (
    compat,  # noqa: F401  (numpy fix before numba.cuda compiles anything)
    decode,
)
from . import decode_tile as parts
from . import decode_warps as dw
from . import launch as launch_route
from . import plan as plans
from ._common import TPB, byte_checksum, dev, grid_size, popc32, prmt
from .compat import atomic_read, u32, wrap64
from .layout import (
    FP32,
    LAY_DTYPE,
    LAY_LO,
    LAY_NBLOCKS,
    LAY_NPLANES,
    WIDE_FIELDS,
    layout_fields,
    wide_header_ok,
    wide_tuple,
)

HDR = fmt.HEADER_SIZE
U64 = np.uint64
HDR8 = HDR // 8
RAW_A = 0x03020100  # high-byte bits of raw nibbles 0..3 (bit 0: mantissa bit 8, bit 1: bit 9)
RAW_B = 0x83828180  # raw nibbles 4..7: the sign (bit 7) as well
# launch bounds of the FP16 tile kernel: 6 resident blocks per multiprocessor (<= 80 registers),
# measured against 8 (<= 64) in experiments/kernels/NOTES.md
FP16_BLOCKS_PER_SM = 6


@dev
def _assemble(ex, byte, r8, r9, r15):
    """One FP16 value's bits from its exponent, low byte and raw bits (as ``encode._fp16_entries``
    splits them)."""
    return (r15 << 15) | (ex << 10) | (r9 << 9) | (r8 << 8) | byte


@dev
def _planes3(f8, q, stride):
    """The bytes at q, q + stride, q + 2 stride (one byte of 3 consecutive planes)."""
    return u32(f8[U64(q)]), u32(f8[U64(q + stride)]), u32(f8[U64(q + 2 * stride)])


@dev
def _round16(f8, f64, u, n, planes_off, raw_off, stride, pwords):
    """(low bytes 0-3, 4-7, 3 code plane bytes, 3 raw plane bytes, valid mask) of the 8 values
    from 8u; bytes outside their sections read as 0 (the tail tile's path)."""
    sm0, sm1, p0, p1, p2, vm = parts.load_round(f8, f64, u, n, planes_off, stride, pwords)
    q0 = u32(0)
    q1 = q0
    q2 = q0
    if u < 4 * pwords:
        q0, q1, q2 = _planes3(f8, raw_off + u, stride)
    return sm0, sm1, p0, p1, p2, q0, q1, q2, vm


@dev
def _full16(f8, f64, u, planes_off, raw_off, stride):
    """``_round16`` of a round whose 8 values are all < n."""
    sm = f64[U64(HDR8 + u)]
    p0, p1, p2 = _planes3(f8, planes_off + u, stride)
    q0, q1, q2 = _planes3(f8, raw_off + u, stride)
    return u32(sm), u32(sm >> 32), p0, p1, p2, q0, q1, q2, u32(0xFF)


@dev
def _tile16(f8, f64, tile, warp, lane, n, planes_off, raw_off, stride, pwords):
    """The lane's bytes of a tile: its 4 rounds' ``_round16`` tuples."""
    g = tile * 512 + warp * 128 + lane
    if (tile + 1) * fmt.BLOCK <= n:
        return (_full16(f8, f64, g, planes_off, raw_off, stride),
                _full16(f8, f64, g + 32, planes_off, raw_off, stride),
                _full16(f8, f64, g + 64, planes_off, raw_off, stride),
                _full16(f8, f64, g + 96, planes_off, raw_off, stride))
    return (_round16(f8, f64, g, n, planes_off, raw_off, stride, pwords),
            _round16(f8, f64, g + 32, n, planes_off, raw_off, stride, pwords),
            _round16(f8, f64, g + 64, n, planes_off, raw_off, stride, pwords),
            _round16(f8, f64, g + 96, n, planes_off, raw_off, stride, pwords))


@dev
def _nibbles(spread, p0, p1, p2):
    """Bits i of the 3 plane bytes as nibble i (bits 0, 1, 2)."""
    return u32(spread[p0] + u32(spread[p1] << 1) + u32(spread[p2] << 2))


@dev
def _high4(cba, cbb, nib, rn):
    """4 FP16 high bytes from 4 code nibbles and 4 raw nibbles (the low 16 bits of each)."""
    return u32(u32(prmt(cba, cbb, nib) << 2) | prmt(RAW_A, RAW_B, rn))


@dev
def _values16(rd, spread, cba, cbb):
    """(4 output words, escape mask) of one round's bytes ``rd`` (escaped values: exponent 0)."""
    sm0, sm1, p0, p1, p2, q0, q1, q2, vm = rd
    nib = _nibbles(spread, p0, p1, p2)
    rn = _nibbles(spread, q0, q1, q2)
    h0 = _high4(cba, cbb, nib, rn)
    h1 = _high4(cba, cbb, u32(nib >> 16), u32(rn >> 16))
    return (prmt(sm0, h0, 0x5140), prmt(sm0, h0, 0x7362), prmt(sm1, h1, 0x5140), prmt(sm1, h1, 0x7362),
            u32(u32(~u32(p0 | p1 | p2)) & vm))


@dev
def _cs16(rd, u, planes_off, raw_off, stride, pwords):
    """Payload checksum terms of one round's low bytes below n and its 6 plane bytes (the low
    bytes past n are padding: ``wide_finish`` counts those)."""
    sm0, sm1, p0, p1, p2, q0, q1, q2, vm = rd
    cs = np.int64(0)
    if vm != 0:
        keep = np.int64(-1)
        if vm != 0xFF:
            keep = (np.int64(1) << (8 * np.int64(popc32(vm)))) - 1
        i = 2 * u
        cs = wrap64(np.int64(u32(sm0 & u32(keep))) * (2 * i + 1)
                    + np.int64(u32(sm1 & u32(keep >> 32))) * (2 * i + 3))
    if u < 4 * pwords:
        q = planes_off + u - HDR
        r = raw_off + u - HDR
        cs = wrap64(cs + byte_checksum(np.int64(p0), q) + byte_checksum(np.int64(p1), q + stride)
                    + byte_checksum(np.int64(p2), q + 2 * stride) + byte_checksum(np.int64(q0), r)
                    + byte_checksum(np.int64(q1), r + stride) + byte_checksum(np.int64(q2), r + 2 * stride))
    return cs


@dev
def _patch(f8, out16, e, pos, nesc, eo, raw_off, stride, do_cs, cs, err):
    """Rewrite escaped value e with the exponent at escape position ``pos``; (checksum, error
    bits)."""
    if pos >= 0 and pos < nesc:
        x = np.int64(f8[U64(eo + pos)])
        if do_cs:
            cs = wrap64(cs + byte_checksum(x, eo + pos - HDR))
        if x > 31:
            err |= ERR_ESCAPE_VALUE
        q = raw_off + (e >> 3)
        b = e & 7
        r8 = (np.int64(f8[U64(q)]) >> b) & 1
        r9 = (np.int64(f8[U64(q + stride)]) >> b) & 1
        r15 = (np.int64(f8[U64(q + 2 * stride)]) >> b) & 1
        out16[U64(e)] = _assemble(x & 0x1F, np.int64(f8[U64(HDR + e)]), r8, r9, r15)
    else:
        err |= ERR_ESCAPE_RANGE
    return cs, err


@cuda.jit(device=True)
def _copy_raw(f16, out16, n, tile, tid, do_cs):
    """RAW frame: the tile's values from the payload; returns their checksum terms."""
    cs = np.int64(0)
    e = tile * fmt.BLOCK + tid
    for _ in range(fmt.BLOCK // TPB):
        if e < n:
            v = np.int64(f16[(HDR >> 1) + e])
            out16[e] = v
            if do_cs:
                cs = wrap64(cs + byte_checksum(v, 2 * e))
        e += TPB
    return cs


@dev
def _raw_tiles(f16, out16, ws, smem, n, tile, tid, n_blocks, do_cs):
    """Whether the frame is RAW (smem[3], from ``block_start``); if so, copy the tiles taken
    from the ticket counter (the coded sections' offsets lie past its end)."""
    if smem[3] == 0:
        return False
    cs = np.int64(0)
    while tile < n_blocks:
        cs = wrap64(cs + _copy_raw(f16, out16, n, tile, tid, do_cs))
        tile = common.block_ticket(ws, smem, tid)
    if do_cs:
        common.flush_checksum(ws, cs, tid & 31)
    return True


_first_tile = parts.block_start(None)


@cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, FP16_BLOCKS_PER_SM)}))
def decode_tiles16(f8, f16, f32, f64, out32, out16, ws, lay):
    """Decode tiles taken from the ticket counter, or copy a RAW frame (docs/KERNELS.md, "The FP16 decoder").
    ``out32``: the first n & ~7 output values as uint32, ``out16`` all n."""
    n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
    raw_off = planes_off + 3 * stride
    spread = cuda.shared.array(256, dtype=np.uint32)
    smem = cuda.shared.array(16, dtype=np.int64)
    if not _first_tile(f8, f32, f64, ws, lay, spread, smem):
        return  # the header does not fit: write nothing
    tile, epoch, nesc, do_cs, tid, lane, warp = parts.block_state(smem)
    if _raw_tiles(f16, out16, ws, smem, n, tile, tid, n_blocks, do_cs):
        return
    cs = np.int64(0)
    err = np.int64(0)
    cba, cbb = parts.codebook_words(smem[6])
    ra, rb, rc, rd = _tile16(f8, f64, tile if tile < n_blocks else 0, warp, lane, n, planes_off, raw_off,
                             stride, pwords)
    while tile < n_blocks:
        g = tile * 512 + warp * 128 + lane
        a0, a1, a2, a3, esc0 = _values16(ra, spread, cba, cbb)
        b0, b1, b2, b3, esc1 = _values16(rb, spread, cba, cbb)
        c0, c1, c2, c3, esc2 = _values16(rc, spread, cba, cbb)
        d0, d1, d2, d3, esc3 = _values16(rd, spread, cba, cbb)
        parts.store_round(out32, out16, g, ra[8], a0, a1, a2, a3)  # a 16-byte store when full
        parts.store_round(out32, out16, g + 32, rb[8], b0, b1, b2, b3)
        parts.store_round(out32, out16, g + 64, rc[8], c0, c1, c2, c3)
        parts.store_round(out32, out16, g + 96, rd[8], d0, d1, d2, d3)
        if do_cs:
            cs = wrap64(cs + _cs16(ra, g, planes_off, raw_off, stride, pwords)
                        + _cs16(rb, g + 32, planes_off, raw_off, stride, pwords)
                        + _cs16(rc, g + 64, planes_off, raw_off, stride, pwords)
                        + _cs16(rd, g + 96, planes_off, raw_off, stride, pwords))
        escm = u32(esc0 | u32(esc1 << 8) | u32(esc2 << 16) | u32(esc3 << 24))
        cntp = u32(popc32(esc0) | u32(popc32(esc1) << 8) | u32(popc32(esc2) << 16)
                   | u32(popc32(esc3) << 24))
        ex, w0t, w1t, w2t, w3t = common.exclusive_scan8(cntp, lane)
        woff, btot = common.block_escapes(smem, 9, warp, lane, w0t, w1t, w2t, w3t)  # A
        if warp == 0:
            err, cs = common.decoder_resolve(f32, ws, smem, 13, tile, epoch, lane, btot, smem[7], smem[8],
                                             nesc, n, n_blocks, counts_off, do_cs, cs, err, False)
        cuda.syncthreads()  # B: this tile's prefix; the next tile's ticket and count
        prefix = smem[13]
        nxt = smem[0]
        if nxt < n_blocks:  # the next tile's loads go out before this tile's escapes
            ra, rb, rc, rd = _tile16(f8, f64, nxt, warp, lane, n, planes_off, raw_off, stride, pwords)
        if escm != 0:
            k0, k1, k2, k3 = common.escape_bases(ex, w0t, w1t, w2t, escm, prefix + woff)
            m = escm
            while m != 0:
                m, low, bit = common.next_escape(m)  # bit 8r + s: value s of round r
                r = u32(bit >> 3)
                e = 8 * g + np.int64(u32(u32(r << 8) + u32(bit & 7)))
                pos = common.escape_rank(k0, k1, k2, k3, r, escm, low)
                cs, err = _patch(f8, out16, e, pos, nesc, eo, raw_off, stride, do_cs, cs, err)
        tile = nxt
    if err != 0:
        cuda.atomic.or_(ws, common.WS_ERR, err)
    if do_cs:
        common.flush_checksum(ws, cs, lane)


@cuda.jit(device=True)
def _padding_sum(f8, lay, tid):
    """Checksum terms of the padding bytes between sections (runs shorter than ALIGN)."""
    n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
    fp32 = lay[LAY_DTYPE] == FP32
    lo_off = lay[LAY_LO]
    cs = np.int64(0)
    sm_end = HDR + (((n + 7) & ~np.int64(7)) if fp32 else n)  # FP32: decode.py's tiles
    starts = (sm_end, counts_off + 4 * n_blocks, lo_off + 2 * n if fp32 else eo)
    ends = (planes_off, lo_off, eo)
    for r in range(3):
        i = starts[r] + tid
        if i < ends[r]:
            cs = wrap64(cs + common.byte_checksum(np.int64(f8[i]), i - HDR))
    for k in range(lay[LAY_NPLANES]):
        i = planes_off + k * stride + 4 * pwords + tid
        if i < planes_off + (k + 1) * stride:
            cs = wrap64(cs + common.byte_checksum(np.int64(f8[i]), i - HDR))
    return cs


@cuda.jit
def wide_finish(f8, f64, ws, lay, crc_zero, crc_tab):
    """Header CRC, escape total, payload checksum; publish the call's errors (one block)."""
    smem = cuda.shared.array(4, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    ok, raw, nesc, has_cs = wide_header_ok(f64, f8.shape[0], lay)
    cs = np.int64(0)
    if ok and raw == 0 and has_cs != 0:
        cs = _padding_sum(f8, lay, tid)
    cs = common.warp_sum(cs)
    if lane == 0:
        smem[tid >> 5] = cs
    cuda.syncthreads()
    if tid < 32:
        crc = np.int64(0)
        for i in range(lane, 8 * (HDR - 4), 32):  # CRC-32 of header bytes 0..123, bit by bit
            if (f64[i >> 6] >> (i & 63)) & 1:
                crc ^= crc_tab[i]
        crc = common.warp_xor(crc) ^ crc_zero
        part = np.int64(0)
        if lane < 8:
            part = atomic_read(ws, common.WS_CSUM + lane)
        total = wrap64(common.warp_sum(part) + smem[0] + smem[1] + smem[2] + smem[3])
        err = np.int64(0)
        if lane == 0:
            if not ok:
                err |= ERR_HEADER
            if crc != ((f64[15] >> 32) & common.LOW32):
                err |= ERR_HEADER_CRC
            if ok and has_cs != 0 and total != f64[4]:
                err |= ERR_CHECKSUM
            if ok and raw == 0 and lay[LAY_NBLOCKS] == 0 and nesc != 0:
                err |= ERR_TOTAL
        common.publish_errors(ws, err, lane)
    common.advance_epoch(ws, tid)


def launch(f8, f16, f32, f64, out32, out16, ws, lay: fmt.Layout, crc_zero: int, crc_tab, stream,
           warps: bool | None = None) -> None:
    """Enqueue the decoder through Numba's dispatcher (the simulator's route). ``f*``: the
    frame buffer as uint8 / 16 / 32 / int64; ``out32`` / ``out16``: the output as uint32 /
    uint16 (FP32: n / 2n of them; FP16: the first n & ~7 values as (n & ~7) / 2 words, and n).
    ``warps`` (FP32): as in ``decode.launch``."""
    lt = wide_tuple(lay)
    if lay.dtype == FP32 and dw.chosen(lay.n_blocks, True, warps):
        dw.launch(f8, f32, f64, out32, out16, ws, lt, lay.n_blocks, True, stream)
    elif lay.n_blocks and lay.dtype == FP32:
        decode.decode_tiles32[grid_size(lay.n_blocks, decode.FP32_BLOCKS_PER_SM), TPB, stream](
            f8, f32, f64, out32, out16, ws, lt)
    elif lay.n_blocks:
        decode_tiles16[grid_size(lay.n_blocks, FP16_BLOCKS_PER_SM), TPB, stream](
            f8, f16, f32, f64, out32, out16, ws, lt)
    wide_finish[1, TPB, stream](f8, f64, ws, lt, crc_zero, crc_tab)


_A = launch_route.array
TILES = launch_route.Kernel(decode_tiles16, (_A(np.uint8), _A(np.uint16), _A(np.uint32), _A(np.int64),
                                             _A(np.uint32), _A(np.uint16), _A(np.int64),
                                             launch_route.int_tuple(WIDE_FIELDS)))
FINISH = launch_route.Kernel(wide_finish, (_A(np.uint8), _A(np.int64), _A(np.int64),
                                           launch_route.int_tuple(WIDE_FIELDS), launch_route.I64,
                                           _A(np.int64)))


class Plan(decode.Plan):
    """The launches of one FP32 / FP16 decode with everything but the stream fixed (as
    ``decode.Plan``): ``decode.decode_tiles32`` or ``decode_warps``' scan and tile kernels
    (FP32, ``warps`` as in ``decode.launch``) or ``decode_tiles16`` (FP16), then ``wide_finish``."""

    __slots__ = ()

    @staticmethod
    def steps_of(device: int, f_ptr: int, f_nbytes: int, out_ptr: int, lay: fmt.Layout, ws, crc_zero: int,
                 crc, warps: bool | None) -> list[plans.Step]:
        n = lay.n
        lt = wide_tuple(lay)
        frame = ((f_ptr, f_nbytes), (f_ptr, f_nbytes // 2), (f_ptr, f_nbytes // 4), (f_ptr, f_nbytes // 8))
        steps = []
        if lay.dtype == FP32 and dw.chosen(lay.n_blocks, True, warps):
            steps.extend(dw.steps(device, (frame[0], frame[2], frame[3]), ((out_ptr, n), (out_ptr, 2 * n)),
                                  ws, lt, lay.n_blocks, True))
        elif lay.n_blocks and lay.dtype == FP32:  # the BF16 tile kernel's FP32 build (decode.py)
            grid = grid_size(lay.n_blocks, decode.FP32_BLOCKS_PER_SM)
            args = (frame[0], frame[2], frame[3], (out_ptr, n), (out_ptr, 2 * n), ws, lt)
            steps.append(plans.Step(decode.TILES32, device, grid, args, (0, 1, 2), (3, 4)))
        elif lay.n_blocks:  # out32: the first n & ~7 values as uint32, out16: all n
            grid = grid_size(lay.n_blocks, FP16_BLOCKS_PER_SM)
            args = (*frame, (out_ptr, (n & ~7) // 2), (out_ptr, n), ws, lt)
            steps.append(plans.Step(TILES, device, grid, args, (0, 1, 2, 3), (4, 5)))
        steps.append(plans.Step(FINISH, device, 1, (frame[0], frame[3], ws, lt, crc_zero, crc), (0, 1), ()))
        return steps
