"""Spill kernels: slot headers, tails out to mapped host memory, tails back in, the error word.

A frame longer than its slot *spills*: its tail moves beside the collective, through pinned,
device-mapped host memory and a host channel (``zipccl.comm.spill``: call blocks, progress
thread). Here: what runs on the device, as CUDA C compiled by CuPy (volatile loads of host
memory, system fences, ``__nanosleep``: none of them in Numba), and beside each kernel its
NumPy twin, the same algorithm on host memory, for host arrays and tests without a GPU: the
twins are the specification. A kernel waits only on a flag the CPU raises, never on later GPU
work. The kernels, their memory, the host's ordering: docs/KERNELS.md, "The spill kernels".
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time

import numpy as np

from .. import format as fmt
from ..format import slot as slots
from ..format.errors import (
    ERR_PEER,
    ERR_PROGRESS,
    ERR_SLOT_CALL,
    ERR_SLOT_HEADER,
    ERR_SLOT_SEQ,
    ERR_SLOT_SIZE,
)
from . import cache as kernel_cache

THREADS = 256  # threads per block of every spill kernel (the CRC table has 256 entries)
MAX_BLOCKS = 32  # blocks of one launch, for the largest tails
BYTES_PER_BLOCK = 1 << 20  # worst-case tail bytes per block when sizing a launch
LIST_MAX = 256  # spilling frames a block lists in shared memory (more: a slower path)

# -- the call block --------------------------------------------------------------------------
HEADER_WORDS = 16  # u64 words at the block's start
W_SEQ, W_OP, W_DTYPE, W_NSEND, W_NRECV, W_SEND_AT, W_RECV_AT = range(7)
W_OUT_READY = 7  # device -> host: this call's send tails and their lengths are in the block
W_IN_REQUEST = 8  # device -> host: this call's receive lengths are posted
W_IN_READY = 9  # host -> device: the requested tails are in the block
W_IN_FREE = 10  # device -> host: the tails were copied out; the block may be reused
W_OWN_MAX = 11  # device: the largest escape count among this rank's send frames of the call
W_MAX_ESC = 12  # device -> host (before W_IN_REQUEST): the largest over every rank's frames
W_HOST_FREE = 13  # host -> device (a site's ring block): the last call whose sends completed
DESC_WORDS = 16  # u64 words per frame descriptor (128 bytes)
D_REGION = 0  # device address of the region: slot header, then the frame
D_SLOT = 1  # slot_bytes
D_REGION_BYTES = 2
D_PEER = 3
D_N = 4  # element count
D_TAIL_AT = 5  # byte offset of this frame's tail area in the block
D_TAIL_CAP = 6  # its size: region_bytes - slot_bytes, the longest tail
D_TAIL_LEN = 7  # device-written: tail bytes sent (send) or due from the peer (receive)
D_TAG = 8  # host channel tag
# -- the control words and the device words ------------------------------------------------
C_WORDS = 16
C_ERR, C_HOST_ERR = 0, 1
DEV_WORDS = 4  # uint32
DEV_ERR = 0
CNT_OUT, CNT_IN, CNT_TICKET = 0, 1, 2  # the block's counters (uint32, device memory)
COUNTERS = 3
# -- a captured call site (``comm.spill_sites``; docs/KERNELS.md): u64 words, pinned mapped
S_GEN, S_BLK, S_SEQ, S_RING, S_BLOCKS = 0, 1, 2, 3, 8  # calls so far, current block and seq, ring
RING_MAX, FEED_MAX = 8, 16  # S_RING 0: fed by the host, (block, seq) per call at S_FEED
S_FEED = S_BLOCKS + RING_MAX
SITE_WORDS = S_FEED + 2 * FEED_MAX

_SLOT_SIZES = {name: struct.calcsize("<" + code) for name, code, _ in slots.SLOT_FIELDS}
assert slots.SLOT_HEADER == 128 and slots.CRC_AT == 124 and _SLOT_SIZES["crc"] == 4


def blocks_for(tail_capacity: int) -> int:
    """Blocks of one launch for calls whose tails may total ``tail_capacity`` bytes.

    >>> blocks_for(0), blocks_for(5 << 20), blocks_for(1 << 40)
    (1, 5, 32)
    """
    return max(1, min(MAX_BLOCKS, int(tail_capacity) // BYTES_PER_BLOCK))


# -- host views of memory by address (the twins' loads and stores) ---------------------------

def _mem(ptr: int, count: int, dtype=np.uint8) -> np.ndarray:
    dt = np.dtype(dtype)
    return np.frombuffer((ctypes.c_uint8 * (count * dt.itemsize)).from_address(int(ptr)), dtype=dt) \
        if count > 0 else np.zeros(0, dt)


def _descs(blk: int, at_word: int, count_word: int) -> np.ndarray:
    n, at = (int(v) for v in _mem(blk, HEADER_WORDS, np.uint64)[[count_word, at_word]])
    return _mem(blk + at, n * DESC_WORDS, np.uint64).reshape(n, DESC_WORDS)


def _sticky_or(dev: int, ctrl: int, bits: int) -> None:
    """Twin of ``sticky_or``: the device word ORed, the host's mirror updated."""
    if bits:
        word = _mem(dev, DEV_WORDS, np.uint32)
        word[DEV_ERR] |= np.uint32(bits)
        _mem(ctrl, C_WORDS, np.uint64)[C_ERR] = np.uint64(word[DEV_ERR])


