"""v7b: the FP32 encoder taking two tiles a ticket, as the BF16 encoder does since v6c.

An FP32 frame is the BF16 frame of the values' upper halves plus a section of their low halves,
and the library builds its FP32 encoder from the tile kernel with one tile a ticket
(``encode._tiles_kernel(FP32)``): per 4,096 values one look-back and two block barriers. v6c
halved both for BF16 (+7% at 16 MiB, +19-22% at >= 256 MiB). Here the FP32 build takes the same
pair of tiles 2k, 2k + 1 a ticket: each tile is loaded straight from global memory (all 8 of a
lane's 16-byte loads before its first store, as in the library: FP32 tiles are not staged),
split (low halves stored), coded and stored; then one barrier A for both tiles' warp totals,
one status word (the pair's count, its look-back, its inclusive prefix: ``encode._pair_resolve``),
barrier B and both tiles' escapes (upper halves re-read from global memory, still cached). The
frame still stores one escape count per 4,096-value block; ``encode_finish`` reads the last
pair's status word, so it is told the number of pairs.

Tile 2k + 1's loads cannot move above tile 2k's stores (a store to a frame that may alias the
input), so the pair's second tile waits for its loads as the per-tile loop's next tile does; what
is saved is one barrier pair and one look-back per 8,192 values.

Frames are byte-identical to the library's FP32 frames. Check under the CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v7b_encode32.py --sizes-k 2 8 9 13

On a GPU ``v7_bench.py`` checks every timed frame against the library's and times it. The
prediction is in NOTES.md ("Round 4").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import v6_sim  # noqa: E402
from numba import cuda  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.kernels import _common as common  # noqa: E402
from zipccl.kernels import compat, encode, encode_launch  # noqa: E402
from zipccl.kernels import launch as launch_route  # noqa: E402
from zipccl.kernels import plan as plans  # noqa: E402
from zipccl.kernels.compat import wrap64  # noqa: E402
from zipccl.kernels.encode import _pair_resolve  # noqa: E402
from zipccl.kernels.encode_tile import _code_tile, _escapes, _fill_tables, _tile_words  # noqa: E402
from zipccl.kernels.layout import FP32, finish_tuple, lay_lo, layout_fields, wide_tuple  # noqa: E402

PER_TICKET = 2


@common.dev
def _code32(t, ahead, lut, rlut, pl, x32, x16, out8, out32, out64, lay, warp, lane, do_cs):
    """One FP32 tile t of a pair, loaded (``ahead``: as ``_tile_words``'), split, coded and stored
    (nothing past the last tile): (``_code_tile``'s escape mask, scan and round totals; the tile's
    checksum terms, low halves' included; g; full)."""
    n, planes_off, stride, _, _, _, pwords, n_blocks = layout_fields(lay)
    g = t * 512 + warp * 128 + lane
    full = (t + 1) * fmt.BLOCK <= n
    if t >= n_blocks:
        z = np.uint32(0)
        return z, z, z, z, z, z, np.int64(0), g, full
    wd, lcs = _tile_words(FP32, ahead, lut, 0, x32, x16, out8, out32, n, t, g, warp, lane, lay_lo(lay), full,
                          do_cs)
    escm, ex, w0t, w1t, w2t, w3t, tcs = _code_tile(FP32, wd, lut, rlut, pl, out8, out32, out64, t, g, warp,
                                                   lane, full, planes_off, stride, pwords, do_cs)
    return escm, ex, w0t, w1t, w2t, w3t, wrap64(tcs + lcs), g, full


def build(blocks_per_sm: int = common.BLOCKS_PER_SM, ahead: int = 4):
    """The v7b tile kernel (``encode.encode_tiles32``' arguments); ``ahead``: 4 = all of a tile's
    loads before its first store (the library's FP32 setting), 1 = each round's after the round
    before (fewer registers: the pair keeps tile 2k's escape state across tile 2k + 1)."""
    assert ahead in (1, 4)

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (common.TPB, blocks_per_sm)}))
    def encode_tiles32_pairs(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
        n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks = layout_fields(lay)
        lut = cuda.shared.array(256, dtype=np.uint32)
        rlut = cuda.shared.array(1, dtype=np.uint32)
        pl = cuda.shared.array(4 * 96, dtype=np.uint32, alignment=16)
        smem = cuda.shared.array(12, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        warp = tid >> 5
        if cb64 < 0:  # the codebook was chosen on the device
            cb64 = ws[common.WS_CODEBOOK]
        _fill_tables(FP32, lut, rlut, tid, cb64)
        common.first_ticket(ws, smem, tid)
        if cuda.blockIdx.x == 0:
            encode._type_padding(FP32, out8, n, planes_off, stride, pwords, counts_off, n_blocks, eo,
                                 lay_lo(lay), tid)
        cuda.syncthreads()
        pair = smem[0]
        epoch = smem[1]
        cs = np.int64(0)
        while pair < (n_blocks + 1) >> 1:
            escm0, ex0, a0, a1, a2, a3, cs0, g0, full0 = _code32(2 * pair, ahead, lut, rlut, pl, x32, x16,
                                                                 out8, out32, out64, lay, warp, lane, do_cs)
            escm1, ex1, b0, b1, b2, b3, cs1, g1, full1 = _code32(2 * pair + 1, ahead, lut, rlut, pl, x32, x16,
                                                                 out8, out32, out64, lay, warp, lane, do_cs)
            cs = wrap64(cs + cs0 + cs1)
            # A: both tiles' warp totals in one word (tile 2k + 1's in the high half: a block's count
            # is at most 4,096, so the sums over warps never carry into it)
            tot = np.int64(a0 + a1 + a2 + a3) | (np.int64(b0 + b1 + b2 + b3) << 32)
            woff, btot = common.block_escapes(smem, 2, warp, lane, tot, 0, 0, 0)
            c0 = btot & common.LOW32
            if warp == 0:
                cs = _pair_resolve(ws, out32, smem, pair, epoch, lane, c0, btot >> 32, counts_off, n_blocks,
                                   do_cs, cs)
            cuda.syncthreads()  # B: the pair's prefix, the next ticket
            base = eo + smem[10]
            pair = smem[0]
            cs = _escapes(FP32, escm0, ex0, a0, a1, a2, base + (woff & common.LOW32), out8, raw_size, lut, 0,
                          x32, x16, g0, full0, do_cs, cs)
            cs = _escapes(FP32, escm1, ex1, b0, b1, b2, base + c0 + (woff >> 32), out8, raw_size, lut, 0, x32,
                          x16, g1, full1, do_cs, cs)
        if do_cs:
            common.flush_checksum(ws, cs, lane)

    return encode_tiles32_pairs


encode_tiles32_pairs = build()


def launch(x32, x16, xu32, xu16, out8, out32, out64, ws, lay: fmt.Layout, hdr, crc_base, crc_tab, cb64,
           checksum, stream, kernel=None):
    """v7b encode of FP32 values: ``encode_launch.launch_wide``'s arguments (``kernel``: another build)."""
    do_cs = 1 if checksum else 0
    raw = 1 if lay.static_size > lay.raw_size else 0
    pairs = 0
    if lay.n_blocks and not raw:
        pairs = -(-lay.n_blocks // PER_TICKET)  # status words, and the tickets
        grid = common.grid_size(pairs)
        (kernel or encode_tiles32_pairs)[grid, common.TPB, stream](x32, xu16, out8, out32, out64, ws,
                                                                   wide_tuple(lay), cb64, do_cs)
    encode.encode_finish[encode_launch.finish_blocks(lay), common.TPB, stream](
        xu32, xu16, out8, out32, out64, ws, finish_tuple(lay), hdr, crc_base, crc_tab, raw, do_cs, pairs,
        1 if cb64 < 0 else 0)


def kernel(blocks_per_sm: int = common.BLOCKS_PER_SM, ahead: int = 4):
    """The lean route's handle (``launch.Kernel``) of a v7b build, for ``plan``."""
    default = (blocks_per_sm, ahead) == (common.BLOCKS_PER_SM, 4)
    enc = encode_tiles32_pairs if default else build(blocks_per_sm, ahead)
    return launch_route.Kernel(enc, encode_launch.TILES32.argtypes)


def plan(tiles, device: int, x_ptr: int, out_ptr: int, out_nbytes: int, ws_ptr: int, ws_count: int, lay, hdr,
         crc_base: int, crc_ptr: int, crc_count: int, cb64: int, checksum: bool):
    """``encode_launch.WidePlan`` of an FP32 frame (its arguments after ``tiles``, the ``kernel`` handle)
    with v7b's tile step and a finishing step told the number of pairs."""
    p = encode_launch.WidePlan(device, x_ptr, out_ptr, out_nbytes, ws_ptr, ws_count, lay, hdr, crc_base,
                               crc_ptr, crc_count, cb64, checksum)
    if lay.n_blocks and lay.static_size <= lay.raw_size:
        n = lay.n
        do_cs = 1 if checksum else 0
        pairs = -(-lay.n_blocks // PER_TICKET)
        out = ((out_ptr, out_nbytes), (out_ptr, out_nbytes // 4), (out_ptr, out_nbytes // 8))
        ws = (ws_ptr, ws_count)
        words = ((x_ptr, (2 * n & ~7) // 2), (x_ptr, 2 * n))  # as WidePlan's: uint32 / uint16 units
        targs = ((x_ptr, n), (x_ptr, 2 * n), *out, ws, wide_tuple(lay), cb64, do_cs)
        fargs = (*words, *out, ws, finish_tuple(lay), hdr, crc_base, (crc_ptr, crc_count), 0, do_cs, pairs,
                 1 if cb64 < 0 else 0)
        first = plans.Step(tiles, device, common.grid_size(pairs), targs, (0, 1), (2, 3, 4))
        last = plans.Step(encode_launch.FINISH, device, encode_launch.finish_blocks(lay), fargs, (0, 1),
                          (2, 3, 4))
        p.steps = (first, last)
    return p


def encode_frame(launcher, bits, exponents, checksum: bool, ws, stream=0, out=None):
    """Encode FP32 ``bits`` (uint32 patterns, host under the simulator or device) with ``launcher``
    (``encode_launch.launch_wide``'s arguments) into ``out`` (or a new buffer); returns it."""
    from zipccl.codec import gpu_workspace
    from zipccl.kernels import runtime

    n = int(bits.size)
    lay = fmt.Layout.for_count(n, FP32)
    if out is None:
        out = np.zeros(fmt.max_compressed_size(n, FP32), np.uint8)
    nb = int(out.size)
    hdr, crc_base, cb64 = gpu_workspace._template(n, (n,), exponents, FP32)
    v = runtime.view
    launcher(v(bits, n, np.uint32), v(bits, 0, np.uint16), v(bits, n, np.uint32), v(bits, 2 * n, np.uint16),
             v(out, nb, np.uint8), v(out, nb // 4, np.uint32), v(out, nb // 8, np.int64), ws.array, lay, hdr,
             crc_base, runtime.crc_table(), cb64, checksum, stream)
    return out


def sim_inputs(sizes_k, seed=7):
    """``v6_sim.float_inputs`` of FP32 (an escape-heavy set: a third of the values random bits, still
    a coded frame)."""
    edge = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 1, 0x807FFFFF,
            0x7F7FFFFF, 0x00800000]
    return v6_sim.float_inputs(sizes_k, np.float32, edge, 3, seed)


def check_sim(sizes_k) -> int:
    """Simulator check: v7b's FP32 frames equal the library's and the reference's."""
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, reference

    cb = Codebook.from_sigma(0.02)

    def library(x, cs, ws):
        out = np.zeros(fmt.max_compressed_size(x.size, FP32), np.uint8)
        gpu.encode_into(x.view(np.float32), out, cb, checksum=cs, workspace=ws)
        return out

    return v6_sim.check_frames("v7b", sim_inputs(sizes_k),
                               lambda x, cs: reference.encode(x, cb, None, cs, dtype=FP32), library,
                               lambda x, cs, ws: encode_frame(launch, x, cb.exponents, cs, ws))


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(check_sim, __doc__))
