"""v5 encoder: v4's per-value code, with the input staged through shared memory by
asynchronous copies (``cp.async``) up to ``ahead`` tiles before it is coded, and the code
planes assembled in shared memory and stored as 16-byte words.

What changes against v4 (``zipccl/kernels/encode.py``), everything else is v4's:

* Tiles by rank: one ticket per block gives its rank r (ranks are handed out in order, so
  every rank below r belongs to a running block), and the block codes tiles r, r + G,
  r + 2G, ... (G = grid size; the grid never exceeds the resident blocks), so the tiles
  ``ahead`` of the current one are known without a ticket per tile. (The first draft drew
  ``ahead`` tickets per block at once: consecutive tiles in one block, so each block's
  first tile waited in the look-back for the previous block's second: a serial chain,
  17x slower on the H200.)
* Staging: ``ahead + 1`` shared buffers of one tile (8 KiB of BF16) per block. After
  barrier B of tile i every lane issues the ``cp.async.cg`` 16-byte copies of its own 4
  units of tile i + ahead (the units it will code), then commits one group. Before
  coding tile i + 1 a lane waits until all but its newest
  ``ahead - 1`` groups have landed (``cp.async.wait_group``). Each lane reads only what it
  copied itself, so no block barrier is needed for the staging, and a buffer is reused
  only by the lane that read it, after it read it.
* The escaped exponents are read from the staging buffer instead of global memory.
* Plane bytes: each lane writes its 12 bytes (4 rounds x 3 planes) into its warp's
  384-byte region of shared memory; after ``syncwarp`` lanes 0..23 each store 16 bytes of
  it (a warp-tile's plane bytes are 128 contiguous bytes per plane), 1 global store per
  lane instead of 12 byte stores.
* The tile holding the end of the data takes v4's path (2-byte loads from global memory,
  byte stores), so the asynchronous copies never read past the input.

The asynchronous-copy helpers are the library's (``zipccl.kernels.compat``), as is the
simulator's ``alignment=`` support. Since commit fced2d3 the library's encoder is this
design with one tile ahead and v4's ticket per tile (the rank order below is not
deadlock-free when a grid's blocks cannot all be resident); this file keeps the measured
variants (rank order, 1 or 2 tiles ahead, the no-look-back ablation).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from zipccl import format as fmt
from zipccl.kernels import compat
from zipccl.kernels._common import (
    STATUS_AGG,
    STATUS_INC,
    TPB,
    WS_CODEBOOK,
    WS_CSUM,
    WS_EPOCH,
    WS_TICKET,
    byte_checksum,
    field8,
    lookback,
    popc32,
    publish,
    warp_sum,
)
from zipccl.kernels.compat import (
    cp_async16,
    cp_commit,
    cp_wait0,
    u32,
    wrap64,
)
from zipccl.kernels.encode_tile import U64, _code_tile, _lut_entry, _tile_words
from zipccl.kernels.layout import layout_fields

TILE_WORDS = fmt.BLOCK // 2  # uint32 words of BF16 input per tile

if compat.SIMULATOR:
    def cp_wait(n):
        pass

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _wait1(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "cp.async.wait_group 1;",
                               "~{memory}", side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return types.void(), codegen

    @cuda.jit(device=True, forceinline=True)
    def cp_wait(n):
        """Wait until at most n (0 or 1) of this thread's newest copy groups are in flight."""
        if n == 0:
            cp_wait0()
        else:
            _wait1()


