"""GPU decoder for FP16 frames, the finishing kernel of FP32 and FP16 frames and their launch
plan; accepts exactly what ``codec.reference.decode`` accepts and never writes outside the
output.

FP32 frames are decoded by the BF16 tile kernel's FP32 build (``decode.decode_tiles32``),
then ``wide_finish``. FP16 takes two launches, no host synchronisation, as BF16 does
(``decode.py``):

1. ``wide_tiles``: a persistent grid whose blocks take tiles from the ticket counter.
   Thread 0 of every block checks the header fields it relies on (magic, version,
   element type, flags, n = the output's, lengths, codebook entries <= 31); if they do
   not fit, the block writes nothing. A RAW frame is copied. Otherwise a warp decodes
   1024 values as 32 groups of 32: every lane reads the group's plane words (one
   broadcast load each; the loads of 4 groups go out together), takes its code and raw
   bits from bit j, its low byte, and writes its value; escaped values are written once
   the look-back (``_common.lookback``, over the stored counts) has given the tile's
   first escape, each at its rank among the group's escape votes. Each tile compares
   the escape codes it saw with its stored count; escape reads are checked against the
   header's total, and escape bytes against 31.
2. ``wide_finish`` (one block, FP32 and FP16): header CRC, escape total, payload
   checksum (the tiles' sums plus the padding bytes it reads), then the call's error
   bits, counter reset and the next epoch, as ``decode.decode_finish`` does for BF16.

Error bits are ``_common``'s, plus ``ERR_ESCAPE_VALUE`` (an FP16 escape byte above 31).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from . import _common as common
from . import (
    compat,  # noqa: F401  (numpy fix before numba.cuda compiles anything)
    decode,
)
from . import launch as launch_route
from . import plan as plans
from ._common import TPB, dev, grid_size
from .compat import atomic_read, ballot, popc, wrap64
from .layout import (
    FP32,
    LAY_DTYPE,
    LAY_LO,
    LAY_N,
    LAY_NBLOCKS,
    LAY_NPLANES,
    LAY_PLANES,
    LAY_PWORDS,
    LAY_STRIDE,
    WIDE_FIELDS,
    layout_fields,
    wide_header_ok,
    wide_tuple,
)

ERR_ESCAPE_VALUE = 64
ERROR_TEXT = {ERR_ESCAPE_VALUE: "an escape byte is not a float16 exponent (above 31)"}

HDR = fmt.HEADER_SIZE


@dev
def vote(pred):
    """``ballot`` as an unsigned 32-bit mask: the vote intrinsic returns an int32, whose
    widening would copy lane 31's bit into bits 32..63 (a plane word's checksum term and
    popcounts would then be wrong; the simulator's ballot is never negative)."""
    return ballot(pred) & 0xFFFFFFFF


@dev
def bcs(byte, q):
    """``_common.byte_checksum``, inlined (it sits in the per-value path)."""
    return wrap64((byte << (8 * (q & 3))) * (2 * (q >> 2) + 1))


@dev
def store_votes(votes, at, lane, s0, s1, s2, s3):
    """Lane 0: 4 consecutive groups' escape votes into votes[at..at + 3]; their escapes."""
    if lane == 0:
        votes[at] = s0
        votes[at + 1] = s1
        votes[at + 2] = s2
        votes[at + 3] = s3
    return popc(s0) + popc(s1) + popc(s2) + popc(s3)


@dev
def _assemble(ex, byte, r8, r9, r15):
    """One FP16 value's bits from its exponent, low byte and raw bits (as ``encode._fp16_entries``
    splits them)."""
    return (r15 << 15) | (ex << 10) | (r9 << 9) | (r8 << 8) | byte


@dev
def _bits3(f32, at, stride, word, lane):
    """Bit ``lane`` of word ``word`` of the 3 bit planes at ``at``, ``at + stride``, ``at + 2
    stride``, as bits 0, 1, 2."""
    b = (np.int64(f32[(at >> 2) + word]) >> lane) & 1
    b |= ((np.int64(f32[((at + stride) >> 2) + word]) >> lane) & 1) << 1
    return b | (((np.int64(f32[((at + 2 * stride) >> 2) + word]) >> lane) & 1) << 2)


@dev
def _dload(f8, f32, e, word, lane, lay):
    """(code | raw bits << 3, low byte) of lane's value e of a group (zeros past the
    sections)."""
    c = np.int64(0)
    if word < lay[LAY_PWORDS]:
        c = _bits3(f32, lay[LAY_PLANES], lay[LAY_STRIDE], word, lane)
        c |= _bits3(f32, lay[LAY_PLANES] + 3 * lay[LAY_STRIDE], lay[LAY_STRIDE], word, lane) << 3
    b = np.int64(0)
    if e < lay[LAY_N]:
        b = np.int64(f8[HDR + e])
    return c, b


