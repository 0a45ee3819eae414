"""v6c: the BF16 encoder with two escape blocks per ticket (one look-back per 8,192 values).

The library's loop (``zipccl/kernels/encode.py``) pays two block barriers and one look-back
(warp 0 waits on L2 while warps 1-3 wait at barrier B) for every 4,096 values. Here a ticket
names a pair of escape blocks, tiles 2k and 2k + 1: the block codes both, one after the other,
each from its own staging buffer (the library's two buffers, so shared memory and resident
blocks are unchanged; the next pair's copies go out once the pair's escapes are placed, so there
is no overlap across pairs), then barrier A (both tiles' warp totals), one status word per pair
(published count, look-back, inclusive prefix: status word k), barrier B, and both tiles'
escapes. The frame still stores one escape count per 4,096-value block, so the frame is the
library's byte for byte; ``encode_finish`` reads the pairs' last status word
(``encode.launch(..., per_ticket=2)``).

It is checked and timed as v6b is (``v6b_encode.py``: ``python experiments/kernels/v6c_encode.py
--sizes-k 9 20 33`` under ``NUMBA_ENABLE_CUDASIM=1``; ``v6_bench.py`` on a GPU); the prediction
and the outcome are in NOTES.md ("v6c").
"""

from __future__ import annotations

import sys

import numpy as np
import v6_sim  # noqa: E402
import v6b_encode  # first: it puts this tree's zipccl on the path
from numba import cuda  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.kernels import _common as cm  # noqa: E402
from zipccl.kernels import compat, encode  # noqa: E402
from zipccl.kernels.compat import cp_wait0, u32, wrap64  # noqa: E402
from zipccl.kernels.layout import lay_no_lo, layout_fields  # noqa: E402

STAGE_WORDS, TILE_WORDS, TPB = encode.STAGE_WORDS, encode.TILE_WORDS, cm.TPB
BF16 = fmt.DTYPE_BF16


@encode.dev
def code_half(t, slot, stage, lut, rlut, pl, x32, x16, out8, out32, out64, lay, warp, lane, do_cs):
    """Code tile t of a pair from staging buffer ``slot`` (nothing past the last tile); returns
    (_code_tile's escape mask, scan and round totals, checksum terms, g, full, sb)."""
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
        wd, _ = encode._tile_words(BF16, 4, stage, sb, x32, x16, out8, out32, n, t, g, warp, lane,
                                   lay_no_lo(lay), full, do_cs)
        escm, ex, w0t, w1t, w2t, w3t, tcs = encode._code_tile(BF16, wd, lut, rlut, pl, out8, out32, out64, t,
                                                              g, warp, lane, full, planes_off, stride, pwords,
                                                              do_cs)
    return escm, ex, w0t, w1t, w2t, w3t, tcs, g, full, sb


@encode.dev
def pair_resolve(ws, out32, smem, pair, epoch, lane, c0, c1, counts_off, n_blocks, do_cs, cs):
    """Warp 0: store both tiles' counts, publish the pair's, resolve its prefix into smem[10]
    and take the next ticket into smem[0]; returns the checksum."""
    t1 = 2 * pair + 1
    if t1 < n_blocks and lane == 0:
        out32[(counts_off >> 2) + t1] = c1
        if do_cs:
            cs = wrap64(cs + cm.count_checksum(c1, counts_off, t1))
    cs = cm.store_count(ws, out32, t1 - 1, pair, epoch, lane, c0, c0 + c1, counts_off, do_cs, cs)
    prefix = cm.tile_prefix(ws, pair, epoch, lane, c0 + c1)
    if lane == 0:
        smem[10] = prefix
        smem[0] = cm.take_ticket(ws)
    return cs


def build(blocks_per_sm: int = cm.BLOCKS_PER_SM):
    """The v6c tile kernel (``encode.encode_tiles``' arguments; BF16; one ticket per pair)."""

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def encode_tiles_v6c(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
        n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks = layout_fields(lay)
        n_pairs = (n_blocks + 1) >> 1
        lut = cuda.shared.array(256, dtype=np.uint32)
        rlut = cuda.shared.array(1, dtype=np.uint32)
        stage = cuda.shared.array(STAGE_WORDS, dtype=np.uint32, alignment=16)
        pl = cuda.shared.array(4 * 96, dtype=np.uint32, alignment=16)
        smem = cuda.shared.array(12, dtype=np.int64)  # 0: ticket, 1: epoch, 2.., 6..: totals, 10: prefix
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        warp = tid >> 5
        if cb64 < 0:
            cb64 = ws[cm.WS_CODEBOOK]
        encode._fill_tables(BF16, lut, rlut, tid, cb64)
        cm.first_ticket(ws, smem, tid)
        cuda.syncthreads()
        pair = smem[0]
        epoch = smem[1]
        encode._issue(stage, 0, x32, n, 2 * pair, n_blocks, warp, lane)
        encode._issue(stage, 1, x32, n, 2 * pair + 1, n_blocks, warp, lane)
        cs = np.int64(0)
        while pair < n_pairs:
            cp_wait0()
            escm0, ex0, a0, a1, a2, a3, tcs0, g0, full0, sb0 = code_half(
                2 * pair, 0, stage, lut, rlut, pl, x32, x16, out8, out32, out64, lay, warp, lane, do_cs)
            escm1, ex1, b0, b1, b2, b3, tcs1, g1, full1, sb1 = code_half(
                2 * pair + 1, 1, stage, lut, rlut, pl, x32, x16, out8, out32, out64, lay, warp, lane, do_cs)
            if do_cs:
                cs = wrap64(cs + tcs0 + tcs1)
            if lane == 0:
                smem[2 + warp] = np.int64(a0 + a1 + a2 + a3)
            woff1, btot1 = cm.block_escapes(smem, 6, warp, lane, b0, b1, b2, b3)  # A
            woff0, btot0 = cm.warp_offsets(smem, 2, warp)
            if warp == 0:
                cs = pair_resolve(ws, out32, smem, pair, epoch, lane, btot0, btot1, counts_off, n_blocks,
                                  do_cs, cs)
            cuda.syncthreads()  # B: the pair's prefix, the next ticket
            prefix = eo + smem[10]
            nxt = smem[0]
            cs = encode._escapes(BF16, escm0, ex0, a0, a1, a2, prefix + woff0, out8, raw_size, stage, sb0,
                                 x32, x16, g0, full0, do_cs, cs)
            encode._issue(stage, 0, x32, n, 2 * nxt, n_blocks, warp, lane)
            cs = encode._escapes(BF16, escm1, ex1, b0, b1, b2, prefix + btot0 + woff1, out8, raw_size, stage,
                                 sb1, x32, x16, g1, full1, do_cs, cs)
            encode._issue(stage, 1, x32, n, 2 * nxt + 1, n_blocks, warp, lane)
            pair = nxt
        cp_wait0()
        if do_cs:
            cm.flush_checksum(ws, cs, lane)

    return encode_tiles_v6c


encode_tiles_v6c = build()


def launch(x32, x16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, cb64, checksum, stream):
    """v6c encode: ``encode.launch``'s arguments."""
    encode.launch(x32, x16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, cb64, checksum, stream,
                  tiles_kernel=encode_tiles_v6c, per_ticket=2)


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(lambda sizes: v6b_encode.check_sim(launch, "v6c", sizes), __doc__))
