"""Kernel version 4 (encode): persistent blocks, 32-bit per-value work, byte-wide plane stores.

Same frame as the library encoder (``zipccl.kernels.encode``), whose ``encode_finish``
it reuses unchanged; only the tile kernel differs. What changed against v3 (see NOTES.md
for the instruction counts that motivated each point):

* **Persistent blocks.** The grid is a few blocks per multiprocessor; each block takes
  tiles (one escape block of 4096 values each) from the workspace ticket counter until
  none is left. The 256-entry code table is built once per block instead of once per
  tile, the next tile's ticket is taken while the current one finishes its look-back,
  and the next tile's four 16-byte loads per lane are issued before the current tile
  writes its escapes (double buffering across tiles).
* **Per value: one shared-memory lookup.** The table entry of an exponent holds code
  bit k at bit 8k and the escape flag at bit 24; a lane's 8 values (one 16-byte load)
  accumulate into one register ``acc`` (value s contributes entry << s), whose bytes
  0..2 are then the lane's byte of each code plane and byte 3 its escape mask. The
  index is taken straight from the 32-bit word (two values per word), so a value
  costs a shift, a mask, the lookup and one multiply-add, all 32-bit.
* **Plane bytes stored as bytes.** Lane j's plane byte k of a round covers values
  8j..8j+7 of the round's 256, so a warp's 32 byte stores per plane are 32
  contiguous bytes (one sector): no shuffles, no transpose.
* **Sign-mantissa bytes by byte permute**: PRMT gathers the low and the high bytes of
  four values, one LOP3 merges sign and mantissa: 3 instructions per 4 values.
* **Escape ranks by one packed exclusive scan** (4 rounds in 8-bit fields: an exclusive
  prefix over 31 lanes is at most 248, so no field carries), then each lane writes its
  own escaped exponent bytes (re-read from the input, which is still cached) at
  ``escapes_offset + block prefix + rank`` once the look-back has resolved.
* Unsigned 64-bit indices for global stores (no negative-index wrap-around code) and a
  tail path (masks, 2-byte loads) taken only by the tile that holds the end of the data.

Deterministic: positions are sums of counts; tiles are numbered by the ticket counter,
which only decides which block codes which tile.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from v4_util import dev, popc32, prmt, shfl_idx_u32, shfl_up_u32, sm_count

from zipccl import format as fmt
from zipccl.kernels import compat
from zipccl.kernels import encode as lib
from zipccl.kernels._common import (
    STATUS_AGG,
    STATUS_INC,
    TPB,
    WS_CSUM,
    WS_EPOCH,
    WS_TICKET,
    byte_checksum,
    lookback,
    publish,
    warp_sum,
)
from zipccl.kernels.compat import load16, u32, wrap64

U64 = np.uint64
HDR8 = fmt.HEADER_SIZE // 8  # the sign-mantissa plane starts at this int64 word
BLOCKS_PER_SM = 8


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
    """(acc, sign-mantissa bytes 0-3, bytes 4-7) of the 8 values in w0..w3."""
    acc = _pair(lut, w0)
    acc = u32(acc + u32(_pair(lut, w1) << 2))
    acc = u32(acc + u32(_pair(lut, w2) << 4))
    acc = u32(acc + u32(_pair(lut, w3) << 6))
    lo = prmt(w0, w1, 0x6420)  # low byte of values 0..3: mantissa, exponent bit 0
    hi = prmt(w0, w1, 0x7531)  # high bytes: sign, exponent bits 7..1
    sm0 = u32(u32(hi & 0x80808080) | u32(lo & 0x7F7F7F7F))
    lo = prmt(w2, w3, 0x6420)
    hi = prmt(w2, w3, 0x7531)
    sm1 = u32(u32(hi & 0x80808080) | u32(lo & 0x7F7F7F7F))
    return acc, sm0, sm1


@dev
def _load_tile(x32, x16, n, tile, warp, lane):
    """The lane's 16 words (4 rounds x 8 values) of a tile and the 4 valid masks."""
    g = tile * 512 + warp * 128 + lane  # 16-byte unit of round 0
    if (tile + 1) * fmt.BLOCK <= n:
        a0, a1, a2, a3 = load16(x32, g)
        b0, b1, b2, b3 = load16(x32, g + 32)
        c0, c1, c2, c3 = load16(x32, g + 64)
        d0, d1, d2, d3 = load16(x32, g + 96)
        m = u32(0xFF)
        return a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3, m, m, m, m
    e = 8 * g
    a0, a1, a2, a3, va = lib._load8(x32, x16, n, e)
    b0, b1, b2, b3, vb = lib._load8(x32, x16, n, e + 256)
    c0, c1, c2, c3, vc = lib._load8(x32, x16, n, e + 512)
    d0, d1, d2, d3, vd = lib._load8(x32, x16, n, e + 768)
    return (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3,
            u32(va), u32(vb), u32(vc), u32(vd))


