"""Run a script as if on a machine with a GPU that it must not touch: any call into torch.cuda raises.

    python tests/torchdist/no_cuda.py SCRIPT [ARGS...]     (also as torchrun's script)

``torch.cuda.is_available()`` says True, ``device_count()`` 1, and torch's accelerator is
CUDA (what FSDP2's default device mesh reads), so code that would pick a GPU on a GPU
machine tries to here too; every other torch.cuda function that selects, initialises or
queries a device raises ``CudaTouched``. A ``--device cpu`` run that passes under this
never calls into CUDA. (``torch.cuda.manual_seed_all``, which ``torch.manual_seed`` calls
on every run and which only queues the seed until CUDA starts, and `is_initialized`, which it
reads, are left alone.)
"""

from __future__ import annotations

import os
import runpy
import sys

import torch

POISONED = ("set_device", "current_device", "init", "_lazy_init", "synchronize",
            "get_device_name", "get_device_properties", "get_device_capability", "current_stream",
            "default_stream", "stream", "Stream", "Event", "mem_get_info", "memory_allocated",
            "device", "set_stream", "empty_cache")


class CudaTouched(RuntimeError):
    """A call into torch.cuda where none may happen."""


def _raiser(name: str):
    def touched(*args, **kwargs):
        raise CudaTouched(f"torch.cuda.{name} called in a run that must not touch CUDA")
    return touched


def poison() -> None:
    """Make torch look like it has one GPU, and every device call on it raise."""
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch._C._get_accelerator = lambda *a, **k: torch.device("cuda")
    for name in POISONED:
        setattr(torch.cuda, name, _raiser(name))


if __name__ == "__main__":
    poison()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` does
    runpy.run_path(script, run_name="__main__")
