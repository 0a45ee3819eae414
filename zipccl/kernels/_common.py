"""Pieces shared by the encode and decode kernels: workspace slots, warp reductions, the
decoupled look-back scan over escape blocks, the header CRC, the 32-bit helpers of the
per-value code (byte permute, shuffles, population count) and the persistent grid size.

Every tile kernel takes tiles (one escape block each) from a ticket counter on a persistent
grid and learns where its escapes go from the counts its predecessors publish, so positions
are sums of counts and the output is the same on every run; the finishing kernel of a call
advances the workspace's epoch, so the workspace is ready for the next call without clearing.
docs/KERNELS.md, "The tile skeleton", says how and why.
"""

from __future__ import annotations

import zlib

import numpy as np
from numba import cuda  # noqa: I001

from .. import format as fmt
from ..format.errors import (
    ERR_COUNTS,
    ERR_TOTAL,
)
from . import compat  # noqa: F401  (numpy fix before numba.cuda compiles anything)
from .compat import atomic_read, ballot, shfl, shfl_up, shfl_xor, u32, wrap64

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
# decode_warps' scan: a finished-blocks counter, each chunk's escape total, each chunk's prefix
# (the escapes of the chunks before it; a chunk: 4,096 tiles)
MAX_CHUNKS = 128
WS_CHUNKS = WS_SLOTS  # the counter
WS_CHUNK_TOTALS = WS_CHUNKS + 1
WS_CHUNK_PREFIXES = WS_CHUNK_TOTALS + MAX_CHUNKS
WS_STATUS = WS_CHUNK_PREFIXES + MAX_CHUNKS + 7

STATUS_AGG = 1
STATUS_INC = 2
EPOCH_LIMIT = 1 << 29
LOW32 = 0xFFFFFFFF

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
def quad_checksum(w0, w1, w2, w3, i):
    """Payload checksum terms of 4 consecutive uint32 words, the first payload word i."""
    return wrap64(np.int64(w0) * (2 * i + 1) + np.int64(w1) * (2 * i + 3)
                  + np.int64(w2) * (2 * i + 5) + np.int64(w3) * (2 * i + 7))


@dev
def field8(x, r):
    """Byte r of the uint32 x."""
    return np.uint32((x >> (8 * r)) & 0xFF)


@dev
def _scan_step(ex, lane, d):
    """One step of an inclusive warp scan: add lane - d's value where there is one."""
    y = shfl_up_u32(ex, d)
    if lane >= d:
        ex = np.uint32(ex + y)
    return ex


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
    ex = _scan_step(ex, lane, 1)  # Kogge-Stone steps (a constant distance each: SHFL immediates)
    ex = _scan_step(ex, lane, 2)
    ex = _scan_step(ex, lane, 4)
    ex = _scan_step(ex, lane, 8)
    ex = _scan_step(ex, lane, 16)
    tex = shfl_idx_u32(ex, 31)
    tcn = shfl_idx_u32(cnt, 31)
    return (ex, np.uint32(field8(tex, 0) + field8(tcn, 0)), np.uint32(field8(tex, 1) + field8(tcn, 1)),
            np.uint32(field8(tex, 2) + field8(tcn, 2)), np.uint32(field8(tex, 3) + field8(tcn, 3)))


# ---------------------------------------------------------------- the tile skeleton
# What every tile kernel (BF16, FP32, FP16; encode and decode) does around its per-type code,
# written once. Each piece is inlined where it is called, so a kernel compiles as if it were
# written out there; the shared-memory slots a piece uses are arguments (constants at every
# call site). A tile's path: take a ticket (``take_ticket``), code the tile, sum the warps'
# escape counts (``block_escapes``, barrier A), let warp 0 publish the tile's count, resolve
# its first escape position by the look-back and take the next ticket (``encoder_resolve`` /
# ``decoder_resolve``; barrier B follows in the kernel), place the escapes
# (``escape_bases`` / ``next_escape`` / ``escape_rank``); at the end ``flush_checksum``.

@dev
def take_ticket(ws):
    """The next tile number (tiles go out in increasing order, one ticket per tile)."""
    return cuda.atomic.add(ws, WS_TICKET, 1)


@dev
def first_ticket(ws, smem, tid):
    """Thread 0: the block's first tile into smem[0], the call's epoch into smem[1]."""
    if tid == 0:
        smem[0] = take_ticket(ws)
        smem[1] = ws[WS_EPOCH]


@dev
def publish_count(ws, tile, epoch, count):
    """Publish tile's escape count for the look-back (tile 0's count is its inclusive prefix)."""
    if tile == 0:
        publish(ws, tile, epoch, STATUS_INC, count)
    else:
        publish(ws, tile, epoch, STATUS_AGG, count)