def _spin(done, ctrl: int) -> None:
    """Twin of the kernels' ``__nanosleep`` spin: wait (on the CPU) until ``done()`` or the
    progress thread failed (``ERR_PROGRESS`` in the host's error word)."""
    delay, host_err = 1e-5, _mem(ctrl, C_WORDS, np.uint64)
    while not done() and not int(host_err[C_HOST_ERR]) & ERR_PROGRESS:
        time.sleep(delay)
        delay = min(2 * delay, 1e-3)


_COMMON_CUDA = r"""
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

__device__ __forceinline__ u64 ld_sys(const u64* p) { return *(const volatile u64*)p; }
__device__ __forceinline__ void st_sys(u64* p, u64 v) { *(volatile u64*)p = v; }

/* The sticky word: ORed in device memory with device-scope atomics, mirrored into mapped
   memory for the host. A writer stores the word again until it stays what it stored, so
   the last store to land holds every bit. */
__device__ void sticky_or(u32* dev, u64* ctrl, u32 bits) {
    if (!bits) return;
    atomicOr(dev + DEV_ERR, bits);
    u32 v;
    do {
        v = *(volatile u32*)(dev + DEV_ERR);
        st_sys(ctrl + C_ERR, (u64)v);
        __threadfence_system();
    } while (*(volatile u32*)(dev + DEV_ERR) != v);
}

__device__ void crc_table(u32* table) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        u32 c = (u32)i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    __syncthreads();
}

/* bytes of a little-endian 128-byte header held as 16 words */
__device__ __forceinline__ u32 hbyte(const u64* h, int i) {
    return (u32)(h[i >> 3] >> (8 * (i & 7))) & 0xFFu;
}
__device__ __forceinline__ u64 hget(const u64* h, int at, int size) {
    u64 v = 0;
    for (int k = size - 1; k >= 0; --k) v = (v << 8) | hbyte(h, at + k);
    return v;
}
__device__ __forceinline__ void hput(u64* h, int at, int size, u64 v) {
    for (int k = 0; k < size; ++k) h[(at + k) >> 3] |= ((v >> (8 * k)) & 0xFFull) << (8 * ((at + k) & 7));
}
/* zlib's CRC-32 of header bytes [0, SO_CRC) */
__device__ u32 header_crc(const u64* h, const u32* table) {
    u32 c = 0xFFFFFFFFu;
    for (int i = 0; i < SO_CRC; ++i) c = table[(c ^ hbyte(h, i)) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* len bytes, grid-stride: 16-byte vectors (both ends 16-byte aligned), then the last bytes.
   Mapped sources are read with .cv loads: fetched again, never from a stale cache line. */
template <bool FROM_HOST>
__device__ void grid_copy(u8* dst, const u8* src, u64 len) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
    const u64 nv = len / 16;
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    for (u64 i = t; i < nv; i += step) d[i] = FROM_HOST ? __ldcv(s + i) : s[i];
    for (u64 i = nv * 16 + t; i < len; i += step)
        dst[i] = FROM_HOST ? *(const volatile u8*)(src + i) : src[i];
}

/* Every thread's writes are fenced; the launch's last block to get here returns true on
   its thread 0 (and resets the counter for the block's next call). */
__device__ bool finish(u32* counter) {
    __shared__ int last;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
        if (last) {
            *counter = 0;
            __threadfence_system();
        }
    }
    __syncthreads();
    return last && threadIdx.x == 0;
}

struct Copy { u8* dst; const u8* src; u64 len; };

/* seq 0: *blk is a captured site; its current call's block and sequence number (spill_take) */
__device__ __forceinline__ void site_call(u64** blk, u64* seq) {
    *seq = ld_sys(*blk + S_SEQ);
    *blk = (u64*)ld_sys(*blk + S_BLK);
}
"""

