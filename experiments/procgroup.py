"""A torchrun job's process group for this folder's training scripts, and its link in words.

``train_e2e.py`` and ``moe_ep.py`` run on 2+ GPUs over NCCL, on one GPU with several ranks
over gloo (CUDA tensors staged through the host: a slow link, the kind compression is for),
or on CPUs over gloo. ``start`` makes the process group and returns the rank's device;
``link_record`` says in the records where the bytes went: the backend, the GPUs and ranks per
GPU, and every NCCL setting that changes the link (``NCCL_LINK_VARS``) that is set.

Ranks take their GPU by the library's one rule (``zipccl.tools.gpus.torch_place``), as the
demo and the examples do.

>>> describe_link("gloo", True, {})
'gloo, host-staged (CUDA tensors over TCP)'
>>> describe_link("nccl", True, {"NCCL_P2P_DISABLE": "1"})
'shared memory (NCCL_P2P_DISABLE=1)'
"""

from __future__ import annotations

import os
import platform

import torch
import torch.distributed as dist

from zipccl.tools.gpus import torch_place

BACKENDS = ("nccl", "gloo")
# the environment variables that change which link NCCL takes (and how it uses it)
NCCL_LINK_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET",
                  "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_SOCKET_IFNAME",
                  "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")


def describe_link(backend: str, cuda: bool, env: dict) -> str:
    """The link in words, from the backend and the NCCL settings in ``env``."""
    if backend == "gloo":
        return "gloo, host-staged (CUDA tensors over TCP)" if cuda else "gloo (CPU)"
    if env.get("NCCL_P2P_DISABLE") == "1" and env.get("NCCL_SHM_DISABLE") == "1":
        return "sockets (NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1)"
    if env.get("NCCL_P2P_DISABLE") == "1":
        return "shared memory (NCCL_P2P_DISABLE=1)"
    return "NVLink (default)"


def start(backend: str | None, cpu: bool) -> torch.device:
    """Make the job's process group; returns this rank's device.

    ``backend``: "nccl" (one GPU per rank), "gloo" (CUDA tensors when a GPU is present and
    ``cpu`` is False, ranks mapped onto the GPUs by ``zipccl.tools.gpus``), or None: NCCL on GPUs,
    gloo on CPUs.
    """
    cuda = torch.cuda.is_available() and not cpu
    backend = backend or ("nccl" if cuda else "gloo")
    if backend not in BACKENDS:
        raise SystemExit(f"--backend must be one of {BACKENDS}, got {backend!r}")
    if not cuda:
        if backend == "nccl":
            raise SystemExit("--backend nccl needs GPUs (and not --cpu / --toy)")
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        dist.init_process_group("gloo")
        return torch.device("cpu")
    place = torch_place()
    if backend == "nccl" and place.shared:
        raise SystemExit(f"NCCL takes one GPU per rank: {place.local_size} ranks, {place.gpus} GPU(s); "
                         f"use --backend gloo")
    device = torch.device("cuda", place.device)
    torch.cuda.set_device(device)
    if backend == "nccl":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return device


def link_record(device: torch.device) -> dict:
    """What the records say about where the job ran and which link its bytes took."""
    cuda = device.type == "cuda"
    backend = dist.get_backend()
    world = dist.get_world_size()
    env = {k: os.environ[k] for k in NCCL_LINK_VARS if k in os.environ}
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    gpus = min(torch.cuda.device_count(), local_world) if cuda else 0
    name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    short = name.replace("NVIDIA ", "")
    machine = (f"{gpus} x {short}" + (f", {local_world // gpus} ranks per GPU" if local_world > gpus else "")
               if cuda else f"CPU ({name})")
    return {"gpu": name if cuda else None, "machine": machine, "backend": backend,
            "gpus_used": gpus, "ranks_per_gpu": (local_world // gpus) if gpus else None,
            "link": describe_link(backend, cuda, env), "link_env": env if backend == "nccl" else {}}
