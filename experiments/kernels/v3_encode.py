"""Kernel version 3 (encode): the library version before v4, kept for comparison (see NOTES.md).

Identical to zipccl/kernels/encode.py at commit d8084d6 except for absolute imports:
32-bit hot paths (``u32`` after every operation), one CUDA block per escape block. The
H200 measurements and its SASS showed it issue-bound. The original module text follows.

GPU encoder: BF16 bit patterns -> a zipccl frame, byte-identical to ``codec.reference.encode``.

Two launches, no host synchronisation:

1. ``encode_tiles`` (grid = one CUDA block of 128 threads per escape block of
   4096 elements). Each warp codes 1024 consecutive elements in 4 rounds; in a
   round lane j holds elements 8j..8j+7 of a 256-element slice, read with one
   16-byte load (the four loads of a warp's rounds are issued before any use).
   Per element: one shared-memory lookup turns the exponent into its 3 code bits
   spread over 3 bytes (bit k of the code at bit 8k), shifted by the element's
   slot, so after 8 elements a lane holds one byte of each code plane (bit s =
   element 8j+s). Plane word w (elements 32w..32w+31) is the bytes of lanes
   4w..4w+3: a 4x4 byte transpose between those lanes (two ``shfl_xor``) leaves
   lane 4w+k holding word w of plane k, stored as 3 x 32 contiguous bytes per
   round. The sign-mantissa bytes are formed two at a time inside 32-bit words
   and stored as 8 bytes per lane (256 contiguous bytes per warp store).
   Escapes: per round each lane has an 8-bit escape mask; one packed warp scan
   (4 rounds in 16-bit fields) and a block scan give each escape its rank inside
   the block, the escaped exponent bytes go to shared memory in element order,
   and the block's count is published for the decoupled look-back
   (``_common.lookback``), which yields the block's first position in the
   escape section; the block then copies its escapes there. Positions are sums
   of counts: deterministic. Payload checksum contributions are summed per
   warp and added to 8 workspace slots (integer sums commute: deterministic).
2. ``encode_finish`` reads the escape total from the last block's inclusive
   status word, decides RAW by ``Layout.is_raw``'s rule, writes the RAW frame
   when needed (grid-stride copy, its own checksum), zeroes the padding bytes
   otherwise, and its last block writes the 128-byte header (CRC-32 computed
   by a warp from a per-bit table, see ``_common``), resets the workspace
   counters and advances the epoch.

All offsets come from ``zipccl.format.Layout`` through the ``lay`` tuple built
by ``layout_tuple``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from zipccl import format as fmt
from zipccl.kernels import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
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
from zipccl.kernels.compat import load16, popc, shfl, shfl_up, shfl_xor_u32, u32, wrap64


@cuda.jit(device=True)
def _spread_code(e, cb64):
    """Code of exponent e (1 + codebook index, 0 = escape), bit k moved to bit 8k."""
    c = np.int64(0)
    for i in range(7):
        if ((cb64 >> (8 * i)) & 0xFF) == e:
            c = i + 1
    return (c & 1) | (((c >> 1) & 1) << 8) | (((c >> 2) & 1) << 16)


@cuda.jit(device=True)
def _load8(x32, x16, n, e):
    """Elements e..e+7 as four uint32 words of two elements, and the mask of those < n.

    The words stay uint32 (one register each) because they live until the escapes
    are staged; everything computed from them is int64.
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


@cuda.jit(device=True)
def _sm_pair(w):
    """Sign-mantissa bytes of the two BF16 values in the uint32 w, as 16 bits (uint32)."""
    t = u32(u32(w & 0x007F007F) | u32(u32(w >> 8) & 0x00800080))
    return u32(u32(t & 0xFF) | u32(u32(t >> 8) & 0xFF00))


