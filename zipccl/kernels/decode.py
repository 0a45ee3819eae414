"""GPU decoder: a zipccl frame -> BF16 bit patterns, accepting exactly what
``codec.reference.decode`` accepts, never writing outside the output.

Two launches, no host synchronisation:

1. ``decode_tiles``: a persistent grid (``_common.grid_size``) whose blocks take
   tiles (one escape block of 4096 values) from the ticket counter. Thread 0 of
   every block checks the header fields it relies on (magic, version, dtype,
   flags, element count = the output's, lengths against the buffer and the
   layout); if they do not fit the block writes nothing. When a tile is drawn,
   its stored escape count is published at once for the look-back scan
   (``_common``), so the scan resolves while the tile decodes. In round r lane j
   decodes values 256r + 8j .. +7 of its warp's 1024: it loads their 8
   sign-mantissa bytes (one 8-byte load) and its byte of each code plane (3
   one-byte loads; a warp reads 32 contiguous bytes per plane, no shuffles). A
   256-entry shared table spreads a plane byte's bit i to bit 4i, so three
   lookups and two multiply-adds give the 8 codes as nibbles; a byte permute
   (PRMT) whose source is the codebook itself (byte 0 = 0 for the escape, bytes
   1..7 = the 7 exponents) and whose selector is that nibble word returns 4
   exponent bytes at once. High bytes (sign | exponent >> 1) and low bytes
   (exponent bit 0 | mantissa) of 4 values take one shift and one LOP3 each, two
   more permutes interleave them into 4 BF16 values, and the round leaves in one
   16-byte store. All per-value work is 32-bit. Escaped values are stored with
   exponent 0 and rewritten (a 2-byte store by the same thread, which program
   order makes the last) once the look-back has given the tile's first escape
   position: ranks come from one packed exclusive warp scan, as in the encoder.
   Each tile compares the escape codes it saw with its stored count, and each
   escape read is checked against the header's escape total. The next tile's
   loads are issued before the current tile patches its escapes.
2. ``decode_finish`` (one block) checks the header CRC, the escape total and
   the payload checksum (summed from the tiles plus the padding bytes it reads
   itself), publishes the call's error bits, resets the counters and advances
   the epoch. Error bits (``format.errors``): WS_ERR_LAST holds the last call's,
   WS_ERR_STICKY accumulates until the host clears it.

FP32 (``decode_tiles32``, the same kernel built with ``fp32`` set): the upper halves are
decoded as BF16 values; each round then loads the 8 values' low halves (one 16-byte load),
merges them with byte permutes and stores 32 bytes; an escaped value's upper half is
rewritten as a 2-byte store. The low halves of two rounds are loaded before the first of
their stores (a load cannot move above a store that may alias it), and the FP32 build has
launch bounds of 6 resident blocks per multiprocessor (``FP32_BLOCKS_PER_SM``): under 64
registers it spills. The header must name FP32, and a RAW frame copies 4n bytes.
Its finishing kernel is ``decode_fp16.wide_finish`` (the FP32 padding runs).

A RAW frame is copied by ``decode_tiles`` (16-byte loads and stores). Version
history and H200 measurements: experiments/kernels/NOTES.md (this is v4; v3 is
kept as experiments/kernels/v3_decode.py).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from ..format.errors import ERR_CHECKSUM, ERR_ESCAPE_RANGE, ERR_HEADER, ERR_HEADER_CRC, ERR_TOTAL
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from . import launch as launch_route
from . import plan as plans
from ._common import (
    BLOCKS_PER_SM,
    LOW32,
    TPB,
    WS_CSUM,
    WS_EPOCH,
    WS_ERR,
    advance_epoch,
    block_escapes,
    block_ticket,
    byte_checksum,
    decoder_header,
    decoder_resolve,
    dev,
    escape_step,
    exclusive_scan8,
    flush_checksum,
    grid_size,
    popc32,
    prmt,
    publish_errors,
    quad_checksum,
    take_stored_count,
    take_ticket,
    warp_sum,
    warp_xor,
)
from .compat import atomic_read, load16, store16, u32, wrap64
from .layout import (
    LAY_FIELDS,
    MAGIC_BF16,
    MAGIC_FP32,
    WIDE_FIELDS,
    header_ok,
    lay_lo,
    lay_no_lo,
    layout_fields,
    layout_tuple,
    wide_header_ok,
)

U64 = np.uint64
HDR8 = fmt.HEADER_SIZE // 8


@cuda.jit(device=True)
def _store(out32, out16, e, vm, o0, o1, o2, o3):
    if vm == 0xFF:
        store16(out32, e >> 3, o0, o1, o2, o3)
    elif vm != 0:
        for k in range(8):
            if (vm >> k) & 1:
                w = o0
                if (k >> 1) == 1:
                    w = o1
                elif (k >> 1) == 2:
                    w = o2
                elif (k >> 1) == 3:
                    w = o3
                out16[e + k] = (np.int64(w) >> (16 * (k & 1))) & 0xFFFF



@dev
def _spread_entry(p):
    """Bit i of the byte p moved to bit 4i."""
    s = u32(0)
    for i in range(8):
        s = u32(s | u32(u32(u32(p >> i) & 1) << (4 * i)))
    return s


@dev
def _load_round(f8, f64, u, n, planes_off, stride, pwords):
    """Tail tile: (sign-mantissa bytes 0-3, 4-7, plane bytes p0, p1, p2, valid mask) of the
    8 values from 8u. Bytes outside the sections read as 0."""
    e = 8 * u
    if e + 8 <= n:
        sm = f64[U64(HDR8 + u)]
        q = planes_off + u
        return (u32(sm), u32(sm >> 32), u32(f8[U64(q)]), u32(f8[U64(q + stride)]),
                u32(f8[U64(q + 2 * stride)]), u32(0xFF))
    sm0 = u32(0)
    sm1 = u32(0)
    vm = u32(0)
    if e < n:
        sm = f64[U64(HDR8 + u)]
        sm0 = u32(sm)
        sm1 = u32(sm >> 32)
        vm = u32((np.int64(1) << (n - e)) - 1)
    p0 = u32(0)
    p1 = u32(0)
    p2 = u32(0)
    if u < 4 * pwords:
        q = planes_off + u
        p0 = u32(f8[U64(q)])
        p1 = u32(f8[U64(q + stride)])
        p2 = u32(f8[U64(q + 2 * stride)])
    return sm0, sm1, p0, p1, p2, vm


@dev
def _load_tile(f8, f64, tile, warp, lane, n, planes_off, stride, pwords):
    """The lane's bytes of a tile: 4 rounds of ``_load_round`` results. Full tiles load from
    one base index per section with constant offsets per round."""
    g = tile * 512 + warp * 128 + lane
    if (tile + 1) * fmt.BLOCK <= n:
        m = u32(0xFF)
        b = U64(HDR8 + g)
        sa = f64[b]
        sb = f64[b + U64(32)]
        sc = f64[b + U64(64)]
        sd = f64[b + U64(96)]
        b0 = U64(planes_off + g)
        b1 = U64(planes_off + stride + g)
        b2 = U64(planes_off + 2 * stride + g)
        a = (u32(sa), u32(sa >> 32), u32(f8[b0]), u32(f8[b1]), u32(f8[b2]), m)
        b = (u32(sb), u32(sb >> 32), u32(f8[b0 + U64(32)]), u32(f8[b1 + U64(32)]),
             u32(f8[b2 + U64(32)]), m)
        c = (u32(sc), u32(sc >> 32), u32(f8[b0 + U64(64)]), u32(f8[b1 + U64(64)]),
             u32(f8[b2 + U64(64)]), m)
        d = (u32(sd), u32(sd >> 32), u32(f8[b0 + U64(96)]), u32(f8[b1 + U64(96)]),
             u32(f8[b2 + U64(96)]), m)
        return a, b, c, d
    a = _load_round(f8, f64, g, n, planes_off, stride, pwords)
    b = _load_round(f8, f64, g + 32, n, planes_off, stride, pwords)
    c = _load_round(f8, f64, g + 64, n, planes_off, stride, pwords)
    d = _load_round(f8, f64, g + 96, n, planes_off, stride, pwords)
    return a, b, c, d


@dev
def _four(sm, ex):
    """4 BF16 values (2 words) from 4 sign-mantissa bytes and 4 exponent bytes."""
    hib = u32(u32(sm & 0x80808080) | u32(u32(ex >> 1) & 0x7F7F7F7F))
    lob = u32(u32(u32(ex << 7) & 0x80808080) | u32(sm & 0x7F7F7F7F))
    return prmt(lob, hib, 0x5140), prmt(lob, hib, 0x7362)


@dev
def _decode_round(rd, spread, cba, cbb):
    """(4 output words, escape mask) of one round's loaded bytes ``rd``."""
    sm0, sm1, p0, p1, p2, vm = rd
    nib = u32(spread[p0] + u32(spread[p1] << 1) + u32(spread[p2] << 2))  # nibble i = code i
    o0, o1 = _four(sm0, prmt(cba, cbb, nib))
    o2, o3 = _four(sm1, prmt(cba, cbb, u32(nib >> 16)))
    esc = u32(u32(~u32(p0 | p1 | p2)) & vm)
    return o0, o1, o2, o3, esc