@dev
def _store_full(out8, out64, g, planes_off, stride, acc0, acc1, acc2, acc3, s0, s1, t0, t1, r0, r1,
                q0, q1):
    """Store a full tile's sign-mantissa words and plane bytes (lane's 16-byte unit g of round 0;
    round r is 32 units further). One base index per section, constant offsets per round."""
    b = U64(HDR8 + g)
    out64[b] = np.int64(s0) | (np.int64(s1) << 32)
    out64[b + U64(32)] = np.int64(t0) | (np.int64(t1) << 32)
    out64[b + U64(64)] = np.int64(r0) | (np.int64(r1) << 32)
    out64[b + U64(96)] = np.int64(q0) | (np.int64(q1) << 32)
    b = U64(planes_off + g)
    out8[b] = acc0
    out8[b + U64(32)] = acc1
    out8[b + U64(64)] = acc2
    out8[b + U64(96)] = acc3
    b = U64(planes_off + stride + g)
    out8[b] = u32(acc0 >> 8)
    out8[b + U64(32)] = u32(acc1 >> 8)
    out8[b + U64(64)] = u32(acc2 >> 8)
    out8[b + U64(96)] = u32(acc3 >> 8)
    b = U64(planes_off + 2 * stride + g)
    out8[b] = u32(acc0 >> 16)
    out8[b + U64(32)] = u32(acc1 >> 16)
    out8[b + U64(64)] = u32(acc2 >> 16)
    out8[b + U64(96)] = u32(acc3 >> 16)


@dev
def _store_round(out8, out64, acc, sm0, sm1, vm, u, planes_off, stride, pwords):
    """Tail tile: store one round (values from 8u) where it lies inside the frame's sections:
    the sign-mantissa word while a value of it is < n, a plane byte while it lies inside the
    plane's words (its bits past n are 0)."""
    if vm != 0:
        out64[U64(HDR8 + u)] = np.int64(sm0) | (np.int64(sm1) << 32)
    if u < 4 * pwords:
        q = planes_off + u
        out8[U64(q)] = acc
        out8[U64(q + stride)] = u32(acc >> 8)
        out8[U64(q + 2 * stride)] = u32(acc >> 16)


@dev
def _round_cs(acc, sm0, sm1, vm, u, planes_off, stride, pwords):
    """Payload checksum part of what ``_store_full`` / ``_store_round`` store for one round."""
    cs = np.int64(0)
    if vm != 0:
        i = 2 * u
        cs = wrap64(np.int64(sm0) * (2 * i + 1) + np.int64(sm1) * (2 * i + 3))
    if vm == 0xFF or u < 4 * pwords:
        q = planes_off + u - fmt.HEADER_SIZE
        cs = wrap64(cs + byte_checksum(np.int64(acc & 0xFF), q)
                    + byte_checksum(np.int64(u32(acc >> 8) & 0xFF), q + stride)
                    + byte_checksum(np.int64(u32(acc >> 16) & 0xFF), q + 2 * stride))
    return cs


@dev
def _field(x, r):
    return u32(u32(x >> (8 * r)) & 0xFF)


