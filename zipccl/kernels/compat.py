"""Compatibility layer under every zipccl CUDA kernel: one place for version quirks.

Every kernel module imports it first, so no kernel is compiled without it. It patches
``numpy.row_stack`` back in for numba-cuda (NumPy >= 2.5 removed it); gives the warp
intrinsics, 16-byte loads and stores, asynchronous shared-memory copies and ``syncwarp`` one
meaning on a GPU (PTX / LLVM) and under Numba's CUDA simulator (Python with the same results);
supplies ``wrap64`` and ``u32`` so that int64 arithmetic agrees bit for bit in both worlds and
the hot paths compile to 32-bit instructions; and makes the simulator's block scheduling and
shared arrays race-free and quick. docs/KERNELS.md, "The compatibility layer", says why each
exists. Nothing here touches a GPU at import time.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

if not hasattr(np, "row_stack"):  # numpy >= 2.5 removed it; numba-cuda 0.30.4 still uses it
    np.row_stack = np.vstack

from numba import config as _numba_config  # noqa: E402
from numba import cuda  # noqa: E402

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF

if SIMULATOR:
    _LOCK = threading.Lock()
    _M64 = (1 << 64) - 1
    # how long a lane waits for the rest of its warp at a shuffle before the kernel fails (only
    # lanes that take different paths wait forever). With the simulator's scheduling below, a
    # wait lasts as long as the other lanes' Python between two shuffles, far below this even on
    # a heavily loaded machine
    EXCHANGE_TIMEOUT_S = 120

    class _Warp:
        """Rendezvous of the 32 simulated threads of one warp.

        One condition variable and two slot buffers used alternately: exchange g
        writes buffer g % 2, so a lane that runs ahead into exchange g + 1 never
        overwrites values another lane is still reading (a single wait per
        exchange instead of the two a plain barrier needs).
        """

        def __init__(self):
            self.cv = threading.Condition()
            self.count = 0
            self.gen = 0
            self.slots = ([0] * 32, [0] * 32)

    def _warp_of_current_thread():
        t = threading.current_thread()
        mgr = t._manager  # the simulator's BlockManager: one per simulated block
        warps = mgr.__dict__.get("_zipccl_warps")
        if warps is None:
            with _LOCK:
                warps = mgr.__dict__.setdefault("_zipccl_warps", {})
        w = warps.get(t.thread_id // 32)
        if w is None:
            with _LOCK:
                w = warps.setdefault(t.thread_id // 32, _Warp())
        return w, t.thread_id % 32

    def _exchange(value):
        w, lane = _warp_of_current_thread()
        with w.cv:
            g = w.gen
            buf = w.slots[g & 1]
            buf[lane] = value
            w.count += 1
            if w.count == 32:
                w.count = 0
                w.gen += 1
                w.cv.notify_all()
            else:
                while w.gen == g:
                    if threading.current_thread().abort:
                        raise RuntimeError("warp exchange left: another thread of the block failed")
                    if not w.cv.wait(timeout=EXCHANGE_TIMEOUT_S):
                        raise RuntimeError("warp exchange timed out: not all 32 lanes arrived")
        return list(buf), lane

    def wrap64(x):
        """x reduced to a two's-complement int64 (mod 2**64)."""
        v = int(x) & _M64
        return np.int64(v - (1 << 64) if v >> 63 else v)

    def ballot(pred):
        """Bit j set iff lane j's predicate is true (all 32 lanes must call)."""
        vals, _ = _exchange(bool(pred))
        return np.int64(sum(1 << j for j, v in enumerate(vals) if v))

    def shfl(value, src):
        """Lane ``src``'s value."""
        vals, _ = _exchange(value)
        return vals[int(src) & 31]

    def shfl_up(value, delta):
        """Value of lane (lane - delta); a lane below ``delta`` keeps its own."""
        vals, lane = _exchange(value)
        return vals[lane - delta] if lane >= delta else value

    def shfl_xor(value, mask):
        """Value of lane (lane ^ mask)."""
        vals, lane = _exchange(value)
        return vals[lane ^ int(mask)]

    def shfl32(value, src):
        """``shfl`` of a value known to fit in 32 unsigned bits (one shuffle on a GPU)."""
        return np.int64(shfl(int(value) & 0xFFFFFFFF, src))

    def shfl_xor32(value, mask):
        """``shfl_xor`` of a value known to fit in 32 unsigned bits (one shuffle on a GPU)."""
        return np.int64(shfl_xor(int(value) & 0xFFFFFFFF, mask))

    def u32(x):
        """x truncated to an unsigned 32-bit value."""
        return np.uint32(int(x) & 0xFFFFFFFF)

    def shfl_u32(value, src):
        """``shfl`` of a uint32 (one shuffle on a GPU)."""
        return np.uint32(int(shfl(int(value) & 0xFFFFFFFF, src)))

    def shfl_xor_u32(value, mask):
        """``shfl_xor`` of a uint32 (one shuffle on a GPU)."""
        return np.uint32(int(shfl_xor(int(value) & 0xFFFFFFFF, mask)))

    def popc(x):
        """Number of set bits of a non-negative value."""
        return np.int64(bin(int(x)).count("1"))

    def load16(a32, i):
        """Words 4i .. 4i+3 of a uint32 array (one 16-byte load on a GPU)."""
        j = 4 * int(i)
        return (a32[j], a32[j + 1], a32[j + 2], a32[j + 3])

    def store16(a32, i, w0, w1, w2, w3):
        """Store four words at 4i .. 4i+3 of a uint32 array (one 16-byte store on a GPU)."""
        j = 4 * int(i)
        a32[j] = int(w0) & 0xFFFFFFFF
        a32[j + 1] = int(w1) & 0xFFFFFFFF
        a32[j + 2] = int(w2) & 0xFFFFFFFF
        a32[j + 3] = int(w3) & 0xFFFFFFFF

    def atomic_read(a, i):
        """Read a[i] through the atomic unit (coherent with other blocks' atomics).

        The simulator runs one block at a time, so a plain read is coherent.
        """
        return np.int64(a[i])

    def cp_async16(stage, sw, x32, gw):
        """Copy words gw..gw+3 of x32 to words sw..sw+3 of the shared array stage."""
        for k in range(4):
            stage[sw + k] = x32[gw + k]

    def cp_commit():
        pass

    def cp_wait0():
        pass

    def lds16(a, w):
        """Words w..w+3 of a shared uint32 array."""
        return a[w], a[w + 1], a[w + 2], a[w + 3]

    def sts8(a32, b, v):
        """Store the low byte of v at byte b of the shared uint32 array a32."""
        a32.view(np.uint8)[b] = int(v) & 0xFF

    def syncwarp():
        ballot(True)  # all 32 simulated lanes meet here

    import sys as _sys
    import traceback as _traceback

    from numba import types as _types
    from numba.cuda.np import numpy_support as _numpy_support
    from numba.cuda.simulator import kernelapi as _kernelapi

    _shared_array = _kernelapi.FakeCUDAShared.array

    def _aligned_shared_array(self, shape, dtype, alignment=None):
        """The simulator's shared array (one per source line, as Numba's), accepting
        ``alignment``."""
        if shape == 0:
            return _shared_array(self, shape, dtype)
        if isinstance(dtype, _types.Type):
            dtype = _numpy_support.as_dtype(dtype)
        caller = _traceback.extract_stack(_sys._getframe())[-2][0:2]
        res = self._allocations.get(caller)
        if res is None:
            # setdefault, one step under the GIL: with a get-then-store (as Numba's own), two
            # lanes that both found none each kept an array of their own, so what one stored
            # the others never saw; lanes of a warp then took different paths and waited at a
            # warp exchange for lanes that had left
            res = self._allocations.setdefault(caller, np.empty(shape, dtype))
        return res

    _kernelapi.FakeCUDAShared.array = _aligned_shared_array

    # The simulator's own scheduling, made to wait instead of spin. Stock numba-cuda runs a
    # block as one Python thread per CUDA thread and (1) the launching thread polls every
    # lane's is_alive / syncthreads flag in a loop that never sleeps, and (2) every call of a
    # device function takes the per-module lock of swapped_cuda_module twice (to swap the fake
    # cuda module into the callee's globals and back). Together they starve the lanes: each
    # time a lane blocks on that lock or on a warp exchange, the GIL tends to go to the polling
    # thread, which keeps it for a whole switch interval doing nothing useful; with 128 lanes
    # making nested device calls, how long a kernel takes then depends on how the OS schedules
    # the lanes, and a loaded machine stretches it many times over. Below, (1) the
    # launching thread sleeps on a condition that lanes notify when the last of them reaches
    # syncthreads or exits or a lane fails, and (2) a device function's module is swapped once
    # per launch (under a lock, by the first lane that calls into it) and restored when the
    # launch ends, so nested calls take no lock. The kernels see the same cuda module, the same
    # barriers and the same errors as with the stock simulator.
    from numba.cuda.simulator import kernel as _simkernel

    _STOCK_THREAD_RUN = _simkernel.BlockThread.run
    _STOCK_KERNEL_CALL = _simkernel.FakeCUDAKernel.__call__
    _STOCK_PUSH_CONTEXT = _simkernel._push_kernel_context

    def _lane_run(self):
        try:
            _STOCK_THREAD_RUN(self)  # records a failure in self.exception
        finally:
            m = self._manager
            with m._zipccl_cv:
                m._zipccl_exited += 1
                if self.exception and m._zipccl_failed is None:
                    m._zipccl_failed = self
                if self.exception or m._zipccl_at_barrier + m._zipccl_exited == m._zipccl_lanes:
                    m._zipccl_cv.notify()

    def _lane_syncthreads(self):
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        m = self._manager
        with m._zipccl_cv:
            self.syncthreads_blocked = True
            m._zipccl_at_barrier += 1
            if m._zipccl_at_barrier + m._zipccl_exited == m._zipccl_lanes:
                m._zipccl_cv.notify()
        self.syncthreads_event.wait()
        self.syncthreads_event.clear()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def _abort_block(mgr, threads):
        for t in threads:
            t.abort = True
            t.syncthreads_blocked = False
            t.syncthreads_event.set()
        for w in list(mgr.__dict__.get("_zipccl_warps", {}).values()):
            with w.cv:
                w.cv.notify_all()  # lanes waiting at a warp exchange see t.abort and leave

    def _run_block(self, grid_point, *args):
        """BlockManager.run: the same lanes, barriers and errors, without polling."""
        self._zipccl_cv = cv = threading.Condition()
        self._zipccl_at_barrier = self._zipccl_exited = 0
        self._zipccl_failed = None
        self._zipccl_lanes = n = int(np.prod(self._block_dim))

        def target():
            self._f(*args)

        threads = [_simkernel.BlockThread(target, self, grid_point, p, self._debug)
                   for p in np.ndindex(*self._block_dim)]
        for t in threads:
            t.start()
        with cv:
            while True:
                failed = self._zipccl_failed
                if failed is not None:
                    _abort_block(self, threads)
                    raise failed.exception[0].with_traceback(failed.exception[1])
                if self._zipccl_exited == n:
                    break
                if self._zipccl_at_barrier and self._zipccl_at_barrier + self._zipccl_exited == n:
                    self._zipccl_at_barrier = 0  # every live lane waits at syncthreads: release
                    for t in threads:
                        if t.syncthreads_blocked:
                            t.syncthreads_blocked = False
                            t.syncthreads_event.set()
                cv.wait()
        for t in threads:
            t.join()

    _launch_swaps = {}  # id(module globals) -> its swapped_cuda_module context, this launch

    def _call_in_launch(self, *args):
        """FakeCUDAKernel.__call__: inside a launch, swap the callee's module once."""
        ctx = _simkernel._kernel_context
        if ctx is None:
            return _STOCK_KERNEL_CALL(self, *args)
        key = id(self.fn.__globals__)
        if key not in _launch_swaps:
            with _LOCK:
                if key not in _launch_swaps:
                    swap = _kernelapi.swapped_cuda_module(self.fn, ctx)
                    swap.__enter__()
                    _launch_swaps[key] = swap
        return self.fn(*args)

    @contextlib.contextmanager
    def _push_context_and_restore(mod):
        with _STOCK_PUSH_CONTEXT(mod):
            try:
                yield
            finally:
                with _LOCK:
                    swaps = list(_launch_swaps.values())
                    _launch_swaps.clear()
                for swap in swaps:
                    swap.__exit__(None, None, None)

    _simkernel.BlockThread.run = _lane_run
    _simkernel.BlockThread.syncthreads = _lane_syncthreads
    _simkernel.BlockManager.run = _run_block
    _simkernel.FakeCUDAKernel.__call__ = _call_in_launch
    _simkernel._push_kernel_context = _push_context_and_restore

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _ld_v4_u32(typingctx, arr, idx):
        sig = types.UniTuple(types.uint32, 4)(arr, idx)

        def codegen(context, builder, sig, args):
            arrty, idxty = sig.args
            ary = context.make_array(arrty)(context, builder, value=args[0])
            i = context.cast(builder, args[1], idxty, types.int64)
            ptr = builder.gep(ary.data, [builder.mul(i, ir.Constant(ir.IntType(64), 4))])
            vty = ir.VectorType(ir.IntType(32), 4)
            gptr = builder.addrspacecast(builder.bitcast(ptr, vty.as_pointer()), vty.as_pointer(1))
            val = builder.load(gptr, align=16)
            elems = [builder.extract_element(val, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, elems)

        return sig, codegen

    @intrinsic
    def _st_v4_u32(typingctx, arr, idx, w0, w1, w2, w3):
        sig = types.void(arr, idx, w0, w1, w2, w3)

        def codegen(context, builder, sig, args):
            arrty, idxty = sig.args[:2]
            ary = context.make_array(arrty)(context, builder, value=args[0])
            i = context.cast(builder, args[1], idxty, types.int64)
            ptr = builder.gep(ary.data, [builder.mul(i, ir.Constant(ir.IntType(64), 4))])
            vty = ir.VectorType(ir.IntType(32), 4)
            vec = ir.Constant(vty, ir.Undefined)
            for k in range(4):
                w = context.cast(builder, args[2 + k], sig.args[2 + k], types.uint32)
                vec = builder.insert_element(vec, w, ir.Constant(ir.IntType(32), k))
            gptr = builder.addrspacecast(builder.bitcast(ptr, vty.as_pointer()), vty.as_pointer(1))
            builder.store(vec, gptr, align=16)
            return context.get_dummy_value()

        return sig, codegen

    @cuda.jit(device=True, forceinline=True)
    def wrap64(x):
        return x

    @cuda.jit(device=True, forceinline=True)
    def ballot(pred):
        return np.int64(cuda.ballot_sync(FULL_MASK, pred))

    @cuda.jit(device=True, forceinline=True)
    def shfl(value, src):
        return cuda.shfl_sync(FULL_MASK, value, src)

    @cuda.jit(device=True, forceinline=True)
    def shfl_up(value, delta):
        return cuda.shfl_up_sync(FULL_MASK, value, delta)

    @cuda.jit(device=True, forceinline=True)
    def shfl_xor(value, mask):
        return cuda.shfl_xor_sync(FULL_MASK, value, mask)

    @cuda.jit(device=True, forceinline=True)
    def shfl32(value, src):
        return np.int64(cuda.shfl_sync(FULL_MASK, np.int32(value), src)) & 0xFFFFFFFF

    @cuda.jit(device=True, forceinline=True)
    def shfl_xor32(value, mask):
        return np.int64(cuda.shfl_xor_sync(FULL_MASK, np.int32(value), mask)) & 0xFFFFFFFF

    @cuda.jit(device=True, forceinline=True)
    def u32(x):
        # Numba widens every integer operation to 64 bits; truncating each result lets
        # LLVM narrow the whole chain back to 32-bit instructions (half the ALU work)
        return np.uint32(x)

    @cuda.jit(device=True, forceinline=True)
    def shfl_u32(value, src):
        return np.uint32(cuda.shfl_sync(FULL_MASK, np.int32(value), src))

    @cuda.jit(device=True, forceinline=True)
    def shfl_xor_u32(value, mask):
        return np.uint32(cuda.shfl_xor_sync(FULL_MASK, np.int32(value), mask))

    @cuda.jit(device=True, forceinline=True)
    def popc(x):
        return np.int64(cuda.popc(x))

    @cuda.jit(device=True, forceinline=True)
    def load16(a32, i):
        return _ld_v4_u32(a32, i)

    @cuda.jit(device=True, forceinline=True)
    def store16(a32, i, w0, w1, w2, w3):
        _st_v4_u32(a32, i, w0, w1, w2, w3)

    @cuda.jit(device=True, forceinline=True)
    def atomic_read(a, i):
        return cuda.atomic.add(a, i, 0)

    def _asm(text, constraint="~{memory}", args=()):
        return ir.InlineAsm(ir.FunctionType(ir.VoidType(), [a.type for a in args]), text, constraint,
                            side_effect=True)

    @intrinsic
    def _cp_async16(typingctx, stage, sw, x32, gw):
        sig = types.void(stage, sw, x32, gw)

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            st = context.make_array(sig.args[0])(context, builder, value=args[0])
            gx = context.make_array(sig.args[2])(context, builder, value=args[2])
            sp = builder.gep(st.data, [context.cast(builder, args[1], sig.args[1], types.int64)])
            gp = builder.gep(gx.data, [context.cast(builder, args[3], sig.args[3], types.int64)])
            ops = [builder.ptrtoint(sp, i64), builder.ptrtoint(gp, i64)]
            builder.call(_asm("{ .reg .u64 s64; .reg .u32 s32; cvta.to.shared.u64 s64, $0; "
                              "cvt.u32.u64 s32, s64; cp.async.cg.shared.global [s32], [$1], 16; }",
                              "l,l,~{memory}", ops), ops)
            return context.get_dummy_value()

        return sig, codegen

    def _statement(text):
        """An intrinsic of no arguments that emits the PTX statement ``text`` (a memory clobber)."""
        @intrinsic
        def statement(typingctx):
            def codegen(context, builder, sig, args):
                builder.call(_asm(text), [])
                return context.get_dummy_value()

            return types.void(), codegen

        return statement

    _cp_commit = _statement("cp.async.commit_group;")
    _cp_wait0 = _statement("cp.async.wait_group 0;")

    @intrinsic
    def _lds16(typingctx, arr, w):
        sig = types.UniTuple(types.uint32, 4)(arr, w)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            p = builder.gep(ary.data, [context.cast(builder, args[1], sig.args[1], types.int64)])
            vty = ir.VectorType(ir.IntType(32), 4)
            val = builder.load(builder.bitcast(p, vty.as_pointer()), align=16)
            elems = [builder.extract_element(val, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, elems)

        return sig, codegen

    @intrinsic
    def _sts8(typingctx, arr, b, v):
        sig = types.void(arr, b, v)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            p = builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()),
                            [context.cast(builder, args[1], sig.args[1], types.int64)])
            val = context.cast(builder, args[2], sig.args[2], types.uint32)
            builder.store(builder.trunc(val, ir.IntType(8)), p)
            return context.get_dummy_value()

        return sig, codegen

    @cuda.jit(device=True, forceinline=True)
    def cp_async16(stage, sw, x32, gw):
        _cp_async16(stage, sw, x32, gw)

    @cuda.jit(device=True, forceinline=True)
    def cp_commit():
        _cp_commit()

    @cuda.jit(device=True, forceinline=True)
    def cp_wait0():
        _cp_wait0()

    @cuda.jit(device=True, forceinline=True)
    def lds16(a, w):
        return _lds16(a, w)

    @cuda.jit(device=True, forceinline=True)
    def sts8(a32, b, v):
        _sts8(a32, b, v)

    @cuda.jit(device=True, forceinline=True)
    def syncwarp():
        cuda.syncwarp()
