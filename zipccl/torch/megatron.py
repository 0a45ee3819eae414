"""Megatron-LM-shaped collectives: drop-ins for its swappable gradient / parameter functions.

Megatron-LM's ``megatron/core/distributed/param_and_grad_buffer.py`` calls two module-level
functions, ``dist_all_gather_func(output, input, group=, async_op=)`` and
``dist_reduce_scatter_func(output, input, op=, group=, async_op=)``, and waits on the handle
they return. ``MegatronComm`` provides both, always returning a handle with ``.wait()``::

    import megatron.core.distributed.param_and_grad_buffer as pgb
    mc = zipccl.torch.MegatronComm(policy="auto")
    pgb.dist_all_gather_func, pgb.dist_reduce_scatter_func = mc.all_gather, mc.reduce_scatter

On CUDA tensors a compressed call enqueues its work on torch's current stream and reads nothing
back to the host, but it issues several transfers (the slot exchange's rounds, spilled tails on
a gloo group); torch's ``_coalescing_manager`` on NCCL defers every collective to the end of its
block, and Megatron puts one around its bucket loop: that is untested, so call outside one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm.policy import Policy
from .functional import Collectives, Stats, _done_work


class MegatronComm:
    """``all_gather(output, input, group, async_op)`` and ``reduce_scatter(output, input, op, group,
    async_op)`` with Megatron's argument order, returning a handle with ``.wait()``."""

    def __init__(self, policy: str | Policy = "auto", *, chunk_bytes: int = 0):
        self.collectives = Collectives(policy, chunk_bytes=chunk_bytes)

    @property
    def stats(self) -> Stats:
        return self.collectives.stats

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
        work = self.collectives.all_gather_into_tensor(output, input, group, async_op=True)
        return work if work is not None else _done_work(output)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM,
                       group=None, async_op: bool = False):
        work = self.collectives.reduce_scatter_tensor(output, input, op, group, async_op=True)
        return work if work is not None else _done_work(output)
