"""FSDP2 comm objects: compressed all-gather of parameters, compressed reduce-scatter of gradients.

``torch.distributed.fsdp`` (FSDP2, ``fully_shard``; torch >= 2.11) lets each ``FSDPModule``
swap the collectives it runs (``set_custom_all_gather`` / ``set_custom_reduce_scatter``) for
objects with ``allocate(size, *, dtype, device)`` and
``__call__(output_tensor, input_tensor, group, [op,] async_op)``. ``ZipAllGather`` and
``ZipReduceScatter`` are such objects; ``compress_fsdp`` installs them on every FSDP module
of a model -- one line in a training script::

    hooks = zipccl.torch.compress_fsdp(model, policy="auto")
    print(hooks.stats)   # after some steps: calls, compressed_calls, raw_bytes, wire_bytes

FSDP2 reduce-scatters with ``ReduceOp.AVG``; BF16, FP32 and FP16 buffers are reduced by zipccl
(``zipccl.torch.functional`` states the exact result). ``PREMUL_SUM`` (a custom gradient divide
factor) passes through to torch.distributed's own reduce-scatter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..comm.policy import Policy
from .functional import Collectives, Stats

try:  # the base classes of FSDP2's comm objects, in every torch zipccl.torch supports (>= 2.11);
    # the objects work by duck typing without them
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover - older torch
    _AllGatherBase = _ReduceScatterBase = object


class _Alloc:
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A plain ``torch.empty`` buffer (FSDP2's default)."""
        return torch.empty(*size, dtype=dtype, device=device)


class ZipAllGather(_Alloc, _AllGatherBase):
    """FSDP2's ``AllGather`` comm, compressed for BF16, FP32 and FP16 parameters.

    ``collectives``: a shared ``zipccl.torch.Collectives`` (its ``stats`` count the calls).
    """

    def __init__(self, policy: str | Policy = "auto", *, collectives: Collectives | None = None):
        self.collectives = collectives if collectives is not None else Collectives(policy)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group,
                 async_op: bool = False):
        return self.collectives.all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


class ZipReduceScatter(_Alloc, _ReduceScatterBase):
    """FSDP2's ``ReduceScatter`` comm, compressed for BF16, FP32 and FP16 gradients (SUM and AVG)."""

    def __init__(self, policy: str | Policy = "auto", *, collectives: Collectives | None = None):
        self.collectives = collectives if collectives is not None else Collectives(policy)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op,
                 async_op: bool = False):
        return self.collectives.reduce_scatter_tensor(output_tensor, input_tensor, op, group, async_op)


@dataclass
class FSDPHooks:
    """What ``compress_fsdp`` installed: the comm objects, the modules, the shared counters."""

    all_gather: ZipAllGather | None
    reduce_scatter: ZipReduceScatter | None
    modules: list = field(default_factory=list)
    collectives: Collectives | None = None

    @property
    def stats(self) -> Stats:
        """calls, compressed_calls, raw_bytes, wire_bytes over both collectives (this rank)."""
        return self.collectives.stats


def compress_fsdp(module: torch.nn.Module, *, policy: str | Policy = "auto", all_gather: bool = True,
                  reduce_scatter: bool = True, chunk_bytes: int = 0) -> FSDPHooks:
    """Install ``ZipAllGather`` / ``ZipReduceScatter`` on every ``FSDPModule`` in ``module``.

    Call it after ``fully_shard`` (the setters act per module, so every sharded
    submodule gets them). Returns the hooks; ``hooks.stats`` counts their calls.

    >>> # model = ...; [fully_shard(b, mp_policy=mp) for b in model.blocks]; fully_shard(model, ...)
    >>> # hooks = compress_fsdp(model, policy="auto")
    """
    from torch.distributed.fsdp import FSDPModule

    coll = Collectives(policy, chunk_bytes=chunk_bytes)
    ag = ZipAllGather(collectives=coll) if all_gather else None
    rs = ZipReduceScatter(collectives=coll) if reduce_scatter else None
    mods = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not mods:
        raise ValueError("compress_fsdp: no FSDPModule in the module; call fully_shard first")
    if not hasattr(mods[0], "set_custom_all_gather"):
        raise RuntimeError(f"compress_fsdp needs FSDP2's custom comm hooks (torch >= 2.11 has them); "
                           f"this is torch {torch.__version__}")
    for m in mods:
        if ag is not None:
            m.set_custom_all_gather(ag)
        if rs is not None:
            m.set_custom_reduce_scatter(rs)
    return FSDPHooks(ag, rs, mods, coll)
