"""Pieces shared by the encode and decode kernels: workspace slots, warp
reductions, the decoupled look-back scan over escape blocks, the header CRC, the
32-bit helpers of the per-value code (byte permute, shuffles, population count)
and the persistent grid size.

Why a look-back scan: the escapes of block b start at the sum of the escape
counts of blocks 0..b-1. Each tile (one escape block, ``format.BLOCK``
= 4096 elements) publishes its count once it is known; the CUDA block coding it
then reads its predecessors' published values (a count, or an inclusive prefix
that ends the walk) and so learns its exclusive prefix without a second pass
over the data. Positions are sums of counts, so the output is the same on every
run; the only atomic that orders anything is the ticket counter that hands out
tiles to the (persistent) CUDA blocks in increasing order (so a block only ever
waits for tiles that running blocks hold), and it decides which CUDA block codes
which tile, never where a byte goes.

Persistent grid: the tile kernels launch ``grid_size`` blocks (a few per
multiprocessor, all resident) that loop over tickets, so per-block set-up (code
tables) is paid once per block, not once per tile.

The workspace is an int64 device array: WS_SLOTS counters, then one status word
per escape block. Status word = epoch << 34 | flag << 32 | value; a word whose
epoch is not the current one counts as "not ready", so the status array never
needs clearing between calls. The finishing kernel of every call resets the
counters and advances the epoch, so a call leaves the workspace ready for the
next one on the same stream (and a captured CUDA graph can replay calls).
"""

from __future__ import annotations

import zlib

import numpy as np
from numba import cuda  # noqa: I001

from .. import format as fmt
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from .compat import atomic_read, ballot, shfl, shfl_up, shfl_xor, wrap64

TPB = 128  # threads per CUDA block: 4 warps
WARPS = TPB // 32
ROUNDS = 4  # per warp: 4 rounds of 32 lanes x 8 elements = 1024 elements
assert fmt.BLOCK == WARPS * ROUNDS * 256, "one CUDA block codes exactly one escape block"

# workspace slots (int64 each)
WS_TICKET = 0  # next tile number for the main kernel
WS_DONE = 1  # finished blocks of a multi-block finishing kernel
WS_EPOCH = 2  # current epoch of the status words
WS_ERR = 3  # decode: error bits of the call in flight
WS_ERR_LAST = 4  # decode: error bits of the last finished call
WS_ERR_STICKY = 5  # decode: OR of the error bits of every call since the host cleared it
WS_NESC = 6  # encode: n_escapes of the last frame (0 for RAW)
WS_FLEN = 7  # encode: frame_len of the last frame
WS_CSUM = 8  # 8 slots: partial payload checksums (spread to avoid one hot address)
WS_CSUM_RAW = 16  # 8 slots: partial checksums of a RAW payload (encode)
WS_CODEBOOK = 24  # encode: the 7 codebook exponents as little-endian bytes, when chosen on the device
WS_SLOTS = 32
WS_STATUS = WS_SLOTS

# The kernels take the frame layout as one tuple argument (``encode.layout_tuple``); its fields
# by name (Numba folds these constants, so ``lay[LAY_N]`` is the same code as ``lay[0]``)
LAY_N = 0  # number of values
LAY_SM = 1  # sign-mantissa section offset
LAY_PLANES = 2  # first code plane's offset
LAY_STRIDE = 3  # bytes from one plane to the next
LAY_COUNTS = 4  # escape counts' offset
LAY_ESCAPES = 5  # escape section's offset
LAY_RAW = 6  # size of the RAW frame
LAY_PWORDS = 7  # uint32 words in one code plane
LAY_NBLOCKS = 8  # escape blocks (tiles)
LAY_FIELDS = 9

STATUS_AGG = 1
STATUS_INC = 2
EPOCH_LIMIT = 1 << 29
LOW32 = 0xFFFFFFFF

# decode error bits
ERR_HEADER = 1  # magic / version / dtype / flags / n / lengths do not fit
ERR_HEADER_CRC = 2
ERR_COUNTS = 4  # a block's escape count disagrees with its code planes (or is impossible)
ERR_TOTAL = 8  # the escape counts do not add up to the header's n_escapes
ERR_CHECKSUM = 16  # payload checksum mismatch
ERR_ESCAPE_RANGE = 32  # an escape position fell outside the escape section

ERROR_TEXT = {
    ERR_HEADER: "bad header fields (magic, version, dtype, flags, element count or lengths)",
    ERR_HEADER_CRC: "header checksum mismatch",
    ERR_COUNTS: "a block's escape count disagrees with its code planes",
    ERR_TOTAL: "escape counts do not add up to the header's",
    ERR_CHECKSUM: "payload checksum mismatch",
    ERR_ESCAPE_RANGE: "an escape position falls outside the escape section",
}

_CRC_BITS = 8 * (fmt.HEADER_SIZE - 4)  # the CRC covers header bytes 0..123


