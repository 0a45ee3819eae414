"""GPU encoder for FP16 frames, and the launch plan of FP32 and FP16 frames; byte-identical
to ``codec.reference.encode``.

FP32 frames are coded by the BF16 tile kernel's FP32 build (``encode.encode_tiles32``: an
FP32 frame is the BF16 frame of the upper halves plus the low halves); ``Plan`` and
``launch`` here pick it. FP16 takes two launches, no host synchronisation:

1. ``wide_tiles``: a persistent grid whose blocks take tiles (one escape block of
   4096 values) from the workspace ticket counter. A warp codes 1024 consecutive
   values as 32 groups of 32; in a group lane j holds value 32g + j (one coalesced
   2-byte load per lane; the loads of 4 groups are issued together). The code comes
   from a 256-entry shared table (code = 1 + codebook index, 0 = escape), and each
   bit-plane word is one warp vote (``ballot``): bit j is lane j's bit, which is
   exactly the format's plane word. Lane k stores plane k's word, so one store
   instruction writes the 6 words of a group (3 code planes, 3 raw-bit planes). Lane j
   stores value j's low byte. The group's escape vote goes to shared memory; once the
   tile's escape count is known it is published for the decoupled look-back
   (``_common.lookback``), and the lanes of escaped values write their exponent bytes
   at the tile's prefix + their rank (a population count of the votes below them),
   re-reading their value (still cached). Block 0 also zeroes the padding between
   sections. Payload checksum terms go to the workspace's 8 checksum slots.
2. ``encode.encode_finish``, the BF16 encoder's second kernel: RAW decision (the same
   ``Layout.is_raw`` rule on the escape total of the last tile's inclusive status
   word), RAW copy, header with its CRC, counters and epoch. It is given
   ``layout.finish_tuple``, in which the value count is counted in 2-byte units (an
   FP32 RAW frame copies 4n bytes; for FP32 that tuple also moves the padding run it
   zeroes to the one after the low halves).

All offsets come from ``zipccl.format.Layout`` (``layout.wide_tuple``).

Speed (an H200, ``experiments/bench_dtypes.py gpu``, ``results/dtypes_gpu.jsonl``): FP16
168 GB/s of input at 256 MiB (decode 135). One value per lane with 64-bit arithmetic
costs some 400 instructions per group of 32 values: bound by instructions, not memory.
FP32 left this path for the BF16 kernels and went from 328 to 1,380 GB/s
(experiments/kernels/NOTES.md); FP16's layout (bit planes for its 3 raw bits) would need
its own 8-values-per-lane kernel.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from . import (
    compat,  # noqa: F401  (numpy fix before numba.cuda compiles anything)
    encode,
)
from . import launch as launch_route
from . import plan as plans
from ._common import (
    BLOCKS_PER_SM,
    TPB,
    block_escapes,
    dev,
    encoder_resolve,
    first_ticket,
    flush_checksum,
    grid_size,
    pick4,
    zero_padding,
)
from .compat import ballot, popc, wrap64
from .layout import (
    FP32,
    LAY_N,
    LAY_NPLANES,
    LAY_PWORDS,
    WIDE_FIELDS,
    finish_tuple,
    layout_fields,
    wide_tuple,
)

HDR = fmt.HEADER_SIZE


@dev
def vote(pred):
    """``ballot`` as an unsigned 32-bit mask: the vote intrinsic returns an int32, whose
    widening would copy lane 31's bit into bits 32..63 (a plane word's checksum term and
    popcounts would then be wrong; the simulator's ballot is never negative)."""
    return ballot(pred) & 0xFFFFFFFF


@dev
def value_parts(v):
    """(exponent, byte-plane byte) of one FP16 value."""
    return (v >> 10) & 0x1F, v & 0xFF


@dev
def bcs(byte, q):
    """``_common.byte_checksum``, inlined (it sits in the per-value path)."""
    return wrap64((byte << (8 * (q & 3))) * (2 * (q >> 2) + 1))


@dev
def _load(x16, e, n):
    """Value e (0 past the end) as an int64."""
    v = np.int64(0)
    if e < n:
        v = np.int64(x16[e])
    return v