@dev
def _round_cs(rd, u, planes_off, stride, pwords):
    """Payload checksum part of one round's sign-mantissa word and plane bytes."""
    sm0, sm1, p0, p1, p2, vm = rd
    cs = np.int64(0)
    if vm != 0:
        i = 2 * u
        cs = wrap64(np.int64(sm0) * (2 * i + 1) + np.int64(sm1) * (2 * i + 3))
    if u < 4 * pwords:
        q = planes_off + u - fmt.HEADER_SIZE
        cs = wrap64(cs + byte_checksum(np.int64(p0), q) + byte_checksum(np.int64(p1), q + stride)
                    + byte_checksum(np.int64(p2), q + 2 * stride))
    return cs


@dev
def _store_round(out32, out16, u, vm, o0, o1, o2, o3):
    """Tail tile: store the round's values < n (from 8u)."""
    if vm == 0xFF:
        store16(out32, u, o0, o1, o2, o3)
    else:
        _store(out32, out16, 8 * u, np.int64(vm), o0, o1, o2, o3)


def block_start(magic: int | None, scanned: bool = False):
    """A decoder block's start, for frames whose header bytes 0..5 are ``magic`` (None: FP32 or
    FP16 by the layout, ``layout.wide_header_ok``): thread 0 takes the first ticket, reads the
    epoch, checks the header and publishes the first tile's stored escape count, into smem
    (``decoder_header``, smem[7], smem[8]); a bad header is reported once, by the block holding
    tile 0. After a barrier every thread returns whether the header fits."""
    if magic is None:
        check = wide_header_ok
    else:
        @dev
        def check(f64, nbytes, lay):
            return header_ok(f64, nbytes, lay, magic)

    @dev
    def start(f8, f32, f64, ws, lay, smem, tid):
        if tid == 0:
            n, _, _, counts_off, _, _, _, n_blocks = layout_fields(lay)
            tile = take_ticket(ws)
            epoch = ws[WS_EPOCH]
            ok, raw, nesc, has_cs = check(f64, f8.shape[0], lay)
            decoder_header(smem, f64, tile, epoch, ok, raw, nesc, has_cs)
            if not ok:
                if tile == 0:
                    cuda.atomic.or_(ws, WS_ERR, ERR_HEADER)
            elif raw == 0:
                take_stored_count(f32, ws, tile, epoch, n, counts_off, n_blocks, smem, 7, scanned)
        cuda.syncthreads()
        return smem[2] != 0

    return start