# -- step 1: a send frame's tail, its slot header, the tail out -----------------------------

_OUT_CUDA = r"""
/* The tail of send frame d: frame bytes past its slot. A frame longer than its region (an
   encoder bug) sends what the region holds and says so (ERR_SLOT_SIZE). */
struct Tail { u64 frame_len, tail; u32 bits; };
__device__ Tail send_tail(const u64* d) {
    const u8* frame = (const u8*)ld_sys(d + D_REGION) + SLOT_HEADER;
    const u64 fit = ld_sys(d + D_SLOT) - SLOT_HEADER, cap = ld_sys(d + D_TAIL_CAP);
    Tail t;
    t.frame_len = *(const u64*)(frame + FRAME_LEN_AT);
    t.tail = t.frame_len > fit ? t.frame_len - fit : 0;
    t.bits = 0;
    if (t.tail > cap) {
        t.tail = cap;
        t.frame_len = fit + cap;
        t.bits = ERR_SLOT_SIZE;
    }
    return t;
}

__device__ void write_slot_header(u8* at, u64 seq, u64 op, u64 dtype, u64 n, u64 frame_len,
                                  u64 slot, u32 error, u64 max_escapes, const u32* table) {
    u64 h[16];
    for (int i = 0; i < 16; ++i) h[i] = 0;
    hput(h, SO_MAGIC, 4, SLOT_MAGIC);
    hput(h, SO_VERSION, 4, SLOT_VERSION);
    hput(h, SO_SEQ, 8, seq);
    hput(h, SO_OP, 4, op);
    hput(h, SO_DTYPE, 4, dtype);
    hput(h, SO_N, 8, n);
    hput(h, SO_FRAME_LEN, 8, frame_len);
    hput(h, SO_SLOT_BYTES, 8, slot);
    hput(h, SO_ERROR, 4, error);
    hput(h, SO_MAX_ESCAPES, 8, max_escapes);
    hput(h, SO_CRC, 4, header_crc(h, table));
    u64* dst = (u64*)at;
    for (int i = 0; i < 16; ++i) dst[i] = h[i];
}

extern "C" __global__ void __launch_bounds__(THREADS)
zipccl_spill_out(u64* blk, u64* ctrl, u32* dev, u32* counters, u64 seq) {
    __shared__ u32 table[256];
    if (seq == 0) site_call(&blk, &seq);
    __shared__ unsigned long long max_esc;
    __shared__ int listed;
    __shared__ Copy list[LIST_MAX];
    crc_table(table);
    const u64 ns = ld_sys(blk + W_NSEND), op = ld_sys(blk + W_OP), dtype = ld_sys(blk + W_DTYPE);
    u64* sd = (u64*)((u8*)blk + ld_sys(blk + W_SEND_AT));
    if (threadIdx.x == 0) { max_esc = 0; listed = 0; }
    __syncthreads();
    /* 1. every block alike: the call's largest escape count, the frames that spill */
    for (u64 f = threadIdx.x; f < ns; f += blockDim.x) {
        const u64* d = sd + f * DESC_WORDS;
        const u8* region = (const u8*)ld_sys(d + D_REGION);
        atomicMax(&max_esc, *(const unsigned long long*)(region + SLOT_HEADER + N_ESCAPES_AT));
        const Tail t = send_tail(d);
        if (t.tail) {
            const int k = atomicAdd(&listed, 1);
            if (k < LIST_MAX)
                list[k] = Copy{(u8*)blk + ld_sys(d + D_TAIL_AT), region + ld_sys(d + D_SLOT), t.tail};
        }
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) st_sys(blk + W_OWN_MAX, max_esc);
    const u32 error = *(volatile u32*)(dev + DEV_ERR) | (u32)ld_sys(ctrl + C_HOST_ERR);
    /* 2. slot headers and tail lengths: frame f by block f % grid */
    for (u64 f = blockIdx.x + (u64)gridDim.x * threadIdx.x; f < ns; f += (u64)gridDim.x * blockDim.x) {
        u64* d = sd + f * DESC_WORDS;
        const Tail t = send_tail(d);
        sticky_or(dev, ctrl, t.bits);
        write_slot_header((u8*)ld_sys(d + D_REGION), seq, op, dtype, ld_sys(d + D_N), t.frame_len,
                          ld_sys(d + D_SLOT), error | t.bits, max_esc, table);
        st_sys(d + D_TAIL_LEN, t.tail);
    }
    /* 3. the tails into the block, every block a share */
    if (listed <= LIST_MAX) {
        for (int k = 0; k < listed; ++k) grid_copy<false>(list[k].dst, list[k].src, list[k].len);
    } else {
        for (u64 f = 0; f < ns; ++f) {
            const u64* d = sd + f * DESC_WORDS;
            const Tail t = send_tail(d);
            if (t.tail) grid_copy<false>((u8*)blk + ld_sys(d + D_TAIL_AT),
                                         (const u8*)ld_sys(d + D_REGION) + ld_sys(d + D_SLOT), t.tail);
        }
    }
    /* 4. the flag, by the last block */
    if (finish(counters + CNT_OUT)) st_sys(blk + W_OUT_READY, seq);
}
"""