@dev
def _group(v, e, word, lane, lut, out8, out32, lay, plane_at, do_cs, cs):
    """Code lane's value v (element e) of one group of 32 and store its share of the
    group's sections; returns (checksum, the group's escape vote)."""
    valid = e < lay[LAY_N]
    ex, byte = value_parts(v)
    code = lut[ex] if valid else 0
    p0 = vote((code & 1) != 0)
    p1 = vote((code & 2) != 0)
    p2 = vote((code & 4) != 0)
    esc = vote(valid and code == 0)
    p3 = vote(valid and ((v >> 8) & 1) != 0)
    p4 = vote(valid and ((v >> 9) & 1) != 0)
    p5 = vote(valid and ((v >> 15) & 1) != 0)
    if word < lay[LAY_PWORDS] and lane < lay[LAY_NPLANES]:
        w = pick4(lane, p0, p1, p2, p3)  # lane k stores plane k
        if lane == 4:
            w = p4
        elif lane == 5:
            w = p5
        out32[(plane_at >> 2) + word] = w
        if do_cs:
            cs = wrap64(cs + w * (2 * (((plane_at - HDR) >> 2) + word) + 1))
    if valid:
        out8[HDR + e] = byte
        if do_cs:
            cs = wrap64(cs + bcs(byte, e))
    return cs, esc


@dev
def store_votes(votes, at, lane, s0, s1, s2, s3):
    """Lane 0: 4 consecutive groups' escape votes into votes[at..at + 3]; their escapes."""
    if lane == 0:
        votes[at] = s0
        votes[at + 1] = s1
        votes[at + 2] = s2
        votes[at + 3] = s3
    return popc(s0) + popc(s1) + popc(s2) + popc(s3)


