"""How torch tensors become a zipccl call: type and reduction names, per-peer counts, plan keys.

``refused`` is ``comm.core.refusal`` asked with torch's arguments, the one decision of whether
zipccl takes a call, shared by ``Collectives`` (``functional``) and the backend's dispatch.
``fast_key`` is a torch call's plan key, read without a check (``comm.core.Core.call``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm.args import check_counts
from ..comm.core import refusal

ReduceOp = dist.ReduceOp
CODED = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}


def op_name(op) -> str | None:
    """"sum" / "avg" for the reductions zipccl computes itself, None for any other."""
    for name, ref in (("sum", ReduceOp.SUM), ("avg", ReduceOp.AVG)):
        try:
            if op == ref:
                return name
        except (TypeError, RuntimeError):
            return None
    return None


def reduce_name(op) -> str:
    """A torch ReduceOp's short name (for decisions' reasons)."""
    return str(getattr(op, "name", op)).split(".")[-1].lower()


def refused(op: str, p: int, tensors, send_n: int, recv_n: int, reduce=None, splits=None):
    """``comm.core.refusal`` of a call on torch tensors: whether zipccl takes it (None) or not
    (NATIVE / INVALID, why), the one decision of ``Collectives`` and the backend. ``tensors``:
    the input, the output, then any others of a list form; ``send_n`` / ``recv_n``: elements of
    the call as zipccl runs it; ``reduce``: torch's ReduceOp (None: no reduction); ``splits``:
    an all-to-all's (input, output) split sizes in rows of dim 0 (None each: equal blocks)."""
    first = tensors[0]
    dtypes, problem = [], None
    for t in tensors:  # a loop, not a generator: no frame per tensor
        dtypes.append(CODED.get(t.dtype))
        if t.device != first.device or t.is_sparse or not t.is_contiguous():
            problem = "tensors on several devices, or not contiguous"
    name = None if reduce is None else op_name(reduce) or reduce_name(reduce)
    counts = ()
    if splits is not None and problem is None:
        try:
            got = split_counts(first, tensors[1], splits, p)
        except (TypeError, ValueError) as e:
            problem = str(e)
        else:
            counts = () if splits[0] is None and splits[1] is None else got
    return refusal(op, p, dtypes, name, send_n, recv_n, *counts, problem=problem)


# torch's current stream's raw handle on a device index, read in C (CUDA builds of torch; the
# same handle ``torch.cuda.current_stream(device).cuda_stream`` builds a Stream object for
# through several Python frames, at every call)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def fast_key(op: str, group, t, r, extra=None):
    """A call's plan key: the op, the group, both tensors' address, size, type, device and
    layout, and the stream (CUDA: torch's current one)."""
    if not t.is_cuda:
        st = None
    elif _RAW_STREAM is not None:
        st = _RAW_STREAM(t.device.index)
    else:
        st = torch.cuda.current_stream(t.device).cuda_stream
    return (op, group, t.data_ptr(), r.data_ptr(), t.numel(), r.numel(), t.dtype, r.dtype,
            t.device, r.device, t.is_contiguous(), r.is_contiguous(), st, extra)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def split_counts(input: torch.Tensor, output: torch.Tensor, splits, p: int):
    """An all-to-all's elements per peer, (sent, received), from torch's (input, output) split
    sizes (``element_counts``); the input's are checked first."""
    return (element_counts(input, splits[0], p, "input"),
            element_counts(output, splits[1], p, "output"))


def element_counts(t: torch.Tensor, splits, p: int, role: str) -> list[int]:
    """Elements per peer of ``t`` split by rows of dim 0 (torch's split sizes; None: equal)."""
    rows = t.shape[0] if t.dim() else 1
    per_row = t.numel() // rows if rows else 0
    if splits is None:
        if rows % p:
            raise ValueError(f"{role}: {rows} rows do not split into {p} equal blocks")
        return [rows // p * per_row] * p
    splits = check_counts(splits, p, f"{role}_split_sizes")  # ints only: never truncated
    if sum(splits) != rows:
        raise ValueError(f"{role} split sizes {splits} do not cover its {rows} rows on {p} ranks")
    return [s * per_row for s in splits]