def send_tail(d: np.ndarray) -> tuple[int, int, int]:
    """Twin of ``send_tail``: (frame_len for the slot header, tail bytes, error bits)."""
    region = int(d[D_REGION])
    fit, cap = int(d[D_SLOT]) - slots.SLOT_HEADER, int(d[D_TAIL_CAP])
    frame_len = int(_mem(region + slots.SLOT_HEADER + fmt.FRAME_LEN_AT, 1, np.uint64)[0])
    tail = max(0, frame_len - fit)
    if tail > cap:
        return fit + cap, cap, ERR_SLOT_SIZE
    return frame_len, tail, 0


def _site(blk: int, seq: int) -> tuple[int, int]:
    """The kernels' preamble: (block, seq) themselves, or with seq 0 a site's current ones."""
    return (blk, seq) if seq else tuple(int(v) for v in _mem(blk, SITE_WORDS, np.uint64)[[S_BLK, S_SEQ]])


def spill_out(blk: int, ctrl: int, dev: int, counters: int, seq: int) -> None:
    """Twin of ``zipccl_spill_out``: slot headers, tails into the block, ``W_OUT_READY``."""
    blk, seq = _site(blk, seq)
    w = _mem(blk, HEADER_WORDS, np.uint64)
    sd = _descs(blk, W_SEND_AT, W_NSEND)
    op, dtype = int(w[W_OP]), int(w[W_DTYPE])
    # 1. the call's largest escape count
    max_esc = max((int(_mem(int(d[D_REGION]) + slots.SLOT_HEADER + fmt.N_ESCAPES_AT, 1, np.uint64)[0])
                   for d in sd), default=0)
    w[W_OWN_MAX] = max_esc
    error = int(_mem(dev, DEV_WORDS, np.uint32)[DEV_ERR]) | int(_mem(ctrl, C_WORDS, np.uint64)[C_HOST_ERR])
    for d in sd:
        # 2. slot header and tail length
        frame_len, tail, bits = send_tail(d)
        _sticky_or(dev, ctrl, bits)
        header = slots.pack_slot_header(slots.SlotHeader(
            seq=seq, op=op, dtype=dtype, n=int(d[D_N]), frame_len=frame_len, slot_bytes=int(d[D_SLOT]),
            error=error | bits, max_escapes=max_esc))
        _mem(int(d[D_REGION]), slots.SLOT_HEADER)[:] = header
        d[D_TAIL_LEN] = tail
        # 3. the tail into the block
        src = _mem(int(d[D_REGION]) + int(d[D_SLOT]), tail)
        _mem(blk + int(d[D_TAIL_AT]), tail)[:] = src
    # 4. the flag
    w[W_OUT_READY] = seq


# -- step 2: a received slot header checked, the request posted, the tails in ---------------

