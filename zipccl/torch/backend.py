"""The torch.distributed backend "zipccl": compression for any code, by changing the backend string.

``import zipccl.torch`` registers it; then ``dist.init_process_group("cpu:gloo,cuda:zipccl")``
and every eligible collective any code issues (FSDP, DDP, DTensor, a user's ``dist.all_reduce``)
goes through ``zipccl.torch``'s ``Collectives`` as the policy decides; everything else goes to
an inner c10d group (gloo for CPU tensors, NCCL or gloo for CUDA ones) with its exact behaviour.
``ZipProcessGroup`` is a Python ``ProcessGroup``: each method either compresses (coded dtypes,
SUM / AVG, the single-tensor and same-shape list forms) or passes the call untouched to the
inner group; calls a compressed call makes on the group pass through (``_Passthrough``). The
policy: ``BackendOptions(policy=...)``, else ``$ZIPCCL_POLICY``, else "auto" (calibrated once
per group and device type, ``autotune``). torch >= 2.11 (tested: 2.13). How it is built and
what the registration cannot do: docs/TORCH.md, "The backend".
"""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    ReduceScatterOptions,
)

from ..comm.policy import MODES, Policy, env_policy
from ..comm.stats import Stats
from .functional import Collectives
from .translate import refused
from .transport import post_failure
from .work import _done_work

BACKEND = "zipccl"
STAT_OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")


@dataclass(frozen=True)
class BackendOptions:
    """``pg_options`` of ``init_process_group`` / ``new_group`` for the zipccl backend.

    ``policy``: "auto" | "always" | "never" | a ``zipccl.comm.Policy`` (None:
    ``$ZIPCCL_POLICY``, else "auto"); ``nccl``: a ``ProcessGroupNCCL.Options`` for the inner
    NCCL group (its timeout is the group's); ``cuda``: the inner backend for CUDA tensors,
    "nccl" or "gloo" (gloo moves CUDA tensors too: ranks that share one GPU, which NCCL refuses).

    >>> BackendOptions(policy="always").policy
    'always'
    """

    policy: str | Policy | None = None
    nccl: object | None = None
    cuda: str = "nccl"

    def __post_init__(self):
        if self.cuda not in ("nccl", "gloo"):
            raise ValueError(f'cuda must be "nccl" or "gloo", got {self.cuda!r}')
        if isinstance(self.policy, str) and self.policy not in MODES:
            raise ValueError(f"policy must be one of {MODES} or a Policy, got {self.policy!r}")


def _mode(policy: str | Policy | None) -> str | Policy:
    """The policy a new group starts with: the argument, else ``$ZIPCCL_POLICY``, else "auto"."""
    if policy is not None:
        return policy
    return env_policy() or "auto"


class _Passthrough(threading.local):
    depth = 0


