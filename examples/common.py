"""What ``ddp.py`` and ``fsdp2.py`` share: the process group, the model, the batches, the report.

Each example trains the same small model twice on every rank -- natively and through
zipccl -- from the same seed on the same batches, then ``report`` says whether the loss
of every step and every parameter are the same bits on every rank, and what zipccl's
``stats`` counted per collective on each rank.
"""

from __future__ import annotations

import argparse
import gc

import numpy as np
import torch
import torch.distributed as dist


def arguments(doc: str) -> argparse.ArgumentParser:
    """The options both examples take (``--steps``, ``--policy``, ``--device``)."""
    p = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per run (default 5)")
    p.add_argument("--policy", default="always", choices=["always", "auto", "never"],
                   help='zipccl\'s policy (default "always"; "auto" keeps host tensors native)')
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="cuda: the GPUs, over NCCL (gloo where ranks share a GPU); cpu: gloo, CUDA "
                        "untouched (auto: cuda if available)")
    return p


def start(device: str) -> torch.device:
    """Join the torchrun job and return this rank's device.

    cuda: the GPU ``zipccl.tools.gpus.torch_place`` gives this rank (a node's ranks take its GPUs
    round robin), over NCCL; where ranks share a GPU (more ranks than GPUs: NCCL refuses that)
    over gloo, which moves CUDA tensors too, and rank 0 says so in one line. cpu: gloo, and
    nothing here calls into torch.cuda.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        dist.init_process_group("gloo")
        return torch.device("cpu")
    from zipccl.tools.gpus import torch_place

    placement = torch_place()
    if placement.device is None:
        raise SystemExit("--device cuda: torch sees no GPU here (use --device cpu)")
    dev = torch.device("cuda", placement.device)
    torch.cuda.set_device(dev)
    torch.cuda.init()  # a device already set: FSDP2's device mesh keeps it (it would take LOCAL_RANK)
    if not placement.shared:
        dist.init_process_group("nccl", device_id=dev)
        return dev
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        print(f"{placement.local_size} ranks share {placement.gpus} GPU(s), up to "
              f"{placement.ranks_per_gpu} per GPU: NCCL cannot run there, so the process group is "
              f"gloo (CUDA tensors)", flush=True)
    return dev


def mesh(device: torch.device):
    """A 1-D device mesh of every rank on ``device``'s type: given to ``fully_shard`` so that
    FSDP2 does not build its default one on the machine's accelerator (which would select a
    CUDA device by ``LOCAL_RANK`` in a CPU run)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),))


def model(device: torch.device) -> torch.nn.Module:
    """The same small MLP (about 85 k parameters) on every rank and in every run."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                               torch.nn.GELU(), torch.nn.Linear(256, 10)).to(device)


def batch(step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's inputs and labels of ``step`` (each rank its own, the same in every run)."""
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(32, 64, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device)


def bits(tensors) -> np.ndarray:
    """The bytes of some tensors, concatenated: what "the same bits" compares."""
    return np.concatenate([t.detach().contiguous().reshape(-1).cpu().view(torch.uint8).numpy()
                           for t in tensors])


def report(name: str, native: tuple[np.ndarray, np.ndarray], zipped: tuple[np.ndarray, np.ndarray],
           stats, device: torch.device, steps: int, policy: str) -> None:
    """Print (rank 0) whether losses and parameters match on every rank, and each rank's
    ``stats`` per collective."""
    differ = torch.tensor([int(not np.array_equal(native[0], zipped[0])),
                           int(not np.array_equal(native[1], zipped[1]))], device=device)
    dist.all_reduce(differ, op=dist.ReduceOp.MAX)
    per_rank: list = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, stats.per_op())
    if dist.get_rank() != 0:
        return
    backend = dist.get_backend()
    print(f"{name}: {dist.get_world_size()} ranks, {backend} on {device.type}, {steps} steps, "
          f'policy "{policy}"')
    for what, bad in zip(("losses", "parameters"), differ.tolist(), strict=True):
        print(f"{what} match: {'no' if bad else 'yes'} (bit for bit, every rank)")
    for r, ops in enumerate(per_rank):
        for op, c in sorted(ops.items()):
            ratio = c["wire_bytes"] / c["raw_bytes"] if c["raw_bytes"] else 1.0
            print(f"rank {r} {op}: {c['calls']} calls, {c['compressed_calls']} compressed, "
                  f"{c['raw_bytes']:,} raw -> {c['wire_bytes']:,} wire bytes (ratio {ratio:.4f})")


def finish() -> None:
    """Leave the job. The models of both runs are garbage first: an FSDP2 module sits in
    reference cycles that keep it (and zipccl's comm objects, which hold the process group)
    alive past ``destroy_process_group``, and a gloo group destroyed only at interpreter exit
    can abort the process there."""
    gc.collect()
    dist.destroy_process_group()
