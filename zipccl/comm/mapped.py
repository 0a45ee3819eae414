"""Waiting for a word of mapped memory without the GIL: the spill progress threads' polls.

A spill progress thread (``spill.Spills``, ``spill_sites.Sites``) waits for the device to
write a call's number into a word of pinned, device-mapped host memory. Polled from Python,
every wake of that thread takes the GIL from the caller's thread, which then waits for it
back at its next driver call: on an H200 a thread polling from 50 µs up made the caller's own
steps of a compressed call ~1.5-2x dearer than the same calls polled 100 times less often
(``experiments/README.md``, "The progress thread's polls"). Here the poll is compiled code
that holds no GIL (``@njit(nogil=True)``) and sleeps between reads in the C library's
``usleep``, a call the compiler cannot see into, so the word is read again after each
sleep; the thread takes the GIL once, when the word is there.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_NEVER = np.zeros(1, np.uint64)  # a stop word nobody sets


@intrinsic
def _usleep(typingctx, us):
    """The C library's ``usleep(us)`` (microseconds, a uint32)."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "usleep"), args)

    return types.int32(types.uint32), codegen


@njit(cache=True, nogil=True)
def _poll(words, at, seq, first_us, max_us, stop):  # pragma: no cover -- compiled
    d = first_us
    while words[at] != seq:
        if stop[0] != 0:
            return False
        _usleep(np.uint32(d))
        d = min(2 * d, max_us)
    return True


def wait(words: np.ndarray, at: int, seq: int, first_s: float, max_s: float, stop=None) -> bool:
    """Return once ``words[at] == seq`` (True) or ``stop[0]`` is set (False): ``words`` and
    ``stop`` are uint64 arrays, read from ``first_s`` seconds apart, the interval doubling to
    ``max_s``; the GIL is free meanwhile."""
    first = max(1, int(first_s * 1e6))
    return bool(_poll(words, int(at), np.uint64(seq), first, max(first, int(max_s * 1e6)),
                      _NEVER if stop is None else stop))
