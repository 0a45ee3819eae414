"""What ``ddp.py`` and ``fsdp2.py`` share: the process group, the model, the batches, the report.

Each example trains the same small model twice on every rank -- natively and through
zipccl -- from the same seed on the same batches, then ``report`` says whether the loss
of every step and every parameter are the same bits on every rank, and what zipccl's
``stats`` counted per collective on each rank.
"""

from __future__ import annotations

import argparse
import gc
import os

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
                   help="cuda: NCCL, the GPU LOCAL_RANK names; cpu: gloo (auto: cuda if available)")
    return p


def start(device: str) -> torch.device:
    """Join the torchrun job: NCCL on the GPU ``LOCAL_RANK`` names, or gloo on the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
        return dev
    dist.init_process_group("gloo")
    return torch.device("cpu")


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