@cuda.jit(launch_bounds=(TPB, BLOCKS_PER_SM)) if not compat.SIMULATOR else cuda.jit
def encode_tiles_v4(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
    """Code tiles taken from the ticket counter until none is left (module docstring)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    counts_off = lay[4]
    eo = lay[5]
    raw_size = lay[6]
    pwords = lay[7]
    n_blocks = lay[8]
    lut = cuda.shared.array(256, dtype=np.uint32)
    smem = cuda.shared.array(8, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    lut[tid] = _lut_entry(tid, cb64)
    lut[tid + TPB] = _lut_entry(tid + TPB, cb64)
    if tid == 0:
        smem[0] = cuda.atomic.add(ws, WS_TICKET, 1)
        smem[1] = ws[WS_EPOCH]
    cuda.syncthreads()
    tile = smem[0]
    epoch = smem[1]
    cs = np.int64(0)
    (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3,
     va, vb, vc, vd) = _load_tile(x32, x16, n, tile if tile < n_blocks else 0, warp, lane)
    while tile < n_blocks:
        g = tile * 512 + warp * 128 + lane
        acc0, s0, s1 = _code8(a0, a1, a2, a3, lut)
        acc1, t0, t1 = _code8(b0, b1, b2, b3, lut)
        acc2, r0, r1 = _code8(c0, c1, c2, c3, lut)
        acc3, q0, q1 = _code8(d0, d1, d2, d3, lut)
        if va != 0xFF or vd != 0xFF:  # the tail tile: values past n get code 0, no escape
            acc0 = u32(acc0 & u32(va * 0x01010101))
            acc1 = u32(acc1 & u32(vb * 0x01010101))
            acc2 = u32(acc2 & u32(vc * 0x01010101))
            acc3 = u32(acc3 & u32(vd * 0x01010101))
        if va == 0xFF and vd == 0xFF:
            _store_full(out8, out64, g, planes_off, stride, acc0, acc1, acc2, acc3, s0, s1, t0, t1,
                        r0, r1, q0, q1)
        else:
            _store_round(out8, out64, acc0, s0, s1, va, g, planes_off, stride, pwords)
            _store_round(out8, out64, acc1, t0, t1, vb, g + 32, planes_off, stride, pwords)
            _store_round(out8, out64, acc2, r0, r1, vc, g + 64, planes_off, stride, pwords)
            _store_round(out8, out64, acc3, q0, q1, vd, g + 96, planes_off, stride, pwords)
        if do_cs:
            cs = wrap64(cs + _round_cs(acc0, s0, s1, va, g, planes_off, stride, pwords)
                        + _round_cs(acc1, t0, t1, vb, g + 32, planes_off, stride, pwords)
                        + _round_cs(acc2, r0, r1, vc, g + 64, planes_off, stride, pwords)
                        + _round_cs(acc3, q0, q1, vd, g + 96, planes_off, stride, pwords))

        # escape mask: bit 8r + s = value s of round r
        escm = u32(u32(acc0 >> 24) | u32(u32(acc1 >> 16) & 0xFF00)
                   | u32(u32(acc2 >> 8) & 0xFF0000) | u32(acc3 & 0xFF000000))
        cnt = u32(popc32(u32(escm & 0xFF)) | u32(popc32(u32(escm & 0xFF00)) << 8)
                  | u32(popc32(u32(escm & 0xFF0000)) << 16) | u32(popc32(u32(escm & 0xFF000000)) << 24))
        # exclusive scan over lanes, 4 rounds in 8-bit fields (each prefix <= 31 * 8)
        ex = shfl_up_u32(cnt, 1)
        if lane == 0:
            ex = u32(0)
        y = shfl_up_u32(ex, 1)
        if lane >= 1:
            ex = u32(ex + y)
        y = shfl_up_u32(ex, 2)
        if lane >= 2:
            ex = u32(ex + y)
        y = shfl_up_u32(ex, 4)
        if lane >= 4:
            ex = u32(ex + y)
        y = shfl_up_u32(ex, 8)
        if lane >= 8:
            ex = u32(ex + y)
        y = shfl_up_u32(ex, 16)
        if lane >= 16:
            ex = u32(ex + y)
        tex = shfl_idx_u32(ex, 31)
        tcn = shfl_idx_u32(cnt, 31)
        w0t = u32(_field(tex, 0) + _field(tcn, 0))  # this warp's escapes in round 0 (<= 256)
        w1t = u32(_field(tex, 1) + _field(tcn, 1))
        w2t = u32(_field(tex, 2) + _field(tcn, 2))
        w3t = u32(_field(tex, 3) + _field(tcn, 3))
        if lane == 0:
            smem[2 + warp] = np.int64(w0t + w1t + w2t + w3t)
        cuda.syncthreads()  # A: warp totals
        woff = np.int64(0)
        btot = np.int64(0)
        for w in range(4):
            v = smem[2 + w]
            if w < warp:
                woff += v
            btot += v
        if warp == 0:
            if lane == 0:
                out32[(counts_off >> 2) + tile] = btot
                if do_cs:
                    cs = wrap64(cs + btot * (2 * (((counts_off - fmt.HEADER_SIZE) >> 2) + tile) + 1))
                if tile == 0:
                    publish(ws, tile, epoch, STATUS_INC, btot)
                else:
                    publish(ws, tile, epoch, STATUS_AGG, btot)
            prefix = np.int64(0)
            if tile > 0:
                prefix = lookback(ws, tile, epoch, lane)
                if lane == 0:
                    publish(ws, tile, epoch, STATUS_INC, prefix + btot)
            if lane == 0:
                smem[6] = prefix
                smem[0] = cuda.atomic.add(ws, WS_TICKET, 1)
        cuda.syncthreads()  # B: prefix of this tile, ticket of the next
        prefix = smem[6]
        nxt = smem[0]
        if nxt < n_blocks:  # next tile's loads go out before this tile's escapes
            (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3,
             va, vb, vc, vd) = _load_tile(x32, x16, n, nxt, warp, lane)
        if escm != 0:
            # rank of escape bit 8r + s = ranks[r] + (escapes below it in this lane)
            base = eo + prefix + woff
            k0 = base + np.int64(_field(ex, 0))
            k1 = base + np.int64(u32(u32(w0t + _field(ex, 1)) - popc32(u32(escm & 0xFF))))
            k2 = base + np.int64(u32(u32(w0t + w1t + _field(ex, 2)) - popc32(u32(escm & 0xFFFF))))
            k3 = base + np.int64(u32(u32(w0t + w1t + w2t + _field(ex, 3))
                                     - popc32(u32(escm & 0xFFFFFF))))
            e0 = 8 * g
            m = escm
            while m != 0:
                low = u32(m & u32(u32(~m) + 1))
                m = u32(m ^ low)
                b = popc32(u32(low - 1))  # bit 8r + s: value s of round r
                r = u32(b >> 3)
                v = u32(x16[U64(e0 + np.int64(u32(u32(r << 8) + u32(b & 7))))])  # still cached
                pos = k0
                if r == 1:
                    pos = k1
                elif r == 2:
                    pos = k2
                elif r == 3:
                    pos = k3
                pos += np.int64(popc32(u32(escm & u32(low - 1))))
                if pos < raw_size:  # past it the frame is RAW and encode_finish rewrites it
                    x = u32(u32(v >> 7) & 0xFF)
                    out8[U64(pos)] = x
                    if do_cs:
                        cs = wrap64(cs + byte_checksum(np.int64(x), pos - fmt.HEADER_SIZE))
        tile = nxt
    if do_cs:
        cs = warp_sum(cs)
        if lane == 0:
            cuda.atomic.add(ws, WS_CSUM + (cuda.blockIdx.x & 7), cs)


def launch(x32, x16, out8, out32, out64, ws, lay: fmt.Layout, hdr: tuple[int, ...], crc_base: int,
           crc_tab, cb64: int, checksum: bool, stream, blocks_per_sm: int = BLOCKS_PER_SM) -> None:
    """``zipccl.kernels.encode.launch`` with the v4 tile kernel (same arguments)."""
    lt = lib.layout_tuple(lay)
    do_cs = 1 if checksum else 0
    force_raw = 1 if lay.static_size > lay.raw_size else 0
    tiles = 0
    if lay.n_blocks and not force_raw:
        grid = min(lay.n_blocks, 2 if compat.SIMULATOR else sm_count() * blocks_per_sm)
        encode_tiles_v4[grid, TPB, stream](x32, x16, out8, out32, out64, ws, lt, cb64, do_cs)
        tiles = lay.n_blocks
    blocks = max(1, min(lib.FINISH_MAX_BLOCKS, (lay.n + 8 * TPB - 1) // (8 * TPB)))
    lib.encode_finish[blocks, TPB, stream](x32, x16, out8, out32, out64, ws, lt, hdr, crc_base,
                                           crc_tab, force_raw, do_cs, tiles, 0)