def _crc_tables() -> tuple[np.ndarray, int]:
    """CRC-32 is affine over GF(2): crc(a ^ b) = crc(a) ^ crc(b) ^ crc(0) for equal lengths.

    So crc(h) = crc(0) ^ XOR over the set bits i of h of T[i], T[i] = crc(e_i) ^ crc(0),
    with e_i the 124-byte message with only bit i set. A warp evaluates that sum in
    parallel; the encoder uses it on the few header bits it fills in on the device.
    """
    zero = bytes(fmt.HEADER_SIZE - 4)
    c0 = zlib.crc32(zero)
    tab = np.zeros(_CRC_BITS, dtype=np.int64)
    for i in range(_CRC_BITS):
        msg = bytearray(zero)
        msg[i >> 3] = 1 << (i & 7)
        tab[i] = zlib.crc32(bytes(msg)) ^ c0
    return tab, c0


CRC_TABLE, CRC_ZERO = _crc_tables()


@cuda.jit(device=True)
def warp_sum(v):
    """Sum (mod 2**64) of v over the warp, in every lane."""
    v = wrap64(v + shfl_xor(v, 16))
    v = wrap64(v + shfl_xor(v, 8))
    v = wrap64(v + shfl_xor(v, 4))
    v = wrap64(v + shfl_xor(v, 2))
    v = wrap64(v + shfl_xor(v, 1))
    return v


@cuda.jit(device=True)
def warp_xor(v):
    """XOR of v over the warp, in every lane."""
    v = v ^ shfl_xor(v, 16)
    v = v ^ shfl_xor(v, 8)
    v = v ^ shfl_xor(v, 4)
    v = v ^ shfl_xor(v, 2)
    v = v ^ shfl_xor(v, 1)
    return v


@cuda.jit(device=True)
def publish(ws, tile, epoch, flag, value):
    """Make tile's count (flag AGG) or inclusive prefix (flag INC) visible to later tiles."""
    cuda.atomic.exch(ws, WS_STATUS + tile, (epoch << 34) | (flag << 32) | (value & LOW32))


@cuda.jit(device=True)
def lookback(ws, tile, epoch, lane):
    """Exclusive prefix of tile's escape count: sum of the values of tiles 0..tile-1.

    Warp-wide: all 32 lanes call it together. Lane j inspects tile pos - j; the
    walk stops at the nearest predecessor that published an inclusive prefix
    (tile -1 counts as an inclusive 0) once every tile in between has published.
    """
    excl = np.int64(0)
    pos = tile - 1
    while True:
        idx = pos - lane
        flag = np.int64(STATUS_INC)
        val = np.int64(0)
        if idx >= 0:
            s = atomic_read(ws, WS_STATUS + idx)
            flag = (s >> 32) & 3
            if (s >> 34) != epoch:
                flag = 0
            val = s & LOW32
        notready = ballot(flag == 0)
        incl = ballot(flag == STATUS_INC)
        if incl != 0:
            need = incl ^ (incl - 1)  # lanes 0 .. first inclusive lane
            if (notready & need) == 0:
                if ((need >> lane) & 1) == 0:
                    val = 0
                return excl + warp_sum(val)
        elif notready == 0:
            excl += warp_sum(val)
            pos -= 32


@cuda.jit(device=True)
def byte_checksum(byte, q):
    """Contribution of the payload byte at payload offset q to format.payload_checksum."""
    return wrap64((byte << (8 * (q & 3))) * (2 * (q >> 2) + 1))


@cuda.jit(device=True)
def advance_epoch(ws, tid):
    """Last step of every call (one block): next epoch; clear all status words on wrap."""
    e = ws[WS_EPOCH] + 1
    if e >= EPOCH_LIMIT:
        i = WS_STATUS + tid
        while i < ws.shape[0]:
            ws[i] = 0
            i += TPB
        e = 0
    cuda.syncthreads()
    if tid == 0:
        ws[WS_EPOCH] = e


# ---------------------------------------------------------------- 32-bit per-value helpers
# prmt(a, b, s): byte permute (PTX prmt.b32). Result byte k is byte (s >> 4k) & 7 of the
# 8-byte value b << 32 | a; only selector nibbles with bit 3 clear are used (PTX's
# sign-replicate mode is not modelled by the simulator). shfl_up_u32 / shfl_idx_u32:
# warp shuffles of a uint32 (one SHFL). popc32: population count of a uint32, as uint32.
# ``dev``: device-function decorator; on a GPU it forces inlining so that the round
# functions are specialised for full tiles and for the tail tile.

BLOCKS_PER_SM = 8  # persistent blocks per multiprocessor (launch bounds: <= 64 registers)

