"""The exact-length compressed all-to-all: the frame lengths first, then the frames at their sizes.

Why it is here: zipccl's compressed all-to-all (``zipccl.torch.all_to_all_single``) is the slot
exchange: every message travels in a slot whose size every rank computes from the element
counts, so the transfer is posted at once and the host never waits for the device; a frame
longer than its slot spills its tail beside the collective. This module is the plain
alternative it is measured against (``moe_ep.py``'s ``exact`` variant), written on zipccl's
public API and torch.distributed only:

1. **encode** every outgoing message with ``zipccl.compress`` (one frame per peer; the
   codebook chosen from the message itself); the host reads each frame's length;
2. **lengths**: one ``all_to_all_single`` of one int64 per peer, then the host reads the
   lengths it will receive;
3. **frames**: one ``all_to_all_single`` of uint8 with the exact lengths as split sizes;
4. **decode** every received frame with ``zipccl.decompress`` into its rows of ``output``,
   and copy the message to self.

Before the slot exchange, zipccl itself offered this algorithm as ``phases=1``
(``collectives.one_phase_exchange``) and a two-phase variant (the static part of every frame,
then the escapes) as ``phases=2``; the ``one_phase`` and ``two_phase`` records of
``results/moe_ep.jsonl`` measured those.

    # on each of 2 ranks, after init_process_group
    exact_length.all_to_all_single(out, x, out_splits, in_splits)  # = dist.all_to_all_single
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

import zipccl

CODED = (torch.bfloat16, torch.float32, torch.float16)  # the types zipccl's frames hold
LENGTH_BYTES = 8  # one int64 per peer in the length exchange
ALIGN = 16  # zipccl's device codec reads and writes 16-byte aligned buffers only


@dataclass
class Stats:
    """What this rank sent to its peers: raw bytes, and bytes on the wire (frames + lengths).

    The names of ``zipccl.torch.Stats`` (every call here compresses).
    """

    calls: int = 0
    compressed_calls: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0

    def reset(self) -> None:
        self.calls = self.compressed_calls = self.raw_bytes = self.wire_bytes = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _splits(t: torch.Tensor, splits, p: int, role: str) -> list[int]:
    """Rows of dim 0 per rank (torch.distributed's rule: equal blocks when ``splits`` is None)."""
    rows = t.shape[0]
    if splits is None or len(splits) == 0:
        if rows % p:
            raise ValueError(f"{role} has {rows} rows, not a multiple of the {p} ranks "
                             f"(give {role}_split_sizes)")
        return [rows // p] * p
    splits = [int(s) for s in splits]
    if len(splits) != p or min(splits) < 0 or sum(splits) != rows:
        raise ValueError(f"{role}_split_sizes {splits} must be {p} counts >= 0 summing to "
                         f"{role}'s {rows} rows")
    return splits


def _starts(counts: list[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or an aligned copy of it where the device codec needs one (CPU tensors: ``t``)."""
    return t.clone() if t.is_cuda and t.data_ptr() % ALIGN else t


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None,
                      input_split_sizes=None, group=None, *, stats: Stats | None = None) -> None:
    """``torch.distributed.all_to_all_single`` (split sizes count rows of dim 0), every message
    to another rank compressed, moved at its exact frame length.

    Same arguments and result as torch.distributed's, synchronous (no ``async_op``): the host
    waits for the frame lengths. Raises ValueError for a type zipccl does not code, mismatched
    tensors or splits, and (on every rank that receives one) for a frame whose length or
    content does not match the rows expected from its sender.
    """
    p, me = dist.get_world_size(group), dist.get_rank(group)
    if input.dtype not in CODED or output.dtype != input.dtype:
        raise ValueError(f"input and output must both be one of {CODED}, got {input.dtype} "
                         f"and {output.dtype}")
    if not (input.is_contiguous() and output.is_contiguous()) or min(input.dim(), output.dim()) < 1:
        raise ValueError("input and output must be contiguous tensors of at least one dimension")
    ins = _splits(input, input_split_sizes, p, "input")
    outs = _splits(output, output_split_sizes, p, "output")
    per_row = math.prod(input.shape[1:])
    if math.prod(output.shape[1:]) != per_row:
        raise ValueError(f"output rows hold {math.prod(output.shape[1:])} elements, input rows "
                         f"{per_row}")
    i0, o0 = _starts(ins), _starts(outs)
    flat_in, flat_out = input.reshape(-1), output.reshape(-1)

    def rows(flat: torch.Tensor, start: int, count: int) -> torch.Tensor:
        return flat[start * per_row:(start + count) * per_row]

    # -- encode: one frame per peer that gets rows; its length is known on the host ----------
    frames, send_len = [], [0] * p
    for j in range(p):
        if j != me and ins[j]:
            frame = zipccl.compress(_aligned(rows(flat_in, i0[j], ins[j])))
            frames.append(frame)
            send_len[j] = frame.numel()

    # -- the lengths: one int64 per peer --------------------------------------------------------
    lengths = torch.tensor(send_len, dtype=torch.int64, device=input.device)
    got = torch.empty_like(lengths)
    dist.all_to_all_single(got, lengths, group=group)
    recv_len = [int(n) if j != me else 0 for j, n in enumerate(got.tolist())]

    # -- the frames at their exact lengths ------------------------------------------------------
    sbuf = torch.cat(frames) if frames else torch.empty(0, dtype=torch.uint8, device=input.device)
    rbuf = torch.empty(sum(recv_len), dtype=torch.uint8, device=output.device)
    dist.all_to_all_single(rbuf, sbuf, recv_len, send_len, group=group)
    if stats is not None:
        stats.calls += 1
        stats.compressed_calls += 1
        stats.raw_bytes += (sum(ins) - ins[me]) * per_row * input.element_size()
        stats.wire_bytes += sum(send_len) + LENGTH_BYTES * (p - 1)

    # -- decode (a length that does not fit its rows is reported after the transfer, so that
    # every rank's transfers stay matched), then the message to self ------------------------------
    at = 0
    for j in range(p):
        n, frame = recv_len[j], rbuf[at:at + recv_len[j]]
        at += n
        if j == me or (n == 0 and outs[j] == 0):
            continue
        if n == 0:
            raise ValueError(f"rank {j} sent no frame for the {outs[j]} rows expected from it")
        dst = rows(flat_out, o0[j], outs[j])
        try:
            if dst.is_cuda and dst.data_ptr() % ALIGN:
                dst.copy_(zipccl.decompress(_aligned(frame)).reshape(-1))
            else:
                zipccl.decompress(_aligned(frame), out=dst)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"frame from rank {j}: {e}") from e
    if ins[me] != outs[me]:
        raise ValueError(f"rank {me} sends itself {ins[me]} rows but expects {outs[me]}")
    rows(flat_out, o0[me], outs[me]).copy_(rows(flat_in, i0[me], ins[me]))
