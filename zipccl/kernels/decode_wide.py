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
from . import (
    compat,  # noqa: F401  (numpy fix before numba.cuda compiles anything)
    decode,
)
from . import launch as launch_route
from ._common import (
    BLOCKS_PER_SM,
    ERR_CHECKSUM,
    ERR_COUNTS,
    ERR_ESCAPE_RANGE,
    ERR_HEADER,
    ERR_HEADER_CRC,
    ERR_TOTAL,
    LOW32,
    STATUS_AGG,
    STATUS_INC,
    TPB,
    WS_CSUM,
    WS_EPOCH,
    WS_ERR,
    WS_ERR_LAST,
    WS_ERR_STICKY,
    WS_TICKET,
    advance_epoch,
    byte_checksum,
    dev,
    grid_size,
    lookback,
    publish,
    warp_sum,
    warp_xor,
)
from .compat import atomic_read, popc, wrap64
from .encode_wide import FP16, FP32, HDR, bcs, vote, wide_tuple

ERR_ESCAPE_VALUE = 64
ERROR_TEXT = {ERR_ESCAPE_VALUE: "an escape byte is not a float16 exponent (above 31)"}
_MAGIC48 = {d: int.from_bytes(fmt.MAGIC + bytes([fmt.VERSION, d]), "little") for d in (FP32, FP16)}
_M32 = _MAGIC48[FP32]
_M16 = _MAGIC48[FP16]


@cuda.jit(device=True)
def header_ok(f64, nbytes, lay):
    """(valid, raw, n_escapes, has_checksum) of the frame header for an output of lay[0]
    values of type lay[11]."""
    n = lay[0]
    eo = lay[5]
    raw_size = lay[6]
    kind = lay[11]
    w0 = f64[0]
    flags = (w0 >> 48) & 0xFFFF
    nesc = f64[2]
    flen = f64[3]
    magic = _M32 if kind == FP32 else _M16
    ok = (w0 & 0xFFFFFFFFFFFF) == magic and (flags & ~np.int64(3)) == 0 and f64[1] == n
    ok = ok and flen >= 0 and flen <= nbytes and nesc >= 0
    if (flags & 1) != 0:
        ok = ok and nesc == 0 and flen == raw_size
    else:
        ok = ok and nesc <= n and flen == eo + nesc and flen <= raw_size
    if (flags & 2) == 0 and f64[4] != 0:
        ok = False
    if kind == FP16:
        cb = f64[5]
        for i in range(7):
            if ((cb >> (8 * i)) & 0xFF) > 31:
                ok = False
    return ok, flags & 1, nesc, (flags >> 1) & 1


@dev
def _assemble(ex, byte, r8, r9, r15):
    """One FP16 value's bits from its exponent, low byte and raw bits (see encode_wide)."""
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
    if word < lay[7]:
        c = _bits3(f32, lay[2], lay[3], word, lane)
        c |= _bits3(f32, lay[2] + 3 * lay[3], lay[3], word, lane) << 3
    b = np.int64(0)
    if e < lay[0]:
        b = np.int64(f8[HDR + e])
    return c, b


@dev
def _dgroup(c, byte, e, word, lane, cb, f32, out16, lay, do_cs, cs):
    """Write lane's value e of one group (an escaped one with exponent 0 for now); returns
    (checksum, the group's escape vote)."""
    valid = e < lay[0]
    code = c & 7
    if do_cs and word < lay[7] and lane < lay[10]:
        at = lay[2] + lane * lay[3]
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
                cs = wrap64(cs + byte_checksum(v, 2 * e))
        e += TPB
    return cs


@cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, BLOCKS_PER_SM)}))
def wide_tiles(f8, f16, f32, f64, out16, ws, lay):
    """Decode tiles taken from the ticket counter, or copy a RAW frame (module docstring)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    counts_off = lay[4]
    eo = lay[5]
    n_blocks = lay[8]
    votes = cuda.shared.array(128, dtype=np.int64)
    smem = cuda.shared.array(16, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    below = (np.int64(1) << lane) - 1
    if tid == 0:
        ok, raw, nesc, has_cs = header_ok(f64, f8.shape[0], lay)
        smem[0] = cuda.atomic.add(ws, WS_TICKET, 1)
        smem[1] = ws[WS_EPOCH]
        smem[2] = 1 if ok else 0
        smem[3] = raw
        smem[4] = nesc
        smem[5] = has_cs
        smem[6] = f64[5]  # codebook bytes (and ndim in the top byte)
        if not ok and smem[0] == 0:
            cuda.atomic.or_(ws, WS_ERR, ERR_HEADER)
    cuda.syncthreads()
    if smem[2] == 0:
        return
    tile = smem[0]
    epoch = smem[1]
    nesc = smem[4]
    do_cs = smem[5] != 0
    cb = smem[6]
    cs = np.int64(0)
    err = np.int64(0)
    if smem[3] != 0:
        while tile < n_blocks:
            cs = wrap64(cs + _copy_raw(f16, out16, n, tile, tid, do_cs))
            cuda.syncthreads()  # everyone has read this ticket
            if tid == 0:
                smem[0] = cuda.atomic.add(ws, WS_TICKET, 1)
            cuda.syncthreads()
            tile = smem[0]
    while smem[3] == 0 and tile < n_blocks:
        if tid == 0:
            craw = np.int64(f32[(counts_off >> 2) + tile])
            lim = min(n - tile * fmt.BLOCK, fmt.BLOCK)
            cnt = craw
            if cnt > lim:
                cnt = lim
                cuda.atomic.or_(ws, WS_ERR, ERR_COUNTS)
            smem[7] = cnt
            smem[8] = craw
            publish(ws, tile, epoch, STATUS_INC if tile == 0 else STATUS_AGG, cnt)
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
            if lane == 0:
                votes[warp * 32 + q0] = s0
                votes[warp * 32 + q0 + 1] = s1
                votes[warp * 32 + q0 + 2] = s2
                votes[warp * 32 + q0 + 3] = s3
            seen += popc(s0) + popc(s1) + popc(s2) + popc(s3)
        if lane == 0:
            smem[9 + warp] = seen
        cuda.syncthreads()  # A: warp totals, votes, the stored count
        woff = np.int64(0)
        btot = np.int64(0)
        for w in range(4):
            c = smem[9 + w]
            if w < warp:
                woff += c
            btot += c
        if warp == 0:
            cnt = smem[7]
            prefix = np.int64(0)
            if tile > 0:
                prefix = lookback(ws, tile, epoch, lane)
                if lane == 0:
                    publish(ws, tile, epoch, STATUS_INC, prefix + cnt)
            if lane == 0:
                smem[13] = prefix
                if btot != smem[8]:
                    err |= ERR_COUNTS
                if tile == n_blocks - 1 and prefix + cnt != nesc:
                    err |= ERR_TOTAL
                if do_cs:
                    cs = wrap64(cs + smem[8] * (2 * (((counts_off - HDR) >> 2) + tile) + 1))
                smem[0] = cuda.atomic.add(ws, WS_TICKET, 1)
        cuda.syncthreads()  # B: this tile's prefix, the next ticket
        if btot != 0:
            run = smem[13] + woff
            for q in range(32):
                esc = votes[warp * 32 + q]
                if (esc >> lane) & 1:
                    pos = run + popc(esc & below)
                    e = wbase + 32 * q + lane
                    if pos < 0 or pos >= nesc:
                        err |= ERR_ESCAPE_RANGE
                    else:
                        ex = np.int64(f8[eo + pos])
                        if do_cs:
                            cs = wrap64(cs + byte_checksum(ex, eo + pos - HDR))
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
        cuda.atomic.or_(ws, WS_ERR, err)
    if do_cs:
        cs = warp_sum(cs)
        if lane == 0:
            cuda.atomic.add(ws, WS_CSUM + (cuda.blockIdx.x & 7), cs)


@cuda.jit(device=True)
def _padding_sum(f8, lay, tid):
    """Checksum terms of the padding bytes between sections (runs shorter than ALIGN)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    cs = np.int64(0)
    sm_end = HDR + (((n + 7) & ~np.int64(7)) if lay[11] == FP32 else n)  # FP32: decode.py's tiles
    starts = (sm_end, lay[4] + 4 * lay[8], lay[9] + 2 * n if lay[11] == FP32 else lay[5])
    ends = (planes_off, lay[9], lay[5])
    for r in range(3):
        i = starts[r] + tid
        if i < ends[r]:
            cs = wrap64(cs + byte_checksum(np.int64(f8[i]), i - HDR))
    for k in range(lay[10]):
        i = planes_off + k * stride + 4 * lay[7] + tid
        if i < planes_off + (k + 1) * stride:
            cs = wrap64(cs + byte_checksum(np.int64(f8[i]), i - HDR))
    return cs