@dev
def block_state(smem):
    """(first tile, epoch, header's n_escapes, checksum present) as ``block_start`` left them."""
    return smem[0], smem[1], smem[4], smem[5] != 0


@cuda.jit(device=True)
def _lo32(f8, f32, u, vm, lo_off):
    """FP32 output, one round: the low halves of the values from 8u that are < n (mask ``vm``)
    as 4 words (one 16-byte load; in the tail tile 2 bytes per value, the others 0)."""
    if vm == 0xFF:
        return load16(f32, (lo_off >> 4) + u)
    q = lo_off + 16 * u
    return (_lo_pair(f8, q, vm), _lo_pair(f8, q + 4, u32(vm >> 2)), _lo_pair(f8, q + 8, u32(vm >> 4)),
            _lo_pair(f8, q + 12, u32(vm >> 6)))


@dev
def _lo_pair(f8, q, vm):
    """The word of two low halves at byte q, each kept where bit 0 / 1 of vm is set."""
    w = u32(0)
    if vm & 1:
        w = u32(u32(f8[U64(q)]) | u32(u32(f8[U64(q + 1)]) << 8))
    if vm & 2:
        w = u32(w | u32(u32(f8[U64(q + 2)]) << 16) | u32(u32(f8[U64(q + 3)]) << 24))
    return w


