"""GPU encoder: BF16 bit patterns -> a zipccl frame, byte-identical to ``codec.reference.encode``.

Two launches, no host synchronisation:

1. ``encode_tiles``: a persistent grid (``_common.grid_size``: 8 blocks of 128
   threads per multiprocessor) whose blocks take tiles (one escape block of 4096
   elements; two a ticket, "BF16 pairs" below) from the workspace ticket counter until
   none is left. Each block
   builds the 256-entry code table once: the entry of exponent e holds code bit
   k at bit 8k (code = 1 + codebook index) or the escape flag at bit 24. In a
   tile each warp codes 1024 consecutive elements in 4 rounds; in round r lane j
   holds elements 256r + 8j .. +7. The input is double-buffered through shared
   memory: once a tile's escape prefix is known (barrier B) every lane issues the
   asynchronous copies (``cp.async``, 4 x 16 bytes) of its own units of the next
   tile into the other staging buffer, and waits for them only when it starts that
   tile; a lane reads only what it copied itself, so the staging needs no block
   barrier. Per element: a shift and a mask take the table index
   from the 32-bit word, one shared-memory lookup, one multiply-add into the
   lane's accumulator at the element's slot, so that after 8 elements bytes 0..2
   of the accumulator are the lane's byte of each code plane and byte 3 its
   escape mask. The plane bytes of a round are assembled in shared memory (a
   warp's 3 x 128 bytes) and leave as 16-byte stores by 24 lanes. Sign-mantissa
   bytes: two byte permutes (PRMT) gather the low and high bytes of 4 values, one
   LOP3 merges sign and mantissa; 8 bytes per lane and round in one store. All
   per-element work is 32-bit (``u32`` after every operation), and stores use one unsigned
   base index per section with constant offsets per round. Escapes: one packed
   exclusive warp scan of the 4 rounds' per-lane counts (8-bit fields,
   ``_common.exclusive_scan8``) and a block sum give each escape its rank in
   the tile; the tile's count is published for the decoupled look-back
   (``_common.lookback``), which yields the tile's first position in the escape
   section, and each lane writes its own escaped exponent bytes there
   (read from the staging buffer). The tile holding the end of the data takes a
   masked path (2-byte loads from global memory, byte stores, values past n get
   code 0 and no escape). Positions are sums of counts: deterministic. Payload checksum
   contributions (when asked for) are summed per block and added to 8
   workspace slots (integer sums commute: deterministic).
2. ``encode_finish`` reads the escape total from the last tile's inclusive
   status word, decides RAW by ``Layout.is_raw``'s rule, writes the RAW frame
   when needed (grid-stride copy, its own checksum), zeroes the padding bytes
   otherwise; block 0 (a coded frame) or the last block to finish (RAW) writes the
   128-byte header (CRC-32 computed
   by a warp from a per-bit table, see ``_common``), resets the workspace
   counters and advances the epoch.

FP32 (``encode_tiles32``, the same kernel built with ``fp32`` set): an FP32 frame is the
BF16 frame of the values' upper halves plus a section of their low halves
(docs/FORMAT.md), so in each round a lane loads its 8 values with two 16-byte loads, byte
permutes split them into 4 words of upper halves (coded exactly as BF16 words) and 4 words
of low halves (one 16-byte store into the low-halves section, the tail tile 2 bytes per
value); all 8 loads of a tile go out before its first store (a load cannot move above a
store that may alias it). FP32 tiles are not staged (32 KiB per block would halve the resident blocks);
escaped values re-read their upper half from global memory. Block 0 zeroes the padding after
the sign-mantissa words and after the counts; ``encode_finish`` (with ``finish_tuple``) the
rest. The layout tuple is ``wide_tuple``.

One tile's work is written once for every element type (``_tile_words``, ``_code_tile``,
``_escapes``, the type a compile-time constant).

FP16 (``encode_tiles16``, one tile a ticket): the same kernel with FP16's bits, as a 2-byte type
staged like BF16: an FP16 value's high byte (sign, 5 exponent bits, mantissa bits 9..8) indexes
the code table (code bits and escape flag of its exponent) and a second table (the 3 raw bits
of bit planes 3..5, accumulated like the code bits); the byte plane is the low byte, an escape
byte the 5-bit exponent, and block 0 zeroes the padding runs of the 6 planes. ``launch_wide`` /
``WidePlan`` launch the FP32 and FP16 builds and ``encode_finish`` (with ``finish_tuple``).

BF16 pairs (``encode_tiles``): a ticket names two escape blocks, tiles 2k and 2k + 1, coded one
after the other from the two staging buffers; then one barrier A (both tiles' warp totals),
one status word (the pair's count, its look-back, its inclusive prefix), barrier B, both tiles'
escapes, and the next pair's copies once a tile's escapes are read. The frame still stores one
escape count per 4,096-value block; ``encode_finish`` reads the last pair's status word.

Version history and H200 measurements: experiments/kernels/NOTES.md (BF16 is v6c: v5's code,
v4's with the shared-memory staging, taking two tiles a ticket; v4 and v6c's experiment copy
are in git history, v3 is kept as experiments/kernels/v3_encode.py). All offsets come from
``zipccl.format.Layout`` through the ``lay`` tuple built by ``layout_tuple``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from . import launch as launch_route
from . import plan as plans
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
    escape_step,
    exclusive_scan8,
    first_ticket,
    flush_checksum,
    grid_size,
    popc32,
    prmt,
    quad_checksum,
    store_count,
    take_ticket,
    tile_prefix,
    warp_offsets,
    warp_sum,
    warp_xor,
    zero_padding,
)
from .compat import (
    atomic_read,
    cp_async16,
    cp_commit,
    cp_wait0,
    lds16,
    load16,
    store16,
    sts8,
    syncwarp,
    u32,
    wrap64,
)
from .layout import (
    FP16,
    FP32,
    LAY_FIELDS,
    WIDE_FIELDS,
    finish_tuple,
    lay_lo,
    lay_no_lo,
    layout_fields,
    layout_tuple,
    wide_tuple,
)

U64 = np.uint64
HDR8 = fmt.HEADER_SIZE // 8  # the sign-mantissa plane starts at this int64 word
TILE_WORDS = fmt.BLOCK // 2  # uint32 words of BF16 input in one tile
STAGE_WORDS = 2 * TILE_WORDS  # two staging buffers per block (16 KiB of shared memory)
PER_TICKET = {fmt.DTYPE_BF16: 2, fmt.DTYPE_FP32: 1, fmt.DTYPE_FP16: 1}  # escape blocks a ticket
FP16_PLANES = fmt.N_PLANES[FP16]  # code planes and raw bit planes of an FP16 frame


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
    """BF16 (module docstring, "pairs"): code pairs of tiles from the ticket counter until none is
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
    """The tile kernel for input of element type ``dt`` (``format.DTYPE_*``: BF16, FP32 (module
    docstring, "FP32") or FP16 (the tables of ``_fp16_entries``)), a compile-time constant, so
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
        """Code tiles taken from the ticket counter until none is left (module docstring)."""
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


@cuda.jit
def encode_finish(x32, x16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, force_raw, do_cs,
                  tiles, cb_dev):
    """RAW decision and RAW copy, zero padding, header (see the module docstring)."""
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


class Plan(plans.Plan):
    """The launches of one encode with everything but the stream fixed: the values at
    ``x_ptr`` (n of them), the frame buffer ``out_ptr`` (``out_nbytes``), the workspace,
    the header template, codebook and checksum flag. Built once per buffer set
    (``codec/gpu.py`` caches it); ``launch(stream)`` is two driver calls, ``retarget(x_ptr,
    out_ptr)`` points it at other buffers of the same sizes.
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

encode_tiles16 = _tiles_kernel(FP16)
TILES16 = launch_route.Kernel(encode_tiles16, TILES32.argtypes)


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
