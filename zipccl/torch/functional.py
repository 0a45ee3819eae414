"""torch.distributed-shaped collectives that move BF16, FP32 and FP16 tensors compressed,
bit-exact: the torch front end of the one call path.

``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single`` and ``all_reduce``
take torch.distributed's arguments and return what it returns (``None``, or a ``Work`` with
``async_op=True``); ``all_gather_single`` / ``reduce_scatter_single`` are torch 2.13's names.
Coded tensors become a ``comm.call.Call`` (``args.wrap``, the collective's own checks) that
``Collectives``' ``comm.core.Core`` decides, agrees, runs and counts; any other dtype or
reduction (not SUM / AVG) goes to torch.distributed's own function unchanged. CUDA tensors run
in order on torch's current stream, CPU tensors synchronously. What the results are, bit for
bit (the stated sum, AVG), is in docs/TORCH.md.
"""

from __future__ import annotations

import atexit
import functools
import weakref

import torch
import torch.distributed as dist

from ..comm import all_gather as _ag
from ..comm import all_reduce as _ar
from ..comm import all_to_all as _aa
from ..comm import reduce_scatter as _rs
from ..comm.agreement import Agreement
from ..comm.args import Arr, call_key, check_counts, unowned, wrap
from ..comm.base import CollectiveError, ExchangeStats
from ..comm.call import Call
from ..comm.core import DEFAULT_CHUNK_BYTES, Core, Link
from ..comm.plans import MAX_PLANS
from ..comm.policy import Decision, Policy
from ..comm.stats import Stats
from . import transport as _tr
from .transport import ProcessGroupTransport, resolve_group

ReduceOp = dist.ReduceOp
_DONE = object()  # ``Collectives._replayed``: the call ran from its plan
_CODED = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}


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


