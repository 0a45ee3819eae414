"""The decoder for large BF16 and FP32 frames: a warp a tile, no block barrier, the escape
prefixes from a scan of the stored counts.

Frames, output and error bits are those of the block decoder (``decode.py``), which still
decodes frames of fewer than ``TILES_PER_WARP`` tiles a warp of the grid (``use_warps``).
Two kernels before the block decoder's finishing kernel, no host synchronisation:
``scan_counts`` gives every tile its escape prefix from the stored counts, with no block
waiting for another; ``decode_warps`` then decodes a tile per warp with the block decoder's
round code (``decode_tile``). How and why: docs/KERNELS.md, "The warp decoder"; the versions
and their measurements: experiments/kernels/NOTES.md.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from ..format.errors import ERR_COUNTS, ERR_HEADER, ERR_TOTAL
from . import _common as common
from . import compat
from . import decode_tile as parts
from . import launch as launch_route
from . import plan as plans
from ._common import (
    MAX_CHUNKS,
    TPB,
    WARPS,
    WS_CHUNK_PREFIXES,
    WS_CHUNK_TOTALS,
    WS_CHUNKS,
    WS_ERR,
    WS_STATUS,
    WS_TICKET,
    count_checksum,
    dev,
    exclusive_scan8,
    shfl_idx_u32,
    shfl_up_u32,
)
from .compat import atomic_read, load16, u32, wrap64
from .layout import (
    LAY_FIELDS,
    MAGIC_BF16,
    MAGIC_FP32,
    WIDE_FIELDS,
    header_ok,
    layout_fields,
)

U64 = np.uint64
HDR = fmt.HEADER_SIZE
ROWS = 32  # counts a scan thread sums
CHUNK = ROWS * TPB  # tiles a scan block covers
CHUNK_SHIFT = CHUNK.bit_length() - 1
# resident blocks a multiprocessor (launch bounds) and how the first tiles are taken: the builds
# that compile without register spills for cc 9.0 (under 64 registers both spill;
# experiments/kernels/NOTES.md, round 4)
BLOCKS = 6  # BF16: 80 registers, first wave by warp number
FP32_BLOCKS = parts.FP32_BLOCKS_PER_SM  # FP32: 6, every tile from the counter
FP32_FIRST_WAVE = False


@dev
def _block_scan(v, tid, part):
    """(exclusive scan of the uint32 ``v`` over the block's threads, the block's total), through
    the warps' totals in the shared ``part`` (one barrier)."""
    lane = tid & 31
    warp = tid >> 5
    x = v
    for d in (1, 2, 4, 8, 16):
        y = shfl_up_u32(x, d)
        if lane >= d:
            x = u32(x + y)
    if lane == 31:
        part[warp] = np.int64(x)
    cuda.syncthreads()
    below = np.int64(0)
    total = np.int64(0)
    for w in range(WARPS):
        t = part[w]
        if w < warp:
            below += t
        total += t
    return below + np.int64(u32(x - v)), total


@dev
def _clamped(c, t, n_blocks, last_lim):
    """Tile t's stored count ``c`` clamped to its values (0 past the last tile)."""
    v = np.int64(c)
    if t >= n_blocks:
        v = np.int64(0)
    elif t == n_blocks - 1 and v > last_lim:
        v = last_lim
    elif v > fmt.BLOCK:
        v = np.int64(fmt.BLOCK)
    return v


