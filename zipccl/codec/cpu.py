"""The CPU fast path: the reference codec's bytes, written by Numba ``@njit`` loops.

Host buffers (CPU clusters, host-staged MPI) are coded here. ``encode`` and
``decode`` have the signatures and the semantics of ``codec/reference.py``,
which stays the specification: the frames are byte-identical (RAW fallback,
zero padding, payload checksum included) and the decoder accepts and rejects
exactly the frames the reference accepts and rejects, with the same messages.

Work is cut along the format's escape blocks (``format.BLOCK`` = 4096 elements,
128 words of each code plane), so every block owns a disjoint slice of the
sign-mantissa plane and of the three code planes, and blocks run in parallel
(``prange``). One pass over the input does everything but the escape bytes'
final placement:

* encode: sign-mantissa bytes, codes (seven compares, no table), the three
  plane words of every 32 values (SWAR bit gather), the escape count, the
  block's escape bytes into a small scratch slot, and the block's share of the
  payload checksum. An exclusive scan of the counts then places each block's
  escapes; a block with more escapes than its slot re-reads its input.
* decode: codes from the plane words, values from a 7-entry table, escapes
  patched in through the scan of the *stored* counts (reads guarded so a
  corrupt frame cannot reach outside the escape section), escape codes counted
  per block, and the block's share of the checksum. The caller then checks the
  checksum and the counts in the reference's order.

The payload checksum (``format.payload_checksum``) is a sum of independent
terms w_i (2i + 1) mod 2**64, so it splits into per-block and per-section
partial sums that add up to exactly the reference's value.

FP32 and FP16 go through the same block loops. An FP32 value's upper half is a
BF16 value (same sign and exponent): one parallel pass splits the values into
upper halves (a scratch array the BF16 loops code) and lower halves (written
straight into the frame's low-halves section); decoding joins them again. An
FP16 value is rewritten as the BF16 pattern whose sign-mantissa byte is the FP16
value's low byte and whose exponent is the FP16 exponent, so the BF16 loops write
its byte plane, code planes, counts and escapes; the same pass writes bit planes
3..5 (FP16 bits 8, 9, 15), and decoding undoes it.

Header, layout and validation stay in Python (``zipccl.format``); only the bulk
loops are compiled. ``cache=True`` keeps compilation (several seconds) to the
first call on a machine.

Threads. Numba's OpenMP workers spin after a parallel region, and so does an MPI
rank waiting in a collective: ranks that share a node and each run as many
threads as the node has cores spend their time waiting for descheduled threads
(40-70x slower on a 2-core machine under ``mpiexec -n 2``). So every call runs
its parallel loops on ``threads_per_call(n)`` threads: one below ``SMALL``
elements (a parallel region costs more than it saves there), otherwise this
process's share of its CPUs -- the CPUs it may run on divided by the ranks the
launcher placed on this node (``local_ranks``) -- and never more than Numba's
own setting (``NUMBA_NUM_THREADS``, ``numba.set_num_threads``).
``ZIPCCL_CPU_THREADS`` overrides the share. The count is set for the call only
(Numba's setting is per thread) and restored afterwards; the bytes never depend
on it.

Calls from several threads at once are safe and give the same bytes: the compiled loops
hold no shared state (every call has its own buffers), the thread count is per thread, and
under Numba's workqueue layer, which is not thread-safe (it aborts the process), the calls
take turns (``_threads``); the OpenMP and TBB layers run them side by side.

The caller's OpenMP settings are left alone. Numba's OpenMP threading layer, when
it starts, sets the OpenMP thread count of the thread that starts it (to
``NUMBA_NUM_THREADS``) and enables nested regions. torch shares the OpenMP runtime
when it is loaded first, reads that count (``torch.get_num_threads()``), and its
CPU kernels' results depend on it, so a first compress on the training thread
would change training bits. ``start_numba_threads`` therefore starts Numba's layer
once, from a short-lived thread of its own, and puts back the process-wide setting.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from contextlib import contextmanager

import numba
import numpy as np
from numba import njit, prange

from .. import format as fmt
from ..codebook import Codebook

_BLOCK = fmt.BLOCK
_SLOT = fmt.BLOCK // 8  # escape bytes a block keeps in scratch before it re-reads its input
_CHUNK_WORDS = 1 << 16  # checksum words per parallel chunk
_PARALLEL_WORDS = 1 << 19  # sections longer than this (2 MiB) are summed in parallel
_HDR = fmt.HEADER_SIZE
# SWAR bit gather: (8 bytes, each 0 or 1) * _GATHER >> 56 moves byte i's bit to bit i.
# Each partial product lands on its own bit position, so nothing carries into the top byte.
_GATHER = np.uint64(0x0102040810204080)
_ONES = np.uint64(0x0101010101010101)
# De Bruijn table for the index of the lowest set bit of a uint32.
_DEBRUIJN = np.array([0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8,
                      31, 27, 13, 23, 21, 19, 16, 7, 26, 12, 18, 6, 11, 5, 10, 9], dtype=np.uint8)

assert fmt.BLOCK % 32 == 0 and fmt.HEADER_SIZE % 4 == 0 and fmt.ALIGN % 4 == 0
assert np.little_endian, "the CPU codec reads and writes little-endian words directly"

# Below this many elements a call runs on one thread: on the 2-core dev box one and
# two threads take the same time up to 64 Ki elements (experiments/README.md).
SMALL = 1 << 16
ENV_THREADS = "ZIPCCL_CPU_THREADS"
# Ranks on this node, as launchers state it: MPICH / Intel MPI (Hydra), Open MPI,
# MVAPICH2, Cray PALS, torchrun.
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "PALS_LOCAL_SIZE", "LOCAL_WORLD_SIZE")


# ---------------------------------------------------------------- threads


def _positive_int(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _slurm_local_tasks(env) -> int | None:
    """Tasks of this node in a Slurm step: SLURM_STEP_TASKS_PER_NODE (e.g. "4(x2),3", one
    entry per node) at index SLURM_NODEID."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE")
    try:
        node = int(env.get("SLURM_NODEID", "0"))
    except ValueError:
        return None
    if not spec:
        return None
    counts = []
    for part in spec.split(","):
        count, _, times = part.partition("(x")
        counts += [count] * (_positive_int(times.rstrip(")")) or 1)
    return _positive_int(counts[node]) if 0 <= node < len(counts) else None