class ZipProcessGroup(dist.ProcessGroup):
    """The "zipccl" torch.distributed group (module docstring). Built by torch, not by users."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta,
                 options: BackendOptions | None = None):
        super().__init__(rank, size)
        options = options if options is not None else BackendOptions()
        self._pt = _Passthrough()
        self._inner = dist.ProcessGroup(store, rank, size)
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("zipccl-gloo/", store), rank, size, timeout)
        gloo._set_sequence_number_for_group()
        backends = [("cpu", dist.ProcessGroup.BackendType.GLOO, gloo)]
        if options.cuda == "gloo":
            backends.append(("cuda", dist.ProcessGroup.BackendType.GLOO, gloo))
        elif torch.cuda.is_available() and dist.is_nccl_available():
            nopts = options.nccl if options.nccl is not None else dist.ProcessGroupNCCL.Options()
            nopts._timeout = timeout
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore("zipccl-nccl/", store), rank, size, nopts)
            nccl._set_sequence_number_for_group()
            backends.append(("cuda", dist.ProcessGroup.BackendType.NCCL, nccl))
        for device, kind, backend in backends:
            self._inner._register_backend(torch.device(device), kind, backend)
            self._register_backend(torch.device(device), kind, backend)
        self._inner._set_default_backend(backends[-1][1])
        self._policy = _mode(options.policy)
        self._zc: dict[str, Collectives] = {}  # per device type
        self._stats = Stats()  # every compressed or native call this group ran, per collective
        self._passed: dict[str, int] = {}

    # -- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 -- torch's name for it
        return BACKEND

    def __repr__(self) -> str:
        return f"ZipProcessGroup(rank={self.rank()}, size={self.size()}, policy={self.policy_mode!r})"

    @property
    def inner(self) -> dist.ProcessGroup:
        """The wrapped c10d group (gloo for CPU tensors, NCCL for CUDA tensors)."""
        return self._inner

    @property
    def policy_mode(self) -> str:
        return self._policy if isinstance(self._policy, str) else self._policy.mode

    # -- the policy -------------------------------------------------------------------------
    def collectives(self, device: torch.device) -> Collectives:
        """The ``Collectives`` for tensors on ``device``'s type, calibrated on first use under "auto".

        Collective under "auto" the first time per device type: every rank reaches it at the same
        call (the first eligible one).
        """
        c = self._zc.get(device.type)
        if c is None:
            policy = self._policy
            if isinstance(policy, str) and policy == "auto":
                from . import autotune

                with self.passthrough():
                    policy = autotune.policy_for(self, device, base=Policy("auto"))
            c = self._zc[device.type] = Collectives(policy)
        return c

    def passthrough(self):
        """Context manager: calls on this group from this thread go to the inner group."""
        return _Scope(self._pt)

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Per collective: calls, compressed calls, raw and wire bytes sent, bytes saved; and the
        number of calls passed through per method."""
        out = {}
        for op in STAT_OPS:
            s = self._stats.of(op)
            out[op] = {**s.as_dict(), "saved_bytes": s.raw_bytes - s.wire_bytes}
        out["passthrough"] = dict(self._passed)
        return out

    def reset_stats(self) -> None:
        self._stats.reset()
        self._passed.clear()

    # -- dispatch ---------------------------------------------------------------------------
    def _pass(self, name: str, *args, **kwargs):
        if self._pt.depth:
            return getattr(self._inner, name)(*args, **kwargs)
        self._passed[name] = self._passed.get(name, 0) + 1
        try:
            return getattr(self._inner, name)(*args, **kwargs)
        except Exception as e:
            # torch's own error for this rank's call; its peers may be waiting in a compressed
            # exchange, whose timeout error then names this one (transport.peer_failures)
            post_failure(self, f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            raise

    def _run(self, op: str, device: torch.device, call):
        """Run ``call(collectives, stats)`` with this group's calls passed through; the core counts
        it into this group's ``Stats`` too."""
        c = self.collectives(device)
        with self.passthrough():
            return call(c, self._stats)

    def _takes(self, op: str, tensors, send_n: int, recv_n: int, reduce=None, splits=None) -> bool:
        """Whether zipccl runs the call (``translate.refused``: the one decision); else it goes to
        the inner group unchanged, as it does inside a pass-through scope and on a device type
        the inner group has no backend for."""
        if self._pt.depth or tensors[0].device.type not in self._device_types_str():
            return False
        return refused(op, self.size(), tensors, send_n, recv_n, reduce, splits) is None

    def _device_types_str(self) -> tuple[str, ...]:
        d = getattr(self, "_dev_types", None)
        if d is None:
            d = self._dev_types = tuple(x.type for x in self._inner._device_types)
        return d

    # all-gather into one tensor (torch >= 2.13 calls all_gather_single, older _allgather_base)
    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        if self._takes("all_gather", (input, output), input.numel(), output.numel()):
            return self._run("all_gather", input.device, lambda c, st: c.all_gather_into_tensor(
                output, input, group=self, async_op=True, stats=st))
        return self._pass("all_gather_single", output, input, opts)

    def _allgather_base(self, output, input, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        if self._takes("all_gather", (input, output), input.numel(), output.numel()):
            return self.all_gather_single(output, input, opts)
        return self._pass("_allgather_base", output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else ReduceScatterOptions()
        if self._takes("reduce_scatter", (input, output), input.numel(), output.numel(), opts.reduceOp):
            return self._run("reduce_scatter", input.device, lambda c, st: c.reduce_scatter_tensor(
                output, input, opts.reduceOp, group=self, async_op=True, stats=st))
        return self._pass("reduce_scatter_single", output, input, opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else ReduceScatterOptions()
        if self._takes("reduce_scatter", (input, output), input.numel(), output.numel(), opts.reduceOp):
            return self.reduce_scatter_single(output, input, opts)
        return self._pass("_reduce_scatter_base", output, input, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else AllToAllOptions()
        osz = list(output_split_sizes) or None
        isz = list(input_split_sizes) or None
        if self._takes("all_to_all", (input, output), input.numel(), output.numel(),
                       splits=(isz, osz)):
            return self._run("all_to_all", input.device, lambda c, st: c.all_to_all_single(
                output, input, osz, isz, group=self, async_op=True, stats=st))
        return self._pass("all_to_all_single", output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else AllToAllOptions()
        if self._takes("all_to_all", (input, output), input.numel(), output.numel(),
                       splits=(list(input_split_sizes) or None, list(output_split_sizes) or None)):
            return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)
        return self._pass("alltoall_base", output, input, output_split_sizes, input_split_sizes, opts)

    def allreduce(self, tensors, opts=None):
        if not isinstance(opts, AllreduceOptions):  # allreduce(tensors, op) overload
            op, opts = opts, AllreduceOptions()
            if op is not None:
                opts.reduceOp = op
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        t = tensors[0] if len(tensors) == 1 else None
        if t is not None and self._takes("all_reduce", (t, t), t.numel(), t.numel(), opts.reduceOp):
            return self._run("all_reduce", t.device, lambda c, st: c.all_reduce(
                t, opts.reduceOp, group=self, async_op=True, stats=st))
        return self._pass("allreduce", tensors, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        p = self.size()
        # the list form as the one-tensor call: p outputs, each of the input's shape
        if (_list_form(input_tensors, output_tensors, p)
                and self._takes("all_gather", (input_tensors[0], *output_tensors[0]),
                                input_tensors[0].numel(), p * input_tensors[0].numel())):
            x, outs = input_tensors[0], output_tensors[0]
            flat = torch.empty((p * x.numel(),), dtype=x.dtype, device=x.device)
            # x flat too: a call "auto" leaves native reaches gloo's all-gather, which wants the
            # output to be p inputs' shapes
            work = self._run("all_gather", x.device, lambda c, st: c.all_gather_into_tensor(
                flat, x.reshape(-1), group=self, async_op=True, stats=st))
            work.wait()
            for r, o in enumerate(outs):
                o.copy_(flat[r * x.numel():(r + 1) * x.numel()].view(o.shape))
            return _done_work(outs[0] if outs else None)
        return self._pass("allgather", output_tensors, input_tensors, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else ReduceScatterOptions()
        p = self.size()
        # the list form as the one-tensor call: p inputs, each of the output's shape
        if (_list_form(output_tensors, input_tensors, p)
                and self._takes("reduce_scatter", (output_tensors[0], *input_tensors[0]),
                                p * output_tensors[0].numel(), output_tensors[0].numel(),
                                opts.reduceOp)):
            out = output_tensors[0]
            flat = torch.cat([i.reshape(-1) for i in input_tensors[0]])
            return self._run("reduce_scatter", out.device, lambda c, st: c.reduce_scatter_tensor(
                out, flat, opts.reduceOp, group=self, async_op=True, stats=st))
        return self._pass("reduce_scatter", output_tensors, input_tensors, opts)


class _Scope:
    def __init__(self, pt: _Passthrough):
        self._pt = pt

    def __enter__(self):
        self._pt.depth += 1
        return self

    def __exit__(self, *exc):
        self._pt.depth -= 1


def _passthrough_method(name: str):
    def method(self, *args, **kwargs):
        return self._pass(name, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}``: the inner group's, unchanged."
    return method


# Everything else torch may call on a group goes to the inner group as it is.
_PASSED = ("allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single_coalesced",
           "allreduce_coalesced", "alltoall", "barrier", "broadcast", "gather", "monitored_barrier",
           "recv", "recv_anysource", "reduce", "reduce_scatter_single_coalesced",
           "reduce_scatter_tensor_coalesced", "scatter", "send", "_start_coalescing",
           "_end_coalescing")
for _name in _PASSED:
    if hasattr(dist.ProcessGroup, _name):
        setattr(ZipProcessGroup, _name, _passthrough_method(_name))


def _create(backend_opts, pg_options) -> ZipProcessGroup:
    """torch's creator for "zipccl" (``register_backend(..., extended_api=True)``)."""
    if pg_options is not None and not isinstance(pg_options, BackendOptions):
        raise TypeError(f"pg_options for the zipccl backend must be zipccl.torch.BackendOptions, "
                        f"got {type(pg_options).__name__}")
    return ZipProcessGroup(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                           backend_opts.timeout, pg_options)


def register() -> None:
    """Register "zipccl" with torch.distributed (``import zipccl.torch`` does; idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def zip_group(group=None) -> ZipProcessGroup:
    """``group`` (default: the world group) as a zipccl group; TypeError if it is another backend's."""
    g = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(g, ZipProcessGroup):
        raise TypeError(f"not a zipccl group (backend {dist.get_backend(g)!r}): create it with "
                        f'init_process_group("cpu:gloo,cuda:zipccl") or new_group(backend="zipccl")')
    return g


def stats(group=None) -> dict:
    """What the zipccl group ``group`` (default: world) compressed, per collective.

    ``{op: {"calls", "compressed_calls", "raw_bytes", "wire_bytes", "saved_bytes"}, ...,
    "passthrough": {method: calls}}`` for op in all_gather, reduce_scatter, all_to_all,
    all_reduce: bytes this rank sent, raw vs on the wire.
    """
    return zip_group(group).stats()


def reset_stats(group=None) -> None:
    """Zero ``stats(group)``."""
    zip_group(group).reset_stats()


def _list_form(ones, lists, p: int) -> bool:
    """Whether a list-form call is one tensor (``ones``) against one list of ``p`` tensors of its
    shape (``lists``): the form the one-tensor collectives run."""
    return (len(ones) == 1 and len(lists) == 1 and len(lists[0]) == p
            and all(t.shape == ones[0].shape for t in lists[0]))
