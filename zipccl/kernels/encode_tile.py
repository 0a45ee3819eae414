"""One tile of the GPU encoder, for every element type: the device functions ``encode``'s
tile kernels are built from.

A tile is one escape block (4096 values); each warp codes 1024 of them in 4 rounds of 8 values a
lane. Here: a tile's loads (2-byte types from the shared-memory staging, FP32 from global memory,
the tail tile masked), a round's coding through the 256-entry code table, the stores of the byte
plane and the code planes, the escapes' ranks and bytes, and the payload checksum terms of all of
them. The element type ``dt`` is a compile-time constant: BF16, FP32 and FP16 differ only where
their bits do.

How the pieces fit, and why they are built so: docs/GPU_CODEC.md, "The encoder". Every offset
comes from ``format.Layout`` through the layout tuple (``layout.py``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from ._common import (
    TPB,
    byte_checksum,
    dev,
    escape_step,
    exclusive_scan8,
    popc32,
    prmt,
    quad_checksum,
)
from .compat import (
    cp_async16,
    cp_commit,
    lds16,
    load16,
    store16,
    sts8,
    syncwarp,
    u32,
    wrap64,
)
from .layout import FP16, FP32, lay_no_lo, layout_fields

U64 = np.uint64
HDR8 = fmt.HEADER_SIZE // 8  # the sign-mantissa plane starts at this int64 word
TILE_WORDS = fmt.BLOCK // 2  # uint32 words of BF16 input in one tile


@cuda.jit(device=True)
def _load8(x32, x16, n, e):
    """Elements e..e+7 as four uint32 words of two elements, and the mask of those < n
    (2-byte loads past n & ~7: the tail tile only).
    """
    if e + 8 <= n:
        v = load16(x32, e >> 3)
        return v[0], v[1], v[2], v[3], np.int64(0xFF)
    w0 = np.uint32(0)
    w1 = np.uint32(0)
    w2 = np.uint32(0)
    w3 = np.uint32(0)
    vm = np.int64(0)
    if e < n:
        vm = (np.int64(1) << (n - e)) - 1
        w0 = np.uint32(x16[e])
        if e + 1 < n:
            w0 = np.uint32(np.int64(w0) | (np.int64(x16[e + 1]) << 16))
        if e + 2 < n:
            w1 = np.uint32(x16[e + 2])
        if e + 3 < n:
            w1 = np.uint32(np.int64(w1) | (np.int64(x16[e + 3]) << 16))
        if e + 4 < n:
            w2 = np.uint32(x16[e + 4])
        if e + 5 < n:
            w2 = np.uint32(np.int64(w2) | (np.int64(x16[e + 5]) << 16))
        if e + 6 < n:
            w3 = np.uint32(x16[e + 6])
    return w0, w1, w2, w3, vm


@dev
def _lut_entry(e, cb64):
    """Table value of exponent e: code bit k at bit 8k, or the escape flag at bit 24."""
    c = u32(0)
    for i in range(7):
        if ((cb64 >> (8 * i)) & 0xFF) == e:
            c = u32(i + 1)
    if c == 0:
        return u32(1 << 24)
    return u32(u32(c & 1) | u32(u32(c & 2) << 7) | u32(u32(c & 4) << 14))


@dev
def _pair(lut, w):
    """Table entries of the two values in w, the high one already shifted by one slot."""
    a = lut[u32(u32(w >> 7) & 0xFF)]
    b = lut[u32(u32(w >> 23) & 0xFF)]
    return u32(a + u32(b << 1))


@dev
def _code8(w0, w1, w2, w3, lut):
    """(acc, sign-mantissa bytes 0-3, bytes 4-7) of the 8 values in w0..w3 (all uint32)."""
    acc = _pair(lut, w0)
    acc = u32(acc + u32(_pair(lut, w1) << 2))
    acc = u32(acc + u32(_pair(lut, w2) << 4))
    acc = u32(acc + u32(_pair(lut, w3) << 6))
    lo = prmt(w0, w1, 0x6420)  # low bytes of values 0..3: mantissa, exponent bit 0
    hi = prmt(w0, w1, 0x7531)  # high bytes: sign, exponent bits 7..1
    sm0 = u32(u32(hi & 0x80808080) | u32(lo & 0x7F7F7F7F))
    lo = prmt(w2, w3, 0x6420)
    hi = prmt(w2, w3, 0x7531)
    sm1 = u32(u32(hi & 0x80808080) | u32(lo & 0x7F7F7F7F))
    return acc, sm0, sm1


@dev
def _load_tile(x32, x16, n, tile, warp, lane):
    """The lane's 16 words (4 rounds x 8 values) of a tile and the 4 rounds' valid masks."""
    g = tile * 512 + warp * 128 + lane  # 16-byte unit of round 0
    if (tile + 1) * fmt.BLOCK <= n:
        a0, a1, a2, a3 = load16(x32, g)
        b0, b1, b2, b3 = load16(x32, g + 32)
        c0, c1, c2, c3 = load16(x32, g + 64)
        d0, d1, d2, d3 = load16(x32, g + 96)
        m = u32(0xFF)
        return a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3, m, m, m, m
    e = 8 * g
    a0, a1, a2, a3, va = _load8(x32, x16, n, e)
    b0, b1, b2, b3, vb = _load8(x32, x16, n, e + 256)
    c0, c1, c2, c3, vc = _load8(x32, x16, n, e + 512)
    d0, d1, d2, d3, vd = _load8(x32, x16, n, e + 768)
    return (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3,
            u32(va), u32(vb), u32(vc), u32(vd))


@dev
def _plane_bytes(out8, acc, q, stride):
    """Bytes 0..2 of acc at q, q + stride, q + 2 stride (one byte of three consecutive planes)."""
    out8[U64(q)] = acc
    out8[U64(q + stride)] = u32(acc >> 8)
    out8[U64(q + 2 * stride)] = u32(acc >> 16)


@dev
def _planes_cs(acc, q, stride):
    """Payload checksum terms of ``_plane_bytes`` at payload offset q."""
    return wrap64(byte_checksum(np.int64(acc & 0xFF), q)
                  + byte_checksum(np.int64(u32(acc >> 8) & 0xFF), q + stride)
                  + byte_checksum(np.int64(u32(acc >> 16) & 0xFF), q + 2 * stride))


@dev
def _store_round(out8, out64, acc, sm0, sm1, vm, u, planes_off, stride, pwords):
    """Tail tile: store one round (values from 8u) where it lies inside the frame's sections:
    the sign-mantissa word while a value of it is < n, a plane byte while it lies inside the
    plane's words (its bits past n are 0)."""
    if vm != 0:
        out64[U64(HDR8 + u)] = np.int64(sm0) | (np.int64(sm1) << 32)
    if u < 4 * pwords:
        _plane_bytes(out8, acc, planes_off + u, stride)