def local_ranks(env=None) -> int:
    """How many processes of this job the launcher placed on this node (1 if none says).

    >>> local_ranks({"MPI_LOCALNRANKS": "2"}), local_ranks({})
    (2, 1)
    """
    env = os.environ if env is None else env
    for name in _LOCAL_SIZE_VARS:
        if (value := _positive_int(env.get(name))) is not None:
            return value
    return _slurm_local_tasks(env) or 1


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def rank_threads() -> int:
    """This process's share of the CPUs: ``ZIPCCL_CPU_THREADS``, else the CPUs it may run
    on divided by ``local_ranks()`` (at least 1). Read once per process."""
    forced = _positive_int(os.environ.get(ENV_THREADS))
    if forced is not None:
        return forced
    return max(1, _usable_cpus() // local_ranks())


# Shared libraries of the OpenMP runtimes Numba's omp layer may be linked against.
_OPENMP_LIBS = ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so")
_START_LOCK = threading.Lock()
_started = False


def _resident_openmp():
    """The OpenMP runtime already loaded in this process that Numba's omp layer would call
    (looked up as the dynamic linker resolves that layer's symbols: the global scope first,
    then a loaded runtime of a known name), or None; never loads one."""
    handles = []
    try:
        handles.append(ctypes.CDLL(None))
    except (OSError, TypeError):  # no such handle on this platform
        pass
    if hasattr(os, "RTLD_NOLOAD"):
        for name in _OPENMP_LIBS:
            try:
                handles.append(ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NOW))
            except OSError:  # not loaded
                pass
    for lib in handles:
        if all(hasattr(lib, f) for f in ("omp_get_max_threads", "omp_set_num_threads",
                                         "omp_get_max_active_levels", "omp_set_max_active_levels")):
            return lib
    return None