class Collectives:
    """The four collectives with one configuration, one ``comm.core.Core`` and one ``stats``.

    >>> # in a torch.distributed job (gloo on CPU, NCCL on GPU):
    >>> # zc = Collectives(policy="always")
    >>> # zc.all_gather_into_tensor(out, x)          # like dist.all_gather_into_tensor(out, x)
    >>> # zc.stats.compressed_calls, zc.stats.wire_bytes / zc.stats.raw_bytes

    ``policy``: "auto" (BF16, FP32 and FP16 messages of at least ``min_compress_bytes``
    per rank on a GPU; host tensors stay native unless ``compress_host``), "always",
    "never", "raw", or a ``zipccl.comm.Policy`` (e.g. with a calibrated profile).
    ``chunk_bytes``: bytes per message per pipeline round (default
    ``comm.core.DEFAULT_CHUNK_BYTES``, as ``Communicator``; 0: one round). ``capacity``: the
    escape capacity of the compressed calls' slots (``comm.capacity.CapacityConfig`` or a dict
    of its settings; None: the adaptive default rule).
    """

    @staticmethod
    def resolve(policy: Policy, group, t: torch.Tensor) -> Policy:
        """The policy a call follows: ``policy`` itself here; ``zipccl.torch.autotune`` (imported
        with ``zipccl.torch``) replaces this with the group's calibrated "auto"."""
        return policy

    def __init__(self, policy: str | Policy = "auto", *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 checksum: bool = False, min_compress_bytes: int = 1 << 20,
                 compress_host: bool = False, capacity=None):
        pol = policy if isinstance(policy, Policy) else \
            Policy(policy, min_bytes=min_compress_bytes, compress_host=compress_host)
        self._core = Core(pol, chunk_bytes=chunk_bytes, checksum=checksum, capacity=capacity)
        self._links: dict[tuple, tuple[ProcessGroupTransport, Link]] = {}
        self._uneven: dict[tuple, object] = {}  # auto's agreed decision for uneven all-to-alls
        self._fast: dict[tuple, tuple] = {}  # compressed signatures planned: (plan, call, route, link)
        _LIVE.add(self)

    @property
    def policy(self) -> Policy:
        return self._core.policy

    @property
    def stats(self) -> Stats:
        """What this object's calls moved, per collective (``comm.stats.Stats``)."""
        return self._core.stats

    @property
    def last_decision(self):
        return self._core.last_decision

    @property
    def capacity(self):
        return self._core.capacity

    @property
    def chunk(self) -> int:
        return self._core.chunk

    # -- plumbing ---------------------------------------------------------------------------
    def _link(self, group, t: torch.Tensor) -> tuple[ProcessGroupTransport, Link]:
        """The transport and agreement link of ``group`` for tensors on ``t``'s device."""
        key = (group, t.device)
        got = self._links.get(key)
        if got is None:
            tr = ProcessGroupTransport(group, t.device)
            got = self._links[key] = (tr, Link(Agreement(tr, tr.size)))
        return got

    def _engine(self, t: torch.Tensor):
        """(engine, stream) for tensors on ``t``'s device (CuPy follows ``t``'s GPU)."""
        if not t.is_cuda:
            return self._core.engine(False), None
        import cupy

        idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
        cupy.cuda.Device(idx).use()  # CuPy keeps its own current device: the engine works on t's
        stream = torch.cuda.current_stream(t.device).cuda_stream
        return self._core.engine(True, stream, idx), stream

    def _work(self, result: torch.Tensor, group):
        """The ``Work`` of a compressed ``async_op=True`` call: ordered on the current stream
        (CUDA) or complete (CPU); on CUDA its ``wait()`` also raises the group's sticky device
        error as ``CollectiveError`` (what the device has reported so far: no host wait)."""
        work = _done_work(result)
        ch = self._core.channels().get((group, result.device)) if result.is_cuda else None
        return work if ch is None else _CheckedWork(work, ch)

    def _replayed(self, op: str, group, t, result, async_op: bool, stats: Stats | None, extra=None):
        """(``_DONE``, the call's result) if ``op`` on these tensors was planned compressed
        before (``_fast_key``) and has run again from its plan; else (its key, None)."""
        key = _fast_key(op, group, t, result, extra)
        if key not in self._fast:
            return key, None
        return _DONE, self._replay(key, t, result, group, async_op, stats)

    def _replay(self, key, t: torch.Tensor, result: torch.Tensor, group, async_op: bool,
                stats: Stats | None):
        """A compressed call whose signature (``_fast_key``) was planned before: its call and
        route come back from the plan (the memory the key names is the caller's, alive), so
        nothing is checked or derived again; host memory agrees its control row, as always."""
        plan, call, route, link = self._fast[key]
        _not_capturing(t)
        if t.is_cuda:
            self._engine(t)  # CuPy's device and the engine's stream: the key's stream
        else:
            self._core.agree(plan, link, False)
        self._core.last_decision = plan.decision
        self._core.run(call, route, True, stats)
        return self._work(result, group) if async_op else None

    def _run(self, group, t: torch.Tensor, result: torch.Tensor, describe, native, async_op: bool,
             stats: Stats | None, reduce: str | None = None, decided=None, fast=None):
        """The one path of a coded call: describe (the collective's checks), plan and agree on
        the group, run compressed through the core, or natively through ``native()`` (torch's
        own function); count it (AVG: the collective's file divides after the stated sum). A
        compressed plan keeps its call and route under ``fast`` for ``_replay``."""
        core = self._core
        call: Call = describe()
        tr, link = self._link(group, t)
        eng, call.stream = self._engine(t)
        key = call_key(call.op, t, result if result is not t else None, None, call.stream,
                       (id(group), reduce, call.uneven))[0] if decided is None else None
        policy = self.resolve(core.policy, group, t)  # "auto": the group's calibration (autotune)
        plan = core.plan(key, call, link, tr.size, policy)
        if decided is not None:  # an uneven all-to-all: the decision agreed for its group
            plan.decision, plan.compress = decided, decided.compress
            core.last_decision = decided
        if plan.compress or t.is_cuda or key is None:
            core.agree(plan, link, t.is_cuda)
        if not plan.compress:
            work = native()
            raw = _native_bytes(call, tr.size)
            core.count(call.op, False, ExchangeStats(raw, raw), stats)
            return work if async_op else None
        _not_capturing(t)
        route = core.route(call, plan.decision, eng, tr, self._channel(group, t, plan.decision))
        core.run(call, route, True, stats)  # AVG: the collective's file divides after the sum
        if fast is not None and key is not None:
            if len(self._fast) >= MAX_PLANS:
                self._fast.clear()
            call.send, call.recv = unowned(call.send), (
                call.send if call.recv is call.send else unowned(call.recv))
            if call.op == "all_reduce":
                call.recv = call.send
            self._fast[fast] = (plan, call, route, link)
        return self._work(result, group) if async_op else None

    def _channel(self, group, t: torch.Tensor, decision):
        """The slot channel of compressed calls over ``group`` on ``t``'s device."""
        from ..comm.spill import Spills
        from .transport import TorchChannel

        return self._core.channel((group, t.device),
                                  lambda: Spills(TorchChannel(group), device=t.is_cuda), decision)

    @staticmethod
    def _arr(t: torch.Tensor, role: str) -> Arr:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{role} must be a torch.Tensor, got {type(t).__name__}")
        return wrap(t, None, role)

    def _native_fallback(self, op: str, nbytes: int, call, async_op: bool, stats: Stats | None,
                         reduce: str | None = None):
        """A call zipccl does not code (dtype, reduction): torch's own function, counted."""
        why = (f"op={reduce!r}: zipccl computes sum and avg; {reduce} is the transport's own"
               if reduce else "not a type zipccl codes (BF16, FP32, FP16): passed through the "
                              "native collective")
        self._core.last_decision = Decision(op, nbytes, False, why)
        work = call()
        self._core.count(op, False, ExchangeStats(nbytes, nbytes), stats)
        return work if async_op else None

    # -- the collectives --------------------------------------------------------------------
    @_guarded("all_gather", 2)
    def all_gather_into_tensor(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               group=None, async_op: bool = False, *, stats: Stats | None = None):
        """output = concatenation over ranks (rank order) of every rank's ``input_tensor``.

        Same arguments and result as ``torch.distributed.all_gather_into_tensor``;
        ``input_tensor`` may be this rank's slice of ``output_tensor`` (in place, as FSDP2 calls it).
        ``stats``: one more ``Stats`` to count the call in.
        """
        group = resolve_group(group)
        fk, done = self._replayed("all_gather", group, input_tensor, output_tensor, async_op, stats)
        if fk is _DONE:
            return done
        p, rank = dist.get_world_size(group), dist.get_rank(group)

        def native():
            return _tr.all_gather_single(output_tensor, input_tensor, group, async_op)

        if not _coded(input_tensor, output_tensor):
            return self._native_fallback("all_gather", _nbytes(input_tensor) * (p - 1), native,
                                         async_op, stats)
        s, r = self._arr(input_tensor, "input_tensor"), self._arr(output_tensor, "output_tensor")
        return self._run(group, input_tensor, output_tensor, lambda: _ag.describe(s, r, p, rank),
                         native, async_op, stats, fast=fk)

    @_guarded("reduce_scatter", 3)
    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM,
                              group=None, async_op: bool = False, *, stats: Stats | None = None):
        """output = reduction over ranks of block ``rank`` of every rank's ``input``.

        Same arguments as ``torch.distributed.reduce_scatter_tensor``. BF16, FP32 and FP16
        SUM / AVG compressed: the stated sum (and division), docs/TORCH.md.
        """
        group, name = resolve_group(group), _op_name(op)
        fk, done = self._replayed("reduce_scatter", group, input, output, async_op, stats, name)
        if fk is _DONE:
            return done
        p, rank = dist.get_world_size(group), dist.get_rank(group)

        def native():
            return _tr.reduce_scatter_single(output, input, op, group, async_op)

        if not _coded(input, output) or name is None:
            return self._native_fallback("reduce_scatter", _nbytes(input) - _nbytes(output), native,
                                         async_op, stats, _reduce_name(op) if _coded(input) else None)
        s, r = self._arr(input, "input"), self._arr(output, "output")
        return self._run(group, input, output, lambda: _rs.describe(s, r, name, p, rank), native,
                         async_op, stats, reduce=name, fast=fk)

    # torch 2.13's names for the two above (the old ones warn there); the same methods
    all_gather_single = all_gather_into_tensor
    reduce_scatter_single = reduce_scatter_tensor

    @_guarded("all_to_all", 4)
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op: bool = False, *, stats: Stats | None = None):
        """Rank i's block j of ``input`` becomes rank j's block i of ``output``.

        Same arguments as ``torch.distributed.all_to_all_single``: split sizes count
        rows of dim 0; without them both tensors split into equal blocks.
        """
        group = resolve_group(group)
        uneven = input_split_sizes is not None or output_split_sizes is not None
        fk = None
        if not uneven:  # per-peer counts change from call to call: planned each time
            fk, done = self._replayed("all_to_all", group, input, output, async_op, stats)
            if fk is _DONE:
                return done
        p, rank = dist.get_world_size(group), dist.get_rank(group)
        sc = _element_counts(input, input_split_sizes, p, "input")
        rc = _element_counts(output, output_split_sizes, p, "output")

        def describe() -> Call:
            if not uneven:
                return _aa.describe(s, r, p, rank)
            call = _aa.describe(s, r, p, rank, sc, rc)
            call.nbytes = nbytes
            return call

        def native():
            return dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                          group=group, async_op=async_op)

        if not _coded(input, output):
            return self._native_fallback("all_to_all", (sum(sc) - sc[rank]) * input.element_size(),
                                         native, async_op, stats)
        s, r = self._arr(input, "input"), self._arr(output, "output")
        nbytes = s.nbytes
        decided = None
        if uneven and self.policy.mode == "auto":
            # every rank must decide alike: the first uneven call of a group and type agrees on
            # the largest size (one small all-reduce) and its decision holds from then on
            key = (group, input.dtype, input.device)
            decided = self._uneven.get(key)
            if decided is None:
                nbytes = _agreed_max(group, input, [nbytes])[0]
                decided = self._uneven[key] = self._core.decide(describe(), p, self.resolve(
                    self.policy, group, input))
        return self._run(group, input, output, describe, native, async_op, stats, decided=decided,
                         fast=fk)

    @_guarded("all_reduce", 2)
    def all_reduce(self, tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False,
                   *, stats: Stats | None = None):
        """In place: ``tensor`` = reduction over ranks of every rank's ``tensor``.

        Same arguments as ``torch.distributed.all_reduce``. BF16, FP32, FP16 SUM / AVG compressed:
        reduce-scatter of near-equal shards (the stated reduction), then all-gather.
        """
        group, name = resolve_group(group), _op_name(op)
        fk, done = self._replayed("all_reduce", group, tensor, tensor, async_op, stats, name)
        if fk is _DONE:
            return done
        p, rank = dist.get_world_size(group), dist.get_rank(group)

        def native():
            return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)

        if not _coded(tensor) or name is None:
            return self._native_fallback("all_reduce", 2 * _nbytes(tensor) * (p - 1) // max(p, 1),
                                         native, async_op, stats,
                                         _reduce_name(op) if _coded(tensor) else None)
        b = self._arr(tensor, "tensor")
        return self._run(group, tensor, tensor, lambda: _ar.describe(b, name, p, rank), native,
                         async_op, stats, reduce=name, fast=fk)


