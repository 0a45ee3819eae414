"""v7c: the BF16 decoder with a warp per tile and no block barrier, its escape prefixes from a
parallel scan of the stored counts.

The library's decoder (``zipccl/kernels/decode.py``) gives a tile to a block: each of its 4 warps
decodes a quarter, then the block meets at two barriers (the warps' escape totals; warp 0's
look-back and next ticket) before any warp places its escapes. Here a warp takes a tile alone
and decodes its 4 quarters one after the other, so no warp ever waits for another:

1. ``scan_counts`` (one block per 4,096 tiles, 128 threads): each thread loads the stored
   counts of a contiguous run of 32 tiles with 8 independent 16-byte loads (clamped to the
   tile's values, as the library's decoder clamps them) and sums them, one block scan gives
   every tile's exclusive prefix inside the block's chunk (written to the workspace's status
   word of the tile), and the chunk's total goes to ``aux``. The last block to finish (a counter in
   ``aux``) scans the chunk totals into the chunks' exclusive prefixes. No block waits for
   another. The round-2 scan (``v6_scan.py``: one block, each thread walking 256 counts at
   1 GiB, twice) was the likely cause of v6a's loss, not the scanned prefixes themselves.
2. ``decode_warps``: each warp takes tickets alone (lane 0's atomic, broadcast by a shuffle);
   a tile's first escape is the chunk's prefix plus the tile's (two loads, issued with the
   next ticket at the tile's start). Per quarter (1,024 values, 4 rounds of 8 values a lane)
   the rounds are decoded and stored exactly as the library does, the quarter's escape ranks
   come from one packed warp scan, the next quarter's loads (the next tile's first quarter
   after the fourth) go out, and the escapes are patched with 2-byte stores. The checks are
   the library's: a stored count above the tile's values, escapes seen against the stored
   count, the last tile's prefix plus count against the header's total, every escape position
   against the total; the checksum terms are the same. The finishing kernel is the library's.

The frame and the output are the library's, bit for bit. Check under the CUDA simulator (the
decoded values equal the input and the library decoder's; a frame with a wrong escape count or a
flipped payload bit gets the library's error bits; the scan alone over several chunks, built
with 4 counts a thread, against NumPy)::

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v7c_decode.py --sizes-k 9 20 33

On a GPU ``v7_bench.py`` checks every timed buffer set and times it beside the library decoder.
The prediction is in NOTES.md ("Round 4").
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
from zipccl.kernels import (  # noqa: E402
    compat,
    decode,
    decode_fp16,  # noqa: E402
)
from zipccl.kernels import launch as launch_route  # noqa: E402
from zipccl.kernels import plan as plans  # noqa: E402
from zipccl.kernels._common import (  # noqa: E402
    ERR_COUNTS,
    ERR_ESCAPE_RANGE,
    ERR_HEADER,
    ERR_TOTAL,
    TPB,
    WS_ERR,
    WS_STATUS,
    WS_TICKET,
    byte_checksum,
    count_checksum,
    dev,
    escape_bases,
    escape_rank,
    exclusive_scan8,
    next_escape,
    popc32,
    shfl_idx_u32,
    shfl_up_u32,
)
from zipccl.kernels.compat import atomic_read, load16, store16, u32, wrap64  # noqa: E402
from zipccl.kernels.layout import (  # noqa: E402
    LAY_FIELDS,
    MAGIC_BF16,
    MAGIC_FP32,
    WIDE_FIELDS,
    header_ok,
    lay_lo,
    lay_no_lo,
    layout_fields,
    layout_tuple,
    wide_tuple,
)

U64 = np.uint64
HDR = fmt.HEADER_SIZE
_lo32 = decode._lo32
_store32 = decode._store32
ROWS = 32  # counts a scan thread sums: a chunk is ROWS * TPB = 4,096 tiles
# aux: [0] the scan's finished-blocks counter, [1 + c] chunk c's total, [1 + MAX_CHUNKS + c] its prefix
MAX_CHUNKS = 256
AUX_SIZE = 1 + 2 * MAX_CHUNKS
BLOCKS = common.BLOCKS_PER_SM


@dev
def _block_scan(v, tid, part):
    """Exclusive scan of the uint32 ``v`` over the block's 128 threads (and the block's total),
    through 4 warp totals in the shared ``part`` (one barrier)."""
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
    for w in range(TPB // 32):
        t = part[w]
        if w < warp:
            below += t
        total += t
    return below + np.int64(u32(x - v)), total


def build_scan(rows: int = ROWS, fp32: bool = False):
    """The chunk scan with ``rows`` counts a thread (a chunk: rows * 128 tiles; rows a multiple
    of 4), for BF16 frames or (``fp32``) FP32 frames."""
    assert rows % 4 == 0
    chunk = rows * TPB
    quads = rows // 4
    magic = MAGIC_FP32 if fp32 else MAGIC_BF16

    @cuda.jit
    def scan_counts(f8, f32, f64, ws, aux, lay):
        """Status word t := tile t's exclusive escape prefix inside its chunk; aux: the chunks'
        totals, then (the last block) their exclusive prefixes (module docstring, 1.)."""
        n, _, _, counts_off, _, _, _, n_blocks = layout_fields(lay)
        part = cuda.shared.array(8, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        if tid == 0:
            ok, raw, _, _ = header_ok(f64, f8.shape[0], lay, magic)
            part[4] = 1 if ok and raw == 0 else 0
        cuda.syncthreads()
        if part[4] == 0:
            return  # the tile kernel writes nothing either; the finishing kernel reports it
        first = np.int64(cuda.blockIdx.x) * chunk + tid * rows  # this thread's tiles: first ..
        last_lim = n - (n_blocks - 1) * fmt.BLOCK  # the values of the last tile
        s = np.int64(0)
        for k in range(quads):  # independent 16-byte loads (the counts section is 128-aligned)
            t = first + 4 * k
            if t < n_blocks:
                c0, c1, c2, c3 = load16(f32, (counts_off >> 4) + (t >> 2))
                s += _clamped(c0, t, n_blocks, last_lim) + _clamped(c1, t + 1, n_blocks, last_lim)
                s += _clamped(c2, t + 2, n_blocks, last_lim) + _clamped(c3, t + 3, n_blocks, last_lim)
        excl, total = _block_scan(u32(s), tid, part)
        run = excl
        for k in range(quads):  # the same words again (L1), now each tile's prefix stored
            t = first + 4 * k
            if t < n_blocks:
                c0, c1, c2, c3 = load16(f32, (counts_off >> 4) + (t >> 2))
                for j in range(4):
                    c = c0 if j == 0 else (c1 if j == 1 else (c2 if j == 2 else c3))
                    if t + j < n_blocks:
                        ws[WS_STATUS + t + j] = run
                        run += _clamped(c, t + j, n_blocks, last_lim)
        if tid == 0:
            aux[1 + cuda.blockIdx.x] = total
            cuda.threadfence()
            part[5] = cuda.atomic.add(aux, 0, 1)
        cuda.syncthreads()
        if part[5] != cuda.gridDim.x - 1:
            return
        # the last block: the chunks' exclusive prefixes (at most MAX_CHUNKS, two a thread)
        c0 = 2 * tid
        a = np.int64(0)
        b = np.int64(0)
        if c0 < cuda.gridDim.x:
            a = atomic_read(aux, 1 + c0)
        if c0 + 1 < cuda.gridDim.x:
            b = atomic_read(aux, 2 + c0)
        cuda.syncthreads()  # part is reused
        e, _ = _block_scan(u32(a + b), tid, part)
        if c0 < cuda.gridDim.x:
            aux[1 + MAX_CHUNKS + c0] = e
        if c0 + 1 < cuda.gridDim.x:
            aux[2 + MAX_CHUNKS + c0] = e + a
        if tid == 0:
            aux[0] = 0

    return scan_counts


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


@dev
def _warp_ticket(ws, lane):
    """The warp's next tile (lane 0 takes the ticket, a shuffle gives it to every lane)."""
    t = u32(0)
    if lane == 0:
        t = u32(cuda.atomic.add(ws, WS_TICKET, 1))
    return np.int64(shfl_idx_u32(t, 0))