def start_numba_threads() -> None:
    """Start Numba's threading layer (once per process) and leave the OpenMP settings as
    they were: the calling thread's thread count and the nesting depth. Does nothing once
    the layer runs.

    Numba's omp layer, when it starts, sets the starting thread's OpenMP thread count (to
    ``NUMBA_NUM_THREADS``) and enables nested regions. It starts here on a thread that exits
    right after, so a per-thread setting changes there only; what an OpenMP runtime keeps
    for the whole process (the nesting depth in GNU OpenMP) is put back afterwards, when a
    runtime was loaded before (torch's, typically). Numba's parallel regions name their
    thread count explicitly, so they run on Numba's threads either way.

    >>> start_numba_threads(); numba.threading_layer() in ("omp", "tbb", "workqueue")
    True
    """
    global _started
    if _started:
        return
    with _START_LOCK:
        if _started:
            return
        omp = _resident_openmp()
        saved = (omp.omp_get_max_threads(), omp.omp_get_max_active_levels()) if omp else None
        failure: list[BaseException] = []

        def start() -> None:
            try:
                numba.get_num_threads()  # starts the layer on this thread
            except BaseException as e:  # noqa: BLE001 -- raised again on the caller's thread
                failure.append(e)

        starter = threading.Thread(target=start, name="zipccl-numba-start")
        starter.start()
        starter.join()
        if saved is not None:
            if omp.omp_get_max_active_levels() != saved[1]:
                omp.omp_set_max_active_levels(saved[1])
            if omp.omp_get_max_threads() != saved[0]:
                omp.omp_set_num_threads(saved[0])
        if failure:
            raise failure[0]
        _started = True


def threads_per_call(n: int) -> int:
    """Threads a call on ``n`` elements runs on (this thread's Numba setting caps it).

    >>> threads_per_call(1)
    1
    """
    start_numba_threads()
    if n < SMALL:
        return 1
    return max(1, min(rank_threads(), numba.get_num_threads()))


# Numba's workqueue layer (taken where neither OpenMP nor TBB is available) aborts the
# process when two threads run parallel regions at once; under it, calls take turns.
_WORKQUEUE_LOCK = threading.RLock()


@contextmanager
def _threads(n: int):
    """Run the enclosed parallel loops on ``threads_per_call(n)`` threads, then restore
    (under Numba's workqueue layer, one thread's call at a time)."""
    start_numba_threads()
    serial = numba.threading_layer() == "workqueue"
    if serial:
        _WORKQUEUE_LOCK.acquire()
    before = numba.get_num_threads()
    wanted = threads_per_call(n)
    try:
        if wanted != before:
            numba.set_num_threads(wanted)
        yield
    finally:
        if wanted != before:
            numba.set_num_threads(before)
        if serial:
            _WORKQUEUE_LOCK.release()


# ---------------------------------------------------------------- compiled loops
# The uint32 views (planes, counts, words) are made in NumPy and passed in: Numba
# 0.68 does not see that a ``.view`` taken inside a ``parallel=True`` function
# aliases its base, and drops the stores made through it.


@njit(cache=True, nogil=True)
def _tail_term(tail, index):  # pragma: no cover - compiled
    """The term of a last, partial word (< 4 bytes, zero-padded) at word ``index``."""
    w = np.uint64(0)
    for k in range(tail.size):
        w |= np.uint64(tail[k]) << np.uint64(8 * k)
    return w * np.uint64(2 * index + 1)


