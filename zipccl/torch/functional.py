"""torch.distributed-shaped collectives that move BF16, FP32 and FP16 tensors compressed, bit-exact.

``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single`` and
``all_reduce`` take torch.distributed's arguments in torch.distributed's order
and return what it returns (``None``, or a ``Work`` with ``async_op=True``).
BF16, FP32 and FP16 tensors go compressed or native as the policy decides; any
other dtype, and any reduction other than SUM / AVG, goes to torch.distributed's
own function unchanged. ``all_gather_single`` and ``reduce_scatter_single`` (torch
2.13's names; the old ones warn there) are the same functions, on every torch.
Adopting them is one import::

    from zipccl.torch import all_gather_single   # instead of torch.distributed's

What the results are, bit for bit:

- all-gather and all-to-all: exactly torch.distributed's (they move bits);
- SUM reductions: ``zipccl.comm.collectives.reduce_sum`` of the ranks'
  inputs -- FP32 accumulation in rank order, then (BF16, FP16) one
  round-to-nearest-even to the type, NaN -> the type's canonical quiet NaN
  (0x7FC0, 0x7FC00000, 0x7E00). On 2 ranks that is the correctly rounded sum,
  which is what gloo (c10::BFloat16 arithmetic) and NCCL compute too; on more
  ranks NCCL and gloo round after every ring step, in an order that depends on
  the chunk, so results can differ in the last bit (for BF16 and FP16 zipccl's
  is the more accurate);
- AVG: that sum, then divided by the group size in FP32 and rounded to the type
  once more (nearest even, NaN -> canonical) -- what gloo computes. Exact for a
  power-of-two group unless the average is subnormal. NCCL's AVG
  pre-multiplies each input by 1/p in the type and sums; on 2 ranks both give the
  correctly rounded (a + b) / 2 except where a/2 or b/2 underflows or a + b
  overflows.

The compressed path runs synchronously on the host for CPU tensors, and in
order on torch's current stream for CUDA tensors (CuPy and the GPU codec). With
``async_op=True`` it returns a ``Work`` that is already complete (CPU) or
ordered on the current stream (CUDA). Each call checks its own arguments as
torch.distributed does (a mismatch between ranks is the caller's bug, as there).
"""

from __future__ import annotations

import atexit
import functools
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from ..comm.agreement import Agreement, describe, sig_hash
from ..comm.args import check_counts
from ..comm.base import CollectiveError, ExchangeStats, chunk_elements
from ..comm.collectives import (
    CANONICAL_NAN,
    CANONICAL_NAN_FP16,
    CANONICAL_NAN_FP32,
    all_gather_values,
    all_reduce_values,
    all_to_all_values,
    reduce_scatter_values,
)
from ..comm.host import HostEngine
from ..comm.policy import Policy
from . import autotune as _autotune
from . import transport as _tr
from .transport import ProcessGroupTransport, resolve_group

ReduceOp = dist.ReduceOp