_IN_CUDA = r"""
/* The received slot header of frame d against the call: the tail the peer sends (from the
   header's own frame_len and slot_bytes, so the host channel stays in step even when the
   call disagrees), how much of it goes into the region, and the error bits. */
struct Check { u64 want, copy; u32 bits; };
__device__ Check check_slot(const u64* d, u64 seq, u64 op, u64 dtype, const u32* table) {
    const u64* at = (const u64*)ld_sys(d + D_REGION);
    u64 h[16];
    for (int i = 0; i < 16; ++i) h[i] = at[i];
    Check c;
    c.want = 0;
    c.copy = 0;
    c.bits = 0;
    const u64 slot = hget(h, SO_SLOT_BYTES, 8), frame_len = hget(h, SO_FRAME_LEN, 8);
    if (hget(h, SO_MAGIC, 4) != SLOT_MAGIC || hget(h, SO_VERSION, 4) != SLOT_VERSION
        || hget(h, SO_CRC, 4) != header_crc(h, table) || slot < SLOT_HEADER) {
        c.bits = ERR_SLOT_HEADER;
        return c;
    }
    c.want = frame_len > slot - SLOT_HEADER ? frame_len - (slot - SLOT_HEADER) : 0;
    if (hget(h, SO_SEQ, 8) != seq) c.bits |= ERR_SLOT_SEQ;
    if (hget(h, SO_OP, 4) != op || hget(h, SO_DTYPE, 4) != dtype || hget(h, SO_N, 8) != ld_sys(d + D_N))
        c.bits |= ERR_SLOT_CALL;
    if (slot != ld_sys(d + D_SLOT) || c.want > ld_sys(d + D_TAIL_CAP)) c.bits |= ERR_SLOT_SIZE;
    c.copy = c.bits ? 0 : c.want;  /* this frame's own mismatches, not the bits its sender reports */
    const u32 peer = (u32)hget(h, SO_ERROR, 4);
    if (peer) c.bits |= peer | ERR_PEER;
    return c;
}

extern "C" __global__ void __launch_bounds__(THREADS)
zipccl_spill_in(u64* blk, u64* ctrl, u32* dev, u32* counters, u64 seq) {
    __shared__ u32 table[256];
    if (seq == 0) site_call(&blk, &seq);
    __shared__ u32 bits;
    __shared__ unsigned long long peer_max;
    __shared__ int due, listed, poster;
    __shared__ Copy list[LIST_MAX];
    crc_table(table);
    const u64 nr = ld_sys(blk + W_NRECV), op = ld_sys(blk + W_OP), dtype = ld_sys(blk + W_DTYPE);
    u64* rd = (u64*)((u8*)blk + ld_sys(blk + W_RECV_AT));
    if (threadIdx.x == 0) {
        bits = 0;
        peer_max = 0;
        due = 0;
        listed = 0;
        poster = atomicAdd(counters + CNT_TICKET, 1u) == 0;
    }
    __syncthreads();
    /* 1. every block alike: check every header; the first block to run writes the request */
    for (u64 f = threadIdx.x; f < nr; f += blockDim.x) {
        u64* d = rd + f * DESC_WORDS;
        const Check c = check_slot(d, seq, op, dtype, table);
        if (c.bits) atomicOr(&bits, c.bits);
        else atomicMax(&peer_max, *(const unsigned long long*)((const u8*)ld_sys(d + D_REGION)
                                                               + SO_MAX_ESCAPES));
        if (c.want) due = 1;
        if (c.copy) {
            const int k = atomicAdd(&listed, 1);
            if (k < LIST_MAX) list[k] = Copy{(u8*)ld_sys(d + D_REGION) + ld_sys(d + D_SLOT),
                                             (const u8*)blk + ld_sys(d + D_TAIL_AT), c.copy};
        }
        if (poster) st_sys(d + D_TAIL_LEN, c.want);
    }
    __threadfence_system();
    __syncthreads();
    if (poster && threadIdx.x == 0) {
        sticky_or(dev, ctrl, bits);
        const u64 own = ld_sys(blk + W_OWN_MAX);
        st_sys(blk + W_MAX_ESC, own > peer_max ? own : peer_max);
        __threadfence_system();
        st_sys(blk + W_IN_REQUEST, seq);
    }
    if (due) {
        /* 2. wait on the CPU (the progress thread), never on later GPU work */
        if (threadIdx.x == 0) {
            unsigned int ns = 32;
            /* a failed progress thread raises ERR_PROGRESS: nothing is due from it then */
            while (ld_sys(blk + W_IN_READY) != seq && !(ld_sys(ctrl + C_HOST_ERR) & ERR_PROGRESS)) {
                __nanosleep(ns);
                if (ns < 8192) ns *= 2;
            }
            __threadfence_system();
        }
        __syncthreads();
        /* 3. the tails into the regions, every block a share */
        if (listed <= LIST_MAX) {
            for (int k = 0; k < listed; ++k) grid_copy<true>(list[k].dst, list[k].src, list[k].len);
        } else {
            for (u64 f = 0; f < nr; ++f) {
                const u64* d = rd + f * DESC_WORDS;
                const Check c = check_slot(d, seq, op, dtype, table);
                if (c.copy) grid_copy<true>((u8*)ld_sys(d + D_REGION) + ld_sys(d + D_SLOT),
                                            (const u8*)blk + ld_sys(d + D_TAIL_AT), c.copy);
            }
        }
    }
    /* 4. the block may be reused */
    if (finish(counters + CNT_IN)) {
        counters[CNT_TICKET] = 0;
        st_sys(blk + W_IN_FREE, seq);
    }
}
"""


