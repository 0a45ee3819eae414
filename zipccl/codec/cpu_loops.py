"""The CPU codec's compiled loops: Numba ``@njit`` over the format's escape blocks.

Every block (``format.BLOCK`` values) owns disjoint slices of the sign-mantissa plane and of
the three code planes, so blocks run in parallel (``prange``): ``encode_blocks`` writes all
but the escapes' final places (``place_escapes``, after a scan of the counts) and
``decode_blocks`` rebuilds the values, each with its blocks' shares of the payload checksum
(``words_sum``). ``split32`` / ``join32`` and ``fp16_split`` / ``fp16_join`` turn FP32 and
FP16 values into the BF16 patterns the block loops code, and back. ``codec.cpu`` lays out the
frame and calls them. The uint32 views (planes, counts, words) are made in NumPy and passed
in: Numba does not see that a ``.view`` taken inside a ``parallel=True`` function aliases its
base, and drops the stores made through it. The design: docs/CPU_CODEC.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import format as fmt

_BLOCK = fmt.BLOCK
SLOT = fmt.BLOCK // 8  # escape bytes a block keeps in scratch before it re-reads its input
_CHUNK_WORDS = 1 << 16  # checksum words per parallel chunk
# SWAR bit gather: (8 bytes, each 0 or 1) * _GATHER >> 56 moves byte i's bit to bit i.
# Each partial product lands on its own bit position, so nothing carries into the top byte.
_GATHER = np.uint64(0x0102040810204080)
_ONES = np.uint64(0x0101010101010101)
# De Bruijn table for the index of the lowest set bit of a uint32.
_DEBRUIJN = np.array([0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8,
                      31, 27, 13, 23, 21, 19, 16, 7, 26, 12, 18, 6, 11, 5, 10, 9], dtype=np.uint8)

assert fmt.BLOCK % 32 == 0
assert np.little_endian, "the CPU codec reads and writes little-endian words directly"


@njit(cache=True, nogil=True)
def tail_term(tail, index):  # pragma: no cover - compiled
    """The term of a last, partial word (< 4 bytes, zero-padded) at word ``index``."""
    w = np.uint64(0)
    for k in range(tail.size):
        w |= np.uint64(tail[k]) << np.uint64(8 * k)
    return w * np.uint64(2 * index + 1)


@njit(cache=True, nogil=True)
def words_sum(words, base):  # pragma: no cover - compiled
    """sum_j w_j (2(base + j) + 1) mod 2**64, in one thread (short sections).

    Written as sum w_j (2j + 1) + 2 base sum w_j, which vectorizes (uint64 arithmetic
    wraps like the reference's).
    """
    local = np.uint64(0)
    plain = np.uint64(0)
    for j in range(words.size):
        w = np.uint64(words[j])
        local += w * np.uint64(2 * j + 1)
        plain += w
    return local + np.uint64(2) * np.uint64(base) * plain


@njit(cache=True, parallel=True, nogil=True)
def words_sum_parallel(words, base):  # pragma: no cover - compiled
    """``words_sum`` over chunks of _CHUNK_WORDS words in parallel (long sections)."""
    nwords = words.size
    nchunks = (nwords + _CHUNK_WORDS - 1) // _CHUNK_WORDS
    partial = np.zeros(nchunks, dtype=np.uint64)
    for c in prange(nchunks):
        lo = c * _CHUNK_WORDS
        partial[c] = words_sum(words[lo:min(lo + _CHUNK_WORDS, nwords)], base + lo)
    total = np.uint64(0)
    for c in range(nchunks):
        total += partial[c]
    return total


@njit(cache=True, inline="always")
def _ctz(x):  # pragma: no cover - compiled
    """Index of the lowest set bit of a non-zero uint32 (de Bruijn multiply)."""
    low = np.uint64(x) & (np.uint64(0) - np.uint64(x))
    return _DEBRUIJN[((low * np.uint64(0x077CB531)) & np.uint64(0xFFFFFFFF)) >> np.uint64(27)]


@njit(cache=True, inline="always")
def _code(e, c0, c1, c2, c3, c4, c5, c6):  # pragma: no cover - compiled
    """1 + the codebook index of exponent ``e``, or 0 (escape); entries are distinct."""
    return (np.uint8(1) * (e == c0) | np.uint8(2) * (e == c1) | np.uint8(3) * (e == c2)
            | np.uint8(4) * (e == c3) | np.uint8(5) * (e == c4) | np.uint8(6) * (e == c5)
            | np.uint8(7) * (e == c6))


@njit(cache=True, inline="always")
def _spread(byte):  # pragma: no cover - compiled
    """The 8 bits of ``byte`` as 8 bytes of value 0 or 1 (bit i -> byte i), SWAR."""
    x = (np.uint64(byte & 0xFF) * _ONES) & np.uint64(0x8040201008040201)
    # Each byte now holds 0 or its single bit; + 0x7F sets its top bit iff non-zero
    # and never carries into the next byte.
    return ((x + np.uint64(0x7F7F7F7F7F7F7F7F)) >> np.uint64(7)) & _ONES


# Inside the prange bodies every array is first cut to the block's slice and then
# indexed from 0: an index written as ``lo + i`` is not known to be non-negative,
# which costs a wraparound check per access and stops LLVM from vectorizing.


@njit(cache=True, inline="always")
def _span(b, n):  # pragma: no cover - compiled
    """Block b's values [lo, hi) of n (the last block may be short)."""
    lo = b * _BLOCK
    return lo, min(lo + _BLOCK, n)


@njit(cache=True, inline="always")
def _block_planes(planes, stride_words, w0, nw):  # pragma: no cover - compiled
    """A block's nw words of each code plane from word w0 (plane k at word k * stride_words)."""
    return (planes[w0:w0 + nw], planes[stride_words + w0:stride_words + w0 + nw],
            planes[2 * stride_words + w0:2 * stride_words + w0 + nw])


@njit(cache=True, inline="always")
def _escape_mask(q0, q1, q2, w, m):  # pragma: no cover - compiled
    """Bit j set where value 32w + j of a block of m values has the escape code (0 in all
    three planes)."""
    mask = np.uint32(np.uint32(0xFFFFFFFF) ^ (q0[w] | q1[w] | q2[w]))
    valid = min(32, m - 32 * w)
    if valid < 32:
        mask &= (np.uint32(1) << np.uint32(valid)) - np.uint32(1)
    return mask


@njit(cache=True, inline="always")
def _pop_lowest(mask):  # pragma: no cover - compiled
    """(index of the lowest set bit of a non-zero uint32, the mask without that bit)."""
    return _ctz(mask), mask & (mask - np.uint32(1))


@njit(cache=True, inline="always")
def _block_share(q0, q1, q2, sm_words, plane_base, stride_words, w0, lo, hi):  # pragma: no cover - compiled
    """A block's checksum share: its plane words and the sm words it fills completely
    (sm word k is payload word k: the sm plane starts right after the header)."""
    return (words_sum(q0, plane_base + w0)
            + words_sum(q1, plane_base + stride_words + w0)
            + words_sum(q2, plane_base + 2 * stride_words + w0)
            + words_sum(sm_words[lo // 4:hi // 4], lo // 4))


@njit(cache=True, parallel=True, nogil=True)
def encode_blocks(bits, cb, sm, sm_words, planes, stride_words, plane_base,
                  scratch, counts, partial):  # pragma: no cover - compiled
    """Everything that depends on one block alone, for every block in parallel.

    Writes the sign-mantissa bytes (``sm``), the plane words (``planes``, plane k at
    word k * stride_words), the block's escape count (``counts``), its first SLOT
    escape bytes (``scratch``) and its checksum share (``partial``): the sm words it
    fills completely and its plane words. ``plane_base`` is the checksum word index
    of plane 0's first word.
    """
    n = bits.size
    n_blocks = counts.size
    c0, c1, c2, c3, c4, c5, c6 = cb[0], cb[1], cb[2], cb[3], cb[4], cb[5], cb[6]
    for b in prange(n_blocks):
        lo, hi = _span(b, n)
        m = hi - lo
        nw = (m + 31) // 32
        w0 = lo // 32
        xb = bits[lo:hi]
        sb = sm[lo:hi]
        codes = np.empty(32 * nw, dtype=np.uint8)
        for i in range(m):
            v = xb[i]
            sb[i] = np.uint8(((v >> 8) & 0x80) | (v & 0x7F))
            codes[i] = _code(np.uint8((v >> 7) & 0xFF), c0, c1, c2, c3, c4, c5, c6)
        for i in range(m, 32 * nw):
            codes[i] = 0  # bits past the end of the tensor are zero
        c64 = codes.view(np.uint64)
        q0, q1, q2 = _block_planes(planes, stride_words, w0, nw)
        for w in range(nw):
            p0 = np.uint64(0)
            p1 = np.uint64(0)
            p2 = np.uint64(0)
            for q in range(4):
                x = c64[4 * w + q]
                sh = np.uint64(8 * q)
                p0 |= (((x & _ONES) * _GATHER) >> np.uint64(56)) << sh
                p1 |= ((((x >> np.uint64(1)) & _ONES) * _GATHER) >> np.uint64(56)) << sh
                p2 |= ((((x >> np.uint64(2)) & _ONES) * _GATHER) >> np.uint64(56)) << sh
            q0[w] = np.uint32(p0)
            q1[w] = np.uint32(p1)
            q2[w] = np.uint32(p2)
        # Escapes: code 0 in all three planes, inside the tensor, in element order.
        e = 0
        slot = scratch[b * SLOT:(b + 1) * SLOT]
        for w in range(nw):
            mask = _escape_mask(q0, q1, q2, w, m)
            while mask:
                j, mask = _pop_lowest(mask)
                if e < SLOT:
                    slot[e] = np.uint8((xb[32 * w + j] >> 7) & 0xFF)
                e += 1
        counts[b] = e
        partial[b] = _block_share(q0, q1, q2, sm_words, plane_base, stride_words, w0, lo, hi)


@njit(cache=True, parallel=True, nogil=True)
def place_escapes(bits, cb, scratch, counts, start, escapes):  # pragma: no cover - compiled
    """Copy each block's escape bytes to escapes[start[b]:]; re-read overflowing blocks."""
    n = bits.size
    c0, c1, c2, c3, c4, c5, c6 = cb[0], cb[1], cb[2], cb[3], cb[4], cb[5], cb[6]
    for b in prange(counts.size):
        c = counts[b]
        dst = escapes[start[b]:start[b] + c]
        if c <= SLOT:
            src = scratch[b * SLOT:b * SLOT + c]
            for k in range(c):
                dst[k] = src[k]
        else:
            lo, hi = _span(b, n)
            xb = bits[lo:hi]
            k = 0
            for i in range(xb.size):
                e = np.uint8((xb[i] >> 7) & 0xFF)
                if _code(e, c0, c1, c2, c3, c4, c5, c6) == 0:
                    dst[k] = e
                    k += 1


@njit(cache=True, parallel=True, nogil=True)
def decode_blocks(sm, sm_words, planes, stride_words, plane_base, stored, table, escapes,
                  out, with_checksum, seen, partial):  # pragma: no cover - compiled
    """Rebuild the bit patterns of every block in parallel.

    ``seen[b]`` gets the number of escape codes in block b and ``partial[b]`` its
    checksum share (sm words it covers completely, its plane words). Block b takes
    its escapes from escapes[sum(stored[:b]):], and only while inside both its own
    stored count and ``escapes``: on a corrupt frame the values are garbage (the
    caller's count check rejects it) but no read leaves the escape section.
    """
    n = out.size
    n_blocks = stored.size
    n_esc = escapes.size
    start = np.empty(n_blocks, dtype=np.int64)
    acc0 = np.int64(0)
    for b in range(n_blocks):
        start[b] = acc0
        acc0 += np.int64(stored[b])
    t1, t2, t3, t4, t5, t6, t7 = (np.uint16(table[1]), np.uint16(table[2]), np.uint16(table[3]),
                                  np.uint16(table[4]), np.uint16(table[5]), np.uint16(table[6]),
                                  np.uint16(table[7]))
    for b in prange(n_blocks):
        lo, hi = _span(b, n)
        m = hi - lo
        nw = (m + 31) // 32
        w0 = lo // 32
        q0, q1, q2 = _block_planes(planes, stride_words, w0, nw)
        sb = sm[lo:hi]
        ob = out[lo:hi]
        codes = np.empty(32 * nw, dtype=np.uint8)
        c64 = codes.view(np.uint64)
        for w in range(nw):
            p0 = q0[w]
            p1 = q1[w]
            p2 = q2[w]
            for q in range(4):
                c64[4 * w + q] = (_spread(p0 >> (8 * q)) | (_spread(p1 >> (8 * q)) << np.uint64(1))
                                  | (_spread(p2 >> (8 * q)) << np.uint64(2)))
        for i in range(m):
            c = codes[i]
            ex = np.uint16(0)
            ex = t1 if c == 1 else ex
            ex = t2 if c == 2 else ex
            ex = t3 if c == 3 else ex
            ex = t4 if c == 4 else ex
            ex = t5 if c == 5 else ex
            ex = t6 if c == 6 else ex
            ex = t7 if c == 7 else ex
            s = np.uint16(sb[i])
            ob[i] = ((s & 0x80) << 8) | (ex << 7) | (s & 0x7F)
        # Escapes, in element order, from this block's share of the escape section.
        limit = min(np.int64(stored[b]), n_esc - start[b])
        base = start[b]
        e = 0
        for w in range(nw):
            mask = _escape_mask(q0, q1, q2, w, m)
            while mask:
                j, mask = _pop_lowest(mask)
                if e < limit:
                    ob[32 * w + j] |= np.uint16(escapes[base + e]) << 7
                e += 1
        seen[b] = e
        if with_checksum:
            partial[b] = _block_share(q0, q1, q2, sm_words, plane_base, stride_words, w0, lo, hi)
        else:
            partial[b] = 0


def _halves32(join: bool):
    """``split32`` (``join`` False: FP32 patterns ``wide`` -> their upper halves ``hi`` and lower
    halves ``lo``) or ``join32`` (True: the inverse, into ``wide``), block-parallel. ``join``
    is a compile-time constant: each function holds only its direction."""

    @njit(cache=True, parallel=True, nogil=True)
    def halves32(wide, hi, lo):  # pragma: no cover - compiled
        n = wide.size
        for b in prange((n + _BLOCK - 1) // _BLOCK):
            s, e = _span(b, n)
            wb = wide[s:e]
            hb = hi[s:e]
            lb = lo[s:e]
            if join:
                for i in range(wb.size):
                    wb[i] = (np.uint32(hb[i]) << np.uint32(16)) | np.uint32(lb[i])
            else:
                for i in range(wb.size):
                    v = wb[i]
                    hb[i] = np.uint16(v >> np.uint32(16))
                    lb[i] = np.uint16(v & np.uint32(0xFFFF))

    return halves32


split32 = _halves32(False)
join32 = _halves32(True)


def _fp16_planes(join: bool):
    """``fp16_split`` (``join`` False) or ``fp16_join`` (True, the inverse; exponents above 31
    are cut to 5 bits, the caller has rejected such escapes already), word-block-parallel.
    Split: the FP16 patterns ``bits`` -> the BF16 patterns the block loops code (``pseudo``:
    the low byte as sign-mantissa byte, the 5-bit exponent as exponent) and the words of bit
    planes 3..5 (``raw_planes``, plane k at word k * stride_words; bits past n are 0).
    ``join`` is a compile-time constant: each function holds only its direction."""

    @njit(cache=True, parallel=True, nogil=True)
    def fp16_planes(bits, pseudo, raw_planes, stride_words):  # pragma: no cover - compiled
        n = bits.size
        words = (n + 31) // 32
        for b in prange((words + 127) // 128):
            w_lo = b * 128
            w_hi = min(w_lo + 128, words)
            for w in range(w_lo, w_hi):
                if join:
                    p8 = raw_planes[w]
                    p9 = raw_planes[stride_words + w]
                    p15 = raw_planes[2 * stride_words + w]
                    for j in range(min(32, n - 32 * w)):
                        p = np.uint32(pseudo[32 * w + j])
                        jj = np.uint32(j)
                        bits[32 * w + j] = np.uint16(
                            (p & np.uint32(0x7F)) | ((p >> np.uint32(8)) & np.uint32(0x80))
                            | (((p >> np.uint32(7)) & np.uint32(0x1F)) << np.uint32(10))
                            | (((p8 >> jj) & np.uint32(1)) << np.uint32(8))
                            | (((p9 >> jj) & np.uint32(1)) << np.uint32(9))
                            | (((p15 >> jj) & np.uint32(1)) << np.uint32(15)))
                else:
                    p8 = np.uint32(0)
                    p9 = np.uint32(0)
                    p15 = np.uint32(0)
                    for j in range(min(32, n - 32 * w)):
                        v = np.uint32(bits[32 * w + j])
                        pseudo[32 * w + j] = np.uint16(
                            (v & np.uint32(0x7F)) | ((v & np.uint32(0x80)) << np.uint32(8))
                            | (((v >> np.uint32(10)) & np.uint32(0x1F)) << np.uint32(7)))
                        p8 |= ((v >> np.uint32(8)) & np.uint32(1)) << np.uint32(j)
                        p9 |= ((v >> np.uint32(9)) & np.uint32(1)) << np.uint32(j)
                        p15 |= ((v >> np.uint32(15)) & np.uint32(1)) << np.uint32(j)
                    raw_planes[w] = p8
                    raw_planes[stride_words + w] = p9
                    raw_planes[2 * stride_words + w] = p15

    return fp16_planes


fp16_split = _fp16_planes(False)
fp16_join = _fp16_planes(True)