@njit(cache=True, nogil=True)
def _words_sum(words, base):  # pragma: no cover - compiled
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
def _words_sum_parallel(words, base):  # pragma: no cover - compiled
    """``_words_sum`` over chunks of _CHUNK_WORDS words in parallel (long sections)."""
    nwords = words.size
    nchunks = (nwords + _CHUNK_WORDS - 1) // _CHUNK_WORDS
    partial = np.zeros(nchunks, dtype=np.uint64)
    for c in prange(nchunks):
        lo = c * _CHUNK_WORDS
        partial[c] = _words_sum(words[lo:min(lo + _CHUNK_WORDS, nwords)], base + lo)
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


@njit(cache=True, parallel=True, nogil=True)
def _encode_blocks(bits, cb, sm, sm_words, planes, stride_words, plane_base,
                   scratch, counts, partial):  # pragma: no cover - compiled
    """Everything that depends on one block alone, for every block in parallel.

    Writes the sign-mantissa bytes (``sm``), the plane words (``planes``, plane k at
    word k * stride_words), the block's escape count (``counts``), its first _SLOT
    escape bytes (``scratch``) and its checksum share (``partial``): the sm words it
    fills completely and its plane words. ``plane_base`` is the checksum word index
    of plane 0's first word.
    """
    n = bits.size
    n_blocks = counts.size
    c0, c1, c2, c3, c4, c5, c6 = cb[0], cb[1], cb[2], cb[3], cb[4], cb[5], cb[6]
    for b in prange(n_blocks):
        lo = b * _BLOCK
        hi = min(lo + _BLOCK, n)
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
        q0 = planes[w0:w0 + nw]
        q1 = planes[stride_words + w0:stride_words + w0 + nw]
        q2 = planes[2 * stride_words + w0:2 * stride_words + w0 + nw]
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
        slot = scratch[b * _SLOT:(b + 1) * _SLOT]
        for w in range(nw):
            mask = np.uint32(np.uint32(0xFFFFFFFF) ^ (q0[w] | q1[w] | q2[w]))
            valid = min(32, m - 32 * w)
            if valid < 32:
                mask &= (np.uint32(1) << np.uint32(valid)) - np.uint32(1)
            while mask:
                j = _ctz(mask)
                mask &= mask - np.uint32(1)
                if e < _SLOT:
                    slot[e] = np.uint8((xb[32 * w + j] >> 7) & 0xFF)
                e += 1
        counts[b] = e
        # Checksum share: the block's plane words and the sm words it fills completely
        # (sm word k is payload word k: the sm plane starts right after the header).
        partial[b] = (_words_sum(q0, plane_base + w0)
                      + _words_sum(q1, plane_base + stride_words + w0)
                      + _words_sum(q2, plane_base + 2 * stride_words + w0)
                      + _words_sum(sm_words[lo // 4:hi // 4], lo // 4))


@njit(cache=True, parallel=True, nogil=True)
def _place_escapes(bits, cb, scratch, counts, start, escapes):  # pragma: no cover - compiled
    """Copy each block's escape bytes to escapes[start[b]:]; re-read overflowing blocks."""
    n = bits.size
    c0, c1, c2, c3, c4, c5, c6 = cb[0], cb[1], cb[2], cb[3], cb[4], cb[5], cb[6]
    for b in prange(counts.size):
        c = counts[b]
        dst = escapes[start[b]:start[b] + c]
        if c <= _SLOT:
            src = scratch[b * _SLOT:b * _SLOT + c]
            for k in range(c):
                dst[k] = src[k]
        else:
            xb = bits[b * _BLOCK:min(b * _BLOCK + _BLOCK, n)]
            k = 0
            for i in range(xb.size):
                e = np.uint8((xb[i] >> 7) & 0xFF)
                if _code(e, c0, c1, c2, c3, c4, c5, c6) == 0:
                    dst[k] = e
                    k += 1


@njit(cache=True, parallel=True, nogil=True)
def _decode_blocks(sm, sm_words, planes, stride_words, plane_base, stored, table, escapes,
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
        lo = b * _BLOCK
        hi = min(lo + _BLOCK, n)
        m = hi - lo
        nw = (m + 31) // 32
        w0 = lo // 32
        q0 = planes[w0:w0 + nw]
        q1 = planes[stride_words + w0:stride_words + w0 + nw]
        q2 = planes[2 * stride_words + w0:2 * stride_words + w0 + nw]
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
            mask = np.uint32(np.uint32(0xFFFFFFFF) ^ (q0[w] | q1[w] | q2[w]))
            valid = min(32, m - 32 * w)
            if valid < 32:
                mask &= (np.uint32(1) << np.uint32(valid)) - np.uint32(1)
            while mask:
                j = _ctz(mask)
                mask &= mask - np.uint32(1)
                if e < limit:
                    ob[32 * w + j] |= np.uint16(escapes[base + e]) << 7
                e += 1
        seen[b] = e
        if with_checksum:
            partial[b] = (_words_sum(q0, plane_base + w0)
                          + _words_sum(q1, plane_base + stride_words + w0)
                          + _words_sum(q2, plane_base + 2 * stride_words + w0)
                          + _words_sum(sm_words[lo // 4:hi // 4], lo // 4))
        else:
            partial[b] = 0


@njit(cache=True, parallel=True, nogil=True)
def _split32(bits, hi, lo):  # pragma: no cover - compiled
    """FP32 patterns -> upper halves (``hi``) and lower halves (``lo``), block-parallel."""
    n = bits.size
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        lo_i = b * _BLOCK
        xb = bits[lo_i:min(lo_i + _BLOCK, n)]
        hb = hi[lo_i:min(lo_i + _BLOCK, n)]
        lb = lo[lo_i:min(lo_i + _BLOCK, n)]
        for i in range(xb.size):
            v = xb[i]
            hb[i] = np.uint16(v >> np.uint32(16))
            lb[i] = np.uint16(v & np.uint32(0xFFFF))


@njit(cache=True, parallel=True, nogil=True)
def _join32(hi, lo, out):  # pragma: no cover - compiled
    """Inverse of ``_split32``."""
    n = out.size
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        lo_i = b * _BLOCK
        hb = hi[lo_i:min(lo_i + _BLOCK, n)]
        lb = lo[lo_i:min(lo_i + _BLOCK, n)]
        ob = out[lo_i:min(lo_i + _BLOCK, n)]
        for i in range(ob.size):
            ob[i] = (np.uint32(hb[i]) << np.uint32(16)) | np.uint32(lb[i])


@njit(cache=True, parallel=True, nogil=True)
def _fp16_split(bits, pseudo, raw_planes, stride_words):  # pragma: no cover - compiled
    """FP16 patterns -> the BF16 patterns the block loops code (low byte as sign-mantissa
    byte, the 5-bit exponent as exponent) and the words of bit planes 3..5 (``raw_planes``,
    plane k at word k * stride_words; bits past n are 0)."""
    n = bits.size
    words = (n + 31) // 32
    for b in prange((words + 127) // 128):
        w_lo = b * 128
        w_hi = min(w_lo + 128, words)
        for w in range(w_lo, w_hi):
            p8 = np.uint32(0)
            p9 = np.uint32(0)
            p15 = np.uint32(0)
            for j in range(min(32, n - 32 * w)):
                v = np.uint32(bits[32 * w + j])
                pseudo[32 * w + j] = np.uint16((v & np.uint32(0x7F)) | ((v & np.uint32(0x80)) << np.uint32(8))
                                               | (((v >> np.uint32(10)) & np.uint32(0x1F)) << np.uint32(7)))
                p8 |= ((v >> np.uint32(8)) & np.uint32(1)) << np.uint32(j)
                p9 |= ((v >> np.uint32(9)) & np.uint32(1)) << np.uint32(j)
                p15 |= ((v >> np.uint32(15)) & np.uint32(1)) << np.uint32(j)
            raw_planes[w] = p8
            raw_planes[stride_words + w] = p9
            raw_planes[2 * stride_words + w] = p15


@njit(cache=True, parallel=True, nogil=True)
def _fp16_join(pseudo, raw_planes, stride_words, out):  # pragma: no cover - compiled
    """Inverse of ``_fp16_split`` (exponents above 31 are cut to 5 bits; the caller has
    rejected such escapes already)."""
    n = out.size
    words = (n + 31) // 32
    for b in prange((words + 127) // 128):
        w_lo = b * 128
        w_hi = min(w_lo + 128, words)
        for w in range(w_lo, w_hi):
            p8 = raw_planes[w]
            p9 = raw_planes[stride_words + w]
            p15 = raw_planes[2 * stride_words + w]
            for j in range(min(32, n - 32 * w)):
                p = np.uint32(pseudo[32 * w + j])
                jj = np.uint32(j)
                out[32 * w + j] = np.uint16((p & np.uint32(0x7F)) | ((p >> np.uint32(8)) & np.uint32(0x80))
                                            | (((p >> np.uint32(7)) & np.uint32(0x1F)) << np.uint32(10))
                                            | (((p8 >> jj) & np.uint32(1)) << np.uint32(8))
                                            | (((p9 >> jj) & np.uint32(1)) << np.uint32(9))
                                            | (((p15 >> jj) & np.uint32(1)) << np.uint32(15)))


# ---------------------------------------------------------------- host side


def _words(frame: np.ndarray, start: int, stop: int) -> np.ndarray:
    """frame[start:stop] (a multiple of 4 bytes) as little-endian uint32 words."""
    return frame[start:stop].view("<u4")


def _section_sum(frame: np.ndarray, start: int, stop: int) -> int:
    """Checksum terms of frame bytes [start, stop); start is word-aligned in the payload.

    Bytes past the last whole word are the frame's last bytes (zero-padded).
    """
    if stop <= start:
        return 0
    split = start + (stop - start) // 4 * 4
    words, base = _words(frame, start, split), (start - _HDR) // 4
    # A parallel region costs more than it saves on short sections.
    total = int(_words_sum_parallel(words, base) if words.size > _PARALLEL_WORDS
                else _words_sum(words, base))
    if split < stop:
        total += int(_tail_term(frame[split:stop], base + words.size))
    return total


def payload_checksum(frame: np.ndarray, frame_len: int) -> int:
    """``format.payload_checksum``, computed in parallel (the same value).

    >>> import numpy as np
    >>> from zipccl import format as fmt
    >>> buf = np.arange(300, dtype=np.uint16).view(np.uint8)
    >>> payload_checksum(buf, 555) == fmt.payload_checksum(buf, 555)
    True
    """
    buf = np.ascontiguousarray(np.asarray(frame).reshape(-1).view(np.uint8))
    with _threads(frame_len // 2):
        return _section_sum(buf, _HDR, frame_len) & 0xFFFFFFFFFFFFFFFF


def _static_rest_sum(frame: np.ndarray, lay: fmt.Layout) -> int:
    """Checksum terms of the static part that no block covers: the last partial sm
    word and the padding after the sm plane, each code plane's padding words, FP16's
    raw bit planes, the counts and their padding, FP32's low halves and their padding."""
    total = _section_sum(frame, _HDR + lay.n // 4 * 4, lay.planes_offset)
    for k in range(3):
        total += _section_sum(frame, lay.plane_offset(k) + 4 * lay.plane_words,
                              lay.plane_offset(k) + lay.plane_stride)
    total += _section_sum(frame, lay.plane_offset(3), lay.counts_offset)
    return total + _section_sum(frame, lay.counts_offset, lay.escapes_offset)


def _sm_words(frame: np.ndarray, n: int) -> np.ndarray:
    return _words(frame, _HDR, _HDR + n // 4 * 4)


def _planes(frame: np.ndarray, lay: fmt.Layout) -> np.ndarray:
    return _words(frame, lay.planes_offset, lay.planes_offset + 3 * lay.plane_stride)


def _as_frame_bytes(frame) -> np.ndarray:
    # Exactly the reference's view of its argument.
    return np.frombuffer(frame, dtype=np.uint8) if not isinstance(frame, np.ndarray) \
        else frame.reshape(-1).view(np.uint8)


def encode(bits: np.ndarray, codebook: Codebook, shape: tuple[int, ...] | None = None,
           checksum: bool = True, dtype=None) -> np.ndarray:
    """Compress bit patterns into one frame: the reference's bytes, faster.

    ``bits`` and ``dtype`` as in ``reference.encode``: uint16 BF16 (default) or FP16
    (``dtype="float16"``) patterns, uint32 FP32 patterns.

    >>> import numpy as np
    >>> from zipccl.codec import reference
    >>> bits = np.arange(0, 65536, 7, dtype=np.uint16)
    >>> cb = Codebook.from_sigma(0.02)
    >>> bool(np.array_equal(encode(bits, cb), reference.encode(bits, cb)))
    True
    """
    from .reference import element_dtype

    code = element_dtype(bits, dtype)
    fmt.check_codebook(codebook.exponents, code)
    bits = np.ascontiguousarray(bits).reshape(-1)
    bits = bits.view(np.uint32 if code == fmt.DTYPE_FP32 else np.uint16)
    shape = (bits.size,) if shape is None else tuple(int(d) for d in shape)
    with _threads(bits.size):
        return _encode(bits, codebook, shape, checksum, code)


def _encode(bits: np.ndarray, codebook: Codebook, shape: tuple[int, ...],
            checksum: bool, code: int = fmt.DTYPE_BF16) -> np.ndarray:
    n = bits.size
    lay = fmt.Layout.for_count(n, code)
    cb = codebook.as_array()

    # Sized for the longest compressed frame, trimmed once the escapes are counted;
    # pages of the tail that are never written are never touched.
    frame = np.empty(lay.compressed_len(n), dtype=np.uint8)
    coded = bits  # the 16-bit patterns the BF16 block loops code
    if code == fmt.DTYPE_FP32:
        coded = np.empty(n, dtype=np.uint16)
        _split32(bits, coded, frame[lay.lo_offset:lay.lo_offset + 2 * n].view(np.uint16))
    elif code == fmt.DTYPE_FP16:
        coded = np.empty(n, dtype=np.uint16)
        _fp16_split(bits, coded, _words(frame, lay.plane_offset(3), lay.counts_offset),
                    lay.plane_stride // 4)
    counts = np.empty(lay.n_blocks, dtype=np.int64)
    partial = np.empty(lay.n_blocks, dtype=np.uint64)
    scratch = np.empty(lay.n_blocks * _SLOT, dtype=np.uint8)
    _encode_blocks(coded, cb, frame[lay.sm_offset:lay.sm_offset + n], _sm_words(frame, n),
                   _planes(frame, lay), lay.plane_stride // 4,
                   (lay.planes_offset - _HDR) // 4, scratch, counts, partial)
    n_esc = int(counts.sum())

    if lay.is_raw(n_esc):
        frame = np.empty(lay.raw_size, dtype=np.uint8)
        frame[_HDR:] = bits.view(np.uint8)
        flags, n_esc = fmt.FLAG_RAW, 0
        total = payload_checksum(frame, frame.size) if checksum else 0
    else:
        # Zero every padding byte of the static part, then the counts.
        frame[_HDR + n:lay.planes_offset] = 0
        for k in range(lay.n_planes):
            frame[lay.plane_offset(k) + 4 * lay.plane_words:
                  lay.plane_offset(k) + lay.plane_stride] = 0
        frame[lay.counts_offset:lay.lo_offset] = 0
        frame[lay.lo_offset + lay.lo_size:lay.escapes_offset] = 0
        _words(frame, lay.counts_offset, lay.counts_offset + 4 * lay.n_blocks)[:] = counts
        start = np.zeros(lay.n_blocks, dtype=np.int64)
        np.cumsum(counts[:-1], out=start[1:])
        end = lay.compressed_len(n_esc)
        _place_escapes(coded, cb, scratch, counts, start, frame[lay.escapes_offset:end])
        # Give the unused tail back (a shrinking realloc; nothing else refers to this
        # buffer yet).
        frame.resize(end, refcheck=False)
        flags = 0
        total = 0
        if checksum:
            total = (int(partial.sum(dtype=np.uint64)) + _static_rest_sum(frame, lay)
                     + _section_sum(frame, lay.escapes_offset, end)) & 0xFFFFFFFFFFFFFFFF

    if checksum:
        flags |= fmt.FLAG_CHECKSUM
    header = fmt.Header(n=n, n_escapes=n_esc, frame_len=frame.size, flags=flags,
                        codebook=codebook.exponents, shape=shape, checksum=total, dtype=code)
    frame[:_HDR] = fmt.pack_header(header)
    return frame


def decode(frame) -> tuple[np.ndarray, fmt.Header]:
    """Decompress a frame into (bit patterns of its shape, header): uint16 for BF16 and
    FP16 frames, uint32 for FP32 frames.

    Accepts and rejects exactly what ``reference.decode`` does, with the same
    ValueError messages, in the same order: bad header or length (``parse_header``),
    payload checksum mismatch, a block whose escape count disagrees with its codes,
    counts that do not add up to the header's total, an FP16 escape above 31.
    """
    buf = _as_frame_bytes(frame)
    h = fmt.parse_header(buf)
    with _threads(h.n):
        return _decode(buf, h)


def _decode(buf: np.ndarray, h: fmt.Header) -> tuple[np.ndarray, fmt.Header]:
    # Always a read-only view: one compiled specialization serves writable arrays,
    # bytes and other read-only buffers alike (each one costs seconds of compilation).
    buf = np.ascontiguousarray(buf).view()
    buf.flags.writeable = False
    n = h.n
    lay = fmt.Layout.for_count(n, h.dtype)
    if h.raw:
        if h.has_checksum and payload_checksum(buf, h.frame_len) != h.checksum:
            raise ValueError("corrupted zipccl frame: payload checksum mismatch")
        if h.dtype == fmt.DTYPE_FP32:
            bits = buf[_HDR:_HDR + 4 * n].view("<u4").astype(np.uint32)
        else:
            bits = buf[_HDR:_HDR + 2 * n].view("<u2").astype(np.uint16)
        return bits.reshape(h.shape), h

    table = np.zeros(8, dtype=np.uint8)
    table[1:] = h.codebook
    out = np.empty(n, dtype=np.uint16)
    counts = _words(buf, lay.counts_offset, lay.counts_offset + 4 * lay.n_blocks)
    seen = np.empty(lay.n_blocks, dtype=np.int64)
    partial = np.empty(lay.n_blocks, dtype=np.uint64)
    _decode_blocks(buf[lay.sm_offset:lay.sm_offset + n], _sm_words(buf, n), _planes(buf, lay),
                   lay.plane_stride // 4, (lay.planes_offset - _HDR) // 4, counts, table,
                   buf[lay.escapes_offset:h.frame_len], out, h.has_checksum, seen, partial)
    if h.has_checksum:
        total = (int(partial.sum(dtype=np.uint64)) + _static_rest_sum(buf, lay)
                 + _section_sum(buf, lay.escapes_offset, h.frame_len)) & 0xFFFFFFFFFFFFFFFF
        if total != h.checksum:
            raise ValueError("corrupted zipccl frame: payload checksum mismatch")
    fmt.check_escape_counts(seen, counts, h.n_escapes)
    if h.dtype == fmt.DTYPE_FP32:
        full = np.empty(n, dtype=np.uint32)
        _join32(out, buf[lay.lo_offset:lay.lo_offset + 2 * n].view(np.uint16), full)
        out = full
    elif h.dtype == fmt.DTYPE_FP16:
        fmt.check_escape_values(buf[lay.escapes_offset:h.frame_len], h.dtype)
        fp16 = np.empty(n, dtype=np.uint16)
        _fp16_join(out, _words(buf, lay.plane_offset(3), lay.counts_offset),
                   lay.plane_stride // 4, fp16)
        out = fp16
    return out.reshape(h.shape), h