@dev
def _dgroup(c, byte, e, word, lane, cb, f32, out16, lay, do_cs, cs):
    """Write lane's value e of one group (an escaped one with exponent 0 for now); returns
    (checksum, the group's escape vote)."""
    valid = e < lay[LAY_N]
    code = c & 7
    if do_cs and word < lay[LAY_PWORDS] and lane < lay[LAY_NPLANES]:
        at = lay[LAY_PLANES] + lane * lay[LAY_STRIDE]
        cs = wrap64(cs + np.int64(f32[(at >> 2) + word]) * (2 * (((at - HDR) >> 2) + word) + 1))
    esc = vote(valid and code == 0)
    if valid:
        if do_cs:
            cs = wrap64(cs + bcs(byte, e))
        ex = np.int64(0)
        if code != 0:
            ex = (cb >> (8 * (code - 1))) & 0xFF
        out16[e] = _assemble(ex, byte, (c >> 3) & 1, (c >> 4) & 1, (c >> 5) & 1)
    return cs, esc


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
                cs = wrap64(cs + common.byte_checksum(v, 2 * e))
        e += TPB
    return cs


_first_tile = decode.block_start(None)


@cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, common.BLOCKS_PER_SM)}))
def wide_tiles(f8, f16, f32, f64, out16, ws, lay):
    """Decode tiles taken from the ticket counter, or copy a RAW frame (module docstring)."""
    n, planes_off, stride, counts_off, eo, _, _, n_blocks = layout_fields(lay)
    votes = cuda.shared.array(128, dtype=np.int64)
    smem = cuda.shared.array(16, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    below = (np.int64(1) << lane) - 1
    if not _first_tile(f8, f32, f64, ws, lay, smem, tid):
        return  # the header does not fit: write nothing
    tile, epoch, nesc, do_cs = decode.block_state(smem)
    cb = smem[6]
    cs = np.int64(0)
    err = np.int64(0)
    if smem[3] != 0:
        while tile < n_blocks:
            cs = wrap64(cs + _copy_raw(f16, out16, n, tile, tid, do_cs))
            tile = common.block_ticket(ws, smem, tid)
    while smem[3] == 0 and tile < n_blocks:
        cnt = smem[7]  # this tile's stored escape count (clamped; published), and as stored
        craw = smem[8]
        wbase = tile * fmt.BLOCK + warp * 1024
        seen = np.int64(0)
        for q0 in range(0, 32, 4):  # the loads of 4 groups go out together
            e0 = wbase + 32 * q0 + lane
            w0 = tile * 128 + warp * 32 + q0
            c0, b0 = _dload(f8, f32, e0, w0, lane, lay)
            c1, b1 = _dload(f8, f32, e0 + 32, w0 + 1, lane, lay)
            c2, b2 = _dload(f8, f32, e0 + 64, w0 + 2, lane, lay)
            c3, b3 = _dload(f8, f32, e0 + 96, w0 + 3, lane, lay)
            cs, s0 = _dgroup(c0, b0, e0, w0, lane, cb, f32, out16, lay, do_cs, cs)
            cs, s1 = _dgroup(c1, b1, e0 + 32, w0 + 1, lane, cb, f32, out16, lay, do_cs, cs)
            cs, s2 = _dgroup(c2, b2, e0 + 64, w0 + 2, lane, cb, f32, out16, lay, do_cs, cs)
            cs, s3 = _dgroup(c3, b3, e0 + 96, w0 + 3, lane, cb, f32, out16, lay, do_cs, cs)
            seen += store_votes(votes, warp * 32 + q0, lane, s0, s1, s2, s3)
        woff, btot = common.block_escapes(smem, 9, warp, lane, seen, 0, 0, 0)  # A: totals, votes
        if warp == 0:
            err, cs = common.decoder_resolve(f32, ws, smem, 13, tile, epoch, lane, btot, cnt, craw, nesc, n,
                                      n_blocks, counts_off, do_cs, cs, err, False)
        cuda.syncthreads()  # B: this tile's prefix; the next tile's ticket and count
        if btot != 0:
            run = smem[13] + woff
            for q in range(32):
                esc = votes[warp * 32 + q]
                if (esc >> lane) & 1:
                    pos = run + popc(esc & below)
                    e = wbase + 32 * q + lane
                    if pos < 0 or pos >= nesc:
                        err |= common.ERR_ESCAPE_RANGE
                    else:
                        ex = np.int64(f8[eo + pos])
                        if do_cs:
                            cs = wrap64(cs + common.byte_checksum(ex, eo + pos - HDR))
                        if ex > 31:
                            err |= ERR_ESCAPE_VALUE
                        word = tile * 128 + warp * 32 + q
                        byte = np.int64(f8[HDR + e])
                        r8 = (np.int64(f32[((planes_off + 3 * stride) >> 2) + word]) >> lane) & 1
                        r9 = (np.int64(f32[((planes_off + 4 * stride) >> 2) + word]) >> lane) & 1
                        r15 = (np.int64(f32[((planes_off + 5 * stride) >> 2) + word]) >> lane) & 1
                        out16[e] = _assemble(ex & 0x1F, byte, r8, r9, r15)
                run += popc(esc)
        tile = smem[0]
        cuda.syncthreads()  # C: smem and votes are reused by the next tile
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
                err |= common.ERR_HEADER
            if crc != ((f64[15] >> 32) & common.LOW32):
                err |= common.ERR_HEADER_CRC
            if ok and has_cs != 0 and total != f64[4]:
                err |= common.ERR_CHECKSUM
            if ok and raw == 0 and lay[LAY_NBLOCKS] == 0 and nesc != 0:
                err |= common.ERR_TOTAL
        common.publish_errors(ws, err, lane)
    common.advance_epoch(ws, tid)


def launch(f8, f16, f32, f64, out32, out16, ws, lay: fmt.Layout, crc_zero: int, crc_tab, stream,
           warps: bool | None = None) -> None:
    """Enqueue the decoder through Numba's dispatcher (the simulator's route). ``f*``: the
    frame buffer as uint8 / 16 / 32 / int64; ``out32`` / ``out16``: the output as uint32 /
    uint16 (FP32: n / 2n of them; FP16: out32 empty, n). ``warps`` (FP32): as in
    ``decode.launch``."""
    from . import decode_warps as dw

    lt = wide_tuple(lay)
    fp32_warps = lay.dtype == FP32 and (dw.use_warps(lay.n_blocks, True) if warps is None else warps)
    if lay.n_blocks and fp32_warps:
        dw.launch(f8, f32, f64, out32, out16, ws, lt, lay.n_blocks, True, stream)
    elif lay.n_blocks and lay.dtype == FP32:
        decode.decode_tiles32[grid_size(lay.n_blocks, decode.FP32_BLOCKS_PER_SM), TPB, stream](
            f8, f32, f64, out32, out16, ws, lt)
    elif lay.n_blocks:
        wide_tiles[grid_size(lay.n_blocks), TPB, stream](f8, f16, f32, f64, out16, ws, lt)
    wide_finish[1, TPB, stream](f8, f64, ws, lt, crc_zero, crc_tab)


_A = launch_route.array
TILES = launch_route.Kernel(wide_tiles, (_A(np.uint8), _A(np.uint16), _A(np.uint32), _A(np.int64),
                                         _A(np.uint16), _A(np.int64), launch_route.int_tuple(WIDE_FIELDS)))
FINISH = launch_route.Kernel(wide_finish, (_A(np.uint8), _A(np.int64), _A(np.int64),
                                           launch_route.int_tuple(WIDE_FIELDS), launch_route.I64,
                                           _A(np.int64)))


class Plan(plans.Plan):
    """The launches of one FP32 / FP16 decode with everything but the stream fixed (as
    ``decode.Plan``): ``decode.decode_tiles32`` or ``decode_warps``' scan and tile kernels
    (FP32, ``warps`` as in ``decode.launch``) or ``wide_tiles`` (FP16), then ``wide_finish``."""

    __slots__ = ()

    def __init__(self, device: int, f_ptr: int, f_nbytes: int, out_ptr: int, lay: fmt.Layout,
                 ws_ptr: int, ws_count: int, crc_zero: int, crc_ptr: int, crc_count: int,
                 warps: bool | None = None):
        from . import decode_warps as dw

        n = lay.n
        lt = wide_tuple(lay)
        frame = ((f_ptr, f_nbytes), (f_ptr, f_nbytes // 2), (f_ptr, f_nbytes // 4), (f_ptr, f_nbytes // 8))
        ws = (ws_ptr, ws_count)
        steps = []
        fp32_warps = lay.dtype == FP32 and (dw.use_warps(lay.n_blocks, True) if warps is None else warps)
        if lay.n_blocks and fp32_warps:
            steps.extend(dw.steps(device, (frame[0], frame[2], frame[3]), ((out_ptr, n), (out_ptr, 2 * n)),
                                  ws, lt, lay.n_blocks, True))
        elif lay.n_blocks and lay.dtype == FP32:  # the BF16 tile kernel's FP32 build (decode.py)
            grid = grid_size(lay.n_blocks, decode.FP32_BLOCKS_PER_SM)
            args = (frame[0], frame[2], frame[3], (out_ptr, n), (out_ptr, 2 * n), ws, lt)
            steps.append(plans.Step(decode.TILES32, device, grid, args, (0, 1, 2), (3, 4)))
        elif lay.n_blocks:
            steps.append(plans.Step(TILES, device, grid_size(lay.n_blocks), (*frame, (out_ptr, n), ws, lt),
                                    (0, 1, 2, 3), (4,)))
        steps.append(plans.Step(FINISH, device, 1, (frame[0], frame[3], ws, lt, crc_zero,
                                                    (crc_ptr, crc_count)), (0, 1), ()))
        super().__init__(device, tuple(steps))
