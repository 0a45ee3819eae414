"""v7a: the FP16 decoder on the BF16 decoder's tile structure (``zipccl/kernels/decode.py``).

The library's FP16 decoder (``decode_fp16.wide_tiles``) decodes one value per lane: every lane
reads a group's 6 plane words (broadcast loads), takes bit j of each, and stores 2 bytes. Here
a lane decodes 8 consecutive values per round, as the BF16 decoder does: in round r lane j holds
values 256r + 8j .. +7 of its warp's 1024, loads their 8 low bytes (one 8-byte load) and its
byte of each of the 6 bit planes (a warp reads 32 contiguous bytes a plane). The decoding is the
inverse of the FP16 encoder's 256-entry table (``encode._fp16_entries``: high byte -> code bits,
raw bits): the shared table spreads a plane byte's bit i to bit 4i, so

* the 3 code planes give 8 codes as nibbles, and a byte permute whose source is the codebook
  (byte 0 = 0 for the escape, bytes 1..7 the exponents) turns 4 of them into 4 exponent bytes,
  shifted by 2 into place in the high byte (an FP16 exponent is at most 31: no carry);
* the 3 raw planes (mantissa bits 8, 9 and the sign) give 8 3-bit nibbles likewise, and a byte
  permute of a constant (byte k = the high-byte bits of raw nibble k: k & 3 | (k & 4) << 5)
  turns 4 of them into the rest of 4 high bytes.

Two more permutes interleave low and high bytes into 4 FP16 values; a round leaves in one
16-byte store. Escaped values are stored with exponent 0 and rewritten once the look-back has
given the tile's first escape (their low byte and raw bits re-read, the exponent checked
against 31). Escape counts, the look-back, the next tile's loads before the escapes, the
checksum, the RAW copy and the finishing kernel (``decode_fp16.wide_finish``) are the library's.

Output and error bits are the library FP16 decoder's. Check under the CUDA simulator (the
output equals the input bit for bit, and the library decoder's, on reference frames)::

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v7a_decode16.py --sizes-k 9 20 33

On a GPU ``v7_bench.py`` checks every timed buffer set and times it. The prediction is in
NOTES.md ("Round 4").
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
from zipccl.kernels import compat, decode, decode_fp16  # noqa: E402
from zipccl.kernels import launch as launch_route  # noqa: E402
from zipccl.kernels import plan as plans  # noqa: E402
from zipccl.kernels._common import byte_checksum, popc32, prmt  # noqa: E402
from zipccl.kernels.compat import u32, wrap64  # noqa: E402
from zipccl.kernels.layout import WIDE_FIELDS, layout_fields, wide_tuple  # noqa: E402

U64 = np.uint64
HDR = fmt.HEADER_SIZE
HDR8 = HDR // 8
RAW_A = 0x03020100  # high-byte bits of raw nibbles 0..3 (bit 0: mantissa bit 8, bit 1: bit 9)
RAW_B = 0x83828180  # raw nibbles 4..7: the sign (bit 7) as well


@common.dev
def _planes3(f8, q, stride):
    """The bytes at q, q + stride, q + 2 stride (one byte of 3 consecutive planes)."""
    return u32(f8[U64(q)]), u32(f8[U64(q + stride)]), u32(f8[U64(q + 2 * stride)])


@common.dev
def _round16(f8, f64, u, n, planes_off, raw_off, stride, pwords):
    """(low bytes 0-3, 4-7, 3 code plane bytes, 3 raw plane bytes, valid mask) of the 8 values
    from 8u; bytes outside their sections read as 0 (the tail tile's path)."""
    sm0, sm1, p0, p1, p2, vm = decode._load_round(f8, f64, u, n, planes_off, stride, pwords)
    q0 = u32(0)
    q1 = q0
    q2 = q0
    if u < 4 * pwords:
        q0, q1, q2 = _planes3(f8, raw_off + u, stride)
    return sm0, sm1, p0, p1, p2, q0, q1, q2, vm


@common.dev
def _full16(f8, f64, u, planes_off, raw_off, stride):
    """``_round16`` of a round whose 8 values are all < n."""
    sm = f64[U64(HDR8 + u)]
    p0, p1, p2 = _planes3(f8, planes_off + u, stride)
    q0, q1, q2 = _planes3(f8, raw_off + u, stride)
    return u32(sm), u32(sm >> 32), p0, p1, p2, q0, q1, q2, u32(0xFF)


@common.dev
def _tile16(f8, f64, tile, warp, lane, n, planes_off, raw_off, stride, pwords):
    """The lane's bytes of a tile: its 4 rounds' ``_round16`` tuples."""
    g = tile * 512 + warp * 128 + lane
    if (tile + 1) * fmt.BLOCK <= n:
        return (_full16(f8, f64, g, planes_off, raw_off, stride),
                _full16(f8, f64, g + 32, planes_off, raw_off, stride),
                _full16(f8, f64, g + 64, planes_off, raw_off, stride),
                _full16(f8, f64, g + 96, planes_off, raw_off, stride))
    return (_round16(f8, f64, g, n, planes_off, raw_off, stride, pwords),
            _round16(f8, f64, g + 32, n, planes_off, raw_off, stride, pwords),
            _round16(f8, f64, g + 64, n, planes_off, raw_off, stride, pwords),
            _round16(f8, f64, g + 96, n, planes_off, raw_off, stride, pwords))


@common.dev
def _nibbles(spread, p0, p1, p2):
    """Bits i of the 3 plane bytes as nibble i (bits 0, 1, 2)."""
    return u32(spread[p0] + u32(spread[p1] << 1) + u32(spread[p2] << 2))


@common.dev
def _high4(cba, cbb, nib, rn):
    """4 FP16 high bytes from 4 code nibbles and 4 raw nibbles (the low 16 bits of each)."""
    return u32(u32(prmt(cba, cbb, nib) << 2) | prmt(RAW_A, RAW_B, rn))


@common.dev
def _values16(rd, spread, cba, cbb):
    """(4 output words, escape mask) of one round's bytes ``rd`` (escaped values: exponent 0)."""
    sm0, sm1, p0, p1, p2, q0, q1, q2, vm = rd
    nib = _nibbles(spread, p0, p1, p2)
    rn = _nibbles(spread, q0, q1, q2)
    h0 = _high4(cba, cbb, nib, rn)
    h1 = _high4(cba, cbb, u32(nib >> 16), u32(rn >> 16))
    return (prmt(sm0, h0, 0x5140), prmt(sm0, h0, 0x7362), prmt(sm1, h1, 0x5140), prmt(sm1, h1, 0x7362),
            u32(u32(~u32(p0 | p1 | p2)) & vm))


@common.dev
def _cs16(rd, u, planes_off, raw_off, stride, pwords):
    """Payload checksum terms of one round's low bytes below n and its 6 plane bytes (the low
    bytes past n are padding: ``decode_fp16.wide_finish`` counts those)."""
    sm0, sm1, p0, p1, p2, q0, q1, q2, vm = rd
    cs = np.int64(0)
    if vm != 0:
        keep = np.int64(-1)
        if vm != 0xFF:
            keep = (np.int64(1) << (8 * np.int64(popc32(vm)))) - 1
        i = 2 * u
        cs = wrap64(np.int64(u32(sm0 & u32(keep))) * (2 * i + 1)
                    + np.int64(u32(sm1 & u32(keep >> 32))) * (2 * i + 3))
    if u < 4 * pwords:
        q = planes_off + u - HDR
        r = raw_off + u - HDR
        cs = wrap64(cs + byte_checksum(np.int64(p0), q) + byte_checksum(np.int64(p1), q + stride)
                    + byte_checksum(np.int64(p2), q + 2 * stride) + byte_checksum(np.int64(q0), r)
                    + byte_checksum(np.int64(q1), r + stride) + byte_checksum(np.int64(q2), r + 2 * stride))
    return cs


@common.dev
def _patch(f8, out16, e, pos, nesc, eo, raw_off, stride, do_cs, cs, err):
    """Rewrite escaped value e with the exponent at escape position ``pos``; (checksum, error
    bits)."""
    if pos >= 0 and pos < nesc:
        x = np.int64(f8[U64(eo + pos)])
        if do_cs:
            cs = wrap64(cs + byte_checksum(x, eo + pos - HDR))
        if x > 31:
            err |= decode_fp16.ERR_ESCAPE_VALUE
        q = raw_off + (e >> 3)
        b = e & 7
        r8 = (np.int64(f8[U64(q)]) >> b) & 1
        r9 = (np.int64(f8[U64(q + stride)]) >> b) & 1
        r15 = (np.int64(f8[U64(q + 2 * stride)]) >> b) & 1
        out16[U64(e)] = decode_fp16._assemble(x & 0x1F, np.int64(f8[U64(HDR + e)]), r8, r9, r15)
    else:
        err |= common.ERR_ESCAPE_RANGE
    return cs, err


def build(blocks_per_sm: int = common.BLOCKS_PER_SM):
    """The v7a tile kernel (``decode.decode_tiles``' arguments; ``wide_tuple`` layout)."""
    first_tile = decode.block_start(None)

    @cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (common.TPB, blocks_per_sm)}))
    def decode_tiles16(f8, f16, f32, f64, out32, out16, ws, lay):
        n, planes_off, stride, counts_off, eo, _, pwords, n_blocks = layout_fields(lay)
        raw_off = planes_off + 3 * stride
        spread = cuda.shared.array(256, dtype=np.uint32)
        smem = cuda.shared.array(16, dtype=np.int64)
        tid = np.int64(cuda.threadIdx.x)
        lane = tid & 31
        warp = tid >> 5
        spread[tid] = decode._spread_entry(tid)
        spread[tid + common.TPB] = decode._spread_entry(tid + common.TPB)
        if not first_tile(f8, f32, f64, ws, lay, smem, tid):
            return  # the header does not fit: write nothing
        tile, epoch, nesc, do_cs = decode.block_state(smem)
        cs = np.int64(0)
        err = np.int64(0)
        if smem[3] != 0:  # RAW frame: the library's copy
            while tile < n_blocks:
                cs = wrap64(cs + decode_fp16._copy_raw(f16, out16, n, tile, tid, do_cs))
                tile = common.block_ticket(ws, smem, tid)
        cba = u32(smem[6] << 8)  # byte 0: exponent 0 for the escape code, bytes 1-3: entries 0-2
        cbb = u32(smem[6] >> 24)  # entries 3-6
        ra, rb, rc, rd = _tile16(f8, f64, tile if tile < n_blocks else 0, warp, lane, n, planes_off, raw_off,
                                 stride, pwords)
        while smem[3] == 0 and tile < n_blocks:
            g = tile * 512 + warp * 128 + lane
            a0, a1, a2, a3, esc0 = _values16(ra, spread, cba, cbb)
            b0, b1, b2, b3, esc1 = _values16(rb, spread, cba, cbb)
            c0, c1, c2, c3, esc2 = _values16(rc, spread, cba, cbb)
            d0, d1, d2, d3, esc3 = _values16(rd, spread, cba, cbb)
            decode._store_round(out32, out16, g, ra[8], a0, a1, a2, a3)  # a 16-byte store when full
            decode._store_round(out32, out16, g + 32, rb[8], b0, b1, b2, b3)
            decode._store_round(out32, out16, g + 64, rc[8], c0, c1, c2, c3)
            decode._store_round(out32, out16, g + 96, rd[8], d0, d1, d2, d3)
            if do_cs:
                cs = wrap64(cs + _cs16(ra, g, planes_off, raw_off, stride, pwords)
                            + _cs16(rb, g + 32, planes_off, raw_off, stride, pwords)
                            + _cs16(rc, g + 64, planes_off, raw_off, stride, pwords)
                            + _cs16(rd, g + 96, planes_off, raw_off, stride, pwords))
            escm = u32(esc0 | u32(esc1 << 8) | u32(esc2 << 16) | u32(esc3 << 24))
            cntp = u32(popc32(esc0) | u32(popc32(esc1) << 8) | u32(popc32(esc2) << 16)
                       | u32(popc32(esc3) << 24))
            ex, w0t, w1t, w2t, w3t = common.exclusive_scan8(cntp, lane)
            woff, btot = common.block_escapes(smem, 9, warp, lane, w0t, w1t, w2t, w3t)  # A
            if warp == 0:
                err, cs = common.decoder_resolve(f32, ws, smem, 13, tile, epoch, lane, btot, smem[7], smem[8],
                                                 nesc, n, n_blocks, counts_off, do_cs, cs, err, False)
            cuda.syncthreads()  # B: this tile's prefix; the next tile's ticket and count
            prefix = smem[13]
            nxt = smem[0]
            if nxt < n_blocks:  # the next tile's loads go out before this tile's escapes
                ra, rb, rc, rd = _tile16(f8, f64, nxt, warp, lane, n, planes_off, raw_off, stride, pwords)
            if escm != 0:
                k0, k1, k2, k3 = common.escape_bases(ex, w0t, w1t, w2t, escm, prefix + woff)
                m = escm
                while m != 0:
                    m, low, bit = common.next_escape(m)  # bit 8r + s: value s of round r
                    r = u32(bit >> 3)
                    e = 8 * g + np.int64(u32(u32(r << 8) + u32(bit & 7)))
                    pos = common.escape_rank(k0, k1, k2, k3, r, escm, low)
                    cs, err = _patch(f8, out16, e, pos, nesc, eo, raw_off, stride, do_cs, cs, err)
            tile = nxt
        if err != 0:
            cuda.atomic.or_(ws, common.WS_ERR, err)
        if do_cs:
            common.flush_checksum(ws, cs, lane)

    return decode_tiles16