@dataclass
class Stats:
    """What a set of calls moved, counted on this rank: bytes it sent, raw vs on the wire.

    The four counts are totals; ``by_op`` holds the same four per collective
    ("all_gather", "reduce_scatter", "all_to_all", "all_reduce": a compressed all-reduce
    counts as one all-reduce), and ``of(op)`` reads one (zeros for a collective not called):

    >>> from zipccl.comm.base import ExchangeStats
    >>> s = Stats()
    >>> s.add(True, ExchangeStats(wire_bytes=70, raw_bytes=100), "all_gather")
    >>> s.add(False, ExchangeStats(wire_bytes=50, raw_bytes=50), "reduce_scatter")
    >>> s.calls, s.wire_bytes, s.of("all_gather").wire_bytes, s.of("reduce_scatter").compressed_calls
    (2, 120, 70, 0)
    >>> s.per_op()["all_gather"], s.of("all_to_all").calls
    ({'calls': 1, 'compressed_calls': 1, 'raw_bytes': 100, 'wire_bytes': 70}, 0)
    """

    calls: int = 0
    compressed_calls: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0
    by_op: dict[str, Stats] = field(default_factory=dict, repr=False)

    def add(self, compressed: bool, ex: ExchangeStats, op: str | None = None) -> None:
        self.calls += 1
        self.compressed_calls += int(compressed)
        self.raw_bytes += int(ex.raw_bytes)
        self.wire_bytes += int(ex.wire_bytes)
        if op is not None:
            self.by_op.setdefault(op, Stats()).add(compressed, ex)

    def of(self, op: str) -> Stats:
        """The counts of one collective (a new, empty ``Stats`` if it was never called)."""
        return self.by_op.get(op) or Stats()

    @property
    def ratio(self) -> float:
        """wire / raw bytes (1.0 when nothing was sent)."""
        return self.wire_bytes / self.raw_bytes if self.raw_bytes else 1.0

    def reset(self) -> None:
        self.calls = self.compressed_calls = self.raw_bytes = self.wire_bytes = 0
        self.by_op.clear()

    def as_dict(self) -> dict:
        """The four totals (``by_op`` left out: see ``per_op``)."""
        return {"calls": self.calls, "compressed_calls": self.compressed_calls,
                "raw_bytes": self.raw_bytes, "wire_bytes": self.wire_bytes}

    def per_op(self) -> dict[str, dict]:
        """``{collective: its four counts}`` for every collective called."""
        return {op: s.as_dict() for op, s in self.by_op.items()}

    def _add_since(self, now: Stats, before: Stats) -> None:
        """Add what ``now`` counted after ``before`` (an earlier copy of it), per collective too."""
        for k, v in now.as_dict().items():
            setattr(self, k, getattr(self, k) + v - getattr(before, k))
        for op, s in now.by_op.items():
            self.by_op.setdefault(op, Stats())._add_since(s, before.of(op))

    def _copy(self) -> Stats:
        return Stats(**self.as_dict(), by_op={op: s._copy() for op, s in self.by_op.items()})


def _done_work(result: torch.Tensor | None = None):
    """A torch.distributed ``Work`` that is complete (CPU) or ordered on the current stream (CUDA)."""
    devices = [result.device] if result is not None and result.is_cuda else []
    fut = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
    fut.set_result([result] if result is not None else [])
    make = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
    return make(fut) if make is not None else _Handle(fut)


class _CheckedWork(dist.Work):
    """A compressed CUDA call's ``Work``: the inner one's stream order, then the slot channel's
    sticky error (``CollectiveError``) at ``wait()``."""

    def __init__(self, inner, channel):
        super().__init__()
        self._inner, self._channel = inner, channel

    def wait(self, timeout=None) -> bool:
        ok = self._inner.wait()
        self._channel.check("wait")
        return ok

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def get_future(self):
        return self._inner.get_future()


class _Handle:
    """Stand-in for ``Work`` where torch cannot wrap a future (``wait``, ``is_completed``, ``get_future``)."""

    def __init__(self, fut):
        self._fut = fut

    def wait(self, timeout=None) -> bool:
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self):
        return self._fut


def _op_name(op) -> str | None:
    """"sum" / "avg" for the reductions zipccl computes itself, None for any other."""
    for name, ref in (("sum", ReduceOp.SUM), ("avg", ReduceOp.AVG)):
        try:
            if op == ref:
                return name
        except (TypeError, RuntimeError):
            return None
    return None


def _divide(t: torch.Tensor, p: int) -> None:
    """In place: t = type(FP32(t) / p), round to nearest even, NaN -> the type's canonical NaN
    (as the stated sum), for BF16, FP32 and FP16 tensors.

    Written out in integer ops rather than ``Tensor.div_`` on the type: ATen's vectorised BF16
    conversion writes NaN as 0xFFFF and its scalar one as 0x7FC0, so a NaN's bits would
    depend on where it sits in the tensor. The same ops run on CPU and GPU (FP32 and FP16:
    IEEE division and conversion, then the NaNs replaced).
    """
    f = t.float().div_(p)
    nan = torch.isnan(f)
    if t.dtype == torch.bfloat16:
        u = f.view(torch.int32)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # arithmetic shift: the low 16 bits are the BF16 bits
        r = torch.where(nan, torch.full_like(r, CANONICAL_NAN), r)
        t.view(torch.int16).copy_(r.to(torch.int16))
    elif t.dtype == torch.float32:
        f.view(torch.int32).masked_fill_(nan, CANONICAL_NAN_FP32)
        t.copy_(f)
    else:
        h = f.to(torch.float16)
        h.view(torch.int16).masked_fill_(nan, CANONICAL_NAN_FP16)
        t.copy_(h)


