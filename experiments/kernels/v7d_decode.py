"""v7d: v7c (a warp a tile, scanned prefixes) with the escapes patched in registers before the
stores, their bytes loaded ahead, and the next quarter's loads issued round by round.

v7c keeps the library's escape patch: after a quarter's 16-byte stores, each escaped value is
rewritten by a 2-byte store, its sign-mantissa byte and escape byte loaded from global memory
then (two dependent loads on the warp's path a quarter, in nearly every quarter at ~1-3%
escapes), and the next quarter's loads go out all together before that patch. Here, per
quarter of a tile (1,024 values, 4 rounds of 8 values a lane):

* the quarter's first escape position (``base``: the tile's scanned prefix plus the escapes of
  its earlier quarters) is known when the quarter starts, so its first 64 escape bytes are loaded
  at once, one byte a lane twice (two coalesced loads), before anything else of the quarter;
* the escape masks and ranks come from the code-plane bytes before any value is decoded (one
  packed warp scan, as before);
* each round is decoded, its escaped values (if any lane has one) are rebuilt in registers, the
  escape byte taken from the loaded ones by a shuffle (rank - base < 64; a global load past
  that) and the sign-mantissa byte from the round's own loaded word, then the round is stored
  with one 16-byte store and no patch store follows;
* right after a round is consumed, the same round of the next quarter (the next tile's first
  after the fourth) is loaded into its registers, so about three rounds of loads are in flight
  while a round is worked on, instead of none between a quarter's last store and the next loads.

FP32 (``fp32``): the upper halves are patched the same way before the round's low halves are
merged in (``decode._store32``; the low halves of a quarter's rounds loaded at its start when
``lo_ahead`` is 4, else each right before its store). The scan kernel, the finishing kernel, the
checks and the checksum terms are v7c's / the library's; output and error bits are the library
decoder's. Check under the CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v7d_decode.py --sizes-k 9 20 33
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import v6_sim  # noqa: E402
import v7c_decode as v7c  # noqa: E402
from numba import cuda  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.kernels import _common as common  # noqa: E402
from zipccl.kernels import compat, decode  # noqa: E402
from zipccl.kernels._common import (  # noqa: E402
    ERR_COUNTS,
    ERR_ESCAPE_RANGE,
    ERR_HEADER,
    ERR_TOTAL,
    TPB,
    WS_ERR,
    WS_STATUS,
    byte_checksum,
    count_checksum,
    dev,
    exclusive_scan8,
    field8,
    popc32,
    shfl_idx_u32,
)
from zipccl.kernels.compat import ballot, load16, store16, u32, wrap64  # noqa: E402
from zipccl.kernels.layout import MAGIC_BF16, MAGIC_FP32, header_ok, lay_lo, lay_no_lo, layout_fields  # noqa: E402

U64 = np.uint64
HDR = fmt.HEADER_SIZE
HDR8 = HDR // 8
_lo32 = decode._lo32
_store32 = decode._store32


@dev
def _round_at(f8, f64, u, full, n, planes_off, stride, pwords):
    """The loaded bytes of the round of 8 values from 8u (``decode._load_round``'s tuple);
    ``full``: the round's tile is whole (one 8-byte and three 1-byte loads, no checks)."""
    if full:
        sm = f64[U64(HDR8 + u)]
        q = planes_off + u
        return (u32(sm), u32(sm >> 32), u32(f8[U64(q)]), u32(f8[U64(q + stride)]),
                u32(f8[U64(q + 2 * stride)]), u32(0xFF))
    return decode._load_round(f8, f64, u, n, planes_off, stride, pwords)


@dev
def _esc(rd):
    """The round's escape mask: values < n whose three code bits are 0."""
    return u32(u32(~u32(rd[2] | rd[3] | rd[4])) & rd[5])


@dev
def _set_half(o0, o1, o2, o3, s, hi):
    """The 4 words with value s (0..7, two a word) replaced by the 16 bits ``hi``."""
    sh = u32(16 * (s & 1))
    keep = u32(~u32(u32(0xFFFF) << sh))
    v = u32(hi << sh)
    w = s >> 1
    if w == 0:
        o0 = u32(u32(o0 & keep) | v)
    elif w == 1:
        o1 = u32(u32(o1 & keep) | v)
    elif w == 2:
        o2 = u32(u32(o2 & keep) | v)
    else:
        o3 = u32(u32(o3 & keep) | v)
    return o0, o1, o2, o3


@dev
def _patch(o0, o1, o2, o3, rd, escr, kr, base, xa, xb, f8, eo, nesc, do_cs, cs, err):
    """Rebuild the round's escaped values in its 4 words (every lane of the warp calls it): the
    escape of rank pos (``kr`` + the lane's lower escapes of the round) takes its exponent from
    escape byte pos, from the lanes' loaded bytes ``xa`` / ``xb`` (ranks base .. base + 63) by a
    shuffle, else from global memory."""
    m = escr
    while ballot(m != 0) != 0:
        rel = np.int64(0)
        pos = np.int64(0)
        low = u32(0)
        if m != 0:
            low = u32(m & u32(u32(~m) + 1))
            pos = kr + np.int64(popc32(u32(escr & u32(low - 1))))
            rel = pos - base
        va = shfl_idx_u32(xa, u32(rel & 31))
        vb = shfl_idx_u32(xb, u32(rel & 31))
        if m != 0:
            m = u32(m ^ low)
            s = popc32(u32(low - 1))
            x = u32(0)
            if pos >= 0 and pos < nesc:
                if rel < 32:
                    x = va
                elif rel < 64:
                    x = vb
                else:
                    x = u32(f8[U64(eo + pos)])
                if do_cs:
                    cs = wrap64(cs + byte_checksum(np.int64(x), eo + pos - HDR))
            else:
                err |= ERR_ESCAPE_RANGE
            smw = rd[0] if s < 4 else rd[1]
            smb = u32(u32(smw >> u32(8 * (s & 3))) & 0xFF)
            hi = u32(u32(u32(smb & 0x80) << 8) | u32(x << 7) | u32(smb & 0x7F))
            o0, o1, o2, o3 = _set_half(o0, o1, o2, o3, s, hi)
    return o0, o1, o2, o3, cs, err


def build(blocks_per_sm: int = v7c.BLOCKS, rows: int = v7c.ROWS, fp32: bool = False, lo_ahead: int = 1):
    """The v7d decoder for BF16 output or (``fp32``) FP32 output (module docstring)."""
    chunk_shift = int(rows * TPB).bit_length() - 1
    assert 1 << chunk_shift == rows * TPB and lo_ahead in (1, 4)
    magic = MAGIC_FP32 if fp32 else MAGIC_BF16
    lo_of = lay_lo if fp32 else lay_no_lo
    raw_rounds = 32 if fp32 else 16

    @dev
    def one_round(rd, u, escr, kr, base, xa, xb, lo, spread, cba, cbb, f8, f32, out32, out16, n, planes_off,
                  stride, pwords, eo, nesc, lo_off, do_cs, cs, err):
        """Decode, patch and store one round (every lane calls it); returns (checksum, errors)."""
        if do_cs:
            cs = wrap64(cs + decode._round_cs(rd, u, planes_off, stride, pwords))
        o0, o1, o2, o3, _ = decode._decode_round(rd, spread, cba, cbb)
        if ballot(escr != 0) != 0:
            o0, o1, o2, o3, cs, err = _patch(o0, o1, o2, o3, rd, escr, kr, base, xa, xb, f8, eo, nesc, do_cs,
                                             cs, err)
        vm = rd[5]
        if fp32:
            if lo_ahead == 1:
                lo = _lo32(f8, f32, u, vm, lo_off)
            cs = wrap64(cs + _store32(out32, u, vm, o0, o1, o2, o3, lo, lo_off, do_cs))
        else:
            decode._store_round(out32, out16, u, vm, o0, o1, o2, o3)
        return cs, err

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, blocks_per_sm)}))
    def decode_warps(f8, f32, f64, out32, out16, ws, aux, lay):
        """Decode tiles, a warp each, or copy a RAW frame (module docstring; v7c's start)."""
        n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
        lo_off = lo_of(lay)
        units = 2 * n if fp32 else n
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
        cuda.syncthreads()
        if hdr[0] == 0:
            return
        nesc = hdr[2]
        do_cs = hdr[3] != 0
        cs = np.int64(0)
        tile = v7c._warp_ticket(ws, lane)
        if hdr[1] != 0:  # RAW frame: v7c's copy
            while tile < n_blocks:
                g = tile * (32 * raw_rounds) + lane
                for _ in range(raw_rounds):
                    e = 8 * g
                    if e + 8 <= units:
                        v0, v1, v2, v3 = load16(f32, (HDR >> 4) + g)
                        store16(out32, g, v0, v1, v2, v3)
                        if do_cs:
                            cs = wrap64(cs + common.quad_checksum(v0, v1, v2, v3, 4 * g))
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
                tile = v7c._warp_ticket(ws, lane)
            if do_cs:
                common.flush_checksum(ws, cs, lane)
            return

        cb64 = hdr[4]
        cba = u32(cb64 << 8)
        cbb = u32(cb64 >> 24)
        err = np.int64(0)
        ra, rb, rc, rd = decode._load_tile(f8, f64, tile if tile < n_blocks else 0, 0, lane, n, planes_off,
                                           stride, pwords)
        z = u32(0)
        la = lb = lc = ld = (z, z, z, z)
        while tile < n_blocks:
            nxt = v7c._warp_ticket(ws, lane)
            craw = np.int64(f32[(counts_off >> 2) + tile])
            prefix = aux[1 + v7c.MAX_CHUNKS + (tile >> chunk_shift)] + ws[WS_STATUS + tile]
            run = np.int64(0)
            for q in range(4):
                g = tile * 512 + q * 128 + lane
                base = prefix + run
                xa = u32(0)
                xb = u32(0)
                if base + lane < nesc:
                    xa = u32(f8[U64(eo + base + lane)])
                if base + 32 + lane < nesc:
                    xb = u32(f8[U64(eo + base + 32 + lane)])
                if fp32 and lo_ahead == 4:
                    la = _lo32(f8, f32, g, ra[5], lo_off)
                    lb = _lo32(f8, f32, g + 32, rb[5], lo_off)
                    lc = _lo32(f8, f32, g + 64, rc[5], lo_off)
                    ld = _lo32(f8, f32, g + 96, rd[5], lo_off)
                esc0 = _esc(ra)
                esc1 = _esc(rb)
                esc2 = _esc(rc)
                esc3 = _esc(rd)
                cntp = u32(popc32(esc0) | u32(popc32(esc1) << 8) | u32(popc32(esc2) << 16)
                           | u32(popc32(esc3) << 24))
                ex, w0t, w1t, w2t, w3t = exclusive_scan8(cntp, lane)
                k0 = base + np.int64(field8(ex, 0))  # rank of the lane's first escape of each round
                k1 = base + np.int64(u32(w0t + field8(ex, 1)))
                k2 = base + np.int64(u32(w0t + w1t + field8(ex, 2)))
                k3 = base + np.int64(u32(w0t + w1t + w2t + field8(ex, 3)))
                nt = tile
                nq = q + 1
                if q == 3:
                    nt = nxt
                    nq = 0
                gn = nt * 512 + nq * 128 + lane
                more = nt < n_blocks
                full = (nt + 1) * fmt.BLOCK <= n
                cs, err = one_round(ra, g, esc0, k0, base, xa, xb, la, spread, cba, cbb, f8, f32, out32,
                                    out16, n, planes_off, stride, pwords, eo, nesc, lo_off, do_cs, cs, err)
                if more:
                    ra = _round_at(f8, f64, gn, full, n, planes_off, stride, pwords)
                cs, err = one_round(rb, g + 32, esc1, k1, base, xa, xb, lb, spread, cba, cbb, f8, f32, out32,
                                    out16, n, planes_off, stride, pwords, eo, nesc, lo_off, do_cs, cs, err)
                if more:
                    rb = _round_at(f8, f64, gn + 32, full, n, planes_off, stride, pwords)
                cs, err = one_round(rc, g + 64, esc2, k2, base, xa, xb, lc, spread, cba, cbb, f8, f32, out32,
                                    out16, n, planes_off, stride, pwords, eo, nesc, lo_off, do_cs, cs, err)
                if more:
                    rc = _round_at(f8, f64, gn + 64, full, n, planes_off, stride, pwords)
                cs, err = one_round(rd, g + 96, esc3, k3, base, xa, xb, ld, spread, cba, cbb, f8, f32, out32,
                                    out16, n, planes_off, stride, pwords, eo, nesc, lo_off, do_cs, cs, err)
                if more:
                    rd = _round_at(f8, f64, gn + 96, full, n, planes_off, stride, pwords)
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


decode_warps = build()
decode_warps32 = build(v7c.FP32_BLOCKS, fp32=True)


def kernels(blocks_per_sm: int = v7c.BLOCKS, fp32: bool = False, lo_ahead: int = 1):
    """v7c's handles (``v7c.kernels``) with the tile kernel a v7d build."""
    default = v7c.FP32_BLOCKS if fp32 else v7c.BLOCKS
    dec = (decode_warps32 if fp32 else decode_warps) if (blocks_per_sm, lo_ahead) == (default, 1) else \
        build(blocks_per_sm, fp32=fp32, lo_ahead=lo_ahead)
    return v7c.kernels(blocks_per_sm, fp32, dec)


def check_sim(sizes_k) -> int:
    """v7c's simulator checks (BF16 with corrupted frames, FP32) with v7d's tile kernels."""
    saved = v7c.decode_warps, v7c.decode_warps32
    v7c.decode_warps, v7c.decode_warps32 = decode_warps, decode_warps32
    try:
        return v7c.check_sim(sizes_k, "v7d")
    finally:
        v7c.decode_warps, v7c.decode_warps32 = saved


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(check_sim, __doc__))