@cuda.jit(device=True)
def _store32(out32, u, vm, o0, o1, o2, o3, lo, lo_off, do_cs):
    """FP32 output, one round: the values from 8u that are < n (mask ``vm``), from their upper
    halves (o0..o3, two per word as BF16 values) and their low halves ``lo`` (``_lo32``): two
    16-byte stores, in the tail tile one store per value. Returns the low halves' checksum
    terms."""
    l0, l1, l2, l3 = lo
    if vm == 0xFF:
        store16(out32, 2 * u, prmt(l0, o0, 0x5410), prmt(l0, o0, 0x7632), prmt(l1, o1, 0x5410),
                prmt(l1, o1, 0x7632))
        store16(out32, 2 * u + 1, prmt(l2, o2, 0x5410), prmt(l2, o2, 0x7632), prmt(l3, o3, 0x5410),
                prmt(l3, o3, 0x7632))
    elif vm != 0:
        for k in range(8):
            if (vm >> k) & 1:
                w = o0
                lw = l0
                if (k >> 1) == 1:
                    w = o1
                    lw = l1
                elif (k >> 1) == 2:
                    w = o2
                    lw = l2
                elif (k >> 1) == 3:
                    w = o3
                    lw = l3
                sh = u32(16 * (k & 1))
                out32[U64(8 * u + k)] = u32(u32(u32(w >> sh) << 16) | u32(u32(lw >> sh) & 0xFFFF))
    cs = np.int64(0)
    if do_cs:
        cs = quad_checksum(l0, l1, l2, l3, ((lo_off - fmt.HEADER_SIZE) >> 2) + 4 * u)
    return cs


@dev
def _raw_unit(f8, f32, out32, out16, g, units, do_cs, cs):
    """RAW frame: copy 16-byte unit g of the payload (``units`` 2-byte units in all; the last,
    partial unit byte by byte); returns the checksum with its terms added."""
    e = 8 * g
    if e + 8 <= units:
        v0, v1, v2, v3 = load16(f32, (fmt.HEADER_SIZE >> 4) + g)
        store16(out32, g, v0, v1, v2, v3)
        if do_cs:
            cs = wrap64(cs + quad_checksum(v0, v1, v2, v3, 4 * g))
    elif e < units:
        for k in range(8):
            if e + k < units:
                q = 2 * (e + k)
                lo = np.int64(f8[fmt.HEADER_SIZE + q])
                hi = np.int64(f8[fmt.HEADER_SIZE + q + 1])
                out16[e + k] = lo | (hi << 8)
                if do_cs:
                    cs = wrap64(cs + byte_checksum(lo, q) + byte_checksum(hi, q + 1))
    return cs