def _scan_kernel(fp32: bool, rows: int = ROWS):
    """The scan for BF16 or (``fp32``) FP32 frames, ``rows`` counts a thread (a multiple of 4;
    a chunk is rows * 128 tiles: the library's ``ROWS``, smaller in a test of many chunks)."""
    assert rows % 4 == 0
    chunk = rows * TPB
    magic = MAGIC_FP32 if fp32 else MAGIC_BF16

    @cuda.jit
    def scan_counts(f8, f32, f64, ws, lay):
        """Status word t := tile t's exclusive escape prefix in its chunk; chunk slot c := the
        chunk's total (docs/KERNELS.md, "The warp decoder", 1.)."""
        n, _, _, counts_off, _, _, _, n_blocks = layout_fields(lay)
        part = cuda.shared.array(8, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        if tid == 0:
            ok, raw, _, _ = header_ok(f64, f8.shape[0], lay, magic)
            part[4] = 1 if ok and raw == 0 else 0
        cuda.syncthreads()
        if part[4] == 0:
            return  # the tile kernel writes nothing either; the finishing kernel reports it
        first = np.int64(cuda.blockIdx.x) * chunk + tid * rows
        last_lim = n - (n_blocks - 1) * fmt.BLOCK  # the values of the last tile
        s = np.int64(0)
        for k in range(rows // 4):
            t = first + 4 * k
            if t < n_blocks:
                c0, c1, c2, c3 = load16(f32, (counts_off >> 4) + (t >> 2))
                s += _clamped(c0, t, n_blocks, last_lim) + _clamped(c1, t + 1, n_blocks, last_lim)
                s += _clamped(c2, t + 2, n_blocks, last_lim) + _clamped(c3, t + 3, n_blocks, last_lim)
        run, total = _block_scan(u32(s), tid, part)
        for k in range(rows // 4):  # the same words again, now each tile's prefix stored
            t = first + 4 * k
            if t < n_blocks:
                c0, c1, c2, c3 = load16(f32, (counts_off >> 4) + (t >> 2))
                for j in range(4):
                    c = c0 if j == 0 else (c1 if j == 1 else (c2 if j == 2 else c3))
                    if t + j < n_blocks:
                        ws[WS_STATUS + t + j] = run
                        run += _clamped(c, t + j, n_blocks, last_lim)
        if cuda.gridDim.x == 1:  # one chunk: its prefix is 0, no block to wait for
            if tid == 0:
                ws[WS_CHUNK_PREFIXES] = 0
            return
        if tid == 0:
            ws[WS_CHUNK_TOTALS + cuda.blockIdx.x] = total
            cuda.threadfence()
            part[5] = cuda.atomic.add(ws, WS_CHUNKS, 1)
        cuda.syncthreads()
        if part[5] != cuda.gridDim.x - 1:
            return
        # the last block to finish: the chunks' exclusive prefixes (one a thread; none waits)
        t = np.int64(0)
        if tid < cuda.gridDim.x:
            t = atomic_read(ws, WS_CHUNK_TOTALS + tid)
        cuda.syncthreads()  # part is reused
        e, _ = _block_scan(u32(t), tid, part)
        if tid < cuda.gridDim.x:
            ws[WS_CHUNK_PREFIXES + tid] = e
        if tid == 0:
            ws[WS_CHUNKS] = 0

    return scan_counts


@dev
def _warp_tile(ws, lane, n_blocks, first_wave):
    """The warp's next tile after its first: from the ticket counter (lane 0's atomic, shared
    by a shuffle), past the first wave's tiles (one a warp of the grid); none (``n_blocks``)
    without an atomic when the first wave covered every tile. (The grid's warp count is read
    here, not kept: a register held across the tile loop costs the kernel spills.)"""
    warps = np.int64(cuda.gridDim.x) * WARPS if first_wave else np.int64(0)
    if warps >= n_blocks:
        return n_blocks
    t = u32(0)
    if lane == 0:
        t = u32(cuda.atomic.add(ws, WS_TICKET, 1))
    return warps + np.int64(shfl_idx_u32(t, 0))


@dev
def _tile_prefix(ws, tile):
    """Tile's first escape position: its chunk's prefix (the scan's last block) plus the tile's
    status word (two independent loads)."""
    return ws[WS_CHUNK_PREFIXES + (tile >> CHUNK_SHIFT)] + ws[WS_STATUS + tile]


def _tiles_kernel(fp32: bool, blocks_per_sm: int, lo_ahead: int = parts.FP32_LO_AHEAD,
                  first_wave: bool = True):
    """The warp-a-tile decoder for BF16 output or (``fp32``, a constant) FP32 output;
    ``first_wave``: the first tiles by warp number (else every tile from the counter)."""
    magic, lo_of, code, patch = parts.tile_parts(fp32, lo_ahead)
    raw_rounds = 32 if fp32 else 16  # RAW copy: 16-byte units a lane and ticket

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def decode_warps(f8, f32, f64, out32, out16, ws, lay):
        """Decode tiles, a warp each, or copy a RAW frame (docs/KERNELS.md, "The warp decoder", 2.)."""
        tid = np.int64(cuda.threadIdx.x)
        hdr = cuda.shared.array(8, dtype=np.int64)  # the header check's results
        spread = cuda.shared.array(256, dtype=np.uint32)
        parts.fill_spread(spread, tid)
        if tid == 0:
            ok, raw, nesc, has_cs = header_ok(f64, f8.shape[0], lay, magic)
            hdr[0] = 1 if ok else 0
            hdr[1] = raw
            hdr[2] = nesc
            hdr[3] = has_cs
            hdr[4] = f64[5]
            if not ok and cuda.blockIdx.x == 0:
                cuda.atomic.or_(ws, WS_ERR, ERR_HEADER)
        cuda.syncthreads()  # the kernel's only barrier: the table and the header
        if hdr[0] == 0:
            return
        n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
        lo_off = lo_of(lay)
        units = 2 * n if fp32 else n  # the RAW payload in 2-byte units
        lane = tid & 31
        nesc = hdr[2]
        do_cs = hdr[3] != 0
        cs = np.int64(0)
        if first_wave:  # one tile a warp, by its number
            tile = np.int64(cuda.blockIdx.x) * WARPS + (tid >> 5)
        else:
            tile = _warp_tile(ws, lane, n_blocks, False)
        if hdr[1] != 0:  # RAW frame: a warp copies 4,096 values a tile
            while tile < n_blocks:
                g = tile * (32 * raw_rounds) + lane
                for _ in range(raw_rounds):
                    cs = parts.raw_unit(f8, f32, out32, out16, g, units, do_cs, cs)
                    g += 32
                tile = _warp_tile(ws, lane, n_blocks, first_wave)
            if do_cs:
                common.flush_checksum(ws, cs, lane)
            return

        cba, cbb = parts.codebook_words(hdr[4])
        err = np.int64(0)
        ra, rb, rc, rd = parts.load_tile(f8, f64, tile if tile < n_blocks else 0, 0, lane, n, planes_off,
                                           stride, pwords)
        while tile < n_blocks:
            nxt = _warp_tile(ws, lane, n_blocks, first_wave)
            craw = np.int64(f32[(counts_off >> 2) + tile])
            prefix = _tile_prefix(ws, tile)
            run = np.int64(0)  # escapes of the tile's earlier quarters
            for q in range(4):
                g = tile * 512 + q * 128 + lane
                escm, cntp, cs = code(ra, rb, rc, rd, g, spread, cba, cbb, f8, f32, out32, out16, lo_off,
                                      planes_off, stride, pwords, do_cs, cs)
                ex, w0t, w1t, w2t, w3t = exclusive_scan8(cntp, lane)
                if q < 3:  # the next quarter's loads go out before this quarter's escapes
                    ra, rb, rc, rd = parts.load_tile(f8, f64, tile, q + 1, lane, n, planes_off, stride,
                                                       pwords)
                elif nxt < n_blocks:
                    ra, rb, rc, rd = parts.load_tile(f8, f64, nxt, 0, lane, n, planes_off, stride, pwords)
                cs, err = patch(f8, out16, escm, ex, w0t, w1t, w2t, prefix + run, g, eo, nesc, do_cs, cs, err)
                run += np.int64(w0t + w1t + w2t + w3t)
            if lane == 0:
                lim = min(n - tile * fmt.BLOCK, fmt.BLOCK)
                cnt = min(craw, lim)
                if craw > lim or run != craw:
                    err |= ERR_COUNTS
                if tile == n_blocks - 1 and prefix + cnt != nesc:
                    err |= ERR_TOTAL
                if do_cs:
                    cs = wrap64(cs + count_checksum(craw, counts_off, tile))
            tile = nxt
        if err != 0:
            cuda.atomic.or_(ws, WS_ERR, err)
        if do_cs:
            common.flush_checksum(ws, cs, lane)

    return decode_warps


scan_counts = _scan_kernel(False)
scan_counts32 = _scan_kernel(True)
decode_warps = _tiles_kernel(False, BLOCKS)
decode_warps32 = _tiles_kernel(True, FP32_BLOCKS, first_wave=FP32_FIRST_WAVE)


# a frame takes the warp decoder from this many tiles per warp of its grid on: where the two
# decoders, each forced, cross (experiments/kernels/NOTES.md, round 4, "the size rule")
TILES_PER_WARP = 4


def use_warps(n_blocks: int, fp32: bool = False) -> bool:
    """Whether a frame of ``n_blocks`` tiles takes this decoder (else the block decoder): from
    ``TILES_PER_WARP`` tiles per warp of its grid on (below that the block decoder's four warps
    a tile have more parallelism than the frame gives the warps), when its chunks fit the
    workspace's slots."""
    bps = FP32_BLOCKS if fp32 else BLOCKS
    slots = WARPS * common.grid_size(1 << 30, bps)
    return n_blocks <= MAX_CHUNKS * CHUNK and n_blocks >= TILES_PER_WARP * slots


def chosen(n_blocks: int, fp32: bool, warps: bool | None) -> bool:
    """Whether a frame of ``n_blocks`` tiles (> 0) decodes here: ``warps`` if the caller forced
    one decoder, else ``use_warps``."""
    return bool(n_blocks) and (use_warps(n_blocks, fp32) if warps is None else warps)


def grid(n_blocks: int, fp32: bool = False) -> int:
    """Blocks of ``decode_warps``: a warp a tile, at most the launch bounds' blocks a multiprocessor."""
    return common.grid_size(-(-n_blocks // WARPS), FP32_BLOCKS if fp32 else BLOCKS)


def chunks(n_blocks: int) -> int:
    return -(-n_blocks // CHUNK)


def launch(f8, f32, f64, out32, out16, ws, lt, n_blocks: int, fp32: bool, stream) -> None:
    """Enqueue the scan and the tile kernel of a frame of ``n_blocks`` tiles
    (``lt``: its layout tuple); the caller enqueues the finishing kernel after them."""
    (scan_counts32 if fp32 else scan_counts)[chunks(n_blocks), TPB, stream](f8, f32, f64, ws, lt)
    (decode_warps32 if fp32 else decode_warps)[grid(n_blocks, fp32), TPB, stream](
        f8, f32, f64, out32, out16, ws, lt)


# -- the lean route (launch.py): compiled once per device, launched from packed parameters --
_A = launch_route.array
_FRAME = (_A(np.uint8), _A(np.uint32), _A(np.int64))
SCAN = launch_route.Kernel(scan_counts, (*_FRAME, _A(np.int64), launch_route.int_tuple(LAY_FIELDS)))
SCAN32 = launch_route.Kernel(scan_counts32, (*_FRAME, _A(np.int64), launch_route.int_tuple(WIDE_FIELDS)))
TILES = launch_route.Kernel(decode_warps, (*_FRAME, _A(np.uint32), _A(np.uint16), _A(np.int64),
                                           launch_route.int_tuple(LAY_FIELDS)))
TILES32 = launch_route.Kernel(decode_warps32, (*_FRAME, _A(np.uint32), _A(np.uint16), _A(np.int64),
                                               launch_route.int_tuple(WIDE_FIELDS)))


def steps(device: int, frame, outs, ws, lt, n_blocks: int, fp32: bool) -> tuple[plans.Step, plans.Step]:
    """The plan steps of the scan and the tile kernel: ``frame`` the (f8, f32, f64) buffers,
    ``outs`` (out32, out16), ``ws`` the workspace, each as (pointer, count)."""
    scan = plans.Step(SCAN32 if fp32 else SCAN, device, chunks(n_blocks), (*frame, ws, lt), (0, 1, 2), ())
    tiles = plans.Step(TILES32 if fp32 else TILES, device, grid(n_blocks, fp32), (*frame, *outs, ws, lt),
                       (0, 1, 2), (3, 4))
    return scan, tiles