@dev
def _round_cs(acc, sm0, sm1, vm, u, planes_off, stride, pwords):
    """Payload checksum part of what ``_store_tile`` / ``_store_round`` store for one round."""
    cs = np.int64(0)
    if vm != 0:
        i = 2 * u
        cs = wrap64(np.int64(sm0) * (2 * i + 1) + np.int64(sm1) * (2 * i + 3))
    if vm == 0xFF or u < 4 * pwords:
        cs = wrap64(cs + _planes_cs(acc, planes_off + u - fmt.HEADER_SIZE, stride))
    return cs


@dev
def _raw_round(out8, racc, vm, u, raw_off, stride, pwords, do_cs):
    """FP16, tail tile: one round's bytes of the 3 raw bit planes (from ``raw_off``), where they
    lie inside the planes' words; returns their checksum terms."""
    cs = np.int64(0)
    if u < 4 * pwords:
        _plane_bytes(out8, racc, raw_off + u, stride)
    if do_cs and (vm == 0xFF or u < 4 * pwords):
        cs = _planes_cs(racc, raw_off + u - fmt.HEADER_SIZE, stride)
    return cs


@dev
def _issue(stage, slot, x32, n, t, n_blocks, warp, lane):
    """This lane's asynchronous copies of its 4 units of tile t (a full tile) into staging
    buffer ``slot``, committed as one group (an empty group for the tail tile or none)."""
    if t < n_blocks and (t + 1) * fmt.BLOCK <= n:
        g = t * 512 + warp * 128 + lane
        s = slot * TILE_WORDS + 4 * (warp * 128 + lane)
        cp_async16(stage, s, x32, 4 * g)
        cp_async16(stage, s + 128, x32, 4 * g + 128)
        cp_async16(stage, s + 256, x32, 4 * g + 256)
        cp_async16(stage, s + 384, x32, 4 * g + 384)
    cp_commit()