def quarter_code(fp32: bool, lo_ahead: int):
    """The code of a lane's 4 rounds (a warp's quarter of a tile: values from 8g, 8(g + 32), ...)
    for BF16 or (``fp32``, a constant) FP32 output, shared by the block decoder and
    ``decode_warps``: decode, store (FP32: the low halves merged in, ``lo_ahead`` rounds' loaded
    before the first store), checksum terms. The device function returns (escape mask, bit 8r + s
    for value s of round r; the 4 rounds' escape counts packed a byte each; the checksum)."""
    assert lo_ahead in (1, 2, 4)

    @dev
    def code(ra, rb, rc, rd, g, spread, cba, cbb, f8, f32, out32, out16, lo_off, planes_off, stride, pwords,
             do_cs, cs):
        a0, a1, a2, a3, esc0 = _decode_round(ra, spread, cba, cbb)
        b0, b1, b2, b3, esc1 = _decode_round(rb, spread, cba, cbb)
        c0, c1, c2, c3, esc2 = _decode_round(rc, spread, cba, cbb)
        d0, d1, d2, d3, esc3 = _decode_round(rd, spread, cba, cbb)
        if fp32:  # with the low halves, lo_ahead rounds' loaded before a store
            la = _lo32(f8, f32, g, ra[5], lo_off)
            if lo_ahead >= 2:
                lb = _lo32(f8, f32, g + 32, rb[5], lo_off)
            if lo_ahead >= 4:
                lc = _lo32(f8, f32, g + 64, rc[5], lo_off)
                ld = _lo32(f8, f32, g + 96, rd[5], lo_off)
            lcs = _store32(out32, g, ra[5], a0, a1, a2, a3, la, lo_off, do_cs)
            if lo_ahead < 2:
                lb = _lo32(f8, f32, g + 32, rb[5], lo_off)
            lcs = wrap64(lcs + _store32(out32, g + 32, rb[5], b0, b1, b2, b3, lb, lo_off, do_cs))
            if lo_ahead < 4:
                lc = _lo32(f8, f32, g + 64, rc[5], lo_off)
                if lo_ahead == 2:
                    ld = _lo32(f8, f32, g + 96, rd[5], lo_off)
            lcs = wrap64(lcs + _store32(out32, g + 64, rc[5], c0, c1, c2, c3, lc, lo_off, do_cs))
            if lo_ahead < 2:
                ld = _lo32(f8, f32, g + 96, rd[5], lo_off)
            lcs = wrap64(lcs + _store32(out32, g + 96, rd[5], d0, d1, d2, d3, ld, lo_off, do_cs))
            cs = wrap64(cs + lcs)
        elif ra[5] == 0xFF and rd[5] == 0xFF:
            store16(out32, g, a0, a1, a2, a3)
            store16(out32, g + 32, b0, b1, b2, b3)
            store16(out32, g + 64, c0, c1, c2, c3)
            store16(out32, g + 96, d0, d1, d2, d3)
        else:
            _store_round(out32, out16, g, ra[5], a0, a1, a2, a3)
            _store_round(out32, out16, g + 32, rb[5], b0, b1, b2, b3)
            _store_round(out32, out16, g + 64, rc[5], c0, c1, c2, c3)
            _store_round(out32, out16, g + 96, rd[5], d0, d1, d2, d3)
        if do_cs:
            cs = wrap64(cs + _round_cs(ra, g, planes_off, stride, pwords)
                        + _round_cs(rb, g + 32, planes_off, stride, pwords)
                        + _round_cs(rc, g + 64, planes_off, stride, pwords)
                        + _round_cs(rd, g + 96, planes_off, stride, pwords))
        escm = u32(esc0 | u32(esc1 << 8) | u32(esc2 << 16) | u32(esc3 << 24))
        cntp = u32(popc32(esc0) | u32(popc32(esc1) << 8) | u32(popc32(esc2) << 16)
                   | u32(popc32(esc3) << 24))
        return escm, cntp, cs

    return code


def escape_patch(fp32: bool):
    """The rewrite of a quarter's escaped values (stored with exponent 0 by ``quarter_code``),
    shared by both decoders: the escape of rank pos takes escape byte pos (checked against the
    header's total ``nesc``), a 2-byte store by the thread that stored the value, so program
    order makes it the last. ``base``: the escapes before this warp's quarter in the frame."""

    @dev
    def patch(f8, out16, escm, ex, w0t, w1t, w2t, base, g, eo, nesc, do_cs, cs, err):
        m = escm
        while m != 0:
            m, r, s, pos = escape_step(ex, w0t, w1t, w2t, escm, base, m)
            e = 8 * g + np.int64(u32(u32(r << 8) + s))
            smb = u32(f8[U64(fmt.HEADER_SIZE + e)])
            x = u32(0)
            if pos >= 0 and pos < nesc:
                x = u32(f8[U64(eo + pos)])
                if do_cs:
                    cs = wrap64(cs + byte_checksum(np.int64(x), eo + pos - fmt.HEADER_SIZE))
            else:
                err |= ERR_ESCAPE_RANGE
            hi = u32(u32(u32(smb & 0x80) << 8) | u32(x << 7) | u32(smb & 0x7F))
            if fp32:
                out16[U64(2 * e + 1)] = hi  # the upper half of FP32 value e
            else:
                out16[U64(e)] = hi
        return cs, err

    return patch


