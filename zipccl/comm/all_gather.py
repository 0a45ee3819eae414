"""All-gather: every rank's shard, in rank order, on every rank (ncclAllGather).

Compressed, each rank encodes its shard once per pipeline round into one slot that every peer
receives (``exchange.slot_exchange`` with ``shared``); natively it is the transport's own
all-gather (uneven shards: an all-to-all of the same bytes). An in-place call (the shard is
this rank's block of the output) copies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import format as fmt
from .args import Arr, byte_view, check_pair, check_sizes
from .base import ExchangeStats, offsets, value_code
from .call import Call, Route, detached, raw_exchange
from .exchange import slot_exchange

OP = "all_gather"


def mismatch(p: int, send_n: int, recv_n: int, send_counts=None, recv_counts=None) -> str | None:
    """Why ``send_n`` and ``recv_n`` elements are no all-gather on ``p`` ranks (None: they are)."""
    if recv_n != p * send_n:
        return (f"recv holds {recv_n} elements; all_gather of {send_n} per rank on {p} ranks "
                f"needs {p * send_n}")
    return None


def describe(send: Arr, recv: Arr, p: int, rank: int, stream=None) -> Call:
    """The call ``recv = concat over ranks of send``: checks the arguments (ValueError /
    TypeError naming the problem)."""
    check_pair(send, recv)
    check_sizes(mismatch(p, send.size, recv.size))
    n = send.size
    return Call(OP, send, recv, (n,) * p, (n,) * p, rank=rank, stream=stream)


def run(call: Call, route: Route, compress: bool) -> ExchangeStats:
    """Run the described call compressed or natively."""
    s, r = call.send.data, call.recv.data
    if not (compress and call.in_place):  # compressed in place: the shard is read, never moved
        s = detached(call, route.eng, s)
    return gather(route, s, r, list(call.recv_counts), compress=compress)


def bind(call: Call, route: Route):
    """The transport's native call with its arguments packed (None where it cannot be)."""
    s8, r8 = byte_view(call.send.data), byte_view(call.recv.data)
    if call.in_place or not call.overlapping:
        return route.tr.bind_allgather(s8, r8, route.stream)
    return None


def gather(route: Route, send, recv, counts: Sequence[int], *, compress: bool) -> ExchangeStats:
    """recv[offsets(counts)[j]:][:counts[j]] = rank j's send, for every j (1-D engine arrays)."""
    tr, me = route.tr, route.tr.rank
    isz = fmt.ITEMSIZE[value_code(send)]
    recvs = list(zip(offsets(counts), counts, strict=True))
    if compress:
        return slot_exchange(route.eng, tr, route.channel, send, [(0, counts[me])] * tr.size,
                             recv, recvs, op=OP, uniform=len(set(counts)) == 1,
                             chunk=route.chunk, max_count=max(counts), shared=True,
                             stream=route.stream, loopback=route.loopback)
    if len(set(counts)) == 1:
        tr.allgather(byte_view(send), byte_view(recv), route.stream)
    else:
        raw_exchange(tr, byte_view(send), [(0, isz * counts[me])] * tr.size, byte_view(recv),
                     [(isz * o, isz * c) for o, c in recvs], route.stream)
    raw = isz * counts[me] * (tr.size - 1)
    return ExchangeStats(raw, raw)
