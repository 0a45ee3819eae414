"""torch.distributed's collectives, BF16 / FP32 / FP16 compressed bit-exact: the torch front end
of the one call path (docs/ARCHITECTURE.md). ``Collectives`` takes torch.distributed's arguments
and returns what it returns (``None``, or a ``Work`` with ``async_op=True``); ``translate`` reads
its tensors for ``comm.core.Core.call``, whose hooks it answers (a group's transport and link,
torch's current stream). Another dtype or reduction (not SUM / AVG) goes to torch.distributed's
own function unchanged. CUDA tensors run in order on torch's current stream, CPU tensors
synchronously. The module-level functions share one ``Collectives`` per policy. What the results
are, bit for bit: docs/TORCH.md.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm import all_gather as _ag
from ..comm import all_reduce as _ar
from ..comm import all_to_all as _aa
from ..comm import reduce_scatter as _rs
from ..comm.agreement import Agreement
from ..comm.args import wrap
from ..comm.core import DEFAULT_CHUNK_BYTES, NATIVE, Core, Front, Link
from ..comm.policy import Policy
from ..comm.spill import Spills
from ..comm.stats import Stats
from . import transport as _tr
from .translate import ReduceOp, fast_key, nbytes, op_name, refused, split_counts
from .transport import ProcessGroupTransport, TorchChannel, resolve_group
from .work import _CheckedWork, _done_work, _guarded

# whether the current stream is being captured, asked in C (torch.cuda's function wraps it)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


class Collectives(Front):
    """The four collectives with one configuration, one ``comm.core.Core`` and one ``stats``.

    >>> # in a torch.distributed job (gloo on CPU, NCCL on GPU):
    >>> # zc = Collectives(policy="always")
    >>> # zc.all_gather_into_tensor(out, x)          # like dist.all_gather_into_tensor(out, x)
    >>> # zc.stats.compressed_calls, zc.stats.wire_bytes / zc.stats.raw_bytes

    ``policy``: "auto" (BF16, FP32, FP16 messages of ``min_compress_bytes`` or more per rank on a
    GPU; host tensors too with ``compress_host``), "always", "never", "raw", or a
    ``zipccl.comm.Policy``. ``chunk_bytes``, ``checksum``, ``capacity``: as ``Communicator``'s.
    """

    @staticmethod
    def resolve(policy: Policy, group, t: torch.Tensor) -> Policy:
        """The policy a call follows: ``policy`` here; ``autotune`` installs the group's calibrated "auto"."""
        return policy

    def __init__(self, policy: str | Policy = "auto", *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 checksum: bool = False, min_compress_bytes: int = 1 << 20,
                 compress_host: bool = False, capacity=None):
        pol = policy if isinstance(policy, Policy) else \
            Policy(policy, min_bytes=min_compress_bytes, compress_host=compress_host)
        self._core = Core(pol, chunk_bytes=chunk_bytes, checksum=checksum, capacity=capacity)
        self._links: dict[tuple, tuple[ProcessGroupTransport, Link]] = {}
        self._capture_streams: dict[torch.device, torch.cuda.Stream] = {}  # zipccl's own graphs'
        _tr.HOLDERS.add(self)  # transport.forget_groups calls forget()

    def forget(self) -> None:
        """Drop every reference to process groups: links (and the decisions agreed on each), plans,
        slot channels (their progress threads stopped first); later calls set them up anew."""
        self._links.clear()
        self._core.plans.clear()
        try:
            self._core.close_channels(timeout=10.0)
        except Exception:  # noqa: BLE001 -- a call whose kernels never ran: leave its thread
            pass

    # -- what the core asks (``ctx``: the group and the tensor the call runs on) -------------
    def described(self, op: str, describe, ctx):
        return describe(dist.get_world_size(ctx[0]), dist.get_rank(ctx[0]))

    def link(self, call, ctx):
        group, t = ctx
        key = (group, t.device)
        got = self._links.get(key)
        if got is None:
            tr = ProcessGroupTransport(group, t.device)
            got = self._links[key] = (tr, Link(Agreement(tr, tr.size), native_host=False))
        call.stream = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None
        return got[1], got[0].size, self.resolve(self._core.policy, group, t)

    def where(self, call, ctx):
        group, t = ctx
        if not t.is_cuda:
            return self._core.engine(False), self._links[(group, t.device)][0]
        import cupy

        idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
        cupy.cuda.Device(idx).use()  # CuPy keeps its own current device: the engine works on t's
        return self._core.engine(True, call.stream, idx), self._links[(group, t.device)][0]

    def capturing(self, call, ctx) -> bool:
        return _capturing()

    def graph(self, call, ctx, record):
        """``record(stream)`` captured with ``torch.cuda.CUDAGraph`` on a capture stream of this
        object's own per device, thread-local: no other thread's CUDA calls are disturbed; its
        memory comes from the graph's own pool. ``replay`` launches it on torch's current stream,
        the call's (the plan's key names it): the default stream too."""
        device = ctx[1].device
        stream = torch.cuda.current_stream(device)
        if stream.cuda_stream != call.stream:
            return None
        cap = self._capture_streams.get(device)
        if cap is None:
            cap = self._capture_streams[device] = torch.cuda.Stream(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(cap):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                record(cap.cuda_stream)
            finally:
                graph.capture_end()
        return graph.replay

    def spills(self, eng, ctx):
        group, t = ctx
        return (group, t.device), lambda: Spills(TorchChannel(group), device=t.is_cuda)

    # -- translation ------------------------------------------------------------------------
    def _call(self, op: str, group, t, result, async_op: bool, stats, native, describe, passed,
              reduce=None, name=None, extra=None, settle=None, splits=None):
        """A call on the core's path (``describe(p, rank)``), or, where zipccl does not code its
        type or reduction (``refused``), torch's ``native()`` counted as ``passed(p)`` bytes;
        the ``Work`` of a compressed ``async_op=True`` call (``_done_work``, checked on CUDA)."""
        if not isinstance(t, torch.Tensor) or not isinstance(result, torch.Tensor):
            bad = result if isinstance(t, torch.Tensor) else t
            raise TypeError(f"expected a torch.Tensor, got {type(bad).__name__}")
        key = None if settle is not None else fast_key(op, group, t, result, extra or name)
        plan = self._core.plans.get(key) if key is not None else None
        if plan is None or (plan.call is None and plan.run is None):  # a kept plan was taken
            no = refused(op, group.size(), (t, result), t.numel(), result.numel(), reduce, splits)
            if no is not None and no[0] == NATIVE:  # INVALID: the collective's describe raises
                work = self._core.native_call(op, passed(group.size()), no[1], native, stats)
                return work if async_op else None
        work = self._core.call(self, op, key, describe, (group, t), stats, native=native,
                               settle=settle, plan=plan)
        if not async_op:
            return None
        if work is not None:
            return work
        ch = self._core.channels().get((group, result.device)) if result.is_cuda else None
        return _done_work(result) if ch is None else _CheckedWork(_done_work(result), ch)

    # -- the collectives: torch.distributed's signatures; ``stats``: one more ``Stats`` to count in
    @_guarded("all_gather", 2)
    def all_gather_into_tensor(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               group=None, async_op: bool = False, *, stats: Stats | None = None):
        """As ``dist.all_gather_into_tensor``: output = every rank's ``input_tensor`` in rank order;
        ``input_tensor`` may be this rank's slice of ``output_tensor`` (in place, as FSDP2 calls it)."""
        group = resolve_group(group)
        return self._call(
            "all_gather", group, input_tensor, output_tensor, async_op, stats,
            lambda: _tr.all_gather_single(output_tensor, input_tensor, group, async_op),
            lambda p, rank: _ag.describe(wrap(input_tensor, None, "input_tensor"),
                                         wrap(output_tensor, None, "output_tensor"), p, rank),
            lambda p: nbytes(input_tensor) * (p - 1))

    @_guarded("reduce_scatter", 3)
    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM,
                              group=None, async_op: bool = False, *, stats: Stats | None = None):
        """As ``dist.reduce_scatter_tensor``: output = reduction over ranks of block ``rank`` of
        every rank's ``input`` (SUM / AVG compressed: the stated sum and division, docs/TORCH.md)."""
        group, name = resolve_group(group), op_name(op)
        return self._call(
            "reduce_scatter", group, input, output, async_op, stats,
            lambda: _tr.reduce_scatter_single(output, input, op, group, async_op),
            lambda p, rank: _rs.describe(wrap(input, None, "input"), wrap(output, None, "output"),
                                         name, p, rank),
            lambda p: nbytes(input) - nbytes(output), op, name)

    # torch 2.13's names for the two above (the old ones warn there); the same methods
    all_gather_single = all_gather_into_tensor
    reduce_scatter_single = reduce_scatter_tensor

    @_guarded("all_to_all", 4)
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op: bool = False, *, stats: Stats | None = None):
        """As ``dist.all_to_all_single``: rank i's block j of ``input`` becomes rank j's block i of
        ``output``; split sizes count rows of dim 0 (none: equal blocks). Per-peer counts under
        "auto" decide once per group and type (``comm.core.Core.settled``)."""
        group = resolve_group(group)
        splits = (input_split_sizes, output_split_sizes)
        uneven = input_split_sizes is not None or output_split_sizes is not None
        settled = uneven and self.policy.mode == "auto"  # decided on the largest size over ranks

        def describe(p: int, rank: int):  # the split sizes checked first, as torch's rows
            counts = split_counts(input, output, splits, p)
            return _aa.describe(wrap(input, None, "input"), wrap(output, None, "output"), p, rank,
                                *(counts if uneven else ()))

        def passed(p: int) -> int:  # bytes torch's own call sends
            sc = split_counts(input, output, splits, p)[0]
            return (sum(sc) - sc[dist.get_rank(group)]) * input.element_size()

        return self._call(
            "all_to_all", group, input, output, async_op, stats,
            lambda: dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                           group=group, async_op=async_op),
            describe, passed, extra="uneven" if uneven else None, splits=splits,
            settle=(lambda n: self._links[(group, input.device)][0].max_int(n)) if settled else None)

    @_guarded("all_reduce", 2)
    def all_reduce(self, tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False,
                   *, stats: Stats | None = None):
        """As ``dist.all_reduce``, in place: ``tensor`` = reduction over ranks of every rank's
        ``tensor`` (SUM / AVG compressed: a reduce-scatter of near-equal shards, then an all-gather)."""
        group, name = resolve_group(group), op_name(op)
        return self._call(
            "all_reduce", group, tensor, tensor, async_op, stats,
            lambda: dist.all_reduce(tensor, op=op, group=group, async_op=async_op),
            lambda p, rank: _ar.describe(wrap(tensor, None, "tensor"), name, p, rank),
            lambda p: 2 * nbytes(tensor) * (p - 1) // max(p, 1), op, name)


_DEFAULTS: dict[object, Collectives] = {}
_tr.FORGET.append(_DEFAULTS.clear)  # forget_groups drops them


def _default(policy) -> Collectives:
    """The shared ``Collectives`` of the module-level functions, one per policy."""
    key = policy if isinstance(policy, str) else id(policy)
    c = _DEFAULTS.get(key)
    if c is None or (not isinstance(policy, str) and c.policy is not policy):
        c = _DEFAULTS[key] = Collectives(policy)
    return c


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False, *,
                           policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.all_gather_into_tensor``, compressed as ``policy`` says (``Collectives``)."""
    return _default(policy).all_gather_into_tensor(output_tensor, input_tensor, group, async_op, stats=stats)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
                          policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.reduce_scatter_tensor``, compressed as ``policy`` says (``Collectives``)."""
    return _default(policy).reduce_scatter_tensor(output, input, op, group, async_op, stats=stats)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, *, policy: str | Policy = "auto",
                      stats: Stats | None = None):
    """``torch.distributed.all_to_all_single``, compressed as ``policy`` says (``Collectives``)."""
    return _default(policy).all_to_all_single(output, input, output_split_sizes,
                                              input_split_sizes, group, async_op, stats=stats)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
               policy: str | Policy = "auto", stats: Stats | None = None):
    """``torch.distributed.all_reduce``, compressed as ``policy`` says (``Collectives``)."""
    return _default(policy).all_reduce(tensor, op, group, async_op, stats=stats)


# torch 2.13's names for the first two (the old names warn there), whichever torch is installed
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
