"""zipccl in PyTorch: torch.distributed-shaped functions, FSDP2 comms, a DDP hook, Megatron drop-ins.

Importing ``zipccl`` never imports torch; importing ``zipccl.torch`` does. Bytes
move over a torch ``ProcessGroup`` (``transport.ProcessGroupTransport``: NCCL on
GPUs, gloo on CPUs), so a ``torchrun`` job needs no MPI.

- ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``, ``all_reduce``
  (and torch 2.13's names ``all_gather_single`` / ``reduce_scatter_single``): torch.distributed's
  signatures and results, compressed as the ``policy`` says;
- ``compress_fsdp`` (FSDP2), ``ddp_comm_hook`` (DDP), ``MegatronComm`` (Megatron-LM);
- the torch.distributed backend "zipccl", registered on import:
  ``dist.init_process_group("cpu:gloo,cuda:zipccl")`` compresses what any code issues;
  ``stats()`` says what it compressed, ``explain(op, nbytes)`` why.

What is bit-identical to torch.distributed, and what zipccl guarantees instead: docs/TORCH.md.
"""

from .autotune import calibrate, explain
from .backend import BackendOptions, ZipProcessGroup, register, reset_stats, stats
from .ddp import DDPCommState, ddp_comm_hook
from .fsdp import FSDPHooks, ZipAllGather, ZipReduceScatter, compress_fsdp
from .functional import (
    Collectives,
    ReduceOp,
    Stats,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_to_all_single,
    reduce_scatter_single,
    reduce_scatter_tensor,
)
from .megatron import MegatronComm
from .transport import ProcessGroupTransport

register()

__all__ = [
    "BackendOptions", "Collectives", "DDPCommState", "FSDPHooks", "MegatronComm",
    "ProcessGroupTransport", "ReduceOp", "Stats", "ZipAllGather", "ZipProcessGroup", "ZipReduceScatter",
    "all_gather_into_tensor", "all_gather_single", "all_reduce", "all_to_all_single", "calibrate",
    "compress_fsdp", "ddp_comm_hook", "explain", "reduce_scatter_single", "reduce_scatter_tensor",
    "register", "reset_stats", "stats",
]