@dev
def _word_below(x32, i, n):
    """x32[i] if i < n, else 0 (the tail tile's loads)."""
    v = u32(0)
    if i < n:
        v = u32(x32[i])
    return v


@cuda.jit(device=True)
def _load32(x32, u, n, full):
    """FP32 input, one round: the 8 values from 8u (two 16-byte loads; in the tail tile those
    < n, the others 0) and their valid mask, as one tuple of 9 uint32."""
    e = 8 * u
    if full or e + 8 <= n:
        v0, v1, v2, v3 = load16(x32, 2 * u)
        v4, v5, v6, v7 = load16(x32, 2 * u + 1)
        return v0, v1, v2, v3, v4, v5, v6, v7, u32(0xFF)
    v0 = u32(0)
    v1 = v0
    v2 = v0
    v3 = v0
    v4 = v0
    v5 = v0
    v6 = v0
    v7 = v0  # value e + 7 < n would make the round full
    vm = u32(0)
    if e < n:
        vm = u32((np.int64(1) << (n - e)) - 1)
        v0 = u32(x32[e])
        v1, v2, v3 = _word_below(x32, e + 1, n), _word_below(x32, e + 2, n), _word_below(x32, e + 3, n)
        v4, v5, v6 = _word_below(x32, e + 4, n), _word_below(x32, e + 5, n), _word_below(x32, e + 6, n)
    return v0, v1, v2, v3, v4, v5, v6, v7, vm


@cuda.jit(device=True)
def _split32(x32, out8, out32, u, lo_off, vals, do_cs):
    """One round of ``_load32`` values: store their low halves (one 16-byte store; in the tail
    tile 2 bytes per value < n) and return their upper halves as 4 BF16-style words (two
    values each), the valid mask and the low halves' checksum terms."""
    v0, v1, v2, v3, v4, v5, v6, v7, vm = vals
    l0 = prmt(v0, v1, 0x5410)
    l1 = prmt(v2, v3, 0x5410)
    l2 = prmt(v4, v5, 0x5410)
    l3 = prmt(v6, v7, 0x5410)
    e = 8 * u
    if vm == 0xFF:
        store16(out32, (lo_off >> 4) + u, l0, l1, l2, l3)
    else:
        for k in range(8):
            if (vm >> k) & 1:
                v = np.int64(x32[e + k])
                out8[lo_off + 2 * (e + k)] = v & 0xFF
                out8[lo_off + 2 * (e + k) + 1] = (v >> 8) & 0xFF
    cs = np.int64(0)
    if do_cs:
        cs = quad_checksum(l0, l1, l2, l3, ((lo_off - fmt.HEADER_SIZE) >> 2) + 4 * u)
    return (prmt(v0, v1, 0x7632), prmt(v2, v3, 0x7632), prmt(v4, v5, 0x7632), prmt(v6, v7, 0x7632),
            vm, cs)


# ---------------------------------------------------------------- one tile, by element type
# ``dt`` (a compile-time constant) is the element type: BF16 and FP16 tiles come from the
# shared-memory staging (2-byte values), FP32 tiles straight from global memory. FP16 differs
# from BF16 only where its bits do: the table is indexed by the high byte (sign, 5 exponent
# bits, mantissa bits 9..8), a second table gives the 3 raw bits (mantissa bits 8, 9, sign) of
# its bit planes 3..5, the byte plane is the low byte and an escape byte is the 5-bit exponent.

@dev
def _fp16_entries(hb, cb64):
    """FP16 tables at high byte hb: (code bits at bit 8k + escape flag at bit 24, raw bits of
    planes 3..5 at bits 0, 8, 16)."""
    raw = u32(u32(hb & 1) | u32(u32(u32(hb >> 1) & 1) << 8) | u32(u32(u32(hb >> 7) & 1) << 16))
    return _lut_entry(u32(u32(hb >> 2) & 0x1F), cb64), raw


@dev
def _pair16(lut, rlut, w):
    """FP16: (``_pair``, raw-bit entries likewise) of the two values in w, by their high bytes."""
    ia = u32(u32(w >> 8) & 0xFF)
    ib = u32(w >> 24)
    return u32(lut[ia] + u32(lut[ib] << 1)), u32(rlut[ia] + u32(rlut[ib] << 1))