def make_encode_tiles(ahead: int = 2, blocks_per_sm: int = 6, with_lookback: bool = True):
    """The v5 tile kernel staging ``ahead`` tiles ahead (``ahead + 1`` buffers).

    ``with_lookback=False`` is an ablation for timing only: no look-back, every tile's
    escapes placed as if it were the first (wrong frames), to measure what the look-back and
    the wait for it at barrier B cost.
    """
    assert ahead in (1, 2), "cp_wait knows 0 and 1 groups in flight"
    nbuf = ahead + 1
    stage_words = nbuf * TILE_WORDS
    opts = {} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}

    @cuda.jit(device=True)
    def issue(stage, slot, x32, n, t, n_blocks, warp, lane):
        """This lane's async copies of tile t (full tiles only) into buffer ``slot``; one group."""
        if t < n_blocks and (t + 1) * fmt.BLOCK <= n:
            g = t * 512 + warp * 128 + lane
            s = slot * TILE_WORDS + 4 * (warp * 128 + lane)
            cp_async16(stage, s, x32, 4 * g)
            cp_async16(stage, s + 128, x32, 4 * g + 128)
            cp_async16(stage, s + 256, x32, 4 * g + 256)
            cp_async16(stage, s + 384, x32, 4 * g + 384)
        cp_commit()

    @cuda.jit(**opts)
    def encode_tiles_v5(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
        n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks = layout_fields(lay)
        lut = cuda.shared.array(256, dtype=np.uint32)
        stage = cuda.shared.array(stage_words, dtype=np.uint32, alignment=16)
        pl = cuda.shared.array(4 * 96, dtype=np.uint32, alignment=16)  # per warp: 3 planes x 128 B
        smem = cuda.shared.array(16, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        warp = tid >> 5
        if cb64 < 0:
            cb64 = ws[WS_CODEBOOK]
        lut[tid] = _lut_entry(tid, cb64)
        lut[tid + TPB] = _lut_entry(tid + TPB, cb64)
        if tid == 0:
            smem[0] = cuda.atomic.add(ws, WS_TICKET, 1)  # this block's rank
            smem[1] = ws[WS_EPOCH]
        cuda.syncthreads()
        rank = smem[0]
        epoch = smem[1]
        nblk = np.int64(cuda.gridDim.x)
        for j in range(ahead):
            issue(stage, j, x32, n, rank + j * nblk, n_blocks, warp, lane)
        tile = rank
        i = 0
        cs = np.int64(0)
        while tile < n_blocks:
            slot = i % nbuf
            g = tile * 512 + warp * 128 + lane
            full = (tile + 1) * fmt.BLOCK <= n
            cp_wait(ahead - 1)  # this lane's copies of tile i have landed
            s = slot * TILE_WORDS + 4 * (warp * 128 + lane)
            wd, _ = _tile_words(fmt.DTYPE_BF16, 4, stage, s, x32, x16, out8, out32, n, tile, g, warp, lane, 0,
                                full, do_cs)
            escm, ex, w0t, w1t, w2t, w3t, tcs = _code_tile(fmt.DTYPE_BF16, wd, lut, lut, pl, out8, out32,
                                                           out64, tile, g, warp, lane, full, planes_off,
                                                           stride, pwords, do_cs)
            if do_cs:
                cs = wrap64(cs + tcs)
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
                if with_lookback and tile > 0:
                    prefix = lookback(ws, tile, epoch, lane)
                    if lane == 0:
                        publish(ws, tile, epoch, STATUS_INC, prefix + btot)
                if lane == 0:
                    smem[6] = prefix
            cuda.syncthreads()  # B: this tile's prefix
            prefix = smem[6]
            issue(stage, (i + ahead) % nbuf, x32, n, tile + ahead * nblk, n_blocks, warp, lane)
            if escm != 0:
                base = eo + prefix + woff
                k0 = base + np.int64(field8(ex, 0))
                k1 = base + np.int64(u32(u32(w0t + field8(ex, 1)) - popc32(u32(escm & 0xFF))))
                k2 = base + np.int64(u32(u32(w0t + w1t + field8(ex, 2)) - popc32(u32(escm & 0xFFFF))))
                k3 = base + np.int64(u32(u32(w0t + w1t + w2t + field8(ex, 3))
                                         - popc32(u32(escm & 0xFFFFFF))))
                e0 = 8 * g
                m = escm
                sbase = slot * TILE_WORDS + 4 * (warp * 128 + lane)
                while m != 0:
                    low = u32(m & u32(u32(~m) + 1))
                    m = u32(m ^ low)
                    bb = popc32(u32(low - 1))
                    r = u32(bb >> 3)
                    sidx = u32(bb & 7)
                    if full:
                        wv = stage[sbase + np.int64(u32(u32(r << 7) + u32(sidx >> 1)))]
                        v = u32(u32(wv >> u32(16 * u32(sidx & 1))) & 0xFFFF)
                    else:
                        v = u32(x16[U64(e0 + np.int64(u32(u32(r << 8) + sidx)))])
                    pos = k0
                    if r == 1:
                        pos = k1
                    elif r == 2:
                        pos = k2
                    elif r == 3:
                        pos = k3
                    pos += np.int64(popc32(u32(escm & u32(low - 1))))
                    if pos < raw_size:
                        x = u32(u32(v >> 7) & 0xFF)
                        out8[U64(pos)] = x
                        if do_cs:
                            cs = wrap64(cs + byte_checksum(np.int64(x), pos - fmt.HEADER_SIZE))
            i += 1
            tile += nblk
        cp_wait(0)
        if do_cs:
            cs = warp_sum(cs)
            if lane == 0:
                cuda.atomic.add(ws, WS_CSUM + (cuda.blockIdx.x & 7), cs)

    return encode_tiles_v5


def grid(tiles: int, blocks_per_sm: int, kernel=None) -> int:
    """Blocks of a launch: at most ``blocks_per_sm`` per multiprocessor and never more than can
    be resident at once (the rank order needs every block of the grid running)."""
    if compat.SIMULATOR:  # it runs one block after another: rank 1 would wait for rank 0 forever
        return 1
    sms = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    g = sms * blocks_per_sm
    if kernel is not None:
        for k in kernel.overloads.values():
            g = min(g, int(k.max_cooperative_grid_blocks(TPB)))
    return max(1, min(tiles, g))


__all__ = ["make_encode_tiles", "grid"]
