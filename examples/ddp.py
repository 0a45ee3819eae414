"""DDP with zipccl's comm hook: a small model trained with and without it, compared bit for bit.

    torchrun --standalone --nproc_per_node 2 examples/ddp.py               # GPUs if any, else CPUs
    torchrun --standalone --nproc_per_node 2 examples/ddp.py --device cpu  # CPUs: gloo

On GPUs (CuPy needed) each rank takes a GPU of its own over NCCL; with fewer GPUs than ranks
(two ranks, one GPU) the ranks share them over gloo, which says so in one line.

Every rank trains the same FP32 model (DDP's default gradient buckets) twice from one
seed on the same batches: with DDP's own all-reduce, then with one more line::

    ddp.register_comm_hook(zt.DDPCommState(policy="always"), zt.ddp_comm_hook)

and rank 0 prints whether the loss of every step and every parameter are the same bits
on every rank, and what the hook's ``stats`` counted on each rank, per collective (DDP
reduces its gradient buckets with all-reduces, so that is the one collective here).

``--policy`` is "always" by default: ``policy="auto"`` keeps host (CPU) tensors native,
since between processes of one machine the link is faster than the CPU codec, so a CPU
run with "auto" compresses nothing. On GPUs "auto" compresses buckets of at least 1 MiB
per rank; this model's gradients are smaller.
"""

from __future__ import annotations

import torch
from common import arguments, batch, bits, finish, model, report, start
from torch.nn.parallel import DistributedDataParallel as DDP

import zipccl.torch as zt


def train(device: torch.device, steps: int, policy: str | None):
    """(loss bits, parameter bits, the hook's state) after ``steps`` SGD steps; ``policy``
    None: DDP's own all-reduce."""
    ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model(device), device_ids=ids)
    state = None
    if policy is not None:
        state = zt.DDPCommState(policy=policy)
        ddp.register_comm_hook(state, zt.ddp_comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch(step, device)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return bits(losses), bits(ddp.parameters()), state


def main() -> None:
    args = arguments(__doc__).parse_args()
    device = start(args.device)
    native = train(device, args.steps, None)
    zipped = train(device, args.steps, args.policy)
    report("ddp", native[:2], zipped[:2], zipped[2].stats, device, args.steps, args.policy)
    del native, zipped
    finish()


if __name__ == "__main__":
    main()
