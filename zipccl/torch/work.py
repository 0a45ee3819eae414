"""How a ``zipccl.torch`` call ends: the ``Work`` it returns with ``async_op=True``, the errors it raises.

A compressed CUDA call is already ordered on torch's current stream when it returns, so its
``Work`` is a completed future on that stream; its ``wait()`` also raises the slot channel's
sticky device error as ``CollectiveError`` (what the device has reported so far: no host
wait). A CPU call has run when it returns: its ``Work`` is complete. ``_guarded`` turns a
rank's failed checks into its peers' errors (through the job's store) and refuses what a
call cannot do, as torch.distributed's own functions do.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ..comm.base import CollectiveError
from . import transport as _tr


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


def _guarded(op: str, group_at: int):
    """Wrap a ``Collectives`` method (its ``group`` is positional argument ``group_at`` or the
    keyword): a group this rank is not in warns and returns None, as torch.distributed's
    functions do; a check this rank fails is posted for its peers (``transport.post_failure``);
    a peer that fails its own checks leaves this rank in an exchange until the group's timeout,
    and the error raised then is a ``CollectiveError`` naming the peer's failure."""

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            group = kwargs.get("group", args[group_at] if len(args) > group_at else None)
            if group is not None and dist.distributed_c10d._rank_not_in_group(group):
                dist.distributed_c10d._warn_not_in_group(op)
                return None
            try:
                return method(self, *args, **kwargs)
            except CollectiveError:
                raise
            except (ValueError, TypeError) as e:
                _tr.post_failure(group, f"{op}: {type(e).__name__}: {e}")
                raise
            except RuntimeError as e:  # gloo's timeout, a store's: was it a peer's mistake?
                peers = _tr.peer_failures(group)
                if peers:
                    raise CollectiveError(f"zipccl {op}: a peer's call failed before the exchange "
                                          f"({peers}); here: {str(e).splitlines()[0][:200]}") from e
                raise

        return call

    return wrap
