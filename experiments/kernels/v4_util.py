"""Kernel version 4: small device helpers shared by v4_encode.py and v4_decode.py.

Why they exist: the v4 kernels keep every per-value operation in 32-bit registers and
use Hopper's byte permute (PRMT) to move whole bytes, which Numba does not expose
directly. Each helper has one meaning on a GPU and under Numba's CUDA simulator
(where it is plain Python), like ``zipccl.kernels.compat``.

* ``prmt(a, b, s)``: byte permute (PTX ``prmt.b32``). Result byte k is byte
  ``(s >> 4k) & 7`` of the 8-byte value ``b << 32 | a``; only selector nibbles with
  bit 3 clear are used (PTX's sign-replicate mode is not modelled by the simulator).
* ``shfl_up_u32`` / ``shfl_idx_u32``: warp shuffles of a uint32 (one SHFL each).
* ``popc32``: population count of a uint32 as a uint32.
* ``dev``: the device-function decorator; on a GPU it forces inlining so that the
  round functions are specialised for full tiles and the tail tile.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from zipccl.kernels import compat

FULL_MASK = 0xFFFFFFFF

if compat.SIMULATOR:
    dev = cuda.jit(device=True)

    def prmt(a, b, s):
        """Byte permute of (b:a) by selector s (nibbles 0..7)."""
        src = (int(b) & 0xFFFFFFFF) << 32 | (int(a) & 0xFFFFFFFF)
        s = int(s)
        r = 0
        for k in range(4):
            sel = (s >> (4 * k)) & 7
            r |= ((src >> (8 * sel)) & 0xFF) << (8 * k)
        return np.uint32(r)

    def shfl_up_u32(v, d):
        return np.uint32(int(compat.shfl_up(int(v) & 0xFFFFFFFF, d)))

    def shfl_idx_u32(v, src):
        return np.uint32(int(compat.shfl(int(v) & 0xFFFFFFFF, src)))

    def popc32(x):
        return np.uint32(bin(int(x) & 0xFFFFFFFF).count("1"))

else:
    dev = cuda.jit(device=True, forceinline=True)

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

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
        return np.uint32(cuda.shfl_up_sync(FULL_MASK, np.int32(v), d))

    @cuda.jit(device=True, forceinline=True)
    def shfl_idx_u32(v, src):
        return np.uint32(cuda.shfl_sync(FULL_MASK, np.int32(v), src))

    @cuda.jit(device=True, forceinline=True)
    def popc32(x):
        return np.uint32(cuda.popc(np.uint32(x)))


_SM_COUNT: list[int] = []


def sm_count() -> int:
    """Multiprocessors of the current device (1 under the simulator)."""
    if compat.SIMULATOR:
        return 1
    if not _SM_COUNT:
        _SM_COUNT.append(int(cuda.get_current_device().MULTIPROCESSOR_COUNT))
    return _SM_COUNT[0]