def check_slot(d: np.ndarray, seq: int, op: int, dtype: int) -> tuple[int, int, int]:
    """Twin of ``check_slot``: (tail bytes the peer sends, bytes to copy, error bits)."""
    raw = _mem(int(d[D_REGION]), slots.SLOT_HEADER)
    try:
        h = slots.parse_slot_header(raw)
    except ValueError:
        return 0, 0, ERR_SLOT_HEADER
    if h.slot_bytes < slots.SLOT_HEADER:
        return 0, 0, ERR_SLOT_HEADER
    want = slots.tail_bytes(h.frame_len, h.slot_bytes)
    bits = 0
    if h.seq != seq:
        bits |= ERR_SLOT_SEQ
    if h.op != op or h.dtype != dtype or h.n != int(d[D_N]):
        bits |= ERR_SLOT_CALL
    if h.slot_bytes != int(d[D_SLOT]) or want > int(d[D_TAIL_CAP]):
        bits |= ERR_SLOT_SIZE
    copy = 0 if bits else want  # this frame's own mismatches, not the bits its sender reports
    if h.error:
        bits |= h.error | ERR_PEER
    return want, copy, bits


def spill_in(blk: int, ctrl: int, dev: int, counters: int, seq: int) -> None:
    """Twin of ``zipccl_spill_in``: headers checked, request posted, tails in (waits on the
    progress thread, like the kernel), ``W_IN_FREE``."""
    blk, seq = _site(blk, seq)
    w = _mem(blk, HEADER_WORDS, np.uint64)
    rd = _descs(blk, W_RECV_AT, W_NRECV)
    op, dtype = int(w[W_OP]), int(w[W_DTYPE])
    # 1. check every header, write the request
    bits, due, copies, peer_max = 0, False, [], 0
    for d in rd:
        want, copy, b = check_slot(d, seq, op, dtype)
        bits |= b
        if not b:
            peer_max = max(peer_max, slots.parse_slot_header(_mem(int(d[D_REGION]),
                                                                   slots.SLOT_HEADER)).max_escapes)
        due |= want > 0
        if copy:
            copies.append((int(d[D_REGION]) + int(d[D_SLOT]), blk + int(d[D_TAIL_AT]), copy))
        d[D_TAIL_LEN] = want
    _sticky_or(dev, ctrl, bits)
    w[W_MAX_ESC] = max(int(w[W_OWN_MAX]), peer_max)
    w[W_IN_REQUEST] = seq
    if due:
        # 2. wait on the CPU (a failed progress thread owes nothing)
        _spin(lambda: int(w[W_IN_READY]) == seq, ctrl)
        # 3. the tails into the regions
        for dst, src, n in copies:
            _mem(dst, n)[:] = _mem(src, n)
    # 4. the block may be reused
    w[W_IN_FREE] = seq


# -- a captured site's next call: its sequence number and ring block ------------------------

_TAKE_CUDA = r"""
extern "C" __global__ void zipccl_spill_take(u64* site, u64* ctrl) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const u64 gen = ld_sys(site + S_GEN) + 1, ring = ld_sys(site + S_RING);
    u64* blk;
    u64 seq = gen;
    if (ring == 0) {  /* fed: the host's call block and number for this launch */
        blk = (u64*)ld_sys(site + S_FEED + 2 * (gen % FEED_MAX));
        seq = ld_sys(site + S_FEED + 2 * (gen % FEED_MAX) + 1);
    } else {  /* the ring block once its previous call (gen - ring) is done: a wait on the CPU */
        blk = (u64*)ld_sys(site + S_BLOCKS + gen % ring);
        unsigned int ns = 32;
        while (ld_sys(blk + W_HOST_FREE) + ring < gen && !(ld_sys(ctrl + C_HOST_ERR) & ERR_PROGRESS)) {
            __nanosleep(ns);
            if (ns < 8192) ns *= 2;
        }
        st_sys(blk + W_SEQ, gen);
    }
    st_sys(site + S_BLK, (u64)blk), st_sys(site + S_SEQ, seq), st_sys(site + S_GEN, gen);
    __threadfence_system();
}
"""


