"""Kernel version 1: one element per lane, the textbook ballot formulation.

Each warp walks its 1024 elements 32 at a time: lane j loads element 32w + j
(a 2-byte load, 64 contiguous bytes per warp), looks its code up in shared
memory, and three ``ballot_sync`` calls produce word w of the three code
planes directly; lane j stores its sign-mantissa byte (1-byte stores, 32
contiguous bytes per warp). Escapes: ballot + popc give ranks, staged in shared
memory, then the same look-back scan and finishing kernel as the library
version. The decoder mirrors it (the look-back first, since the stored counts
are known up front). Kept as the baseline the library kernels (v2) are measured
against; see NOTES.md.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from v3_encode import _spread_code  # the v3 table entry (v3 left the library)

from zipccl import format as fmt
from zipccl.kernels import compat  # noqa: F401
from zipccl.kernels._common import (
    STATUS_AGG,
    STATUS_INC,
    TPB,
    WS_EPOCH,
    WS_TICKET,
    lookback,
    publish,
)
from zipccl.kernels.compat import ballot, popc


@cuda.jit
def encode_tiles_v1(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
    """Same output as zipccl.kernels.encode.encode_tiles (checksum not supported: do_cs = 0)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    counts_off = lay[4]
    eo = lay[5]
    raw_size = lay[6]
    pwords = lay[7]
    lut = cuda.shared.array(256, dtype=np.int32)
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
    wesc = np.int64(0)  # escapes of this warp so far (same in every lane)
    my_esc_pos = cuda.local.array(32, dtype=np.int64)
    my_esc_exp = cuda.local.array(32, dtype=np.int64)
    k_esc = 0
    for it in range(32):
        e = wbase + 32 * it + lane
        valid = e < n
        v = np.int64(0)
        if valid:
            v = np.int64(x16[e])
            out8[fmt.HEADER_SIZE + e] = ((v >> 8) & 0x80) | (v & 0x7F)
        spread = np.int64(lut[(v >> 7) & 0xFF]) if valid else np.int64(0)
        b0 = ballot((spread & 1) != 0)
        b1 = ballot((spread & 0x100) != 0)
        b2 = ballot((spread & 0x10000) != 0)
        em = ballot(valid and spread == 0)
        gw = (wbase >> 5) + it
        if gw < pwords:
            if lane == 0:
                out32[(planes_off >> 2) + gw] = b0
            elif lane == 1:
                out32[((planes_off + stride) >> 2) + gw] = b1
            elif lane == 2:
                out32[((planes_off + 2 * stride) >> 2) + gw] = b2
        if valid and spread == 0:
            my_esc_pos[k_esc] = wesc + popc(em & ((np.int64(1) << lane) - 1))
            my_esc_exp[k_esc] = (v >> 7) & 0xFF
            k_esc += 1
        wesc += popc(em)
    if lane == 0:
        smem[2 + warp] = wesc
    cuda.syncthreads()
    woff = np.int64(0)
    btot = np.int64(0)
    for w in range(4):
        if w < warp:
            woff += smem[2 + w]
        btot += smem[2 + w]
    for k in range(k_esc):
        stage[woff + my_esc_pos[k]] = my_esc_exp[k]
    if tid == 0:
        out32[(counts_off >> 2) + tile] = btot
        publish(ws, tile, epoch, STATUS_INC if tile == 0 else STATUS_AGG, btot)
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
        if pos < raw_size:
            out8[pos] = stage[i]
        i += TPB
    # the library's sm stores cover whole 8-byte groups: pad the last group with zeros
    if tile * 4096 + warp * 1024 <= n - 1 < tile * 4096 + warp * 1024 + 1024 and lane < 8:
        p = n + lane
        if p < ((n + 7) & ~np.int64(7)):
            out8[fmt.HEADER_SIZE + p] = 0


@cuda.jit
def decode_tiles_v1(f8, f32, f64, out32, out16, ws, lay):
    """Same output as zipccl.kernels.decode.decode_tiles for valid, checksum-free, non-RAW
    frames (the experiment only times such frames; validation lives in the library)."""
    n = lay[0]
    planes_off = lay[2]
    stride = lay[3]
    counts_off = lay[4]
    eo = lay[5]
    smem = cuda.shared.array(16, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    if tid == 0:
        tile = cuda.atomic.add(ws, WS_TICKET, 1)
        smem[0] = tile
        smem[1] = ws[WS_EPOCH]
        cnt = np.int64(f32[(counts_off >> 2) + tile])
        smem[2] = cnt
        smem[3] = f64[5]
        publish(ws, tile, smem[1], STATUS_INC if tile == 0 else STATUS_AGG, cnt)
    cuda.syncthreads()
    tile = smem[0]
    epoch = smem[1]
    cb = smem[3]
    if warp == 0:
        prefix = np.int64(0)
        if tile > 0:
            prefix = lookback(ws, tile, epoch, lane)
            if lane == 0:
                publish(ws, tile, epoch, STATUS_INC, prefix + smem[2])
        if lane == 0:
            smem[4] = prefix
    # per-warp escape offsets need every warp's count: count first, then decode
    wbase = tile * 4096 + warp * 1024
    wcount = np.int64(0)
    for it in range(32):
        gw = (wbase >> 5) + it
        e = wbase + 32 * it + lane
        c = np.int64(0)
        if e < n:
            c = ((np.int64(f32[(planes_off >> 2) + gw]) >> lane) & 1) \
                | (((np.int64(f32[((planes_off + stride) >> 2) + gw]) >> lane) & 1) << 1) \
                | (((np.int64(f32[((planes_off + 2 * stride) >> 2) + gw]) >> lane) & 1) << 2)
        wcount += popc(ballot(e < n and c == 0))
    if lane == 0:
        smem[8 + warp] = wcount
    cuda.syncthreads()
    woff = smem[4]
    for w in range(4):
        if w < warp:
            woff += smem[8 + w]
    for it in range(32):
        gw = (wbase >> 5) + it
        e = wbase + 32 * it + lane
        c = np.int64(0)
        if e < n:
            c = ((np.int64(f32[(planes_off >> 2) + gw]) >> lane) & 1) \
                | (((np.int64(f32[((planes_off + stride) >> 2) + gw]) >> lane) & 1) << 1) \
                | (((np.int64(f32[((planes_off + 2 * stride) >> 2) + gw]) >> lane) & 1) << 2)
        em = ballot(e < n and c == 0)
        if e < n:
            s = np.int64(f8[fmt.HEADER_SIZE + e])
            if c == 0:
                ex = np.int64(f8[eo + woff + popc(em & ((np.int64(1) << lane) - 1))])
            else:
                ex = (cb >> (8 * (c - 1))) & 0xFF
            out16[e] = ((s & 0x80) << 8) | (ex << 7) | (s & 0x7F)
        woff += popc(em)


@cuda.jit
def naive_split(x16, n, sm, ex):
    """The naive baseline: one element per thread, sign-mantissa byte and exponent byte out."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        v = np.int64(x16[i])
        sm[i] = ((v >> 8) & 0x80) | (v & 0x7F)
        ex[i] = (v >> 7) & 0xFF
        i += step
