"""The ``Work`` objects ``zipccl.torch``'s calls return with ``async_op=True``.

A compressed CUDA call is already ordered on torch's current stream when it returns, so its
``Work`` is a completed future on that stream; its ``wait()`` also raises the slot channel's
sticky device error as ``CollectiveError`` (what the device has reported so far: no host
wait). A CPU call has run when it returns: its ``Work`` is complete.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _done_work(result: torch.Tensor | None = None):
    """A torch.distributed ``Work`` that is complete (CPU) or ordered on the current stream (CUDA)."""
    devices = [result.device] if result is not None and result.is_cuda else []
    fut = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
    fut.set_result([result] if result is not None else [])
    make = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
    return make(fut) if make is not None else _Handle(fut)


class _CheckedWork(dist.Work):
    """A compressed CUDA call's ``Work``: the inner one's stream order, then the slot channel's
    sticky error (``CollectiveError``) at ``wait()``."""

    def __init__(self, inner, channel):
        super().__init__()
        self._inner, self._channel = inner, channel

    def wait(self, timeout=None) -> bool:
        ok = self._inner.wait()
        self._channel.check("wait")
        return ok

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def get_future(self):
        return self._inner.get_future()


class _Handle:
    """Stand-in for ``Work`` where torch cannot wrap a future (``wait``, ``is_completed``, ``get_future``)."""

    def __init__(self, fut):
        self._fut = fut

    def wait(self, timeout=None) -> bool:
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self):
        return self._fut