def build(blocks_per_sm: int = BLOCKS, rows: int = ROWS, fp32: bool = False, lo_ahead: int = 2):
    """The warp-per-tile decoder (``rows``: the scan's, for the chunk of a tile) for BF16 output
    or (``fp32``) FP32 output: then each round's low halves are merged in as the library's FP32
    build does (``lo_ahead`` rounds' loaded before the first of their stores)."""
    chunk_shift = int(rows * TPB).bit_length() - 1
    assert 1 << chunk_shift == rows * TPB and lo_ahead in (1, 2, 4)
    magic = MAGIC_FP32 if fp32 else MAGIC_BF16
    lo_of = lay_lo if fp32 else lay_no_lo
    raw_rounds = 32 if fp32 else 16  # RAW copy: 16-byte units a lane and ticket

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def decode_warps(f8, f32, f64, out32, out16, ws, aux, lay):
        """Decode tiles, a warp each, or copy a RAW frame (module docstring, 2.)."""
        n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
        lo_off = lo_of(lay)
        units = 2 * n if fp32 else n  # the RAW payload in 2-byte units
        spread = cuda.shared.array(256, dtype=np.uint32)
        hdr = cuda.shared.array(8, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        spread[tid] = decode._spread_entry(tid)
        spread[tid + TPB] = decode._spread_entry(tid + TPB)
        if tid == 0:
            ok, raw, nesc, has_cs = header_ok(f64, f8.shape[0], lay, magic)
            hdr[0] = 1 if ok else 0
            hdr[1] = raw
            hdr[2] = nesc
            hdr[3] = has_cs
            hdr[4] = f64[5]
            if not ok and cuda.blockIdx.x == 0:
                cuda.atomic.or_(ws, WS_ERR, ERR_HEADER)
        cuda.syncthreads()  # the only barrier: the table and the header
        if hdr[0] == 0:
            return
        nesc = hdr[2]
        do_cs = hdr[3] != 0
        cs = np.int64(0)
        tile = _warp_ticket(ws, lane)
        if hdr[1] != 0:  # RAW frame: a warp copies 4,096 values a ticket
            while tile < n_blocks:
                g = tile * (32 * raw_rounds) + lane
                for _ in range(raw_rounds):
                    e = 8 * g
                    if e + 8 <= units:
                        v0, v1, v2, v3 = load16(f32, (HDR >> 4) + g)
                        store16(out32, g, v0, v1, v2, v3)
                        if do_cs:
                            i = 4 * g
                            cs = wrap64(cs + np.int64(v0) * (2 * i + 1) + np.int64(v1) * (2 * i + 3)
                                        + np.int64(v2) * (2 * i + 5) + np.int64(v3) * (2 * i + 7))
                    elif e < units:
                        for k in range(8):
                            if e + k < units:
                                q = 2 * (e + k)
                                lo = np.int64(f8[HDR + q])
                                hi = np.int64(f8[HDR + q + 1])
                                out16[e + k] = lo | (hi << 8)
                                if do_cs:
                                    cs = wrap64(cs + byte_checksum(lo, q) + byte_checksum(hi, q + 1))
                    g += 32
                tile = _warp_ticket(ws, lane)
            if do_cs:
                common.flush_checksum(ws, cs, lane)
            return

        cb64 = hdr[4]
        cba = u32(cb64 << 8)
        cbb = u32(cb64 >> 24)
        err = np.int64(0)
        ra, rb, rc, rd = decode._load_tile(f8, f64, tile if tile < n_blocks else 0, 0, lane, n, planes_off,
                                           stride, pwords)
        while tile < n_blocks:
            nxt = _warp_ticket(ws, lane)
            craw = np.int64(f32[(counts_off >> 2) + tile])
            prefix = aux[1 + MAX_CHUNKS + (tile >> chunk_shift)] + ws[WS_STATUS + tile]
            run = np.int64(0)  # escapes of the tile's earlier quarters
            for q in range(4):
                g = tile * 512 + q * 128 + lane
                a0, a1, a2, a3, esc0 = decode._decode_round(ra, spread, cba, cbb)
                b0, b1, b2, b3, esc1 = decode._decode_round(rb, spread, cba, cbb)
                c0, c1, c2, c3, esc2 = decode._decode_round(rc, spread, cba, cbb)
                d0, d1, d2, d3, esc3 = decode._decode_round(rd, spread, cba, cbb)
                if fp32:  # with the low halves, lo_ahead rounds' loaded before a store (the library's)
                    la = _lo32(f8, f32, g, ra[5], lo_off)
                    if lo_ahead >= 2:
                        lb = _lo32(f8, f32, g + 32, rb[5], lo_off)
                    if lo_ahead >= 4:
                        lc = _lo32(f8, f32, g + 64, rc[5], lo_off)
                        ld = _lo32(f8, f32, g + 96, rd[5], lo_off)
                    lcs = _store32(out32, g, ra[5], a0, a1, a2, a3, la, lo_off, do_cs)
                    if lo_ahead < 2:
                        lb = _lo32(f8, f32, g + 32, rb[5], lo_off)
                    lcs = wrap64(lcs + _store32(out32, g + 32, rb[5], b0, b1, b2, b3, lb, lo_off, do_cs))
                    if lo_ahead < 4:
                        lc = _lo32(f8, f32, g + 64, rc[5], lo_off)
                        if lo_ahead == 2:
                            ld = _lo32(f8, f32, g + 96, rd[5], lo_off)
                    lcs = wrap64(lcs + _store32(out32, g + 64, rc[5], c0, c1, c2, c3, lc, lo_off, do_cs))
                    if lo_ahead < 2:
                        ld = _lo32(f8, f32, g + 96, rd[5], lo_off)
                    lcs = wrap64(lcs + _store32(out32, g + 96, rd[5], d0, d1, d2, d3, ld, lo_off, do_cs))
                    cs = wrap64(cs + lcs)
                elif ra[5] == 0xFF and rd[5] == 0xFF:
                    store16(out32, g, a0, a1, a2, a3)
                    store16(out32, g + 32, b0, b1, b2, b3)
                    store16(out32, g + 64, c0, c1, c2, c3)
                    store16(out32, g + 96, d0, d1, d2, d3)
                else:
                    decode._store_round(out32, out16, g, ra[5], a0, a1, a2, a3)
                    decode._store_round(out32, out16, g + 32, rb[5], b0, b1, b2, b3)
                    decode._store_round(out32, out16, g + 64, rc[5], c0, c1, c2, c3)
                    decode._store_round(out32, out16, g + 96, rd[5], d0, d1, d2, d3)
                if do_cs:
                    cs = wrap64(cs + decode._round_cs(ra, g, planes_off, stride, pwords)
                                + decode._round_cs(rb, g + 32, planes_off, stride, pwords)
                                + decode._round_cs(rc, g + 64, planes_off, stride, pwords)
                                + decode._round_cs(rd, g + 96, planes_off, stride, pwords))
                escm = u32(esc0 | u32(esc1 << 8) | u32(esc2 << 16) | u32(esc3 << 24))
                cntp = u32(popc32(esc0) | u32(popc32(esc1) << 8) | u32(popc32(esc2) << 16)
                           | u32(popc32(esc3) << 24))
                ex, w0t, w1t, w2t, w3t = exclusive_scan8(cntp, lane)
                if q < 3:  # the next quarter's loads go out before this quarter's escapes
                    ra, rb, rc, rd = decode._load_tile(f8, f64, tile, q + 1, lane, n, planes_off, stride,
                                                       pwords)
                elif nxt < n_blocks:
                    ra, rb, rc, rd = decode._load_tile(f8, f64, nxt, 0, lane, n, planes_off, stride, pwords)
                if escm != 0:
                    k0, k1, k2, k3 = escape_bases(ex, w0t, w1t, w2t, escm, prefix + run)
                    e0 = 8 * g
                    m = escm
                    while m != 0:
                        m, low, bit = next_escape(m)  # bit 8r + s: value s of round r
                        r = u32(bit >> 3)
                        e = e0 + np.int64(u32(u32(r << 8) + u32(bit & 7)))
                        smb = u32(f8[U64(HDR + e)])
                        pos = escape_rank(k0, k1, k2, k3, r, escm, low)
                        x = u32(0)
                        if pos >= 0 and pos < nesc:
                            x = u32(f8[U64(eo + pos)])
                            if do_cs:
                                cs = wrap64(cs + byte_checksum(np.int64(x), eo + pos - HDR))
                        else:
                            err |= ERR_ESCAPE_RANGE
                        hi = u32(u32(u32(smb & 0x80) << 8) | u32(x << 7) | u32(smb & 0x7F))
                        if fp32:
                            out16[U64(2 * e + 1)] = hi  # the upper half of FP32 value e
                        else:
                            out16[U64(e)] = hi
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


scan_counts = build_scan()
decode_warps = build()
FP32_BLOCKS = decode.FP32_BLOCKS_PER_SM
scan_counts32 = build_scan(fp32=True)
decode_warps32 = build(FP32_BLOCKS, fp32=True, lo_ahead=decode.FP32_LO_AHEAD)


def grid(n_blocks: int, blocks_per_sm: int = BLOCKS) -> int:
    """Blocks of the tile kernel: a warp a tile, at most ``blocks_per_sm`` a multiprocessor."""
    return common.grid_size(-(-n_blocks // (TPB // 32)), blocks_per_sm)


def chunks(n_blocks: int, rows: int = ROWS) -> int:
    c = -(-n_blocks // (rows * TPB))
    assert c <= MAX_CHUNKS
    return c


def launch(f8, f32, f64, out32, out16, ws, aux, lay: fmt.Layout, crc_zero, crc_tab, stream, kernel=None,
           scan=None, rows: int = ROWS, blocks_per_sm: int | None = None) -> None:
    """v7c decode of the BF16 or FP32 frame in ``f8`` (views as in ``decode.launch``; FP32:
    ``out32`` the n values, ``out16`` their 2n halves) of ``lay`` (its dtype) into ``out16``;
    ``aux``: int64[AUX_SIZE] on the device, zero before the first call."""
    fp32 = lay.dtype == fmt.DTYPE_FP32
    lt = wide_tuple(lay) if fp32 else layout_tuple(lay)
    if blocks_per_sm is None:
        blocks_per_sm = FP32_BLOCKS if fp32 else BLOCKS
    if lay.n_blocks:
        (scan or (scan_counts32 if fp32 else scan_counts))[chunks(lay.n_blocks, rows), TPB, stream](
            f8, f32, f64, ws, aux, lt)
        tiles = kernel or (decode_warps32 if fp32 else decode_warps)
        tiles[grid(lay.n_blocks, blocks_per_sm), TPB, stream](f8, f32, f64, out32, out16, ws, aux, lt)
    if fp32:
        decode_fp16.wide_finish[1, TPB, stream](f8, f64, ws, lt, crc_zero, crc_tab)
    else:
        decode.decode_finish[1, TPB, stream](f8, f32, f64, ws, lt, crc_zero, crc_tab)


_A = launch_route.array
_FRAME = (_A(np.uint8), _A(np.uint32), _A(np.int64))


def kernels(blocks_per_sm: int = BLOCKS, fp32: bool = False, dec=None):
    """The lean route's handles (``launch.Kernel``) of the scan and a v7c build (or the tile
    kernel ``dec`` with v7c's arguments), for ``plan``."""
    if dec is not None:
        pass
    elif fp32:
        dec = decode_warps32 if blocks_per_sm == FP32_BLOCKS else build(blocks_per_sm, fp32=True,
                                                                        lo_ahead=decode.FP32_LO_AHEAD)
    else:
        dec = decode_warps if blocks_per_sm == BLOCKS else build(blocks_per_sm)
    lt = launch_route.int_tuple(WIDE_FIELDS if fp32 else LAY_FIELDS)
    scan = scan_counts32 if fp32 else scan_counts
    return (launch_route.Kernel(scan, (*_FRAME, _A(np.int64), _A(np.int64), lt)),
            launch_route.Kernel(dec, (*_FRAME, _A(np.uint32), _A(np.uint16), _A(np.int64), _A(np.int64), lt)))


def plan(handles, blocks_per_sm: int, device: int, f_ptr: int, f_nbytes: int, out_ptr: int, lay, ws_ptr: int,
         ws_count: int, aux_ptr: int, crc_zero: int, crc_ptr: int, crc_count: int):
    """``decode.Plan`` (BF16) or ``decode_fp16.Plan`` (FP32, by ``lay.dtype``) with the tile step
    replaced by v7c's scan and tile steps (the lean route, so that eager timings compare with the
    library's)."""
    fp32 = lay.dtype == fmt.DTYPE_FP32
    base = decode_fp16.Plan if fp32 else decode.Plan
    p = base(device, f_ptr, f_nbytes, out_ptr, lay, ws_ptr, ws_count, crc_zero, crc_ptr, crc_count)
    if lay.n_blocks:
        scan, tiles = handles
        n = lay.n
        frame = ((f_ptr, f_nbytes), (f_ptr, f_nbytes // 4), (f_ptr, f_nbytes // 8))
        lt = wide_tuple(lay) if fp32 else layout_tuple(lay)
        wsa = (ws_ptr, ws_count)
        aux = (aux_ptr, AUX_SIZE)
        outs = ((out_ptr, n), (out_ptr, 2 * n)) if fp32 else ((out_ptr, (n & ~7) // 2), (out_ptr, n))
        s1 = plans.Step(scan, device, chunks(lay.n_blocks), (*frame, wsa, aux, lt), (0, 1, 2), ())
        s2 = plans.Step(tiles, device, grid(lay.n_blocks, blocks_per_sm), (*frame, *outs, wsa, aux, lt),
                        (0, 1, 2), (3, 4))
        p.steps = (s1, s2, *p.steps[1:])
    return p


def decode_frame(frame, n: int, ws, aux, out=None, stream=None, dtype=fmt.DTYPE_BF16, **kw):
    """Decode the BF16 or FP32 ``frame`` (host arrays under the simulator) of n values into
    ``out`` (uint16 / uint32) on ``stream`` (``runtime.stream``'s kinds)."""
    from zipccl.kernels import runtime

    fp32 = dtype == fmt.DTYPE_FP32
    if out is None:
        out = np.zeros(n, np.uint32 if fp32 else np.uint16)
    nb = int(frame.size)
    v = runtime.view
    lay = fmt.Layout.for_count(n, dtype)
    outs = (v(out, n, np.uint32), v(out, 2 * n, np.uint16)) if fp32 else (v(out, (n & ~7) // 2, np.uint32),
                                                                           v(out, n, np.uint16))
    launch(v(frame, nb, np.uint8), v(frame, nb // 4, np.uint32), v(frame, nb // 8, np.int64), *outs, ws.array,
           aux, lay, common.CRC_ZERO, runtime.crc_table(), runtime.stream(stream), **kw)
    return out


def check_scan_sim() -> int:
    """The scan alone, built with 4 counts a thread (a chunk of 512 tiles), over 3 chunks and a
    part: every tile's prefix (chunk prefix + status word) equals NumPy's cumulative sum of the
    clamped stored counts, and the counter is back at 0."""
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, reference

    n = 3 * 512 * fmt.BLOCK + 5 * fmt.BLOCK + 77
    rng = np.random.default_rng(11)
    x = (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    x[rng.integers(0, n, 2000)] = 0x7F80
    frame = reference.encode(x, Codebook.from_sigma(0.02), None, False)
    lay = fmt.Layout.for_count(n)
    counts = frame[lay.counts_offset:lay.counts_offset + 4 * lay.n_blocks].view(np.uint32).astype(np.int64)
    want = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ws = gpu.Workspace(n)
    aux = np.zeros(AUX_SIZE, np.int64)
    nb = frame.size
    scan1 = build_scan(4)
    scan1[chunks(lay.n_blocks, 4), TPB](frame, frame[:nb // 4 * 4].view(np.uint32),
                                        frame[:nb // 8 * 8].view(np.int64), ws.array, aux, layout_tuple(lay))
    t = np.arange(lay.n_blocks)
    got = aux[1 + MAX_CHUNKS + (t >> 9)] + ws.array[WS_STATUS + t]
    ok = np.array_equal(got, want) and aux[0] == 0
    said = "ok" if ok else "DIFFERS"
    print(f"v7c scan over {chunks(lay.n_blocks, 4)} chunks of 512 tiles: {said}", flush=True)
    return 0 if ok else 1


def check_sim(sizes_k, name: str = "v7c") -> int:
    """Simulator check: v7c decodes reference BF16 frames (with and without a checksum, an
    escape-heavy one, a RAW one) to the input bit for bit, as the library's decoder does, with no
    error bits; corrupted frames get the library's error bits; then ``check_scan_sim``."""
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, reference

    cb = Codebook.from_sigma(0.02)
    bad = 0

    def both(frame, n):
        out = []
        for which in ("library", name):
            ws = gpu.Workspace(max(n, 1))
            if which == "library":
                got = np.zeros(n, np.uint16)
                gpu.decode_into(frame, got, workspace=ws)
            else:
                got = decode_frame(frame, n, ws, np.zeros(AUX_SIZE, np.int64))
            out.append((got, ws.last_error()))
        return out

    edge = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x0001, 0x807F, 0x7F7F, 0x0080]
    inputs = [(label, (x >> 16).astype(np.uint16))
              for label, x in v6_sim.float_inputs(sizes_k, np.float32, [e << 16 for e in edge], 6, 7)]
    for label, x in inputs:
        for cs in (False, True):
            frame = reference.encode(x, cb, None, cs)
            (lib, lib_err), (got, err) = both(frame, x.size)
            ok = err == 0 and lib_err == 0 and np.array_equal(got, x) and np.array_equal(lib, x)
            bad += not ok
            print(f"{name} {label} checksum={cs}: {'ok' if ok else 'DIFFERS'} "
                  f"(raw: {fmt.parse_header(frame).raw}, error bits {err}, library's {lib_err})", flush=True)
    x = inputs[0][1]
    frame = reference.encode(x, cb, None, True)
    h = fmt.parse_header(frame)
    lay = fmt.Layout.for_count(x.size)
    cases = [("payload bit", HDR + 7, 1 ^ int(frame[HDR + 7]))]
    if h.n_escapes:
        cases += [("escape count", lay.counts_offset, 1 + int(frame[lay.counts_offset])),
                  ("escape count above the tile", lay.counts_offset + 1, 0x20)]
    for label, at, value in cases:
        f = frame.copy()
        f[at] = value
        (lib, lib_err), (got, err) = both(f, x.size)
        ok = err == lib_err and err != 0
        bad += not ok
        said = "ok" if ok else "DIFFERS"
        print(f"{name} corrupted ({label}): error bits {err}, library's {lib_err}: {said}", flush=True)
    bad += check_fp32_sim(sizes_k, name)
    return (1 if bad else 0) | check_scan_sim()


def check_fp32_sim(sizes_k, name: str = "v7c") -> int:
    """The FP32 build: reference FP32 frames (gaussian with edge patterns, escape-heavy, RAW; with
    and without a checksum) decode to the input bit for bit, as the library's FP32 decoder's do."""
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, reference

    cb = Codebook.from_sigma(0.02)
    bad = 0
    edge = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 1, 0x807FFFFF,
            0x00800000]
    for label, x in v6_sim.float_inputs(sizes_k, np.float32, edge, 6, 9):
        for cs in (False, True):
            frame = reference.encode(x, cb, None, cs, dtype=fmt.DTYPE_FP32)
            ws = gpu.Workspace(x.size)
            lib = np.zeros(x.size, np.uint32)
            gpu.decode_into(frame, lib.view(np.float32), workspace=ws)
            lib_err = ws.last_error()
            ws = gpu.Workspace(x.size)
            got = decode_frame(frame, x.size, ws, np.zeros(AUX_SIZE, np.int64), dtype=fmt.DTYPE_FP32)
            err = ws.last_error()
            ok = err == 0 and lib_err == 0 and np.array_equal(got, x) and np.array_equal(lib, x)
            bad += not ok
            print(f"{name} FP32 {label} checksum={cs}: {'ok' if ok else 'DIFFERS'} "
                  f"(raw: {fmt.parse_header(frame).raw}, error bits {err}, library's {lib_err})", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(check_sim, __doc__))
