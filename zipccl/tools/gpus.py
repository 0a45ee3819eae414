"""Which GPU each rank of a job uses, and whether ranks share one: one rule for every script.

The ranks of a node take the node's visible GPUs round robin: local rank ``r`` of ``n``
uses GPU ``r % g``. With fewer GPUs than local ranks (``n > g``: two ranks on a
one-GPU machine) some ranks share a GPU. NCCL refuses that (two ranks of one
communicator on one device); MPI (device arrays staged through host memory) and
gloo (which moves CUDA tensors) do not, so a caller on a shared GPU picks one of them.

``place`` is the rule on plain numbers (tested with stand-in values, no GPU needed);
``mpi_place`` reads the numbers of an MPI job (``Split_type(COMM_TYPE_SHARED)`` for the
node's ranks, CuPy for the GPU count) and ``torch_place`` those of a ``torchrun`` job
(``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``torch.cuda.device_count()``). Nothing here
selects a device: the caller does, with the ``device`` it returns. The demo, the
examples and the experiments use these; ``zipccl.Communicator`` checks for ranks that
share a GPU itself, from the devices the ranks have selected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Local rank ``local_rank`` of the ``local_size`` ranks of a node with ``gpus`` visible GPUs.

    >>> p = place(1, 2, 1)
    >>> p.device, p.shared, p.ranks_per_gpu
    (0, True, 2)
    >>> print(p)
    local rank 1 of 2 on GPU 0 of 1 (shared: up to 2 ranks per GPU)
    """

    local_rank: int
    local_size: int
    gpus: int

    def __post_init__(self):
        if self.local_size < 1:
            raise ValueError(f"a node has at least one rank, got local_size={self.local_size}")
        if not 0 <= self.local_rank < self.local_size:
            raise ValueError(f"local_rank must be in [0, {self.local_size}), got {self.local_rank}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")

    @property
    def device(self) -> int | None:
        """The GPU this rank uses (its index among the visible ones), or None without GPUs."""
        return self.local_rank % self.gpus if self.gpus else None

    @property
    def ranks_per_gpu(self) -> int:
        """The most ranks any GPU of the node serves (0 without GPUs)."""
        return -(-self.local_size // self.gpus) if self.gpus else 0

    @property
    def shared(self) -> bool:
        """True when some GPU of the node serves more than one rank: NCCL cannot run there."""
        return self.ranks_per_gpu > 1

    def __str__(self) -> str:
        if self.device is None:
            return f"local rank {self.local_rank} of {self.local_size}, no GPU"
        text = f"local rank {self.local_rank} of {self.local_size} on GPU {self.device} of {self.gpus}"
        return text + (f" (shared: up to {self.ranks_per_gpu} ranks per GPU)" if self.shared else "")


def place(local_rank: int, local_size: int, gpus: int) -> Placement:
    """The rule: local rank ``r`` of ``local_size`` uses GPU ``r % gpus`` (None if ``gpus == 0``).

    >>> [place(r, 4, 2).device for r in range(4)]
    [0, 1, 0, 1]
    >>> place(0, 2, 8).shared, place(0, 1, 0).device
    (False, None)
    """
    return Placement(int(local_rank), int(local_size), int(gpus))


def visible_gpus() -> int:
    """The number of GPUs CuPy sees here; 0 without CuPy, a driver or a device."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 -- no CuPy, no driver, no device: all mean none
        return 0


def mpi_place(comm, gpus: int | None = None) -> Placement:
    """This rank's placement in an MPI job: its rank among ``comm``'s ranks on the same node
    (``Split_type(COMM_TYPE_SHARED)``, a collective of ``comm``) and the GPUs CuPy sees
    (``gpus`` overrides the count)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        rank, size = local.Get_rank(), local.Get_size()
    finally:
        local.Free()
    return place(rank, size, visible_gpus() if gpus is None else gpus)


def torch_place(env: Mapping[str, str] | None = None, gpus: int | None = None) -> Placement:
    """This rank's placement in a ``torchrun`` job (``LOCAL_RANK`` of ``LOCAL_WORLD_SIZE``;
    one rank alone without them) with the GPUs torch sees (``gpus`` overrides the count, and
    then torch.cuda is not asked).

    >>> torch_place({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, gpus=1).shared
    True
    """
    env = os.environ if env is None else env
    rank = int(env.get("LOCAL_RANK", "0"))
    size = int(env.get("LOCAL_WORLD_SIZE", str(rank + 1)))
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    return place(rank, size, gpus)
