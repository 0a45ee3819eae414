"""Kernel version 2 (decode): the first library version, kept for comparison (see NOTES.md).

Identical to zipccl/kernels/decode.py at commit 774566c except for absolute imports:
every intermediate is int64 (Numba widens all integer arithmetic to 64 bits), which the
H200 measurements showed to be instruction-bound. The original module text follows.

GPU decoder: a zipccl frame -> BF16 bit patterns, accepting exactly what
``codec.reference.decode`` accepts, never writing outside the output.

Two launches, no host synchronisation:

1. ``decode_tiles`` (one CUDA block of 128 threads per escape block). Every
   block checks the header fields it relies on (magic, version, dtype, flags,
   element count = the output's, lengths against the buffer and the layout);
   if they do not fit it writes nothing. Thread 0 reads the block's escape
   count and publishes it at once for the look-back scan (``_common``), so
   the scan resolves while the block decodes. Lane L of a warp loads word L
   of each code plane (3 x 128 contiguous bytes per warp); in round r lane j
   fetches the plane bytes of its 8 elements from lane 8r + j/4 (3 shuffles),
   loads the elements' 8 sign-mantissa bytes, and forms the 8 output values
   in 4 registers (codes by a multiply that gathers one bit of each plane;
   exponents from an 8-entry shared table); escaped values are completed
   after the scan from the escape section, at the same ranks the encoder
   used, and written with one 16-byte store per lane and round. Each block
   compares the escape codes it saw with its count; each escape read is
   checked against the header's escape total.
2. ``decode_finish`` (one block) checks the header CRC, the escape total and
   the payload checksum (summed from the tiles plus the padding bytes it reads
   itself), publishes the call's error bits, resets the counters and advances
   the epoch. Error bits (``_common.ERR_*``): WS_ERR_LAST holds the last call's,
   WS_ERR_STICKY accumulates until the host clears it.

A RAW frame is copied by ``decode_tiles`` (16-byte loads and stores).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from zipccl import format as fmt
from zipccl.format.errors import ERR_COUNTS, ERR_ESCAPE_RANGE, ERR_HEADER, ERR_TOTAL
from zipccl.kernels import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from zipccl.kernels._common import (
    LOW32,
    STATUS_AGG,
    STATUS_INC,
    TPB,
    WS_CSUM,
    WS_EPOCH,
    WS_ERR,
    WS_TICKET,
    byte_checksum,
    lookback,
    publish,
    warp_sum,
)
from zipccl.kernels.compat import load16, popc, shfl, shfl32, shfl_up, store16, wrap64
from zipccl.kernels.layout import header_ok

_MAGIC48 = int.from_bytes(fmt.MAGIC + bytes([fmt.VERSION, fmt.DTYPE_BF16]), "little")


@cuda.jit(device=True)
def _pair(t, s, smb, dl2):
    """Two output values (slots s, s+1) as one 32-bit word, escapes' exponents left 0.

    t = p0 | p1 << 8 | p2 << 16 holds the lane's three plane bytes; the 6 code bits
    of the two slots index ``dl2``, which holds both exponents already in place.
    """
    x = (t >> s) & 0x030303
    u = (smb & 0xFF) | ((smb & 0xFF00) << 8)
    sp = ((u & 0x00800080) << 8) | (u & 0x007F007F)
    return np.uint32(sp | dl2[(x & 3) | ((x >> 6) & 12) | ((x >> 12) & 48)])


@cuda.jit(device=True)
def _round(f64, p0w, p1w, p2w, e, n, r, lane, dl2, do_cs):
    """Decode one round: (4 output words, escape mask, valid mask, checksum part)."""
    src = 8 * r + (lane >> 2)
    sh8 = 8 * (lane & 3)
    p0 = (shfl32(p0w, src) >> sh8) & 0xFF
    p1 = (shfl32(p1w, src) >> sh8) & 0xFF
    p2 = (shfl32(p2w, src) >> sh8) & 0xFF
    vm = np.int64(0)
    if e + 8 <= n:
        vm = np.int64(0xFF)
    elif e < n:
        vm = (np.int64(1) << (n - e)) - 1
    esc = ~(p0 | p1 | p2) & vm
    t = p0 | (p1 << 8) | (p2 << 16)
    sm = np.int64(0)
    cs = np.int64(0)
    if vm != 0:
        sm = f64[(fmt.HEADER_SIZE + e) >> 3]
        if do_cs:
            i = e >> 2
            cs = wrap64((sm & LOW32) * (2 * i + 1) + ((sm >> 32) & LOW32) * (2 * i + 3))
    o0 = _pair(t, 0, sm & 0xFFFF, dl2)
    o1 = _pair(t, 2, (sm >> 16) & 0xFFFF, dl2)
    o2 = _pair(t, 4, (sm >> 32) & 0xFFFF, dl2)
    o3 = _pair(t, 6, (sm >> 48) & 0xFFFF, dl2)
    return o0, o1, o2, o3, esc, vm, cs


@cuda.jit(device=True)
def _patch(f8, esc, base, eo, nesc, o0, o1, o2, o3):
    """Fill in the escaped exponents of one round; (words, checksum part, error bits)."""
    m = esc
    cs = np.int64(0)
    err = np.int64(0)
    while m != 0:
        low = m & (-m)
        m ^= low
        s = popc(low - 1)
        pos = base + popc(esc & (low - 1))
        b = np.int64(0)
        if pos >= 0 and pos < nesc:
            b = np.int64(f8[eo + pos])
            cs = wrap64(cs + byte_checksum(b, eo + pos - fmt.HEADER_SIZE))
        else:
            err = ERR_ESCAPE_RANGE
        v = b << (7 + 16 * (s & 1))
        k = s >> 1
        if k == 0:
            o0 = np.uint32(np.int64(o0) | v)
        elif k == 1:
            o1 = np.uint32(np.int64(o1) | v)
        elif k == 2:
            o2 = np.uint32(np.int64(o2) | v)
        else:
            o3 = np.uint32(np.int64(o3) | v)
    return o0, o1, o2, o3, cs, err


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


@cuda.jit
def decode_tiles(f8, f32, f64, out32, out16, ws, lay):
    """Decode one escape block per CUDA block, or copy a RAW frame (module docstring)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    counts_off = lay[4]
    eo = lay[5]
    pwords = lay[7]
    smem = cuda.shared.array(16, dtype=np.int64)
    dl2 = cuda.shared.array(64, dtype=np.int32)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    if tid == 0:
        tile = cuda.atomic.add(ws, WS_TICKET, 1)
        epoch = ws[WS_EPOCH]
        ok, raw, nesc, has_cs = header_ok(f64, f8.shape[0], lay)
        smem[0] = tile
        smem[1] = epoch
        smem[2] = 1 if ok else 0
        smem[3] = raw
        smem[4] = nesc
        smem[5] = has_cs
        smem[6] = f64[5]  # codebook bytes (and ndim in the top byte)
        if not ok:
            if tile == 0:
                cuda.atomic.or_(ws, WS_ERR, ERR_HEADER)
        elif raw == 0:
            craw = np.int64(f32[(counts_off >> 2) + tile])
            lim = n - tile * 4096
            if lim > 4096:
                lim = 4096
            cnt = craw
            if cnt > lim:
                cnt = lim
                cuda.atomic.or_(ws, WS_ERR, ERR_COUNTS)
            smem[7] = cnt
            smem[8] = craw
            if tile == 0:
                publish(ws, tile, epoch, STATUS_INC, cnt)
            else:
                publish(ws, tile, epoch, STATUS_AGG, cnt)
    cuda.syncthreads()
    if smem[2] == 0:
        return
    tile = smem[0]
    epoch = smem[1]
    raw = smem[3]
    nesc = smem[4]
    do_cs = smem[5] != 0
    cs = np.int64(0)
    if raw != 0:
        g = tile * 512 + tid
        for _ in range(4):
            e = 8 * g
            if e + 8 <= n:
                v0, v1, v2, v3 = load16(f32, (fmt.HEADER_SIZE >> 4) + g)
                store16(out32, g, v0, v1, v2, v3)
                if do_cs:
                    i = 4 * g
                    cs = wrap64(cs + np.int64(v0) * (2 * i + 1) + np.int64(v1) * (2 * i + 3)
                                + np.int64(v2) * (2 * i + 5) + np.int64(v3) * (2 * i + 7))
            elif e < n:
                for k in range(8):
                    if e + k < n:
                        q = 2 * (e + k)
                        lo = np.int64(f8[fmt.HEADER_SIZE + q])
                        hi = np.int64(f8[fmt.HEADER_SIZE + q + 1])
                        out16[e + k] = lo | (hi << 8)
                        if do_cs:
                            cs = wrap64(cs + byte_checksum(lo, q) + byte_checksum(hi, q + 1))
            g += TPB
        if do_cs:
            cs = warp_sum(cs)
            if lane == 0:
                cuda.atomic.add(ws, WS_CSUM + (tile & 7), cs)
        return

    if tid < 64:
        # index bits: 0,1 = plane-0 bits of slots s, s+1; 2,3 = plane 1; 4,5 = plane 2
        ca = (tid & 1) | ((tid >> 1) & 2) | ((tid >> 2) & 4)
        cb = ((tid >> 1) & 1) | ((tid >> 2) & 2) | ((tid >> 3) & 4)
        ea = np.int64(0)
        eb = np.int64(0)
        if ca != 0:
            ea = (smem[6] >> (8 * (ca - 1))) & 0xFF
        if cb != 0:
            eb = (smem[6] >> (8 * (cb - 1))) & 0xFF
        dl2[tid] = (ea << 7) | (eb << 23)
    cnt = smem[7]
    wbase = tile * 4096 + warp * 1024
    gw = (wbase >> 5) + lane
    p0w = np.int64(0)
    p1w = np.int64(0)
    p2w = np.int64(0)
    if gw < pwords:
        p0w = np.int64(f32[(planes_off >> 2) + gw])
        p1w = np.int64(f32[((planes_off + stride) >> 2) + gw])
        p2w = np.int64(f32[((planes_off + 2 * stride) >> 2) + gw])
        if do_cs:
            base = 2 * (((planes_off - fmt.HEADER_SIZE) >> 2) + gw) + 1
            step = 2 * (stride >> 2)
            cs = wrap64(p0w * base + p1w * (base + step) + p2w * (base + 2 * step))
    cuda.syncthreads()  # dl2 ready
    e0 = wbase + 8 * lane
    a0, a1, a2, a3, esc0, vm0, c = _round(f64, p0w, p1w, p2w, e0, n, 0, lane, dl2, do_cs)
    cs = wrap64(cs + c)
    b0, b1, b2, b3, esc1, vm1, c = _round(f64, p0w, p1w, p2w, e0 + 256, n, 1, lane, dl2, do_cs)
    cs = wrap64(cs + c)
    c0, c1, c2, c3, esc2, vm2, c = _round(f64, p0w, p1w, p2w, e0 + 512, n, 2, lane, dl2, do_cs)
    cs = wrap64(cs + c)
    d0, d1, d2, d3, esc3, vm3, c = _round(f64, p0w, p1w, p2w, e0 + 768, n, 3, lane, dl2, do_cs)
    cs = wrap64(cs + c)

    cntp = popc(esc0) | (popc(esc1) << 16) | (popc(esc2) << 32) | (popc(esc3) << 48)
    inc = cntp
    y = shfl_up(inc, 1)
    if lane >= 1:
        inc += y
    y = shfl_up(inc, 2)
    if lane >= 2:
        inc += y
    y = shfl_up(inc, 4)
    if lane >= 4:
        inc += y
    y = shfl_up(inc, 8)
    if lane >= 8:
        inc += y
    y = shfl_up(inc, 16)
    if lane >= 16:
        inc += y
    exc = inc - cntp
    tot = shfl(inc, 31)
    t0 = tot & 0xFFFF
    t1 = (tot >> 16) & 0xFFFF
    t2 = (tot >> 32) & 0xFFFF
    t3 = (tot >> 48) & 0xFFFF
    if lane == 0:
        smem[9 + warp] = t0 + t1 + t2 + t3
    cuda.syncthreads()
    woff = np.int64(0)
    btot = np.int64(0)
    for w in range(4):
        if w < warp:
            woff += smem[9 + w]
        btot += smem[9 + w]
    if warp == 0:
        prefix = np.int64(0)
        if tile > 0:
            prefix = lookback(ws, tile, epoch, lane)
            if lane == 0:
                publish(ws, tile, epoch, STATUS_INC, prefix + cnt)
        if lane == 0:
            smem[13] = prefix
            if btot != smem[8]:
                cuda.atomic.or_(ws, WS_ERR, ERR_COUNTS)
            if tile == lay[8] - 1 and prefix + cnt != nesc:
                cuda.atomic.or_(ws, WS_ERR, ERR_TOTAL)
            if do_cs:
                cs = wrap64(cs + smem[8] * (2 * (((counts_off - fmt.HEADER_SIZE) >> 2) + tile) + 1))
    cuda.syncthreads()
    base = smem[13] + woff
    a0, a1, a2, a3, c, err = _patch(f8, esc0, base + (exc & 0xFFFF), eo, nesc, a0, a1, a2, a3)
    cs = wrap64(cs + c)
    b0, b1, b2, b3, c, err1 = _patch(f8, esc1, base + t0 + ((exc >> 16) & 0xFFFF), eo, nesc,
                                      b0, b1, b2, b3)
    cs = wrap64(cs + c)
    c0, c1, c2, c3, c, err2 = _patch(f8, esc2, base + t0 + t1 + ((exc >> 32) & 0xFFFF), eo, nesc,
                                      c0, c1, c2, c3)
    cs = wrap64(cs + c)
    d0, d1, d2, d3, c, err3 = _patch(f8, esc3, base + t0 + t1 + t2 + ((exc >> 48) & 0xFFFF), eo, nesc,
                                      d0, d1, d2, d3)
    cs = wrap64(cs + c)
    err = err | err1 | err2 | err3
    if err != 0:
        cuda.atomic.or_(ws, WS_ERR, err)
    _store(out32, out16, e0, vm0, a0, a1, a2, a3)
    _store(out32, out16, e0 + 256, vm1, b0, b1, b2, b3)
    _store(out32, out16, e0 + 512, vm2, c0, c1, c2, c3)
    _store(out32, out16, e0 + 768, vm3, d0, d1, d2, d3)
    if do_cs:
        cs = warp_sum(cs)
        if lane == 0:
            cuda.atomic.add(ws, WS_CSUM + (tile & 7), cs)


# header_ok and the finishing kernel (CRC, totals, checksum, error bits) are the library's:
# zipccl.kernels.decode.header_ok / decode_finish (bench_codec.py launches this tile
# kernel, then decode_finish).
