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
    LOW32,
    STATUS_AGG,
    STATUS_INC,
    TPB,
    WS_CSUM,
    WS_CSUM_RAW,
    WS_DONE,
    WS_EPOCH,
    WS_FLEN,
    WS_NESC,
    WS_STATUS,
    WS_TICKET,
    advance_epoch,
    byte_checksum,
    lookback,
    publish,
    warp_sum,
    warp_xor,
)
from zipccl.kernels.compat import atomic_read, load16, popc, shfl, shfl_up, shfl_xor_u32, store16, u32, wrap64


def layout_tuple(lay: fmt.Layout) -> tuple[int, ...]:
    """The Layout fields the kernels read, as one int tuple (a single kernel argument)."""
    return (lay.n, lay.sm_offset, lay.planes_offset, lay.plane_stride, lay.counts_offset,
            lay.escapes_offset, lay.raw_size, lay.plane_words, lay.n_blocks)


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


@cuda.jit
def encode_finish(x32, x16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, force_raw, do_cs,
                  tiles):
    """RAW decision and RAW copy, zero padding, header (see the module docstring)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    counts_off = lay[4]
    eo = lay[5]
    raw_size = lay[6]
    pwords = lay[7]
    n_blocks = lay[8]
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
    elif bid == 0:
        # padding bytes: each region is shorter than ALIGN (128) bytes
        i = fmt.HEADER_SIZE + ((n + 7) & ~np.int64(7)) + tid
        if i < planes_off:
            out8[i] = 0
        for k in range(3):
            i = planes_off + k * stride + 4 * pwords + tid
            if i < planes_off + (k + 1) * stride:
                out8[i] = 0
        i = counts_off + 4 * n_blocks + tid
        if i < eo:
            out8[i] = 0
    cuda.threadfence()
    cuda.syncthreads()
    if tid == 0:
        smem[0] = cuda.atomic.add(ws, WS_DONE, 1)
    cuda.syncthreads()
    if smem[0] != nblk - 1:
        return
    # the last block to finish: header
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
        for i in range(lane, 208, 32):
            if i < 16:
                bit = (flags >> i) & 1
                idx = 48 + i  # header byte 6 = flags
            else:
                j = i - 16
                f = j >> 6
                val = csum
                if f == 0:
                    val = nesc_f
                elif f == 1:
                    val = flen
                bit = (val >> (j & 63)) & 1
                idx = 128 + j  # header bytes 16..39 = n_escapes, frame_len, checksum
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
           crc_tab, cb64: int, checksum: bool, stream) -> None:
    """Enqueue the encoder for the ``lay.n`` values of ``x16`` (``x32``: the first n & ~7 of
    them as uint32) into ``out8`` (``out32`` / ``out64``: the same bytes as uint32 / int64).

    ``hdr`` is the header template (16 little-endian int64 words, with n_escapes,
    frame_len, checksum, flags and CRC zero) and ``crc_base`` the CRC-32 of its first
    124 bytes; ``cb64`` the codebook's 7 exponents as little-endian bytes. Nothing here
    synchronises.
    """
    lt = layout_tuple(lay)
    do_cs = 1 if checksum else 0
    force_raw = 1 if lay.static_size > lay.raw_size else 0
    tiles = 0
    if lay.n_blocks and not force_raw:
        encode_tiles[lay.n_blocks, TPB, stream](x32, x16, out8, out32, out64, ws, lt, cb64, do_cs)
        tiles = lay.n_blocks
    blocks = max(1, min(FINISH_MAX_BLOCKS, (lay.n + 8 * TPB - 1) // (8 * TPB)))
    encode_finish[blocks, TPB, stream](x32, x16, out8, out32, out64, ws, lt, hdr, crc_base, crc_tab,
                                       force_raw, do_cs, tiles)