if compat.SIMULATOR:
    dev = cuda.jit(device=True)

    def prmt(a, b, s):
        """Byte permute of (b:a) by selector s (nibbles 0..7)."""
        src = (int(b) & LOW32) << 32 | (int(a) & LOW32)
        s = int(s)
        r = 0
        for k in range(4):
            r |= ((src >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k)
        return np.uint32(r)

    def shfl_up_u32(v, d):
        return np.uint32(int(shfl_up(int(v) & LOW32, d)))

    def shfl_idx_u32(v, src):
        return np.uint32(int(shfl(int(v) & LOW32, src)))

    def popc32(x):
        return np.uint32(bin(int(x) & LOW32).count("1"))

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    dev = cuda.jit(device=True, forceinline=True)

    @intrinsic
    def _prmt(typingctx, a, b, s):
        # inline PTX rather than libdevice's __nv_byte_perm, which masks a run-time
        # selector with 0x7777 first (one more instruction per permute)
        sig = types.uint32(types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32, i32, i32]), "prmt.b32 $0, $1, $2, $3;",
                               "=r,r,r,r")
            return builder.call(asm, list(args))

        return sig, codegen

    @cuda.jit(device=True, forceinline=True)
    def prmt(a, b, s):
        return _prmt(np.uint32(a), np.uint32(b), np.uint32(s))

    @cuda.jit(device=True, forceinline=True)
    def shfl_up_u32(v, d):
        return np.uint32(cuda.shfl_up_sync(compat.FULL_MASK, np.int32(v), d))

    @cuda.jit(device=True, forceinline=True)
    def shfl_idx_u32(v, src):
        return np.uint32(cuda.shfl_sync(compat.FULL_MASK, np.int32(v), src))

    @cuda.jit(device=True, forceinline=True)
    def popc32(x):
        return np.uint32(cuda.popc(np.uint32(x)))


@dev
def layout_fields(lay):
    """(n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks): the fields of the
    layout tuple the kernels read, by name (``encode.layout_tuple``; ``LAY_*`` give the order)."""
    return (lay[LAY_N], lay[LAY_PLANES], lay[LAY_STRIDE], lay[LAY_COUNTS], lay[LAY_ESCAPES],
            lay[LAY_RAW], lay[LAY_PWORDS], lay[LAY_NBLOCKS])


@dev
def lay_lo(lay):
    """The FP32 low halves' offset: ``encode.wide_tuple``'s field after ``layout_tuple``'s."""
    return lay[LAY_FIELDS]


@dev
def lay_no_lo(lay):
    """``lay_lo`` of a BF16 kernel (no low halves)."""
    return np.int64(0)


@dev
def quad_checksum(w0, w1, w2, w3, i):
    """Payload checksum terms of 4 consecutive uint32 words, the first payload word i."""
    return wrap64(np.int64(w0) * (2 * i + 1) + np.int64(w1) * (2 * i + 3)
                  + np.int64(w2) * (2 * i + 5) + np.int64(w3) * (2 * i + 7))


@dev
def field8(x, r):
    """Byte r of the uint32 x."""
    return np.uint32((x >> (8 * r)) & 0xFF)


@dev
def exclusive_scan8(cnt, lane):
    """Exclusive warp scan of 4 counts packed in 8-bit fields (each count <= 8).

    Returns (exclusive prefix over lower lanes, packed; this warp's 4 totals). An
    exclusive prefix is at most 31 * 8 = 248, so no field carries into the next; the
    totals (up to 256) are added field by field from lane 31's prefix and count.
    """
    ex = shfl_up_u32(cnt, 1)
    if lane == 0:
        ex = np.uint32(0)
    y = shfl_up_u32(ex, 1)
    if lane >= 1:
        ex = np.uint32(ex + y)
    y = shfl_up_u32(ex, 2)
    if lane >= 2:
        ex = np.uint32(ex + y)
    y = shfl_up_u32(ex, 4)
    if lane >= 4:
        ex = np.uint32(ex + y)
    y = shfl_up_u32(ex, 8)
    if lane >= 8:
        ex = np.uint32(ex + y)
    y = shfl_up_u32(ex, 16)
    if lane >= 16:
        ex = np.uint32(ex + y)
    tex = shfl_idx_u32(ex, 31)
    tcn = shfl_idx_u32(cnt, 31)
    return (ex, np.uint32(field8(tex, 0) + field8(tcn, 0)), np.uint32(field8(tex, 1) + field8(tcn, 1)),
            np.uint32(field8(tex, 2) + field8(tcn, 2)), np.uint32(field8(tex, 3) + field8(tcn, 3)))


_SM_COUNT: dict[int, int] = {}


def grid_size(tiles: int, blocks_per_sm: int = BLOCKS_PER_SM) -> int:
    """Blocks of a persistent tile kernel for ``tiles`` tiles: ``blocks_per_sm`` (its launch
    bounds) per multiprocessor of the current device (at most one per tile; 2 under the
    simulator, which is enough to exercise the hand-over of tiles between blocks)."""
    if compat.SIMULATOR:
        return max(1, min(tiles, 2))
    dev_id = cuda.get_current_device().id
    sms = _SM_COUNT.get(dev_id)
    if sms is None:
        sms = _SM_COUNT[dev_id] = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return max(1, min(tiles, sms * blocks_per_sm))