_CODED = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}


def _check(t: torch.Tensor, role: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{role} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{role} must be contiguous (as torch.distributed requires)")


def _check_pair(big: torch.Tensor, big_role: str, small: torch.Tensor, small_role: str, p: int) -> None:
    """Both contiguous tensors of one dtype, ``big`` holding p x ``small``'s elements."""
    _check(big, big_role)
    _check(small, small_role)
    if big.numel() != p * small.numel() or big.dtype != small.dtype:
        raise ValueError(f"{big_role} must hold {p} x {small.numel()} elements of {small.dtype} "
                         f"({p} ranks, {small_role} of {small.numel()}); got {big.numel()} of {big.dtype}")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _cupy_view(v: torch.Tensor):
    """A 1-D CuPy array over the contiguous CUDA tensor ``v``'s memory (kept alive by it),
    made directly from its pointer: ``cupy.asarray`` reads ``__cuda_array_interface__``,
    which costs tens of microseconds a call."""
    import cupy

    nbytes = v.numel() * v.element_size()
    mem = cupy.cuda.UnownedMemory(v.data_ptr(), nbytes, v, v.device.index)
    return cupy.ndarray((v.numel(),), _CUPY_DTYPES[v.dtype], cupy.cuda.MemoryPointer(mem, 0))


def _guarded(op: str, group_at: int):
    """Wrap a ``Collectives`` method (its ``group`` is positional argument ``group_at`` or the
    keyword): a group this rank is not in warns and returns None, as torch.distributed's
    functions do; a check this rank fails is posted for its peers (``transport.post_failure``);
    a peer that fails its own checks leaves this rank in an exchange until the group's timeout,
    and the error raised then is a ``CollectiveError`` naming the peer's failure."""

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            group = kwargs.get("group", args[group_at] if len(args) > group_at else None)
            if group is not None and dist.distributed_c10d._rank_not_in_group(group):
                dist.distributed_c10d._warn_not_in_group(op)
                return None
            try:
                return method(self, *args, **kwargs)
            except CollectiveError:
                raise
            except (ValueError, TypeError) as e:
                _tr.post_failure(group, f"{op}: {type(e).__name__}: {e}")
                raise
            except RuntimeError as e:  # gloo's timeout, a store's: was it a peer's mistake?
                peers = _tr.peer_failures(group)
                if peers:
                    raise CollectiveError(f"zipccl {op}: a peer's call failed before the exchange "
                                          f"({peers}); here: {str(e).splitlines()[0][:200]}") from e
                raise

        return call

    return wrap


_CUPY_DTYPES = {torch.int16: np.int16, torch.float32: np.float32, torch.float16: np.float16,
                torch.uint8: np.uint8}


class Collectives:
    """The four collectives with one configuration and one ``stats`` counter.

    >>> # in a torch.distributed job (gloo on CPU, NCCL on GPU):
    >>> # zc = Collectives(policy="always")
    >>> # zc.all_gather_into_tensor(out, x)          # like dist.all_gather_into_tensor(out, x)
    >>> # zc.stats.compressed_calls, zc.stats.wire_bytes / zc.stats.raw_bytes

    ``policy``: "auto" (BF16, FP32 and FP16 messages of at least ``min_compress_bytes``
    per rank on a GPU; host tensors stay native unless ``compress_host``), "always",
    "never", or a ``zipccl.comm.Policy`` (e.g. with a calibrated profile, which covers
    BF16: FP32 / FP16 then stay native). ``chunk_bytes``: bytes per message per pipeline
    round (0: one round).
    ``capacity``: the escape capacity of the compressed calls' slots (``comm.capacity.CapacityConfig``
    or a dict of its settings, e.g. ``{"fraction": 0.1}``; None: the adaptive default rule).
    """

    def __init__(self, policy: str | Policy = "auto", *, chunk_bytes: int = 0,
                 checksum: bool = False, min_compress_bytes: int = 1 << 20,
                 compress_host: bool = False, capacity=None):
        from ..comm.capacity import as_config

        self.capacity = as_config(capacity)
        self.policy = policy if isinstance(policy, Policy) else \
            Policy(policy, min_bytes=min_compress_bytes, compress_host=compress_host)
        if chunk_bytes < 0:
            raise ValueError(f"chunk_bytes must be >= 0, got {chunk_bytes}")
        from .. import format as fmt

        self.chunk = 0 if chunk_bytes == 0 else max(fmt.BLOCK, chunk_bytes // 2 // fmt.BLOCK * fmt.BLOCK)
        self.checksum = bool(checksum)
        self.stats = Stats()
        self.last_decision = None
        self._host: HostEngine | None = None
        self._device: dict[int, object] = {}
        self._routes: dict[tuple, ProcessGroupTransport] = {}
        self._channels: dict[tuple, object] = {}
        self._uneven: dict[tuple, object] = {}  # auto's agreed decision for uneven all-to-alls
        self._agreements: dict[tuple, Agreement] = {}  # host tensors: the control row per route
        _LIVE.add(self)

    # -- plumbing ---------------------------------------------------------------------------
    def _route(self, group, t: torch.Tensor):
        """(engine, transport, stream) for tensors on ``t``'s device over ``group``."""
        key = (group, t.device)
        tr = self._routes.get(key)
        if tr is None:
            tr = self._routes[key] = ProcessGroupTransport(group, t.device)
        if not t.is_cuda:
            if self._host is None:
                self._host = HostEngine(checksum=self.checksum)
            return self._host, tr, None
        import cupy

        idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
        cupy.cuda.Device(idx).use()  # CuPy keeps its own current device: the engine works on t's
        eng = self._device.get(idx)
        if eng is None:
            from ..comm.pipeline import DeviceEngine

            eng = self._device[idx] = DeviceEngine(checksum=self.checksum)
        stream = torch.cuda.current_stream(t.device).cuda_stream
        eng.set_stream(stream)
        return eng, tr, stream

    def _channel(self, group, t: torch.Tensor):
        """The slot channel of compressed calls over ``group`` on ``t``'s device (CPU or a GPU):
        call numbering, spills over a gloo group, the error word. Made at the group's first
        compressed call there, which every rank makes at the same point."""
        key = (group, t.device)
        ch = self._channels.get(key)
        if ch is None:
            from ..comm.capacity import CapacityRule
            from ..comm.exchange import SlotChannel
            from ..comm.spill import Spills
            from .transport import TorchChannel

            ch = self._channels[key] = SlotChannel(Spills(TorchChannel(group), device=t.is_cuda),
                                                   CapacityRule(self.capacity))
        ch.raw = self.last_decision.raw  # policy "raw": this call's frames go RAW
        return ch

    def _agree(self, tr: ProcessGroupTransport, t: torch.Tensor, sig: tuple) -> None:
        """Host tensors: before a compressed call's exchange, the ranks all-gather the control row
        (``comm.agreement``: a hash of ``sig``, the call's op, dtype and counts; a few dozen
        bytes), so ranks whose calls differ -- whose slot exchanges would differ in size, which
        gloo answers by aborting the process -- all raise the same ``CollectiveError`` instead.
        CUDA tensors skip it (no host wait there): their slot headers carry the call."""
        if t.is_cuda:
            return
        key = (tr.group, t.device)
        ag = self._agreements.get(key)
        if ag is None:
            ag = self._agreements[key] = Agreement(tr, tr.size)
        ag.control(sig[0], sig_hash(sig), None, describe=describe(sig))

    def _work(self, result: torch.Tensor, group):
        """The ``Work`` of a compressed ``async_op=True`` call: ordered on the current stream
        (CUDA) or complete (CPU); on CUDA its ``wait()`` also raises the group's sticky device
        error as ``CollectiveError`` (what the device has reported so far: no host wait)."""
        work = _done_work(result)
        ch = self._channels.get((group, result.device)) if result.is_cuda else None
        return work if ch is None else _CheckedWork(work, ch)

    @staticmethod
    def _bits(t: torch.Tensor):
        """A 1-D engine array (NumPy or CuPy) sharing ``t``'s memory, as the collectives take
        it: BF16 as uint16 bit patterns, FP32 and FP16 as themselves."""
        v = t.detach().reshape(-1)
        bf16 = v.dtype == torch.bfloat16
        if bf16:
            v = v.view(torch.int16)
        if v.is_cuda:
            a = _cupy_view(v)
        else:
            a = v.numpy()
        return a.view(np.uint16) if bf16 else a

    def _chunk_of(self, t: torch.Tensor) -> int:
        """Elements per pipeline round for ``t``'s type (``base.chunk_elements``)."""
        return chunk_elements(self.chunk, t.element_size())

    def _decide(self, op: str, nbytes: int, t: torch.Tensor, p: int, reduce_op: str | None = "sum",
                group=None):
        dtype = _CODED.get(t.dtype) if reduce_op is not None else None
        policy = _autotune.resolve(self.policy, group, t)  # "auto": the group's calibration
        d = policy.decide(op, nbytes, dtype=dtype, device=t.is_cuda, world=p)
        self.last_decision = d
        return d

    def _native(self, op: str, call, raw: int, async_op: bool):
        work = call()
        self.stats.add(False, ExchangeStats(raw, raw), op)
        return work if async_op else None

    # -- the collectives --------------------------------------------------------------------
    @_guarded("all_gather", 2)
    def all_gather_into_tensor(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               group=None, async_op: bool = False):
        """output = concatenation over ranks (rank order) of every rank's ``input_tensor``.

        Same arguments and result as ``torch.distributed.all_gather_into_tensor``;
        ``input_tensor`` may be this rank's slice of ``output_tensor`` (in place, as FSDP2 calls it).
        """
        group = resolve_group(group)
        p = dist.get_world_size(group)
        _check_pair(output_tensor, "output_tensor", input_tensor, "input_tensor", p)
        n = input_tensor.numel()
        d = self._decide("all_gather", n * input_tensor.element_size(), input_tensor, p, group=group)
        if not d.compress:
            raw = n * input_tensor.element_size() * (p - 1)
            return self._native("all_gather", lambda: _tr.all_gather_single(
                output_tensor, input_tensor, group, async_op), raw, async_op)
        eng, tr, stream = self._route(group, input_tensor)
        self._agree(tr, input_tensor, ("all_gather", _CODED[input_tensor.dtype], n, ""))
        send = input_tensor
        own = output_tensor.reshape(-1)[tr.rank * n:(tr.rank + 1) * n]
        if _overlaps(send, output_tensor) and send.data_ptr() != own.data_ptr():
            send = send.clone()  # partial overlap: only the in-place slot is safe to read while writing
        ex = all_gather_values(eng, tr, self._bits(send), self._bits(output_tensor), [n] * p,
                             compress=True, stream=stream, chunk=self._chunk_of(send),
                             channel=self._channel(group, send))
        self.stats.add(True, ex, "all_gather")
        return self._work(output_tensor, group) if async_op else None

    @_guarded("reduce_scatter", 3)
    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM,
                              group=None, async_op: bool = False):
        """output = reduction over ranks of block ``rank`` of every rank's ``input``.

        Same arguments as ``torch.distributed.reduce_scatter_tensor``. BF16, FP32 and FP16
        SUM / AVG compressed: the reduction stated in this module's docstring.
        """
        group = resolve_group(group)
        p = dist.get_world_size(group)
        _check_pair(input, "input", output, "output", p)
        m = output.numel()
        name = _op_name(op)
        d = self._decide("reduce_scatter", input.numel() * input.element_size(), input, p, name, group)
        if not d.compress or name is None:
            raw = (p - 1) * m * input.element_size()
            return self._native("reduce_scatter", lambda: _tr.reduce_scatter_single(
                output, input, op, group, async_op), raw, async_op)
        eng, tr, stream = self._route(group, input)
        self._agree(tr, input, ("reduce_scatter", _CODED[input.dtype], m, name, ""))
        send = input.clone() if _overlaps(input, output) else input
        ex = reduce_scatter_values(eng, tr, self._bits(send), self._bits(output), [m] * p,
                                 compress=True, stream=stream, chunk=self._chunk_of(send),
                             channel=self._channel(group, send))
        if name == "avg":
            _divide(output, p)
        self.stats.add(True, ex, "reduce_scatter")
        return self._work(output, group) if async_op else None

    # torch 2.13's names for the two above (the old ones warn there); the same methods
    all_gather_single = all_gather_into_tensor
    reduce_scatter_single = reduce_scatter_tensor

    @_guarded("all_to_all", 4)
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op: bool = False):
        """Rank i's block j of ``input`` becomes rank j's block i of ``output``.

        Same arguments as ``torch.distributed.all_to_all_single``: split sizes count
        rows of dim 0; without them both tensors split into equal blocks.
        """
        group = resolve_group(group)
        _check(output, "output")
        _check(input, "input")
        p = dist.get_world_size(group)
        if output.dtype != input.dtype:
            raise ValueError(f"output is {output.dtype} but input is {input.dtype}")

        def counts(t: torch.Tensor, splits, role: str) -> list[int]:
            rows = t.shape[0] if t.dim() else 1
            per_row = t.numel() // rows if rows else 0
            if splits is None:
                if rows % p:
                    raise ValueError(f"{role}: {rows} rows do not split into {p} equal blocks")
                return [rows // p * per_row] * p
            splits = check_counts(splits, p, f"{role}_split_sizes")  # ints only: never truncated
            if sum(splits) != rows:
                raise ValueError(f"{role} split sizes {splits} do not cover its {rows} rows on {p} ranks")
            return [s * per_row for s in splits]

        sc = counts(input, input_split_sizes, "input")
        rc = counts(output, output_split_sizes, "output")
        uneven = input_split_sizes is not None or output_split_sizes is not None
        nbytes = input.numel() * input.element_size()
        key = (group, input.dtype, input.device)
        if uneven and input.dtype in _CODED and self.policy.mode == "auto":
            # every rank must decide alike: the first uneven call of a group and type agrees on
            # the largest size (one small all-reduce) and its decision holds from then on
            d = self._uneven.get(key)
            if d is None:
                nbytes = self._agreed_max(group, input, [nbytes])[0]
                d = self._uneven[key] = self._decide("all_to_all", nbytes, input, p, group=group)
            self.last_decision = d
        else:
            d = self._decide("all_to_all", nbytes, input, p, group=group)
        if not d.compress:
            raw = (sum(sc) - sc[dist.get_rank(group)]) * input.element_size()
            return self._native("all_to_all", lambda: dist.all_to_all_single(
                output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op),
                raw, async_op)
        eng, tr, stream = self._route(group, input)
        # per-peer counts differ between ranks by design: the uneven call agrees on its kind only
        self._agree(tr, input, ("all_to_all", _CODED[input.dtype], "uneven" if uneven else sum(sc), ""))
        send = input.clone() if _overlaps(input, output) else input
        # uneven: the slot exchange in one round, so no rank needs the others' largest message
        chunk = 0 if uneven else self._chunk_of(send)
        ex = all_to_all_values(eng, tr, self._bits(send), self._bits(output), sc, rc,
                             compress=True, stream=stream, chunk=chunk,
                             channel=self._channel(group, send),
                             uniform=not uneven)
        self.stats.add(True, ex, "all_to_all")
        return self._work(output, group) if async_op else None

    @_guarded("all_reduce", 2)
    def all_reduce(self, tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
        """In place: ``tensor`` = reduction over ranks of every rank's ``tensor``.

        Same arguments as ``torch.distributed.all_reduce``. BF16, FP32, FP16 SUM / AVG compressed:
        reduce-scatter of near-equal shards (the stated reduction), then all-gather.
        """
        group = resolve_group(group)
        _check(tensor, "tensor")
        p = dist.get_world_size(group)
        name = _op_name(op)
        d = self._decide("all_reduce", tensor.numel() * tensor.element_size(), tensor, p, name, group)
        if not d.compress or name is None:
            raw = 2 * tensor.numel() * tensor.element_size() * (p - 1) // max(p, 1)
            return self._native("all_reduce", lambda: dist.all_reduce(
                tensor, op=op, group=group, async_op=async_op), raw, async_op)
        eng, tr, stream = self._route(group, tensor)
        self._agree(tr, tensor, ("all_reduce", _CODED[tensor.dtype], tensor.numel(), name, ""))
        ex = all_reduce_values(eng, tr, self._bits(tensor), compress=True, stream=stream,
                               chunk=self._chunk_of(tensor), channel=self._channel(group, tensor))
        if name == "avg":
            _divide(tensor, p)
        self.stats.add(True, ex, "all_reduce")
        return self._work(tensor, group) if async_op else None

    @staticmethod
    def _agreed_max(group, like: torch.Tensor, values: list[int]) -> list[int]:
        """Element-wise maximum over the group's ranks of a few ints (one small all-reduce)."""
        t = torch.tensor(values, dtype=torch.int64, device=like.device)
        dist.all_reduce(t, op=ReduceOp.MAX, group=group)
        return [int(v) for v in t.tolist()]


_DEFAULTS: dict[object, Collectives] = {}
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every Collectives made: forget_groups empties them


def forget_groups() -> None:
    """Drop every reference zipccl.torch holds to process groups (routes, slot channels, the
    module functions' shared ``Collectives``), then collect. Run at interpreter exit (``atexit``):
    a gloo group that survives into finalization, its work objects holding tensors, aborts the
    process there ("terminate called without an active exception"); dropping the references
    while the interpreter is whole lets the groups go in order. Each slot channel is closed
    first: its progress thread (a daemon thread, which would otherwise keep the channel's own
    gloo group alive into finalization) is stopped and joined. Later calls set them up anew."""
    import gc

    for c in list(_LIVE):
        c._routes.clear()
        channels = list(c._channels.values())
        c._channels.clear()
        for ch in channels:
            try:
                ch.spills.close(timeout=10.0)
            except Exception:  # noqa: BLE001 -- a call whose kernels never ran: leave its thread
                pass
        c._uneven.clear()
        c._agreements.clear()
    _DEFAULTS.clear()
    from . import autotune

    autotune._DONE.clear()
    gc.collect()


atexit.register(forget_groups)


def _default(policy) -> Collectives:
    """The shared ``Collectives`` of the module-level functions, one per policy."""
    key = policy if isinstance(policy, str) else id(policy)
    c = _DEFAULTS.get(key)
    if c is None or (not isinstance(policy, str) and c.policy is not policy):
        c = _DEFAULTS[key] = Collectives(policy)
    return c


def _with_stats(c: Collectives, stats: Stats | None, call):
    """Run ``call`` and add what it moved to ``stats`` as well."""
    if stats is None:
        return call()
    before = c.stats._copy()
    try:
        return call()
    finally:
        stats._add_since(c.stats, before)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False, *,
                           policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.all_gather_into_tensor``, BF16 / FP32 / FP16 compressed as ``policy`` says.

    ``stats``: a ``Stats`` to count this call in. See ``Collectives``.
    """
    c = _default(policy)
    return _with_stats(c, stats, lambda: c.all_gather_into_tensor(output_tensor, input_tensor, group,
                                                                  async_op))


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
                          policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.reduce_scatter_tensor``, BF16 / FP32 / FP16 SUM / AVG compressed as
    ``policy`` says."""
    c = _default(policy)
    return _with_stats(c, stats, lambda: c.reduce_scatter_tensor(output, input, op, group, async_op))


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, *, policy: str | Policy = "auto",
                      stats: Stats | None = None):
    """``torch.distributed.all_to_all_single``, BF16 / FP32 / FP16 compressed as ``policy`` says."""
    c = _default(policy)
    return _with_stats(c, stats, lambda: c.all_to_all_single(output, input, output_split_sizes,
                                                             input_split_sizes, group, async_op))


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
               policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.all_reduce``, BF16 / FP32 / FP16 SUM / AVG compressed as ``policy`` says."""
    c = _default(policy)
    return _with_stats(c, stats, lambda: c.all_reduce(tensor, op, group, async_op))


# torch 2.13's names for the first two (torch.distributed.all_gather_single and
# reduce_scatter_single, same signatures; the old names warn there): the same functions,
# offered whichever torch is installed
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
