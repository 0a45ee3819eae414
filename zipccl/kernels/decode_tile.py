"""The device parts every tile decoder shares (the block decoders of ``decode`` and
``decode_fp16``, the warp decoder of ``decode_warps``): a tile's plane loads, a round's
decode through the spread table and the codebook permute, the FP32 low halves, the escape
patch, RAW units, and a block's start (ticket, epoch, header check).

How the decoders use them, and why they are built so: docs/KERNELS.md.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from ..format.errors import ERR_ESCAPE_RANGE, ERR_HEADER
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from ._common import (
    TPB,
    WS_EPOCH,
    WS_ERR,
    byte_checksum,
    decoder_header,
    dev,
    escape_step,
    popc32,
    prmt,
    quad_checksum,
    take_stored_count,
    take_ticket,
)
from .compat import load16, store16, u32, wrap64
from .layout import (
    MAGIC_BF16,
    MAGIC_FP32,
    header_ok,
    lay_lo,
    lay_no_lo,
    layout_fields,
    wide_header_ok,
)

U64 = np.uint64

# FP32 builds: low halves loaded two rounds ahead, launch bounds of 6 resident blocks (<= 80 registers:
# under 64 it spills); measured against the other settings in experiments/kernels/NOTES.md
FP32_LO_AHEAD = 2
FP32_BLOCKS_PER_SM = 6
HDR8 = fmt.HEADER_SIZE // 8


@cuda.jit(device=True)
def store(out32, out16, e, vm, o0, o1, o2, o3):
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
def spread_entry(p):
    """Bit i of the byte p moved to bit 4i."""
    s = u32(0)
    for i in range(8):
        s = u32(s | u32(u32(u32(p >> i) & 1) << (4 * i)))
    return s


@dev
def fill_spread(spread, tid):
    """Thread ``tid``'s two entries of the block's shared spread table (entry p:
    ``spread_entry(p)``): read the table after the next barrier."""
    spread[tid] = spread_entry(tid)
    spread[tid + TPB] = spread_entry(tid + TPB)


@dev
def codebook_words(cb64):
    """The header's codebook word as the two byte-permute tables of ``decode_round``: byte 0
    the exponent 0 of the escape code, bytes 1-3 entries 0-2; entries 3-6."""
    return u32(cb64 << 8), u32(cb64 >> 24)


@dev
def load_round(f8, f64, u, n, planes_off, stride, pwords):
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
def load_tile(f8, f64, tile, warp, lane, n, planes_off, stride, pwords):
    """The lane's bytes of a tile: 4 rounds of ``load_round`` results. Full tiles load from
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
    a = load_round(f8, f64, g, n, planes_off, stride, pwords)
    b = load_round(f8, f64, g + 32, n, planes_off, stride, pwords)
    c = load_round(f8, f64, g + 64, n, planes_off, stride, pwords)
    d = load_round(f8, f64, g + 96, n, planes_off, stride, pwords)
    return a, b, c, d


@dev
def four(sm, ex):
    """4 BF16 values (2 words) from 4 sign-mantissa bytes and 4 exponent bytes."""
    hib = u32(u32(sm & 0x80808080) | u32(u32(ex >> 1) & 0x7F7F7F7F))
    lob = u32(u32(u32(ex << 7) & 0x80808080) | u32(sm & 0x7F7F7F7F))
    return prmt(lob, hib, 0x5140), prmt(lob, hib, 0x7362)


@dev
def decode_round(rd, spread, cba, cbb):
    """(4 output words, escape mask) of one round's loaded bytes ``rd``."""
    sm0, sm1, p0, p1, p2, vm = rd
    nib = u32(spread[p0] + u32(spread[p1] << 1) + u32(spread[p2] << 2))  # nibble i = code i
    o0, o1 = four(sm0, prmt(cba, cbb, nib))
    o2, o3 = four(sm1, prmt(cba, cbb, u32(nib >> 16)))
    esc = u32(u32(~u32(p0 | p1 | p2)) & vm)
    return o0, o1, o2, o3, esc


@dev
def round_cs(rd, u, planes_off, stride, pwords):
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
def store_round(out32, out16, u, vm, o0, o1, o2, o3):
    """Tail tile: store the round's values < n (from 8u)."""
    if vm == 0xFF:
        store16(out32, u, o0, o1, o2, o3)
    else:
        store(out32, out16, 8 * u, np.int64(vm), o0, o1, o2, o3)


def block_start(magic: int | None, scanned: bool = False):
    """A decoder block's start, for frames whose header bytes 0..5 are ``magic`` (None: FP32 or
    FP16 by the layout, ``layout.wide_header_ok``): every thread fills its entries of the shared
    spread table (``fill_spread``); thread 0 takes the first ticket, reads the epoch, checks the
    header and publishes the first tile's stored escape count, into the shared words ``smem``
    (``decoder_header``, smem[7], smem[8]); a bad header is reported once, by the block holding
    tile 0. After a barrier every thread returns whether the header fits."""
    if magic is None:
        check = wide_header_ok
    else:
        @dev
        def check(f64, nbytes, lay):
            return header_ok(f64, nbytes, lay, magic)

    @dev
    def start(f8, f32, f64, ws, lay, spread, smem):
        tid = np.int64(cuda.threadIdx.x)
        fill_spread(spread, tid)
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
    """(first tile, epoch, header's n_escapes, checksum present) as ``block_start`` left them,
    and the thread's index, lane and warp."""
    tid = np.int64(cuda.threadIdx.x)
    return smem[0], smem[1], smem[4], smem[5] != 0, tid, tid & 31, tid >> 5


