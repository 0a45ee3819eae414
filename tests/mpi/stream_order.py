"""Stream-order check of the device collectives: every buffer hand-off between streams is ordered.

    mpiexec -n 2 python tests/mpi/stream_order.py [DIR]      # exits 0 when no race is found

On a GPU the device engine splits each collective over three streams (the caller's
for encoding, a transfer stream for NCCL, a decode stream), ordered only by events.
A missing ``wait_event`` is a race that a slow link hides and a fast one (NVLink)
exposes: a kernel reads a buffer before the transfer that fills it has finished, or
a buffer is zeroed or reused while another stream still uses it. Such races do not
show on the host, where ``fake_cupy`` runs every operation at once.

This script runs the device path on ``fake_cupy`` (CuPy and NCCL stood in for on the
host), with the GPU codec replaced by the CPU codec behind the same entry points, and
tracks *happens-before* the way CUDA defines it: every stream has a vector clock;
an operation enqueued on a stream ticks it and inherits what the host has already
waited for; ``Event.record`` snapshots a stream's clock, ``Stream.wait_event`` joins
it, ``synchronize`` joins it into the host's. Every device operation declares the
byte ranges it reads and writes (allocation and zeroing, copies, ``get``/``set``, the
reduction kernel, NCCL calls, encode and decode with their workspaces, the spill kernels
from their call blocks' frame descriptors); two accesses
to overlapping bytes from different streams, at least one a write, must be ordered,
or the run reports a race with both operations named. All streams count as
non-blocking (no implicit ordering through the legacy default stream), which is what
the engine's own streams and a caller's ``Stream(non_blocking=True)`` are.

The collectives run pipelined in several rounds and in one round, with growing
messages and no host synchronisation between calls (as a training loop calls them),
and must return exactly the expected bits; a decode workspace outgrown in the middle of a
call must still report its errors. Two negative controls must be caught: the decode
stream without its wait for the transfer, and the spill-in kernel on the caller's stream.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # zipccl.kernels._common is imported, never run
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_cupy  # noqa: E402

cupy = fake_cupy.install()

from mpi4py import MPI  # noqa: E402


class Race(AssertionError):
    pass


# -- happens-before bookkeeping ----------------------------------------------------------------

_clock: dict[int, dict[int, int]] = {}  # stream ptr -> vector clock
_host: dict[int, int] = {}  # what the host has waited for
_history: list[tuple[int, int, bool, int, int, str]] = []  # lo, hi, write, stream, tick, what
_stack: list = []


def _join(a: dict[int, int], b: dict[int, int]) -> None:
    for k, v in b.items():
        if a.get(k, 0) < v:
            a[k] = v


def _ptr(s) -> int:
    if s is None:
        s = current_stream()
    return int(s if isinstance(s, int) else s.ptr)


def _span(a) -> tuple[int, int]:
    lo = a.__array_interface__["data"][0]
    return lo, lo + a.nbytes


def op(stream, what: str, reads=(), writes=()) -> None:
    """Enqueue one device operation on ``stream`` touching the (lo, hi) byte ranges given."""
    s = _ptr(stream)
    vc = _clock.setdefault(s, {})
    _join(vc, _host)  # enqueued after everything the host has seen complete
    vc[s] = vc.get(s, 0) + 1
    mine = [(lo, hi, False) for lo, hi in reads] + [(lo, hi, True) for lo, hi in writes]
    for lo, hi, w in mine:
        if hi <= lo:
            continue
        for plo, phi, pw, ps, ptick, pwhat in _history:
            if ps != s and (w or pw) and plo < hi and lo < phi and vc.get(ps, 0) < ptick:
                raise Race(f"rank {MPI.COMM_WORLD.Get_rank()}: '{what}' on stream {s:#x} "
                           f"{'writes' if w else 'reads'} bytes that '{pwhat}' on stream {ps:#x} "
                           f"{'writes' if pw else 'reads'}, with no event between them")
    _history.extend((lo, hi, w, s, vc[s], what) for lo, hi, w in mine if hi > lo)


def current_stream():
    return _stack[-1] if _stack else fake_cupy._CURRENT


def _enter(self):
    _stack.append(self)
    return self


def _exit(self, *exc):
    _stack.pop()
    return False


def _record(self, stream=None) -> None:
    fake_cupy._check_stream(stream)
    s = _ptr(stream)
    vc = _clock.setdefault(s, {})
    _join(vc, _host)
    self.recorded, self.vc = True, dict(vc)


def _wait_event(self, event) -> None:
    if not getattr(event, "recorded", False):
        raise RuntimeError("waiting on an event that was never recorded")
    _join(_clock.setdefault(self.ptr, {}), event.vc)


def _event_sync(self) -> None:
    if not self.recorded:
        raise RuntimeError("synchronising an event that was never recorded")
    _join(_host, self.vc)


def _stream_sync(self) -> None:
    _join(_host, _clock.get(self.ptr, {}))


Stream, Event, nd = fake_cupy.Stream, fake_cupy.Event, fake_cupy.ndarray
Stream.__enter__, Stream.__exit__ = _enter, _exit
Stream.wait_event, Stream.synchronize = _wait_event, _stream_sync
Event.record, Event.synchronize = _record, _event_sync
cupy.cuda.get_current_stream = fake_cupy.get_current_stream = current_stream

_zeros, _empty, _full, _asarray = fake_cupy.zeros, fake_cupy.empty, fake_cupy.full, fake_cupy.asarray


def _allocating(f, name):
    def g(*a, **k):
        x = f(*a, **k)
        op(None, name, writes=[_span(x)])
        return x
    return g


cupy.zeros = _allocating(_zeros, "zeros")
cupy.empty = _allocating(_empty, "empty")
cupy.full = _allocating(_full, "full")
cupy.asarray = _allocating(_asarray, "asarray")
_get, _set, _setitem = nd.get, nd.set, np.ndarray.__setitem__


def _nd_get(self, stream=None, order="C", out=None, blocking=True):
    op(stream, "get", reads=[_span(self)])
    if blocking:
        _join(_host, _clock[_ptr(stream)])
    return _get(self, stream, order, out, blocking)


def _nd_set(self, arr, stream=None):
    op(stream, "set", writes=[_span(self)])
    _set(self, arr, stream)


def _nd_setitem(self, idx, value):
    dst = np.ndarray.__getitem__(self, idx)
    reads = [_span(value)] if isinstance(value, np.ndarray) else []
    op(None, "copy", reads=reads, writes=[_span(dst)] if isinstance(dst, np.ndarray) else [])
    _setitem(self, idx, value)


nd.get, nd.set, nd.__setitem__ = _nd_get, _nd_set, _nd_setitem
_asnumpy = fake_cupy.asnumpy


def _asnumpy_tracked(x, stream=None):
    op(stream, "asnumpy", reads=[_span(x)])
    _join(_host, _clock[_ptr(stream)])
    return _asnumpy(x, stream)


cupy.asnumpy = _asnumpy_tracked
_ew_call = fake_cupy.ElementwiseKernel.__call__


def _ew(self, stack, p, m, out):
    base = stack.__array_interface__["data"][0]
    k, m = out.size, int(m)
    rows = [(base + 2 * r * m, base + 2 * (r * m + k)) for r in range(int(p))]
    op(None, "reduce kernel", reads=rows, writes=[_span(out)])
    _ew_call(self, stack, p, m, out)


fake_cupy.ElementwiseKernel.__call__ = _ew
Comm = cupy.cuda.nccl.NcclCommunicator
_ag, _snd, _rcv = Comm.allGather, Comm.send, Comm.recv


def _allgather(self, send, recv, count, dtype, stream):
    n = count * cupy.cuda.nccl._ITEM[dtype]
    op(stream, "NCCL all-gather", reads=[(send, send + n)],
       writes=[(recv, recv + n * self.comm.Get_size())])
    _ag(self, send, recv, count, dtype, stream)


def _send(self, ptr, count, dtype, peer, stream):
    op(stream, "NCCL send", reads=[(ptr, ptr + count * cupy.cuda.nccl._ITEM[dtype])])
    _snd(self, ptr, count, dtype, peer, stream)


def _recv(self, ptr, count, dtype, peer, stream):
    op(stream, "NCCL recv", writes=[(ptr, ptr + count * cupy.cuda.nccl._ITEM[dtype])])
    _rcv(self, ptr, count, dtype, peer, stream)


Comm.allGather, Comm.send, Comm.recv = _allgather, _send, _recv
_memcpy = fake_cupy._Runtime.memcpyAsync


def _memcpy_async(dst, src, size, kind, stream):
    op(stream, "device copy", reads=[(src, src + size)], writes=[(dst, dst + size)])
    _memcpy(dst, src, size, kind, stream)


fake_cupy._Runtime.memcpyAsync = staticmethod(_memcpy_async)
_raw_call = fake_cupy._RawKernel.__call__


def _raw_kernel(self, grid, block, args, stream=None, shared_mem: int = 0):
    """The spill kernels: what each touches, read from the call block's frame descriptors."""
    from zipccl.format.slot import SLOT_HEADER
    from zipccl.kernels import spill as sk

    a = [int(x) for x in args]
    name = next(k for k, v in sk.HOST_TWINS.items() if v is self.twin)
    reads, writes = [], []
    if name == "zipccl_spill_out":  # reads each send frame, writes its slot header
        for d in sk._descs(a[0], sk.W_SEND_AT, sk.W_NSEND):
            r, n = int(d[sk.D_REGION]), int(d[sk.D_REGION_BYTES])
            reads.append((r + SLOT_HEADER, r + n))
            writes.append((r, r + SLOT_HEADER))
    elif name == "zipccl_spill_in":  # reads each received slot, writes its tail after it
        for d in sk._descs(a[0], sk.W_RECV_AT, sk.W_NRECV):
            r, slot, n = int(d[sk.D_REGION]), int(d[sk.D_SLOT]), int(d[sk.D_REGION_BYTES])
            reads.append((r, r + slot))
            writes.append((r + slot, r + n))
    else:  # zipccl_spill_record: a decode workspace's error bits
        reads.append((a[2], a[2] + 4))
    op(stream, name, reads=reads, writes=writes)
    return _raw_call(self, grid, block, args, stream, shared_mem)