@dev
def _code8_16(w0, w1, w2, w3, lut, rlut):
    """FP16: (acc as ``_code8``'s, raw-plane bytes at bytes 0..2, low bytes 0-3, low bytes 4-7)."""
    acc, racc = _pair16(lut, rlut, w0)
    a, r = _pair16(lut, rlut, w1)
    acc = u32(acc + u32(a << 2))
    racc = u32(racc + u32(r << 2))
    a, r = _pair16(lut, rlut, w2)
    acc = u32(acc + u32(a << 4))
    racc = u32(racc + u32(r << 4))
    a, r = _pair16(lut, rlut, w3)
    acc = u32(acc + u32(a << 6))
    racc = u32(racc + u32(r << 6))
    return acc, racc, prmt(w0, w1, 0x6420), prmt(w2, w3, 0x6420)


@dev
def _code_any(dt, w0, w1, w2, w3, lut, rlut):
    """(acc, raw-plane bytes (FP16; else 0), byte-plane words 0-3 and 4-7) of 8 values."""
    if dt == FP16:
        return _code8_16(w0, w1, w2, w3, lut, rlut)
    acc, sm0, sm1 = _code8(w0, w1, w2, w3, lut)
    return acc, u32(0), sm0, sm1


@dev
def _tile_words(dt, ahead, stage, sb, x32, x16, out8, out32, n, tile, g, warp, lane, lo_off, full,
                do_cs):
    """This lane's 16 words of 2-byte values (4 rounds x 8 values; FP32: their upper halves, the
    low halves stored here) and the 4 rounds' valid masks, as one tuple; and the low halves'
    checksum terms (FP32)."""
    cs = np.int64(0)
    if dt == FP32:
        # every load of the tile before any store: a load cannot move above a store to a buffer
        # that may alias the input
        ra = _load32(x32, g, n, full)
        if ahead == 4:
            rb = _load32(x32, g + 32, n, full)
            rc = _load32(x32, g + 64, n, full)
            rd = _load32(x32, g + 96, n, full)
        a0, a1, a2, a3, va, la = _split32(x32, out8, out32, g, lo_off, ra, do_cs)
        if ahead == 1:
            rb = _load32(x32, g + 32, n, full)
        b0, b1, b2, b3, vb, lb = _split32(x32, out8, out32, g + 32, lo_off, rb, do_cs)
        if ahead == 1:
            rc = _load32(x32, g + 64, n, full)
        c0, c1, c2, c3, vc, lc = _split32(x32, out8, out32, g + 64, lo_off, rc, do_cs)
        if ahead == 1:
            rd = _load32(x32, g + 96, n, full)
        d0, d1, d2, d3, vd, ld = _split32(x32, out8, out32, g + 96, lo_off, rd, do_cs)
        if do_cs:
            cs = wrap64(la + lb + lc + ld)
    elif full:
        a0, a1, a2, a3 = lds16(stage, sb)
        b0, b1, b2, b3 = lds16(stage, sb + 128)
        c0, c1, c2, c3 = lds16(stage, sb + 256)
        d0, d1, d2, d3 = lds16(stage, sb + 384)
        va = u32(0xFF)
        vb = va
        vc = va
        vd = va
    else:  # the tail tile: 2-byte loads past n & ~7, values past n get code 0 and no escape
        (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3,
         va, vb, vc, vd) = _load_tile(x32, x16, n, tile, warp, lane)
    return (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3, va, vb, vc, vd), cs


@dev
def _stage_planes(pl, pb, acc0, acc1, acc2, acc3):
    """The 3 plane bytes of each of a lane's 4 rounds into the warp's plane staging (byte
    pb + 128k + 32r: plane k, round r)."""
    sts8(pl, pb, acc0)
    sts8(pl, pb + 32, acc1)
    sts8(pl, pb + 64, acc2)
    sts8(pl, pb + 96, acc3)
    sts8(pl, pb + 128, u32(acc0 >> 8))
    sts8(pl, pb + 160, u32(acc1 >> 8))
    sts8(pl, pb + 192, u32(acc2 >> 8))
    sts8(pl, pb + 224, u32(acc3 >> 8))
    sts8(pl, pb + 256, u32(acc0 >> 16))
    sts8(pl, pb + 288, u32(acc1 >> 16))
    sts8(pl, pb + 320, u32(acc2 >> 16))
    sts8(pl, pb + 352, u32(acc3 >> 16))