def _tiles_kernel(fp32: bool, lo_ahead: int = 2, blocks_per_sm: int = BLOCKS_PER_SM,
                  scanned: bool = False):
    """The tile kernel for BF16 output (``fp32`` False) or FP32 output (True; module
    docstring, "FP32"). ``fp32`` is a compile-time constant: each kernel holds only its path.
    ``lo_ahead`` (FP32): how many rounds' low halves are loaded before the stores of the first
    of them (1, 2 or 4); ``blocks_per_sm``: the launch bounds' resident blocks (8: at most 64
    registers); ``scanned``: the tiles' escape prefixes were written to the status words by a
    scan of the stored counts launched before (experiments/kernels/v6_scan.py), so no tile
    publishes or looks back. experiments/kernels/NOTES.md compares them."""
    assert lo_ahead in (1, 2, 4)
    first_tile = block_start(MAGIC_FP32 if fp32 else MAGIC_BF16, scanned)
    lo_of = lay_lo if fp32 else lay_no_lo
    code = quarter_code(fp32, lo_ahead)
    patch = escape_patch(fp32)
    per_ticket = 8 if fp32 else 4  # RAW copy: 16-byte units per thread and tile

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def decode_tiles(f8, f32, f64, out32, out16, ws, lay):
        """Decode tiles taken from the ticket counter, or copy a RAW frame (module docstring)."""
        n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
        lo_off = lo_of(lay)
        units = 2 * n if fp32 else n  # the RAW payload in 2-byte units
        spread = cuda.shared.array(256, dtype=np.uint32)
        smem = cuda.shared.array(16, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        warp = tid >> 5
        spread[tid] = _spread_entry(tid)
        spread[tid + TPB] = _spread_entry(tid + TPB)
        if not first_tile(f8, f32, f64, ws, lay, smem, tid):
            return  # the header does not fit: write nothing
        tile, epoch, nesc, do_cs = block_state(smem)
        cs = np.int64(0)
        if smem[3] != 0:  # RAW frame: copy, 4096 values per ticket
            while tile < n_blocks:
                g = tile * (TPB * per_ticket) + tid
                for _ in range(per_ticket):
                    cs = _raw_unit(f8, f32, out32, out16, g, units, do_cs, cs)
                    g += TPB
                tile = block_ticket(ws, smem, tid)
            if do_cs:
                flush_checksum(ws, cs, lane)
            return

        cb64 = smem[6]
        cba = u32(cb64 << 8)  # byte 0: exponent 0 for the escape code, bytes 1-3: entries 0-2
        cbb = u32(cb64 >> 24)  # entries 3-6
        err = np.int64(0)
        ra, rb, rc, rd = _load_tile(f8, f64, tile if tile < n_blocks else 0, warp, lane, n, planes_off,
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
                ra, rb, rc, rd = _load_tile(f8, f64, nxt, warp, lane, n, planes_off, stride, pwords)
            cs, err = patch(f8, out16, escm, ex, w0t, w1t, w2t, prefix + woff, g, eo, nesc, do_cs, cs, err)
            tile = nxt
        if err != 0:
            cuda.atomic.or_(ws, WS_ERR, err)
        if do_cs:
            flush_checksum(ws, cs, lane)

    return decode_tiles


# FP32: low halves loaded two rounds ahead, launch bounds of 6 resident blocks (<= 80 registers:
# under 64 it spills); measured against the other settings in experiments/kernels/NOTES.md
FP32_LO_AHEAD = 2
FP32_BLOCKS_PER_SM = 6
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
    from . import decode_warps as dw

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
        from . import decode_warps as dw

        n = lay.n
        lt = layout_tuple(lay)
        frame = ((f_ptr, f_nbytes), (f_ptr, f_nbytes // 4), (f_ptr, f_nbytes // 8))
        outs = ((out_ptr, (n & ~7) // 2), (out_ptr, n))
        steps = []
        if dw.chosen(lay.n_blocks, False, warps):
            steps.extend(dw.steps(device, frame, outs, (ws_ptr, ws_count), lt, lay.n_blocks, False))
        elif lay.n_blocks:  # both kernels start with the frame (f8, f32, f64); then (out32, out16)
            steps.append(plans.Step(TILES, device, grid_size(lay.n_blocks),
                                    (*frame, *outs, (ws_ptr, ws_count), lt), (0, 1, 2), (3, 4)))
        steps.append(plans.Step(FINISH, device, 1, (*frame, (ws_ptr, ws_count), lt, crc_zero,
                                                    (crc_ptr, crc_count)), (0, 1, 2), ()))
        super().__init__(device, tuple(steps))