fake_cupy._RawKernel.__call__ = _raw_kernel

# -- the GPU codec's entry points, on the CPU codec, declaring what the kernels touch -----------

import fake_gpu_codec  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.codec import cpu  # noqa: E402


def _track(stream, what, reads=(), writes=(), host_waits=False) -> None:
    op(stream, what, reads=reads, writes=writes)
    if host_waits:
        _join(_host, _clock[_ptr(stream)])


fake_gpu_codec.track = _track
fake_gpu_codec.install()

# -- the collectives -----------------------------------------------------------------------------

import zipccl  # noqa: E402
from zipccl.comm.pipeline import DeviceEngine  # noqa: E402
from zipccl.comm.reduction import reduce_sum_bf16  # noqa: E402

WORLD = MPI.COMM_WORLD
P, ME = WORLD.Get_size(), WORLD.Get_rank()


def bits(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0.0, 0.02, n).astype(np.float32).view(np.uint32)
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)


def expected_sum(parts: list[np.ndarray]) -> np.ndarray:
    out = np.empty(parts[0].size, np.uint16)
    reduce_sum_bf16(np.stack(parts), out)
    return out


def run(chunk_bytes: int) -> None:
    """Growing collectives back to back on a non-blocking stream; one host sync at the end."""
    comm = zipccl.Communicator(WORLD, backend="nccl", policy="always", chunk_bytes=chunk_bytes)
    s = cupy.cuda.Stream(non_blocking=True)
    cases = []
    for n in (3000, 9000, 20000):  # each call grows the engine's buffers
        ag_out = cupy.zeros(P * n, dtype=cupy.uint16)
        rs_in = [bits(P * n, 100 + r) for r in range(P)]
        rs_out = cupy.zeros(n, dtype=cupy.uint16)
        ar = [bits(n + 1, 200 + r) for r in range(P)]
        counts = [n // 3 + 7 * j for j in range(P)]
        a2a_in = [bits(sum(counts), 300 + r) for r in range(P)]
        a2a_out = cupy.zeros(P * counts[ME], dtype=cupy.uint16)
        x, y, z, w = (cupy.asarray(bits(n, ME)), cupy.asarray(rs_in[ME]), cupy.asarray(ar[ME]),
                      cupy.asarray(a2a_in[ME]))
        cupy.cuda.get_current_stream().synchronize()  # inputs are ready before the calls
        comm.all_gather(x, ag_out, dtype="bfloat16", stream=s)
        comm.reduce_scatter(y, rs_out, dtype="bfloat16", stream=s)
        comm.all_reduce(z, dtype="bfloat16", stream=s)
        comm.all_to_all(w, a2a_out, send_counts=counts, recv_counts=[counts[ME]] * P,
                        dtype="bfloat16", stream=s)
        cases.append((n, ag_out, rs_out, rs_in, z, ar, a2a_out, a2a_in, counts))
    s.synchronize()
    for n, ag_out, rs_out, rs_in, z, ar, a2a_out, a2a_in, counts in cases:
        assert np.array_equal(np.asarray(ag_out), np.concatenate([bits(n, r) for r in range(P)]))
        assert np.array_equal(np.asarray(rs_out),
                              expected_sum([x[ME * n:(ME + 1) * n] for x in rs_in]))
        assert np.array_equal(np.asarray(z), expected_sum(ar))
        mine = [a2a_in[r][sum(counts[:ME]):sum(counts[:ME + 1])] for r in range(P)]
        assert np.array_equal(np.asarray(a2a_out), np.concatenate(mine))
    comm.close()


def negative_control() -> None:
    """Without the decode stream's wait for the round's transfer the race must be reported
    (the slot exchange orders its decode stream in ``decode_stream``, before the spill-in
    kernel and the decodes)."""
    real = DeviceEngine.decode_stream

    def no_wait(self, k):
        self._dec_round = k  # as if the decode stream already waited for round k
        return real(self, k)

    DeviceEngine.decode_stream = no_wait
    try:
        run(2 * fmt.BLOCK)
    except Race:
        return
    finally:
        DeviceEngine.decode_stream = real
    raise AssertionError("the stream-order check missed a decode that does not wait for its transfer")


def negative_control_spill_in() -> None:
    """The spill-in kernel on the caller's stream, which never waits for the transfer stream,
    must be reported (it reads the received slot headers the transfer writes)."""
    real = DeviceEngine.decode_stream

    def callers(self, k):
        return self._stream

    DeviceEngine.decode_stream = callers
    try:
        run(2 * fmt.BLOCK)
    except Race as e:
        assert "zipccl_spill_in" in str(e), e
        return
    finally:
        DeviceEngine.decode_stream = real
    raise AssertionError("the stream-order check missed a spill-in kernel that does not wait for "
                         "its transfer")


def outgrown_workspace_keeps_its_errors() -> None:
    """A decode stream workspace replaced by a larger one mid-call still reports its errors."""
    from zipccl.codebook import Codebook

    eng = DeviceEngine()
    eng.set_stream(cupy.cuda.Stream(non_blocking=True))
    cb = Codebook.from_sigma(0.02)
    small, big = bits(100, 1), bits((1 << 20) + 1, 2)  # the second needs a larger workspace
    bad = cupy.asarray(cpu.encode(small, cb, (small.size,), False))
    bad[0] ^= 1  # magic
    good = cupy.asarray(cpu.encode(big, cb, (big.size,), False))
    outs = cupy.zeros(small.size, dtype=cupy.uint16), cupy.zeros(big.size, dtype=cupy.uint16)
    cupy.cuda.get_current_stream().synchronize()
    eng.pipeline_begin(1, 2)
    eng.encoded(0)
    eng.transfer_stream(0)
    eng.received(0)
    eng.decode_frame(bad, outs[0], 0)
    eng.decode_frame(good, outs[1], 0)
    used = []
    eng.pipeline_finish(lambda stream, ws: used.append((stream, ws)))  # what the error word takes in
    assert len(used) == 2, used  # the outgrown workspace and its successor
    found = 0
    for stream, ws in used:
        found |= ws.sticky_error(stream)
    assert "bad header" in eng.gpu_workspace.Workspace.describe(found), hex(found)


def _fresh(check):
    def case():
        _history.clear()
        check()
    return case


#: the cases, in the order they run: (name, what runs)
CASES = (("outgrown_workspace_keeps_its_errors", outgrown_workspace_keeps_its_errors),
         ("pipelined", lambda: run(2 * fmt.BLOCK)),  # rounds of one escape block
         ("one_round", lambda: run(0)),
         ("negative_control_decode_wait", _fresh(negative_control)),
         ("negative_control_spill_in", _fresh(negative_control_spill_in)))


def main(out_dir: str | None) -> None:
    """Run every case; with ``out_dir`` each rank writes ``rank<r>.json``: the cases that
    passed, in order, and the one that failed (then the job aborts)."""
    passed = []

    def report(failed: str | None) -> None:
        if out_dir:
            with open(os.path.join(out_dir, f"rank{ME}.json"), "w") as f:
                json.dump({"rank": ME, "passed": passed, "failed": failed}, f)

    for name, case in CASES:
        try:
            case()
        except BaseException:
            report(name)
            raise
        passed.append(name)
    WORLD.Barrier()
    report(None)
    if ME == 0:
        print(f"stream order: no race on {P} ranks (pipelined and in one round); "
              "both negative controls caught")


if __name__ == "__main__":
    try:
        main(sys.argv[1] if len(sys.argv) > 1 else None)
    except BaseException:  # the peer would wait forever in its next collective
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        WORLD.Abort(1)