BLOCKS = common.BLOCKS_PER_SM
decode_tiles16 = build(BLOCKS)


def launch(f8, f16, f32, f64, out32, out16, ws, lay, crc_zero, crc_tab, stream, kernel=None,
           blocks_per_sm: int = BLOCKS):
    """v7a decode of an FP16 frame: ``decode_fp16.launch``'s arguments, but ``out32`` is the
    first n & ~7 output values as uint32 (the library's FP16 route passes it empty)."""
    lt = wide_tuple(lay)
    if lay.n_blocks:
        (kernel or decode_tiles16)[common.grid_size(lay.n_blocks, blocks_per_sm), common.TPB, stream](
            f8, f16, f32, f64, out32, out16, ws, lt)
    decode_fp16.wide_finish[1, common.TPB, stream](f8, f64, ws, lt, crc_zero, crc_tab)


def kernel(blocks_per_sm: int = BLOCKS):
    """The lean route's handle (``launch.Kernel``) of a v7a build, for ``plan``."""
    dec = decode_tiles16 if blocks_per_sm == BLOCKS else build(blocks_per_sm)
    a = launch_route.array
    return launch_route.Kernel(dec, (a(np.uint8), a(np.uint16), a(np.uint32), a(np.int64), a(np.uint32),
                                     a(np.uint16), a(np.int64), launch_route.int_tuple(WIDE_FIELDS)))


