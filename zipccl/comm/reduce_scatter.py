"""Reduce-scatter: block j of every rank's input, summed, lands on rank j (ncclReduceScatter).

Both paths move the p shards of this rank's block into a (p, m) staging array and reduce it
with the stated sum (``reduction``): compressed, each round's columns as soon as they are
decoded; natively on a transport without that sum (MPI), the same exchange uncompressed. A
transport with its own reduction (NCCL, a torch group) runs it natively instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import format as fmt
from .args import Arr, byte_view, check_pair, check_sizes
from .base import ExchangeStats, offsets, value_code
from .call import Call, Route, detached, raw_exchange
from .exchange import slot_exchange
from .transport import REDUCE_OPS

OP = "reduce_scatter"


def check_reduction(op: str) -> None:
    """The reductions a call may name; zipccl computes sums (and torch's AVG) itself."""
    if op not in REDUCE_OPS and op != "avg":
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")


def mismatch(p: int, send_n: int, recv_n: int, send_counts=None, recv_counts=None) -> str | None:
    """Why ``send_n`` and ``recv_n`` elements are no reduce-scatter on ``p`` ranks (None: they are)."""
    if send_n != p * recv_n:
        return (f"send holds {send_n} elements; reduce_scatter into {recv_n} per rank on {p} "
                f"ranks needs {p * recv_n}")
    return None


def describe(send: Arr, recv: Arr, op: str, p: int, rank: int, stream=None) -> Call:
    """The call ``recv = reduction over ranks of each rank's block rank of send``."""
    check_pair(send, recv)
    check_reduction(op)
    check_sizes(mismatch(p, send.size, recv.size))
    m = recv.size
    return Call(OP, send, recv, (m,) * p, (m,) * p, reduce=op, rank=rank, stream=stream)


def stated(call: Call, route: Route, compress: bool) -> bool:
    """Whether zipccl computes the reduction itself: compressed, on a transport without a sum of
    its own (MPI), and AVG natively (the stated sum, then ``reduction.divide``)."""
    return call.code is not None and (compress or not route.tr.own_reduction
                                      or call.reduce == "avg")


def finish(call: Call, route: Route) -> None:
    """After the stated sum: AVG divides by the group size (``reduction.divide``)."""
    if call.reduce == "avg":
        route.eng.divide(call.recv.data, route.tr.size)


def run(call: Call, route: Route, compress: bool) -> ExchangeStats:
    """Run the described call: the stated sum (and AVG's division) where zipccl computes the
    reduction (``stated``), else the transport's reduction."""
    s, r = call.send.data, call.recv.data
    if stated(call, route, compress):
        st = reduce_blocks(route, detached(call, route.eng, s), r, list(call.recv_counts),
                           compress=compress)
        finish(call, route)
        return st
    kind = "bfloat16" if call.send.bf16 else None
    route.tr.reduce_scatter(detached(call, route.eng, s), r, call.reduce, route.stream, dtype=kind)
    raw = s.nbytes - r.nbytes
    return ExchangeStats(raw, raw)


def bind(call: Call, route: Route):
    """The transport's native call with its arguments packed (None where it cannot be)."""
    if stated(call, route, False):
        return None
    s, r = call.send.data, call.recv.data
    if call.in_place or not call.overlapping:
        kind = "bfloat16" if call.send.bf16 else None
        return route.tr.bind_reduce_scatter(s, r, call.reduce, route.stream, dtype=kind)
    return None


def reduce_blocks(route: Route, send, recv, counts: Sequence[int], *, compress: bool) -> ExchangeStats:
    """recv = the stated sum over ranks of each rank's block ``rank`` of ``send`` (packed by
    ``counts``; 1-D engine arrays)."""
    eng, tr = route.eng, route.tr
    p, me = tr.size, tr.rank
    m = counts[me]
    isz = fmt.ITEMSIZE[value_code(send)]
    stage = eng.values_workspace("stage", p * m, send.dtype)
    sends = list(zip(offsets(counts), counts, strict=True))
    recvs = [(j * m, m) for j in range(p)]
    if compress:
        def reduce_cols(lo: int, hi: int) -> None:
            eng.reduce_cols(stage, p, m, lo, hi, recv)

        return slot_exchange(eng, tr, route.channel, send, sends, stage, recvs, op=OP,
                             uniform=len(set(counts)) == 1, chunk=route.chunk,
                             max_count=max(counts), stream=route.stream, on_chunk=reduce_cols,
                             loopback=route.loopback)
    raw_exchange(tr, byte_view(send), [(isz * o, isz * c) for o, c in sends], byte_view(stage),
                 [(isz * o, isz * c) for o, c in recvs], route.stream)
    eng.reduce_sum(stage.reshape(p, m), recv)
    raw = isz * (sum(counts) - m)
    return ExchangeStats(raw, raw)