def _reduce_name(op) -> str:
    """A torch ReduceOp's short name (for decisions' reasons)."""
    return str(getattr(op, "name", op)).split(".")[-1].lower()


def _not_capturing(t: torch.Tensor) -> None:
    """A compressed call cannot be captured in a CUDA graph yet: refuse it, before anything is
    enqueued, with what to do instead (a native call is torch's own, capturable on NCCL)."""
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        raise CollectiveError("zipccl.torch: a compressed collective cannot be captured in a CUDA "
                              "graph yet; call it outside the capture, or with policy='never' "
                              "inside it (torch's own collective)")


def _fast_key(op: str, group, t, r, extra=None):
    """What a compressed call's plan is kept under: the op, the group, both tensors' address,
    size, type, device and layout, and the stream (CUDA: torch's current one); None for
    arguments that are not two tensors (the checked path names the problem)."""
    if not (isinstance(t, torch.Tensor) and isinstance(r, torch.Tensor)):
        return None
    st = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None
    return (op, group, t.data_ptr(), r.data_ptr(), t.numel(), r.numel(), t.dtype, r.dtype,
            t.device, r.device, t.is_contiguous(), r.is_contiguous(), st, extra)


def _coded(*tensors) -> bool:
    """Tensors zipccl codes: torch tensors of one coded dtype (anything else is torch's)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    return tensors[0].dtype in _CODED and all(t.dtype == tensors[0].dtype for t in tensors)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _native_bytes(call: Call, p: int) -> int:
    """Bytes this rank sends in the native form of ``call``."""
    isz = call.send.data.itemsize
    if call.op == "all_reduce":
        return 2 * call.send.nbytes * (p - 1) // max(p, 1)
    return isz * (sum(call.send_counts) - call.send_counts[call.rank])


def _element_counts(t: torch.Tensor, splits, p: int, role: str) -> list[int]:
    """Elements per peer of ``t`` split by rows of dim 0 (torch's split sizes; None: equal)."""
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


def _agreed_max(group, like: torch.Tensor, values: list[int]) -> list[int]:
    """Element-wise maximum over the group's ranks of a few ints (one small all-reduce)."""
    t = torch.tensor(values, dtype=torch.int64, device=like.device)
    dist.all_reduce(t, op=ReduceOp.MAX, group=group)
    return [int(v) for v in t.tolist()]


_DEFAULTS: dict[object, Collectives] = {}
FORGET: list = []  # what else forget_groups clears (autotune adds its calibrations)
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every Collectives made: forget_groups empties them


def forget_groups() -> None:
    """Drop every reference zipccl.torch holds to process groups (links, slot channels, the
    module functions' shared ``Collectives``), then collect; run at interpreter exit, so that
    no gloo group survives into finalization (docs/TORCH.md, "Exit"). Each slot channel's
    progress thread is stopped first. Later calls set them up anew."""
    import gc

    for c in list(_LIVE):
        c._links.clear()
        c._fast.clear()
        try:
            c._core.close_channels(timeout=10.0)
        except Exception:  # noqa: BLE001 -- a call whose kernels never ran: leave its thread
            pass
        c._uneven.clear()
    _DEFAULTS.clear()
    for forget in FORGET:
        forget()
    gc.collect()


atexit.register(forget_groups)


def _default(policy) -> Collectives:
    """The shared ``Collectives`` of the module-level functions, one per policy."""
    key = policy if isinstance(policy, str) else id(policy)
    c = _DEFAULTS.get(key)
    if c is None or (not isinstance(policy, str) and c.policy is not policy):
        c = _DEFAULTS[key] = Collectives(policy)
    return c


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False, *,
                           policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.all_gather_into_tensor``, BF16 / FP32 / FP16 compressed as ``policy`` says.

    ``stats``: a ``Stats`` to count this call in. See ``Collectives``.
    """
    c = _default(policy)
    return c.all_gather_into_tensor(output_tensor, input_tensor, group, async_op, stats=stats)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
                          policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.reduce_scatter_tensor``, BF16 / FP32 / FP16 SUM / AVG compressed as
    ``policy`` says."""
    c = _default(policy)
    return c.reduce_scatter_tensor(output, input, op, group, async_op, stats=stats)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, *, policy: str | Policy = "auto",
                      stats: Stats | None = None):
    """``torch.distributed.all_to_all_single``, BF16 / FP32 / FP16 compressed as ``policy`` says."""
    c = _default(policy)
    return c.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group,
                               async_op, stats=stats)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
               policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.all_reduce``, BF16 / FP32 / FP16 SUM / AVG compressed as ``policy`` says."""
    c = _default(policy)
    return c.all_reduce(tensor, op, group, async_op, stats=stats)


# torch 2.13's names for the first two (torch.distributed.all_gather_single and
# reduce_scatter_single, same signatures; the old names warn there): the same functions,
# offered whichever torch is installed
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