@dev
def tile_prefix(ws, tile, epoch, lane, count):
    """Warp 0: tile's exclusive escape prefix (the look-back), its inclusive prefix published."""
    prefix = np.int64(0)
    if tile > 0:
        prefix = lookback(ws, tile, epoch, lane)
        if lane == 0:
            publish(ws, tile, epoch, STATUS_INC, prefix + count)
    return prefix


@dev
def block_escapes(smem, at, warp, lane, t0, t1, t2, t3):
    """Barrier A: each warp's escape count t0 + t1 + t2 + t3 in (smem[at + warp]; the sum is
    formed in lane 0 alone); (escapes of the lower warps, the block's) out, in every thread."""
    if lane == 0:
        smem[at + warp] = np.int64(t0 + t1 + t2 + t3)
    cuda.syncthreads()  # A: warp totals
    return warp_offsets(smem, at, warp)


@dev
def warp_offsets(smem, at, warp):
    """(escapes of the warps below ``warp``, the block's) from the warp totals in smem[at..]."""
    woff = np.int64(0)
    btot = np.int64(0)
    for w in range(WARPS):
        v = smem[at + w]
        if w < warp:
            woff += v
        btot += v
    return woff, btot


@dev
def count_checksum(count, counts_off, tile):
    """Payload checksum term of tile's 4-byte escape count."""
    return count * (2 * (((counts_off - fmt.HEADER_SIZE) >> 2) + tile) + 1)


@dev
def encoder_resolve(ws, out32, smem, at, tile, epoch, lane, btot, counts_off, do_cs, cs):
    """Warp 0 of an encoder: store and publish the tile's escape count ``btot``, resolve its
    prefix into smem[at] and take the next ticket into smem[0]; returns the checksum."""
    cs = store_count(ws, out32, tile, tile, epoch, lane, btot, btot, counts_off, do_cs, cs)
    prefix = tile_prefix(ws, tile, epoch, lane, btot)
    if lane == 0:
        smem[at] = prefix
        smem[0] = take_ticket(ws)
    return cs


@dev
def store_count(ws, out32, tile, status, epoch, lane, count, published, counts_off, do_cs, cs):
    """Lane 0 of an encoder's warp 0: store tile's escape count (and its checksum term) and
    publish ``published`` as status word ``status``'s count; returns the checksum."""
    if lane == 0:
        out32[(counts_off >> 2) + tile] = count
        if do_cs:
            cs = wrap64(cs + count_checksum(count, counts_off, tile))
        publish_count(ws, status, epoch, published)
    return cs


@dev
def decoder_resolve(f32, ws, smem, at, tile, epoch, lane, btot, cnt, craw, nesc, n, n_blocks,
                    counts_off, do_cs, cs, err, scanned):
    """Warp 0 of a decoder: resolve the tile's prefix (its clamped stored count ``cnt`` was
    published when it was taken) into smem[at]; lane 0 checks the escapes seen (``btot``)
    against the stored count ``craw`` and, in the last tile, the total against the header's
    ``nesc``, takes the next ticket into smem[0] and publishes that tile's stored count
    (``take_stored_count``, smem[7], smem[8]). Returns (err, checksum). ``scanned`` (a
    constant): the inclusive prefixes are already in the status words (a scan of the stored
    counts ran before), so the prefix is one load instead of the look-back."""
    if scanned:
        prefix = np.int64(0)
        if tile > 0:
            prefix = atomic_read(ws, WS_STATUS + tile - 1) & LOW32
    else:
        prefix = tile_prefix(ws, tile, epoch, lane, cnt)
    if lane == 0:
        smem[at] = prefix
        if btot != craw:
            err |= ERR_COUNTS
        if tile == n_blocks - 1 and prefix + cnt != nesc:
            err |= ERR_TOTAL
        if do_cs:
            cs = wrap64(cs + count_checksum(craw, counts_off, tile))
        nxt = take_ticket(ws)
        smem[0] = nxt
        take_stored_count(f32, ws, nxt, epoch, n, counts_off, n_blocks, smem, 7, scanned)
    return err, cs


@dev
def take_stored_count(f32, ws, tile, epoch, n, counts_off, n_blocks, smem, at, scanned):
    """Decoder, thread 0: publish ``tile``'s stored escape count (clamped to the tile's
    values; a larger one is an error) for the look-back; smem[at] = clamped, smem[at + 1] =
    stored count. ``scanned`` (a constant): the prefixes were scanned ahead, nothing to
    publish."""
    if tile < n_blocks:
        craw = np.int64(f32[(counts_off >> 2) + tile])
        lim = n - tile * fmt.BLOCK
        if lim > fmt.BLOCK:
            lim = fmt.BLOCK
        cnt = craw
        if cnt > lim:
            cnt = lim
            cuda.atomic.or_(ws, WS_ERR, ERR_COUNTS)
        smem[at] = cnt
        smem[at + 1] = craw
        if not scanned:
            publish_count(ws, tile, epoch, cnt)