@dev
def _flush_planes(out32, pl, pw, q0, stride, lane):
    """Lanes 0..23: the warp's 3 x 128 staged plane bytes (from word pw of pl) to the frame,
    plane lane >> 3 and 16-byte unit lane & 7 (q0: the warp's byte in the first plane)."""
    if lane < 24:
        w0, w1, w2, w3 = lds16(pl, pw + 4 * lane)
        q = q0 + (lane >> 3) * stride + 16 * (lane & 7)
        store16(out32, q >> 4, w0, w1, w2, w3)


@dev
def _code_tile(dt, wd, lut, rlut, pl, out8, out32, out64, tile, g, warp, lane, full, planes_off, stride,
               pwords, do_cs):
    """Code one tile's 4 rounds of this lane (``_tile_words``' ``wd``) and store its byte plane
    and bit planes; returns (escape mask: bit 8r + s = value s of round r, the packed exclusive
    scan and the warp's 4 round totals of ``exclusive_scan8``, checksum terms)."""
    a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3, va, vb, vc, vd = wd
    acc0, x0, s0, s1 = _code_any(dt, a0, a1, a2, a3, lut, rlut)
    acc1, x1, t0, t1 = _code_any(dt, b0, b1, b2, b3, lut, rlut)
    acc2, x2, r0, r1 = _code_any(dt, c0, c1, c2, c3, lut, rlut)
    acc3, x3, q0, q1 = _code_any(dt, d0, d1, d2, d3, lut, rlut)
    raw_off = planes_off + 3 * stride
    cs = np.int64(0)
    if full:
        b = U64(HDR8 + g)
        out64[b] = np.int64(s0) | (np.int64(s1) << 32)
        out64[b + U64(32)] = np.int64(t0) | (np.int64(t1) << 32)
        out64[b + U64(64)] = np.int64(r0) | (np.int64(r1) << 32)
        out64[b + U64(96)] = np.int64(q0) | (np.int64(q1) << 32)
        span = 768 if dt == FP16 else 384  # staged plane bytes per warp
        pb = warp * span + lane
        _stage_planes(pl, pb, acc0, acc1, acc2, acc3)
        if dt == FP16:
            _stage_planes(pl, pb + 384, x0, x1, x2, x3)
        syncwarp()
        qw = tile * 512 + warp * 128
        _flush_planes(out32, pl, warp * (span >> 2), planes_off + qw, stride, lane)
        if dt == FP16:
            _flush_planes(out32, pl, warp * (span >> 2) + 96, raw_off + qw, stride, lane)
        syncwarp()
    else:
        acc0 = u32(acc0 & u32(va * 0x01010101))
        acc1 = u32(acc1 & u32(vb * 0x01010101))
        acc2 = u32(acc2 & u32(vc * 0x01010101))
        acc3 = u32(acc3 & u32(vd * 0x01010101))
        _store_round(out8, out64, acc0, s0, s1, va, g, planes_off, stride, pwords)
        _store_round(out8, out64, acc1, t0, t1, vb, g + 32, planes_off, stride, pwords)
        _store_round(out8, out64, acc2, r0, r1, vc, g + 64, planes_off, stride, pwords)
        _store_round(out8, out64, acc3, q0, q1, vd, g + 96, planes_off, stride, pwords)
        if dt == FP16:  # values past n are 0: no raw bits
            cs = wrap64(_raw_round(out8, x0, va, g, raw_off, stride, pwords, do_cs)
                        + _raw_round(out8, x1, vb, g + 32, raw_off, stride, pwords, do_cs)
                        + _raw_round(out8, x2, vc, g + 64, raw_off, stride, pwords, do_cs)
                        + _raw_round(out8, x3, vd, g + 96, raw_off, stride, pwords, do_cs))
    if do_cs:
        cs = wrap64(cs + _round_cs(acc0, s0, s1, va, g, planes_off, stride, pwords)
                    + _round_cs(acc1, t0, t1, vb, g + 32, planes_off, stride, pwords)
                    + _round_cs(acc2, r0, r1, vc, g + 64, planes_off, stride, pwords)
                    + _round_cs(acc3, q0, q1, vd, g + 96, planes_off, stride, pwords))
        if dt == FP16 and full:
            cs = wrap64(cs + _planes_cs(x0, raw_off + g - fmt.HEADER_SIZE, stride)
                        + _planes_cs(x1, raw_off + g + 32 - fmt.HEADER_SIZE, stride)
                        + _planes_cs(x2, raw_off + g + 64 - fmt.HEADER_SIZE, stride)
                        + _planes_cs(x3, raw_off + g + 96 - fmt.HEADER_SIZE, stride))
    escm = u32(u32(acc0 >> 24) | u32(u32(acc1 >> 16) & 0xFF00)
               | u32(u32(acc2 >> 8) & 0xFF0000) | u32(acc3 & 0xFF000000))
    cnt = u32(popc32(u32(escm & 0xFF)) | u32(popc32(u32(escm & 0xFF00)) << 8)
              | u32(popc32(u32(escm & 0xFF0000)) << 16) | u32(popc32(u32(escm & 0xFF000000)) << 24))
    ex, w0t, w1t, w2t, w3t = exclusive_scan8(cnt, lane)
    return escm, ex, w0t, w1t, w2t, w3t, cs