@cuda.jit(device=True)
def _code8(w0, w1, w2, w3, vm, lut):
    """(plane bytes p0 | p1 << 8 | p2 << 16, escape mask, sign-mantissa bytes 0-3 and 4-7).

    All uint32 (``u32`` after every operation keeps the instructions 32-bit), except
    the escape mask (int64, it feeds the scan).
    """
    acc = lut[u32(u32(w0 >> 7) & 0xFF)]
    acc = u32(acc | u32(lut[u32(u32(w0 >> 23) & 0xFF)] << 1))
    acc = u32(acc | u32(lut[u32(u32(w1 >> 7) & 0xFF)] << 2))
    acc = u32(acc | u32(lut[u32(u32(w1 >> 23) & 0xFF)] << 3))
    acc = u32(acc | u32(lut[u32(u32(w2 >> 7) & 0xFF)] << 4))
    acc = u32(acc | u32(lut[u32(u32(w2 >> 23) & 0xFF)] << 5))
    acc = u32(acc | u32(lut[u32(u32(w3 >> 7) & 0xFF)] << 6))
    acc = u32(acc | u32(lut[u32(u32(w3 >> 23) & 0xFF)] << 7))
    acc = u32(acc & u32(vm * 0x010101))  # elements past n: code 0, and not an escape
    esc = np.int64(u32(~u32(acc | u32(acc >> 8) | u32(acc >> 16))) & 0xFF) & vm
    lo = u32(_sm_pair(w0) | u32(_sm_pair(w1) << 16))
    hi = u32(_sm_pair(w2) | u32(_sm_pair(w3) << 16))
    return acc, esc, lo, hi


@cuda.jit(device=True)
def _transpose(acc, lane):
    """4x4 byte transpose among lanes 4w..4w+3: lane 4w+k gets plane k's word w (uint32)."""
    q = lane & 3
    y = shfl_xor_u32(acc, 2)
    if q < 2:
        x = u32(u32(acc & 0xFFFF) | u32(y << 16))
    else:
        x = u32(u32(y >> 16) | u32(acc & 0xFFFF0000))
    y = shfl_xor_u32(x, 1)
    if (q & 1) == 0:
        return u32(u32(x & 0x00FF00FF) | u32(u32(y & 0x00FF00FF) << 8))
    return u32(u32(u32(y >> 8) & 0x00FF00FF) | u32(x & 0xFF00FF00))


@cuda.jit(device=True)
def _store_round(out32, out64, e, vm, acc, lo, hi, r, wbase, lane, planes_off, stride, pwords, do_cs):
    """Store one round's sign-mantissa bytes and plane words; return their checksum part."""
    cs = np.int64(0)
    if vm != 0:
        out64[(fmt.HEADER_SIZE + e) >> 3] = np.int64(lo) | wrap64(np.int64(hi) << 32)
        if do_cs:
            i = e >> 2
            cs = wrap64(np.int64(lo) * (2 * i + 1) + np.int64(hi) * (2 * i + 3))
    t = _transpose(acc, lane)
    q = lane & 3
    gw = (wbase >> 5) + 8 * r + (lane >> 2)
    if q < 3 and gw < pwords:
        po = planes_off + q * stride
        out32[(po >> 2) + gw] = t
        if do_cs:
            cs = wrap64(cs + np.int64(t) * (2 * (((po - fmt.HEADER_SIZE) >> 2) + gw) + 1))
    return cs


@cuda.jit(device=True)
def _stage(stage, esc, base, w0, w1, w2, w3):
    """Put this lane's escaped exponent bytes at their block ranks base + ... in shared memory."""
    m = esc
    while m != 0:
        low = m & (-m)
        m ^= low
        s = popc(low - 1)
        k = s >> 1
        w = w0
        if k == 1:
            w = w1
        elif k == 2:
            w = w2
        elif k == 3:
            w = w3
        stage[base + popc(esc & (low - 1))] = (np.int64(w) >> (7 + 16 * (s & 1))) & 0xFF