def spill_take(site: int, ctrl: int) -> None:
    """Twin of ``zipccl_spill_take``: the site's next call numbered, its block named."""
    s = _mem(site, SITE_WORDS, np.uint64)
    gen, ring = int(s[S_GEN]) + 1, int(s[S_RING])
    if ring == 0:
        blk, seq = int(s[S_FEED + 2 * (gen % FEED_MAX)]), int(s[S_FEED + 2 * (gen % FEED_MAX) + 1])
    else:
        w = _mem(blk := int(s[S_BLOCKS + gen % ring]), HEADER_WORDS, np.uint64)
        _spin(lambda: int(w[W_HOST_FREE]) >= gen - ring, ctrl)
        w[W_SEQ] = seq = gen
    s[S_BLK], s[S_SEQ], s[S_GEN] = blk, seq, gen


# -- a decode workspace's error bits into the sticky word ------------------------------------

_RECORD_CUDA = r"""
extern "C" __global__ void zipccl_spill_record(u64* ctrl, u32* dev, const u32* bits) {
    if (blockIdx.x == 0 && threadIdx.x == 0) sticky_or(dev, ctrl, *(const volatile u32*)bits);
}
"""


def spill_record(ctrl: int, dev: int, bits: int) -> None:
    """Twin of ``zipccl_spill_record``: the uint32 at address ``bits`` ORed into the sticky word."""
    _sticky_or(dev, ctrl, int(_mem(bits, 1, np.uint32)[0]))


HOST_TWINS = {"zipccl_spill_out": spill_out, "zipccl_spill_in": spill_in,
              "zipccl_spill_record": spill_record, "zipccl_spill_take": spill_take}


def defines() -> str:
    """The constants the CUDA source takes from Python (slot layout, block layout, bits)."""
    names = {
        "THREADS": THREADS, "LIST_MAX": LIST_MAX, "SLOT_HEADER": slots.SLOT_HEADER,
        "SLOT_MAGIC": int.from_bytes(slots.SLOT_MAGIC, "little"), "SLOT_VERSION": slots.SLOT_VERSION,
        "FRAME_LEN_AT": fmt.FRAME_LEN_AT, "N_ESCAPES_AT": fmt.N_ESCAPES_AT,
        "DESC_WORDS": DESC_WORDS, "C_ERR": C_ERR, "C_HOST_ERR": C_HOST_ERR, "DEV_ERR": DEV_ERR,
        "CNT_OUT": CNT_OUT, "CNT_IN": CNT_IN, "CNT_TICKET": CNT_TICKET,
    }
    names.update({f"SO_{k.upper()}": v for k, v in slots.SLOT_OFFSET.items()})
    g = globals()
    names.update({k: g[k] for k in g if k.startswith(("W_", "D_", "S_", "ERR_SLOT_", "ERR_PEER",
                                                       "ERR_PROGRESS", "FEED_MAX"))})
    return "".join(f"#define {k} {int(v)}u\n" if k.startswith(("ERR_", "SLOT_MAGIC")) else
                   f"#define {k} {int(v)}\n" for k, v in sorted(names.items()))


def source() -> str:
    """The whole CUDA C source of the spill kernels."""
    return defines() + _COMMON_CUDA + _OUT_CUDA + _IN_CUDA + _TAKE_CUDA + _RECORD_CUDA


_MODULES: dict[tuple[int, int], object] = {}
_LOCK = threading.Lock()


def function(cupy, name: str):
    """The kernel ``name`` on the current device (the module compiled once per device)."""
    key = (id(cupy.RawModule), cupy.cuda.runtime.getDevice())
    mod = _MODULES.get(key)
    if mod is None:
        with _LOCK:
            mod = _MODULES.get(key)
            if mod is None:
                mod = _MODULES[key] = kernel_cache.cupy_module(cupy, source(), ("--std=c++14",))
    return mod.get_function(name)
