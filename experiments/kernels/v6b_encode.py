"""v6b: the BF16 encoder with one block barrier per tile; tile t's escapes placed during tile t+1.

The tile loop (``zipccl/kernels/encode.py``, one tile a ticket; the library's BF16 loop before it
took pairs of tiles, v6c) has two barriers per tile: A (the warps'
escape totals) and B, behind which warps 1-3 wait while warp 0 publishes the tile's count, walks
the look-back and takes the next ticket. Here there is no barrier B. After barrier A every warp
knows each of its escapes' rank inside the tile and writes the escaped bytes into a
shared-memory buffer at that rank (a tile's escapes are one contiguous run of the frame's
escape section), issues the next tile's copies and goes on coding it. Warp 0, after barrier A,
stores and publishes the tile's count and takes the ticket after next; then it resolves the
*previous* tile's prefix by the look-back (its predecessors have had a whole tile's time to
publish, so the walk rarely polls), publishes that tile's inclusive prefix and copies its run
of escape bytes from the buffer to the frame. Everything that crosses warps is double-buffered
by the tile's parity (escape buffer, warp totals, ticket slot), and barrier A of tile t + 1
orders warp 0's reading of tile t's buffer before anybody writes it again at tile t + 2. A last
barrier after the loop hands the block's last tile to warp 0.

Deadlock-free as the library's loop is: tiles go out in increasing order to running blocks, a
tile's count is published before its block waits for anything, and a look-back of tile t waits
only for the counts of tiles below t.

Frames are byte-identical to the library encoder's. Measured slower than v6c (NOTES.md), so it
stays here. Check under the CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v6b_encode.py --sizes-k 9 20 33

On a GPU ``v6_bench.py`` checks every timed frame against the library's and times it.
The prediction and the outcome are in NOTES.md ("v6b").
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
from zipccl.kernels import compat, encode_launch  # noqa: E402
from zipccl.kernels._common import (  # noqa: E402
    BLOCKS_PER_SM,
    TPB,
    WS_CODEBOOK,
    WS_EPOCH,
    byte_checksum,
    dev,
    flush_checksum,
    store_count,
    take_ticket,
    tile_prefix,
    warp_offsets,
)
from zipccl.kernels.compat import cp_wait0, wrap64  # noqa: E402
from zipccl.kernels.encode import STAGE_WORDS  # noqa: E402
from zipccl.kernels.encode_tile import (  # noqa: E402
    TILE_WORDS,
    _code_tile,
    _escapes,
    _fill_tables,
    _issue,
    _tile_words,
)
from zipccl.kernels.layout import lay_no_lo, layout_fields  # noqa: E402

BF16 = fmt.DTYPE_BF16
FAR = np.int64(1) << 62  # no limit: the buffer holds every escape of a tile
EBUF = 2 * fmt.BLOCK  # escape bytes of two tiles (a tile has at most BLOCK)


@dev
def copy_escapes(ebuf, src, count, out8, dst, lim, lane, do_cs, cs):
    """Warp 0: ``count`` staged escape bytes from ebuf[src..] to out8[dst..] (those below
    ``lim``), lane j bytes j, j + 32, ...; with ``do_cs`` their checksum terms added to cs."""
    i = np.int64(lane)
    while i < count:
        pos = dst + i
        if pos < lim:  # past raw_size the frame is RAW and encode_finish rewrites it
            x = np.int64(ebuf[src + i])
            out8[pos] = x
            if do_cs:
                cs = wrap64(cs + byte_checksum(x, pos - fmt.HEADER_SIZE))
        i += 32
    return cs


@dev
def resolve_previous(ws, ebuf, src, prev, pcnt, epoch, lane, out8, eo, raw_size, do_cs, cs):
    """Warp 0: the previous tile's prefix (look-back; its inclusive prefix published) and its
    staged escapes copied to the frame. No-op while there is no previous tile (prev < 0)."""
    if prev >= 0:
        prefix = tile_prefix(ws, prev, epoch, lane, pcnt)
        cs = copy_escapes(ebuf, src, pcnt, out8, eo + prefix, raw_size, lane, do_cs, cs)
    return cs


def build(blocks_per_sm: int = BLOCKS_PER_SM):
    """The v6b tile kernel (``encode.encode_tiles``' arguments; BF16)."""

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def encode_tiles_v6b(x32, x16, out8, out32, out64, ws, lay, cb64, do_cs):
        n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks = layout_fields(lay)
        lut = cuda.shared.array(256, dtype=np.uint32)
        rlut = cuda.shared.array(1, dtype=np.uint32)
        stage = cuda.shared.array(STAGE_WORDS, dtype=np.uint32, alignment=16)
        pl = cuda.shared.array(4 * 96, dtype=np.uint32, alignment=16)
        ebuf = cuda.shared.array(EBUF, dtype=np.uint8)  # escape bytes of tiles t, t + 1
        smem = cuda.shared.array(12, dtype=np.int64)  # 0, 1: ticket by parity; 2: epoch; 4 + 4p: totals
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        warp = tid >> 5
        if cb64 < 0:
            cb64 = ws[WS_CODEBOOK]
        _fill_tables(BF16, lut, rlut, tid, cb64)
        if tid == 0:
            smem[3] = take_ticket(ws)
            smem[1] = take_ticket(ws)  # the block's second tile, read at its first barrier A
            smem[2] = ws[WS_EPOCH]
        cuda.syncthreads()
        tile = smem[3]
        epoch = smem[2]
        _issue(stage, 0, x32, n, tile, n_blocks, warp, lane)
        slot = 0
        par = 0
        prev = np.int64(-1)  # the tile before (its escapes wait in ebuf), and its count
        pcnt = np.int64(0)
        cs = np.int64(0)
        while tile < n_blocks:
            g = tile * 512 + warp * 128 + lane
            full = (tile + 1) * fmt.BLOCK <= n
            cp_wait0()
            sb = slot * TILE_WORDS + 4 * (warp * 128 + lane)
            wd, _ = _tile_words(BF16, 4, stage, sb, x32, x16, out8, out32, n, tile, g, warp, lane,
                                lay_no_lo(lay), full, do_cs)
            escm, ex, w0t, w1t, w2t, w3t, tcs = _code_tile(BF16, wd, lut, rlut, pl, out8, out32, out64, tile,
                                                           g, warp, lane, full, planes_off, stride, pwords,
                                                           do_cs)
            if do_cs:
                cs = wrap64(cs + tcs)
            at = 4 + 4 * par
            if lane == 0:
                smem[at + warp] = np.int64(w0t + w1t + w2t + w3t)
            cuda.syncthreads()  # A: warp totals; the next ticket; ebuf[par ^ 1] complete
            woff, btot = warp_offsets(smem, at, warp)
            nxt = smem[1 - par]
            _issue(stage, slot ^ 1, x32, n, nxt, n_blocks, warp, lane)
            cs = _escapes(BF16, escm, ex, w0t, w1t, w2t, par * fmt.BLOCK + woff, ebuf, FAR, stage, sb, x32,
                          x16, g, full, 0, cs)
            if warp == 0:
                cs = store_count(ws, out32, tile, tile, epoch, lane, btot, btot, counts_off, do_cs, cs)
                nn = np.int64(0)
                if lane == 0:
                    nn = take_ticket(ws)
                cs = resolve_previous(ws, ebuf, (par ^ 1) * fmt.BLOCK, prev, pcnt, epoch, lane, out8, eo,
                                      raw_size, do_cs, cs)
                if lane == 0:
                    smem[par] = nn  # read after barrier A of tile nxt
            prev = tile
            pcnt = btot
            tile = nxt
            slot ^= 1
            par ^= 1
        cp_wait0()
        cuda.syncthreads()  # the last tile's escapes are staged
        if warp == 0:
            cs = resolve_previous(ws, ebuf, (par ^ 1) * fmt.BLOCK, prev, pcnt, epoch, lane, out8, eo,
                                  raw_size, do_cs, cs)
        if do_cs:
            flush_checksum(ws, cs, lane)

    return encode_tiles_v6b


encode_tiles_v6b = build()


def launch(x32, x16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, cb64, checksum, stream):
    """v6b encode: ``encode_launch.launch``'s arguments."""
    encode_launch.launch(x32, x16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, cb64, checksum,
                         stream, tiles_kernel=encode_tiles_v6b, per_ticket=1)


def encode_frame(launcher, bits, exponents, checksum: bool, ws, stream=0, out=None):
    """Encode ``bits`` (uint16 BF16 patterns, host under the simulator or device) with
    ``launcher`` (``encode_launch.launch``'s arguments) into ``out`` (or a new buffer); returns it."""
    from zipccl.codec import gpu_workspace
    from zipccl.kernels import runtime

    n = int(bits.size)
    lay = fmt.Layout.for_count(n)
    if out is None:
        out = np.zeros(fmt.max_compressed_size(n), np.uint8)
    nbytes = int(out.size)
    hdr, crc_base, cb64 = gpu_workspace._template(n, (n,), exponents)
    v = runtime.view
    launcher(v(bits, (n & ~7) // 2, np.uint32), v(bits, n, np.uint16), v(out, nbytes, np.uint8),
             v(out, nbytes // 4, np.uint32), v(out, nbytes // 8, np.int64), ws.array, lay, hdr, crc_base,
             runtime.crc_table(), cb64, checksum, stream)
    return out


def sim_inputs(sizes_k, seed=3):
    """(name, BF16 bits) of the simulator checks: N(0, 0.02) with an escape in every tile, an
    escape-heavy set (a third of the values escape) at sizes not a multiple of a tile, and random
    bits (a RAW frame) at the first size."""
    rng = np.random.default_rng(seed)
    for k in sizes_k:
        n = int(k * 1024) + (5 if int(k) % 2 else 0)
        x = (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        x[::613] = 0x7F80
        yield f"n={n} gaussian", x
        y = x.copy()
        y[::3] = (rng.integers(0, 1 << 16, y[::3].size)).astype(np.uint16)
        yield f"n={n} escape-heavy", y
        if k == sizes_k[0]:
            yield f"n={n} random (RAW)", rng.integers(0, 1 << 16, n).astype(np.uint16)


def check_sim(launcher, name: str, sizes_k) -> int:
    """Simulator check: ``launcher``'s frames equal the library encoder's and the reference's."""
    from zipccl.codebook import Codebook
    from zipccl.codec import reference

    cb = Codebook.from_sigma(0.02)
    return v6_sim.check_frames(name, sim_inputs(sizes_k), lambda x, cs: reference.encode(x, cb, None, cs),
                               lambda x, cs, ws: encode_frame(encode_launch.launch, x, cb.exponents, cs, ws),
                               lambda x, cs, ws: encode_frame(launcher, x, cb.exponents, cs, ws))


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(lambda sizes: check_sim(launch, "v6b", sizes), __doc__))