@cuda.jit
def encode_tiles(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
    """Code one escape block per CUDA block (see the module docstring)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    counts_off = lay[4]
    eo = lay[5]
    raw_size = lay[6]
    pwords = lay[7]
    lut = cuda.shared.array(256, dtype=np.uint32)
    stage = cuda.shared.array(4096, dtype=np.uint8)
    smem = cuda.shared.array(8, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    lut[tid] = _spread_code(tid, cb64)
    lut[tid + TPB] = _spread_code(tid + TPB, cb64)
    if tid == 0:
        smem[0] = cuda.atomic.add(ws, WS_TICKET, 1)
        smem[1] = ws[WS_EPOCH]
    cuda.syncthreads()
    tile = smem[0]
    epoch = smem[1]
    wbase = tile * 4096 + warp * 1024
    e0 = wbase + lane * 8
    # all four 16-byte loads first: 64 bytes in flight per lane
    a0, a1, a2, a3, vm0 = _load8(x32, x16, n, e0)
    b0, b1, b2, b3, vm1 = _load8(x32, x16, n, e0 + 256)
    c0, c1, c2, c3, vm2 = _load8(x32, x16, n, e0 + 512)
    d0, d1, d2, d3, vm3 = _load8(x32, x16, n, e0 + 768)

    acc0, esc0, lo0, hi0 = _code8(a0, a1, a2, a3, vm0, lut)
    acc1, esc1, lo1, hi1 = _code8(b0, b1, b2, b3, vm1, lut)
    acc2, esc2, lo2, hi2 = _code8(c0, c1, c2, c3, vm2, lut)
    acc3, esc3, lo3, hi3 = _code8(d0, d1, d2, d3, vm3, lut)
    cs = _store_round(out32, out64, e0, vm0, acc0, lo0, hi0, 0, wbase, lane, planes_off, stride,
                      pwords, do_cs)
    cs += _store_round(out32, out64, e0 + 256, vm1, acc1, lo1, hi1, 1, wbase, lane, planes_off, stride,
                       pwords, do_cs)
    cs += _store_round(out32, out64, e0 + 512, vm2, acc2, lo2, hi2, 2, wbase, lane, planes_off, stride,
                       pwords, do_cs)
    cs += _store_round(out32, out64, e0 + 768, vm3, acc3, lo3, hi3, 3, wbase, lane, planes_off, stride,
                       pwords, do_cs)
    cs = wrap64(cs)

    # escape ranks: one warp scan of the 4 rounds' per-lane counts packed in 16-bit fields
    cnt = popc(esc0) | (popc(esc1) << 16) | (popc(esc2) << 32) | (popc(esc3) << 48)
    inc = cnt
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
    exc = inc - cnt
    tot = shfl(inc, 31)
    t0 = tot & 0xFFFF
    t1 = (tot >> 16) & 0xFFFF
    t2 = (tot >> 32) & 0xFFFF
    t3 = (tot >> 48) & 0xFFFF
    if lane == 0:
        smem[2 + warp] = t0 + t1 + t2 + t3
    cuda.syncthreads()
    woff = np.int64(0)
    btot = np.int64(0)
    for w in range(4):
        if w < warp:
            woff += smem[2 + w]
        btot += smem[2 + w]
    if tid == 0:
        out32[(counts_off >> 2) + tile] = btot
        if do_cs:
            cs = wrap64(cs + btot * (2 * (((counts_off - fmt.HEADER_SIZE) >> 2) + tile) + 1))
        if tile == 0:
            publish(ws, tile, epoch, STATUS_INC, btot)
        else:
            publish(ws, tile, epoch, STATUS_AGG, btot)
    _stage(stage, esc0, woff + (exc & 0xFFFF), a0, a1, a2, a3)
    _stage(stage, esc1, woff + t0 + ((exc >> 16) & 0xFFFF), b0, b1, b2, b3)
    _stage(stage, esc2, woff + t0 + t1 + ((exc >> 32) & 0xFFFF), c0, c1, c2, c3)
    _stage(stage, esc3, woff + t0 + t1 + t2 + ((exc >> 48) & 0xFFFF), d0, d1, d2, d3)
    if warp == 0:
        prefix = np.int64(0)
        if tile > 0:
            prefix = lookback(ws, tile, epoch, lane)
            if lane == 0:
                publish(ws, tile, epoch, STATUS_INC, prefix + btot)
        if lane == 0:
            smem[6] = prefix
    cuda.syncthreads()
    prefix = smem[6]
    i = tid
    while i < btot:
        pos = eo + prefix + i
        if pos < raw_size:  # past it the frame is RAW and encode_finish rewrites it
            b = np.int64(stage[i])
            out8[pos] = b
            if do_cs:
                cs = wrap64(cs + byte_checksum(b, pos - fmt.HEADER_SIZE))
        i += TPB
    if do_cs:
        cs = warp_sum(cs)
        if lane == 0:
            cuda.atomic.add(ws, WS_CSUM + (tile & 7), cs)


# The finishing kernel (RAW decision, padding, header), the layout tuple and the launcher
# are the library's: zipccl.kernels.encode.encode_finish / layout_tuple (bench_codec.py
# launches this tile kernel, then encode_finish).