def plan(tiles, blocks_per_sm: int, device: int, f_ptr: int, f_nbytes: int, out_ptr: int, lay, ws_ptr: int,
         ws_count: int, crc_zero: int, crc_ptr: int, crc_count: int):
    """``decode_fp16.Plan`` (its arguments after ``tiles``, the ``kernel`` handle) with the tile
    step replaced by v7a's: the lean route, so that eager timings compare with the library's."""
    p = decode_fp16.Plan(device, f_ptr, f_nbytes, out_ptr, lay, ws_ptr, ws_count, crc_zero, crc_ptr,
                         crc_count)
    if lay.n_blocks:
        n = lay.n
        frame = ((f_ptr, f_nbytes), (f_ptr, f_nbytes // 2), (f_ptr, f_nbytes // 4), (f_ptr, f_nbytes // 8))
        args = (*frame, (out_ptr, (n & ~7) // 2), (out_ptr, n), (ws_ptr, ws_count), wide_tuple(lay))
        step = plans.Step(tiles, device, common.grid_size(lay.n_blocks, blocks_per_sm), args, (0, 1, 2, 3),
                          (4, 5))
        p.steps = (step, *p.steps[1:])
    return p


def decode_frame(launcher, frame, n: int, ws, stream=0, out=None):
    """Decode the FP16 ``frame`` (uint8, host under the simulator or device) of n values with
    ``launcher`` (``launch``'s arguments) into ``out`` (uint16; or a new one); returns it."""
    from zipccl.codec import gpu
    from zipccl.kernels import runtime

    if out is None:
        out = np.zeros(n, np.uint16)
    nb = int(frame.size)
    v = runtime.view
    lay = fmt.Layout.for_count(n, fmt.DTYPE_FP16)
    launcher(v(frame, nb, np.uint8), v(frame, nb // 2, np.uint16), v(frame, nb // 4, np.uint32),
             v(frame, nb // 8, np.int64), v(out, (n & ~7) // 2, np.uint32), v(out, n, np.uint16), ws.array,
             lay, gpu._kernels()[0].CRC_ZERO, runtime.crc_table(), stream)
    return out


def sim_inputs(sizes_k, seed=5):
    """``v6_sim.float_inputs`` of FP16 (an escape-heavy set: every sixth value random bits, ~15%
    escapes, still a coded frame but at the smallest sizes)."""
    edge = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF, 0x0001, 0x83FF, 0x7BFF, 0x0400]
    return v6_sim.float_inputs(sizes_k, np.float16, edge, 6, seed)


def check_sim(sizes_k) -> int:
    """Simulator check: v7a decodes reference FP16 frames (with and without a checksum) to the
    input bit for bit, as the library's decoder does, with no error bits; and a frame with a bad
    escape byte, a wrong escape count or a flipped payload bit gets the library's error bits."""
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, reference

    cb = Codebook.from_sigma(0.02, dtype="float16")
    bad = 0

    def both(frame, n):
        out = []
        for name in ("library", "v7a"):
            ws = gpu.Workspace(max(n, 1))
            if name == "library":
                got = np.zeros(n, np.uint16)
                gpu.decode_into(frame, got.view(np.float16), workspace=ws)
            else:
                got = decode_frame(launch, frame, n, ws)
            out.append((got, ws.last_error()))
        return out

    for label, x in sim_inputs(sizes_k):
        for cs in (False, True):
            frame = reference.encode(x, cb, None, cs, dtype="float16")
            (lib, lib_err), (got, err) = both(frame, x.size)
            ok = err == 0 and lib_err == 0 and np.array_equal(got, x) and np.array_equal(lib, x)
            bad += not ok
            print(f"v7a {label} checksum={cs}: {'ok' if ok else 'DIFFERS'} "
                  f"(raw: {fmt.parse_header(frame).raw}, error bits {err}, library's {lib_err})", flush=True)
    x = next(iter(sim_inputs(sizes_k[:1])))[1]
    frame = reference.encode(x, cb, None, True, dtype="float16")
    h = fmt.parse_header(frame)
    lay = fmt.Layout.for_count(x.size, fmt.DTYPE_FP16)
    for label, at, value in (("escape byte > 31", lay.escapes_offset, 40),
                             ("escape count", lay.counts_offset, 1 + int(frame[lay.counts_offset])),
                             ("payload bit", HDR + 7, 1 ^ int(frame[HDR + 7]))):
        if label != "payload bit" and h.n_escapes == 0:
            continue
        f = frame.copy()
        f[at] = value
        (lib, lib_err), (got, err) = both(f, x.size)
        ok = err == lib_err and err != 0
        bad += not ok
        print(f"v7a corrupted ({label}): error bits {err}, library's {lib_err}: {'ok' if ok else 'DIFFERS'}",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(check_sim, __doc__))
