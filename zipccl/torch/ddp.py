"""A DDP communication hook: the all-reduce of each BF16, FP32 or FP16 gradient bucket, compressed.

::

    state = zipccl.torch.DDPCommState(policy="auto")
    ddp_model.register_comm_hook(state, zipccl.torch.ddp_comm_hook)
    ...
    print(state.stats)

It does what DDP's own all-reduce does -- divide the bucket by the group size,
then sum over ranks -- with the sum computed by zipccl (see
``zipccl.torch.functional``). On 2 ranks the result is bit-identical to DDP
without a hook for finite gradients whose halves stay normal numbers. Buckets
of other dtypes, and buckets the policy keeps native, go through
torch.distributed's all-reduce exactly as ``default_hooks.allreduce_hook`` does.
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..comm.policy import Policy
from .functional import Collectives, Stats


@dataclass
class DDPCommState:  # annotations evaluated (no __future__ import): DDP checks the hook's at run time
    """The hook's state: the group (None: the default one), the policy, the counters."""

    group: object = None
    policy: str | Policy = "auto"
    chunk_bytes: int = 0
    collectives: Collectives = field(init=False)

    def __post_init__(self):
        self.collectives = Collectives(self.policy, chunk_bytes=self.chunk_bytes)

    @property
    def stats(self) -> Stats:
        return self.collectives.stats


def ddp_comm_hook(state: DDPCommState | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: bucket / world size, then a (compressed for BF16 / FP32 / FP16) SUM all-reduce.

    ``state`` may be None (default group, ``policy="auto"``, no counters kept).
    """
    if state is None:
        state = _default_state()
    tensor = bucket.buffer()
    group = state.group if state.group is not None else dist.group.WORLD
    tensor.div_(dist.get_world_size(group))
    coll = state.collectives
    work = coll.all_reduce(tensor, dist.ReduceOp.SUM, group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


_STATE: list[DDPCommState] = []


def _default_state() -> DDPCommState:
    if not _STATE:
        _STATE.append(DDPCommState())
    return _STATE[0]
