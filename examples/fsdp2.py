"""FSDP2 with zipccl: a small model trained with and without compressed comms, compared bit for bit.

    torchrun --standalone --nproc_per_node 2 examples/fsdp2.py               # GPUs if any, else CPUs
    torchrun --standalone --nproc_per_node 2 examples/fsdp2.py --device cpu  # CPUs: gloo

On GPUs (CuPy needed) each rank takes a GPU of its own over NCCL; with fewer GPUs than ranks
(two ranks, one GPU) the ranks share them over gloo, which says so in one line.

Every rank shards the same model with ``fully_shard`` (BF16 parameters and gradient
reductions), trains it twice from one seed on the same batches -- FSDP2's own
collectives, then with one more line::

    hooks = zt.compress_fsdp(model, policy="always")

-- and rank 0 prints whether the loss of every step and every parameter shard are the
same bits on every rank, and what ``hooks.stats`` counted on each rank per collective:
the all-gathers of parameters (forward, and again in backward) and the reduce-scatters
of gradients. ``--reduce-dtype float32`` reduces FP32 gradients instead (compressed too).

``--policy`` is "always" by default: ``policy="auto"`` keeps host (CPU) tensors native,
since between processes of one machine the link is faster than the CPU codec, so a CPU
run with "auto" compresses nothing. On GPUs "auto" compresses messages of at least 1 MiB
per rank; this model's are smaller.
"""

from __future__ import annotations

import torch
from common import arguments, batch, bits, finish, mesh, model, report, start
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import zipccl.torch as zt


def train(device: torch.device, steps: int, policy: str | None, reduce_dtype: torch.dtype):
    """(loss bits, parameter-shard bits, the hooks) after ``steps`` AdamW steps; ``policy``
    None: FSDP2's own collectives."""
    net = model(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    ranks = mesh(device)
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=ranks, mp_policy=mp)
    fully_shard(net, mesh=ranks, mp_policy=mp)
    hooks = zt.compress_fsdp(net, policy=policy) if policy is not None else None
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        x, y = batch(step, device)
        loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return bits(losses), bits(p.to_local() for p in net.parameters()), hooks


def main() -> None:
    p = arguments(__doc__)
    p.add_argument("--reduce-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="the gradients' reduce-scatter type (default bfloat16)")
    args = p.parse_args()
    reduce_dtype = getattr(torch, args.reduce_dtype)
    device = start(args.device)
    native = train(device, args.steps, None, reduce_dtype)
    zipped = train(device, args.steps, args.policy, reduce_dtype)
    report("fsdp2", native[:2], zipped[:2], zipped[2].stats, device, args.steps, args.policy)
    del native, zipped
    finish()


if __name__ == "__main__":
    main()