@dev
def _escapes(dt, escm, ex, w0t, w1t, w2t, base, dst, lim, stage, sb, x32, x16, g, full, do_cs, cs):
    """Store this lane's escape bytes at dst[base + rank] (rank: the escape's place among the
    tile's escapes below this warp's, from ``_code_tile``'s scan), those below ``lim``; with
    ``do_cs`` their checksum terms (dst is the frame) are added to cs."""
    e0 = 8 * g
    m = escm
    while m != 0:
        m, r, s, pos = escape_step(ex, w0t, w1t, w2t, escm, base, m)
        if dt == FP32:  # the upper half, from global memory (still cached)
            v = u32(x32[U64(e0 + np.int64(u32(u32(r << 8) + s)))] >> 16)
        elif full:  # the value, from the staging buffer (this lane copied it)
            wv = stage[sb + np.int64(u32(u32(r << 7) + u32(s >> 1)))]
            v = u32(u32(wv >> u32(16 * u32(s & 1))) & 0xFFFF)
        else:
            v = u32(x16[U64(e0 + np.int64(u32(u32(r << 8) + s)))])
        if pos < lim:  # past raw_size the frame is RAW and encode_finish rewrites it
            x = u32(u32(v >> 10) & 0x1F) if dt == FP16 else u32(u32(v >> 7) & 0xFF)
            dst[U64(pos)] = x
            if do_cs:
                cs = wrap64(cs + byte_checksum(np.int64(x), pos - fmt.HEADER_SIZE))
    return cs


@dev
def _fill_tables(dt, lut, rlut, tid, cb64):
    """Thread tid's two entries of the 256-entry code table (FP16: and of the raw-bit table)."""
    for e in (tid, tid + TPB):
        if dt == FP16:
            c, r = _fp16_entries(u32(e), cb64)
            lut[e] = c
            rlut[e] = r
        else:
            lut[e] = _lut_entry(e, cb64)


@dev
def _code_half(t, slot, stage, lut, rlut, pl, x32, x16, out8, out32, out64, lay, warp, lane, do_cs):
    """BF16, one tile t of a pair, from staging buffer ``slot`` (nothing past the last tile):
    (``_code_tile``'s escape mask, scan and round totals, its checksum terms, g, full, sb)."""
    n, planes_off, stride, _, _, _, pwords, n_blocks = layout_fields(lay)
    g = t * 512 + warp * 128 + lane
    full = (t + 1) * fmt.BLOCK <= n
    sb = slot * TILE_WORDS + 4 * (warp * 128 + lane)
    escm = u32(0)
    ex = u32(0)
    w0t = u32(0)
    w1t = u32(0)
    w2t = u32(0)
    w3t = u32(0)
    tcs = np.int64(0)
    if t < n_blocks:
        wd, _ = _tile_words(fmt.DTYPE_BF16, 4, stage, sb, x32, x16, out8, out32, n, t, g, warp, lane,
                            lay_no_lo(lay), full, do_cs)
        escm, ex, w0t, w1t, w2t, w3t, tcs = _code_tile(fmt.DTYPE_BF16, wd, lut, rlut, pl, out8, out32, out64,
                                                       t, g, warp, lane, full, planes_off, stride, pwords,
                                                       do_cs)
    return escm, ex, w0t, w1t, w2t, w3t, tcs, g, full, sb