@cuda.jit(**({} if compat.SIMULATOR else {"launch_bounds": (TPB, BLOCKS_PER_SM)}))
def wide_tiles(x16, out8, out32, ws, lay, cb64, do_cs):
    """Code tiles taken from the ticket counter until none is left (module docstring)."""
    n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks = layout_fields(lay)
    lut = cuda.shared.array(256, dtype=np.int32)
    votes = cuda.shared.array(128, dtype=np.int64)  # escape vote of each group of the tile
    smem = cuda.shared.array(8, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    below = (np.int64(1) << lane) - 1
    for e in (tid, tid + TPB):
        c = 0
        for i in range(7):
            if ((cb64 >> (8 * i)) & 0xFF) == e:
                c = i + 1
        lut[e] = c
    first_ticket(ws, smem, tid)
    if cuda.blockIdx.x == 0:
        zero_padding(out8, HDR + n, planes_off, stride, pwords, lay[LAY_NPLANES], counts_off + 4 * n_blocks,
                     eo, tid)
    cuda.syncthreads()
    tile = smem[0]
    epoch = smem[1]
    cs = np.int64(0)
    plane_at = planes_off + lane * stride  # lane k < n_planes stores plane k
    while tile < n_blocks:
        wbase = tile * fmt.BLOCK + warp * 1024
        cnt = np.int64(0)
        for q0 in range(0, 32, 4):  # the loads of 4 groups go out together
            e0 = wbase + 32 * q0 + lane
            w0 = tile * 128 + warp * 32 + q0
            v0 = _load(x16, e0, n)
            v1 = _load(x16, e0 + 32, n)
            v2 = _load(x16, e0 + 64, n)
            v3 = _load(x16, e0 + 96, n)
            cs, s0 = _group(v0, e0, w0, lane, lut, out8, out32, lay, plane_at, do_cs, cs)
            cs, s1 = _group(v1, e0 + 32, w0 + 1, lane, lut, out8, out32, lay, plane_at, do_cs, cs)
            cs, s2 = _group(v2, e0 + 64, w0 + 2, lane, lut, out8, out32, lay, plane_at, do_cs, cs)
            cs, s3 = _group(v3, e0 + 96, w0 + 3, lane, lut, out8, out32, lay, plane_at, do_cs, cs)
            cnt += store_votes(votes, warp * 32 + q0, lane, s0, s1, s2, s3)
        woff, btot = block_escapes(smem, 2, warp, lane, cnt, 0, 0, 0)  # A: warp totals (and the votes)
        if warp == 0:
            cs = encoder_resolve(ws, out32, smem, 6, tile, epoch, lane, btot, counts_off, do_cs, cs)
        cuda.syncthreads()  # B: this tile's prefix, the next ticket
        if btot != 0:
            run = smem[6] + woff
            for q in range(32):
                esc = votes[warp * 32 + q]
                if (esc >> lane) & 1:
                    pos = eo + run + popc(esc & below)
                    if pos < raw_size:  # past it the frame is RAW and encode_finish rewrites it
                        e = wbase + 32 * q + lane
                        ex, _ = value_parts(np.int64(x16[e]))
                        out8[pos] = ex
                        if do_cs:
                            cs = wrap64(cs + bcs(ex, pos - HDR))
                run += popc(esc)
        tile = smem[0]
        cuda.syncthreads()  # C: smem and votes are reused by the next tile
    if do_cs:
        flush_checksum(ws, cs, lane)


def finish_blocks(lay: fmt.Layout) -> int:
    units = finish_tuple(lay)[0]
    return max(1, min(encode.FINISH_MAX_BLOCKS, (units + 8 * TPB - 1) // (8 * TPB)))


def force_raw(lay: fmt.Layout) -> int:
    return 1 if lay.static_size > lay.raw_size else 0


def launch(x32, x16, xu32, xu16, out8, out32, out64, ws, lay: fmt.Layout, hdr, crc_base: int,
           crc_tab, cb64: int, checksum: bool, stream, fp16_tiles=None) -> None:
    """Enqueue the encoder through Numba's dispatcher (the simulator's route).

    ``x32`` / ``x16``: the n values as uint32 (FP32) / uint16 (FP16), the other one
    empty; ``xu32`` / ``xu16``: the same bytes as uint32 / uint16 (``finish_tuple``'s
    units: the RAW copy, and FP32's tail); ``out*``: the frame buffer as uint8 / 32 / int64.
    ``fp16_tiles``: an FP16 tile kernel of ``encode.encode_tiles``' arguments instead of
    ``wide_tiles`` (``encode._tiles_kernel(FP16)``, compared in experiments/kernels/).
    """
    do_cs = 1 if checksum else 0
    raw = force_raw(lay)
    tiles = 0
    if lay.n_blocks and not raw:
        if lay.dtype == FP32:
            encode.encode_tiles32[grid_size(lay.n_blocks), TPB, stream](x32, xu16, out8, out32, out64, ws,
                                                                        wide_tuple(lay), cb64, do_cs)
        elif fp16_tiles is not None:
            fp16_tiles[grid_size(lay.n_blocks), TPB, stream](xu32, x16, out8, out32, out64, ws,
                                                             wide_tuple(lay), cb64, do_cs)
        else:
            wide_tiles[grid_size(lay.n_blocks), TPB, stream](x16, out8, out32, ws, wide_tuple(lay), cb64,
                                                             do_cs)
        tiles = lay.n_blocks
    encode.encode_finish[finish_blocks(lay), TPB, stream](xu32, xu16, out8, out32, out64, ws,
                                                          finish_tuple(lay), hdr, crc_base, crc_tab,
                                                          raw, do_cs, tiles, 1 if cb64 < 0 else 0)


# -- the lean route (see launch.py) --
_A = launch_route.array
TILES = launch_route.Kernel(wide_tiles, (_A(np.uint16), _A(np.uint8), _A(np.uint32), _A(np.int64),
                                         launch_route.int_tuple(WIDE_FIELDS), launch_route.I64,
                                         launch_route.I64))


class Plan(plans.Plan):
    """The launches of one FP32 / FP16 encode with everything but the stream fixed (as
    ``encode.Plan``): ``encode.encode_tiles32`` (FP32) or ``wide_tiles`` (FP16), then
    ``encode.encode_finish``."""

    __slots__ = ()

    def __init__(self, device: int, x_ptr: int, out_ptr: int, out_nbytes: int, ws_ptr: int,
                 ws_count: int, lay: fmt.Layout, hdr: tuple[int, ...], crc_base: int, crc_ptr: int,
                 crc_count: int, cb64: int, checksum: bool):
        n = lay.n
        units = n * fmt.ITEMSIZE[lay.dtype] // 2
        do_cs = 1 if checksum else 0
        raw = force_raw(lay)
        out = ((out_ptr, out_nbytes), (out_ptr, out_nbytes // 4), (out_ptr, out_nbytes // 8))
        ws = (ws_ptr, ws_count)
        steps = []
        tiles = 0
        if lay.n_blocks and not raw:
            grid = grid_size(lay.n_blocks)
            if lay.dtype == FP32:  # the BF16 tile kernel's FP32 build (encode.py)
                steps.append(plans.Step(encode.TILES32, device, grid, ((x_ptr, n), (x_ptr, 2 * n), *out, ws,
                                                                       wide_tuple(lay), cb64, do_cs),
                                        (0, 1), (2, 3, 4)))
            else:
                steps.append(plans.Step(TILES, device, grid, ((x_ptr, n), *out[:2], ws, wide_tuple(lay), cb64,
                                                              do_cs), (0,), (1, 2)))
            tiles = lay.n_blocks
        steps.append(plans.Step(encode.FINISH, device, finish_blocks(lay), (
            (x_ptr, (units & ~7) // 2), (x_ptr, units), *out, ws, finish_tuple(lay), hdr, crc_base,
            (crc_ptr, crc_count), raw, do_cs, tiles, 1 if cb64 < 0 else 0), (0, 1), (2, 3, 4)))
        super().__init__(device, tuple(steps))