@cuda.jit
def wide_finish(f8, f64, ws, lay, crc_zero, crc_tab):
    """Header CRC, escape total, payload checksum; publish the call's errors (one block)."""
    smem = cuda.shared.array(4, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    ok, raw, nesc, has_cs = header_ok(f64, f8.shape[0], lay)
    cs = np.int64(0)
    if ok and raw == 0 and has_cs != 0:
        cs = _padding_sum(f8, lay, tid)
    cs = warp_sum(cs)
    if lane == 0:
        smem[tid >> 5] = cs
    cuda.syncthreads()
    if tid < 32:
        crc = np.int64(0)
        for i in range(lane, 8 * (HDR - 4), 32):  # CRC-32 of header bytes 0..123, bit by bit
            if (f64[i >> 6] >> (i & 63)) & 1:
                crc ^= crc_tab[i]
        crc = warp_xor(crc) ^ crc_zero
        part = np.int64(0)
        if lane < 8:
            part = atomic_read(ws, WS_CSUM + lane)
        total = wrap64(warp_sum(part) + smem[0] + smem[1] + smem[2] + smem[3])
        if lane == 0:
            err = atomic_read(ws, WS_ERR)
            if not ok:
                err |= ERR_HEADER
            if crc != ((f64[15] >> 32) & LOW32):
                err |= ERR_HEADER_CRC
            if ok and has_cs != 0 and total != f64[4]:
                err |= ERR_CHECKSUM
            if ok and raw == 0 and lay[8] == 0 and nesc != 0:
                err |= ERR_TOTAL
            ws[WS_ERR] = 0
            ws[WS_ERR_LAST] = err
            ws[WS_ERR_STICKY] = ws[WS_ERR_STICKY] | err
            ws[WS_TICKET] = 0
        if lane < 8:
            ws[WS_CSUM + lane] = 0
    advance_epoch(ws, tid)


def launch(f8, f16, f32, f64, out32, out16, ws, lay: fmt.Layout, crc_zero: int, crc_tab, stream) -> None:
    """Enqueue the decoder through Numba's dispatcher (the simulator's route). ``f*``: the
    frame buffer as uint8 / 16 / 32 / int64; ``out32`` / ``out16``: the output as uint32 /
    uint16 (FP32: n / 2n of them; FP16: out32 empty, n)."""
    lt = wide_tuple(lay)
    if lay.n_blocks and lay.dtype == FP32:
        decode.decode_tiles32[grid_size(lay.n_blocks, decode.FP32_BLOCKS_PER_SM), TPB, stream](
            f8, f32, f64, out32, out16, ws, lt)
    elif lay.n_blocks:
        wide_tiles[grid_size(lay.n_blocks), TPB, stream](f8, f16, f32, f64, out16, ws, lt)
    wide_finish[1, TPB, stream](f8, f64, ws, lt, crc_zero, crc_tab)


_A = launch_route.array
TILES = launch_route.Kernel(wide_tiles, (_A(np.uint8), _A(np.uint16), _A(np.uint32), _A(np.int64),
                                         _A(np.uint16), _A(np.int64), launch_route.int_tuple(12)))
FINISH = launch_route.Kernel(wide_finish, (_A(np.uint8), _A(np.int64), _A(np.int64),
                                           launch_route.int_tuple(12), launch_route.I64, _A(np.int64)))


class Plan:
    """The launches of one FP32 / FP16 decode with everything but the stream fixed:
    ``decode.decode_tiles32`` (FP32) or ``wide_tiles`` (FP16), then ``wide_finish``."""

    __slots__ = ("device", "tiles", "finish", "tiles_grid", "p_tiles", "p_finish", "workspace", "f_slots",
                 "o_slots")

    def __init__(self, device: int, f_ptr: int, f_nbytes: int, out_ptr: int, lay: fmt.Layout,
                 ws_ptr: int, ws_count: int, crc_zero: int, crc_ptr: int, crc_count: int):
        n = lay.n
        lt = wide_tuple(lay)
        frame = ((f_ptr, f_nbytes), (f_ptr, f_nbytes // 2), (f_ptr, f_nbytes // 4), (f_ptr, f_nbytes // 8))
        self.device = device
        self.tiles = None
        if lay.n_blocks:
            if lay.dtype == FP32:  # the BF16 tile kernel's FP32 build (decode.py)
                self.tiles_grid = grid_size(lay.n_blocks, decode.FP32_BLOCKS_PER_SM)
                self.tiles = decode.TILES32.function(device)
                self.p_tiles = launch_route.Params(decode.TILES32, (
                    frame[0], frame[2], frame[3], (out_ptr, n), (out_ptr, 2 * n), (ws_ptr, ws_count), lt))
                self.f_slots, self.o_slots = _T32_F, _T32_OUT
            else:
                self.tiles_grid = grid_size(lay.n_blocks)
                self.tiles = TILES.function(device)
                self.p_tiles = launch_route.Params(TILES, (*frame, (out_ptr, n), (ws_ptr, ws_count), lt))
                self.f_slots, self.o_slots = _F_SLOTS, _OUT_SLOTS
        self.finish = FINISH.function(device)
        self.p_finish = launch_route.Params(FINISH, (frame[0], frame[3], (ws_ptr, ws_count), lt, crc_zero,
                                                     (crc_ptr, crc_count)))

    def retarget(self, f_ptr: int, out_ptr: int) -> None:
        """Point the plan at other buffers of the same sizes (the frame, the values)."""
        if self.tiles is not None:
            for slot in self.f_slots:
                self.p_tiles.set(slot, f_ptr)
            for slot in self.o_slots:
                self.p_tiles.set(slot, out_ptr)
        for slot in _FIN_F_SLOTS:
            self.p_finish.set(slot, f_ptr)

    def launch(self, stream: int) -> None:
        if self.tiles is not None:
            launch_route.launch(self.tiles, self.tiles_grid, TPB, stream, self.p_tiles)
        launch_route.launch(self.finish, 1, TPB, stream, self.p_finish)


_F_SLOTS = tuple(TILES.data_slot(i) for i in range(4))
_OUT_SLOTS = (TILES.data_slot(4),)
_T32_F = tuple(decode.TILES32.data_slot(i) for i in range(3))
_T32_OUT = (decode.TILES32.data_slot(3), decode.TILES32.data_slot(4))
_FIN_F_SLOTS = (FINISH.data_slot(0), FINISH.data_slot(1))