@dev
def block_ticket(ws, smem, tid):
    """Every thread: the block's next tile, once every thread is done with the current one
    (two barriers; the RAW copies, whose tiles need no look-back)."""
    cuda.syncthreads()  # everyone has read this ticket
    if tid == 0:
        smem[0] = take_ticket(ws)
    cuda.syncthreads()
    return smem[0]


@dev
def decoder_header(smem, f64, tile, epoch, ok, raw, nesc, has_cs):
    """Decoder, thread 0: the block's first ticket and epoch and the header check's results
    into smem[0..6] (6: the codebook word)."""
    smem[0] = tile
    smem[1] = epoch
    smem[2] = 1 if ok else 0
    smem[3] = raw
    smem[4] = nesc
    smem[5] = has_cs
    smem[6] = f64[5]  # codebook bytes (and ndim in the top byte)


@dev
def flush_checksum(ws, cs, lane):
    """Add the warp's payload checksum terms to one of the workspace's 8 checksum slots."""
    cs = warp_sum(cs)
    if lane == 0:
        cuda.atomic.add(ws, WS_CSUM + (cuda.blockIdx.x & 7), cs)


@dev
def publish_errors(ws, err, lane):
    """A decoder's finishing kernel, warp 0: the call's error bits (lane 0's ``err`` and those
    the tiles raised) to WS_ERR_LAST and WS_ERR_STICKY; counters and checksum slots cleared
    for the next call."""
    if lane == 0:
        err |= atomic_read(ws, WS_ERR)
        ws[WS_ERR] = 0
        ws[WS_ERR_LAST] = err
        ws[WS_ERR_STICKY] = ws[WS_ERR_STICKY] | err
        ws[WS_TICKET] = 0
    if lane < 8:
        ws[WS_CSUM + lane] = 0


@dev
def zero_padding(out8, sm_end, planes_off, stride, pwords, n_planes, counts_end, after_counts, tid):
    """Zero the padding runs of a coded frame (each shorter than ALIGN, one byte a thread):
    after the byte plane (up to ``planes_off``), after each of ``n_planes`` code planes'
    ``pwords`` words, after the counts (up to ``after_counts``, the next section)."""
    i = sm_end + tid
    if i < planes_off:
        out8[i] = 0
    for k in range(n_planes):
        i = planes_off + k * stride + 4 * pwords + tid
        if i < planes_off + (k + 1) * stride:
            out8[i] = 0
    i = counts_end + tid
    if i < after_counts:
        out8[i] = 0


@dev
def escape_bases(ex, w0t, w1t, w2t, escm, base):
    """Rank of the first escape of each round of a lane, from the packed exclusive scan ``ex``
    (``exclusive_scan8``), the warp's round totals and the lane's escape mask ``escm`` (bit
    8r + s: value s of round r): rank of escape bit 8r + s = k_r + (escapes below it in this
    lane). ``base``: the escapes before this warp's in the frame."""
    k0 = base + np.int64(field8(ex, 0))
    k1 = base + np.int64(u32(u32(w0t + field8(ex, 1)) - popc32(u32(escm & 0xFF))))
    k2 = base + np.int64(u32(u32(w0t + w1t + field8(ex, 2)) - popc32(u32(escm & 0xFFFF))))
    k3 = base + np.int64(u32(u32(w0t + w1t + w2t + field8(ex, 3)) - popc32(u32(escm & 0xFFFFFF))))
    return k0, k1, k2, k3


@dev
def next_escape(m):
    """(m without its lowest set bit, that bit, its index 8r + s) of a nonzero escape mask."""
    low = u32(m & u32(u32(~m) + 1))
    return u32(m ^ low), low, popc32(u32(low - 1))


@dev
def pick4(i, v0, v1, v2, v3):
    """v_i for i = 1, 2, 3; v0 otherwise (a chain of selects, no local array)."""
    return v1 if i == 1 else (v2 if i == 2 else (v3 if i == 3 else v0))


@dev
def escape_rank(k0, k1, k2, k3, r, escm, low):
    """Rank (position in the escape section) of the escape bit ``low`` of round r."""
    return pick4(r, k0, k1, k2, k3) + np.int64(popc32(u32(escm & u32(low - 1))))


@dev
def escape_step(ex, w0t, w1t, w2t, escm, base, m):
    """One step over a lane's remaining escape mask ``m`` (nonzero; ``escm`` the whole mask, the
    rest ``escape_bases``' arguments, loop-invariant): (m without its lowest escape, that
    escape's round r, its value s in the round, its rank in the escape section)."""
    k0, k1, k2, k3 = escape_bases(ex, w0t, w1t, w2t, escm, base)
    m, low, bit = next_escape(m)  # bit 8r + s: value s of round r
    r = u32(bit >> 3)
    return m, r, u32(bit & 7), escape_rank(k0, k1, k2, k3, r, escm, low)


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