@cuda.jit(device=True)
def lo32(f8, f32, u, vm, lo_off):
    """FP32 output, one round: the low halves of the values from 8u that are < n (mask ``vm``)
    as 4 words (one 16-byte load; in the tail tile 2 bytes per value, the others 0)."""
    if vm == 0xFF:
        return load16(f32, (lo_off >> 4) + u)
    q = lo_off + 16 * u
    return (lo_pair(f8, q, vm), lo_pair(f8, q + 4, u32(vm >> 2)), lo_pair(f8, q + 8, u32(vm >> 4)),
            lo_pair(f8, q + 12, u32(vm >> 6)))


@dev
def lo_pair(f8, q, vm):
    """The word of two low halves at byte q, each kept where bit 0 / 1 of vm is set."""
    w = u32(0)
    if vm & 1:
        w = u32(u32(f8[U64(q)]) | u32(u32(f8[U64(q + 1)]) << 8))
    if vm & 2:
        w = u32(w | u32(u32(f8[U64(q + 2)]) << 16) | u32(u32(f8[U64(q + 3)]) << 24))
    return w


@cuda.jit(device=True)
def store32(out32, u, vm, o0, o1, o2, o3, lo, lo_off, do_cs):
    """FP32 output, one round: the values from 8u that are < n (mask ``vm``), from their upper
    halves (o0..o3, two per word as BF16 values) and their low halves ``lo`` (``lo32``): two
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
def raw_unit(f8, f32, out32, out16, g, units, do_cs, cs):
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


def tile_parts(fp32: bool, lo_ahead: int):
    """The parts a BF16 or (``fp32``) FP32 tile decoder takes by its output type: (the header's
    magic, the layout's low-halves offset, ``quarter_code``, ``escape_patch``)."""
    return (MAGIC_FP32 if fp32 else MAGIC_BF16, lay_lo if fp32 else lay_no_lo, quarter_code(fp32, lo_ahead),
            escape_patch(fp32))


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
        a0, a1, a2, a3, esc0 = decode_round(ra, spread, cba, cbb)
        b0, b1, b2, b3, esc1 = decode_round(rb, spread, cba, cbb)
        c0, c1, c2, c3, esc2 = decode_round(rc, spread, cba, cbb)
        d0, d1, d2, d3, esc3 = decode_round(rd, spread, cba, cbb)
        if fp32:  # with the low halves, lo_ahead rounds' loaded before a store
            la = lo32(f8, f32, g, ra[5], lo_off)
            if lo_ahead >= 2:
                lb = lo32(f8, f32, g + 32, rb[5], lo_off)
            if lo_ahead >= 4:
                lc = lo32(f8, f32, g + 64, rc[5], lo_off)
                ld = lo32(f8, f32, g + 96, rd[5], lo_off)
            lcs = store32(out32, g, ra[5], a0, a1, a2, a3, la, lo_off, do_cs)
            if lo_ahead < 2:
                lb = lo32(f8, f32, g + 32, rb[5], lo_off)
            lcs = wrap64(lcs + store32(out32, g + 32, rb[5], b0, b1, b2, b3, lb, lo_off, do_cs))
            if lo_ahead < 4:
                lc = lo32(f8, f32, g + 64, rc[5], lo_off)
                if lo_ahead == 2:
                    ld = lo32(f8, f32, g + 96, rd[5], lo_off)
            lcs = wrap64(lcs + store32(out32, g + 64, rc[5], c0, c1, c2, c3, lc, lo_off, do_cs))
            if lo_ahead < 2:
                ld = lo32(f8, f32, g + 96, rd[5], lo_off)
            lcs = wrap64(lcs + store32(out32, g + 96, rd[5], d0, d1, d2, d3, ld, lo_off, do_cs))
            cs = wrap64(cs + lcs)
        elif ra[5] == 0xFF and rd[5] == 0xFF:
            store16(out32, g, a0, a1, a2, a3)
            store16(out32, g + 32, b0, b1, b2, b3)
            store16(out32, g + 64, c0, c1, c2, c3)
            store16(out32, g + 96, d0, d1, d2, d3)
        else:
            store_round(out32, out16, g, ra[5], a0, a1, a2, a3)
            store_round(out32, out16, g + 32, rb[5], b0, b1, b2, b3)
            store_round(out32, out16, g + 64, rc[5], c0, c1, c2, c3)
            store_round(out32, out16, g + 96, rd[5], d0, d1, d2, d3)
        if do_cs:
            cs = wrap64(cs + round_cs(ra, g, planes_off, stride, pwords)
                        + round_cs(rb, g + 32, planes_off, stride, pwords)
                        + round_cs(rc, g + 64, planes_off, stride, pwords)
                        + round_cs(rd, g + 96, planes_off, stride, pwords))
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


