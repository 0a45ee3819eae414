"""All-to-all: rank i's block j becomes rank j's block i, equal blocks or per-peer counts.

Compressed, each message is encoded into its own slot (``exchange.slot_exchange``); natively it
is the transport's all-to-all of the same bytes. Per-peer counts differ between ranks by design:
a call that knows the largest message between any two ranks (``Call.largest``) may pipeline in
rounds; one that does not moves in one round.
"""

from __future__ import annotations

from .args import Arr, byte_view, check_counts, check_pair, overlap
from .base import ExchangeStats, offsets
from .call import Call, Route, detached
from .exchange import slot_exchange

OP = "all_to_all"


def describe(send: Arr, recv: Arr, p: int, rank: int, send_counts=None, recv_counts=None,
             stream=None, largest: int | None = None) -> Call:
    """The call; without counts both buffers split into ``p`` equal blocks. ``recv_counts``
    must be given with ``send_counts`` here (the Communicator derives it from the control row
    first). Counts are elements; they are checked as ints, never coerced."""
    check_pair(send, recv)
    if send_counts is None and recv_counts is None:
        if send.size % p or recv.size != send.size:
            raise ValueError(f"all_to_all without counts needs send and recv of equal size "
                             f"divisible by {p}; got {send.size} and {recv.size}")
        b = send.size // p
        return Call(OP, send, recv, (b,) * p, (b,) * p, rank=rank, stream=stream,
                    largest=b if p > 1 else 0)
    if send_counts is None:
        raise ValueError("recv_counts given without send_counts")
    sc = check_counts(send_counts, p, "send_counts")
    rc = check_counts(recv_counts, p, "recv_counts")
    if sum(sc) != send.size:
        raise ValueError(f"send_counts add up to {sum(sc)} but send holds {send.size}")
    if sum(rc) != recv.size:
        raise ValueError(f"recv_counts add up to {sum(rc)} but recv holds {recv.size}")
    return Call(OP, send, recv, tuple(sc), tuple(rc), uneven=True, rank=rank, stream=stream,
                largest=largest)


def counts_row(send: Arr, recv: Arr, send_counts, recv_counts, p: int):
    """Per-peer counts checked before the count matrix is agreed: (send counts, recv counts or
    None, the control row's ints: send counts, recv counts (-1 each when left out), recv's size)."""
    check_pair(send, recv)
    if send_counts is None:
        raise ValueError("recv_counts given without send_counts")
    sc = check_counts(send_counts, p, "send_counts")
    rc = None if recv_counts is None else check_counts(recv_counts, p, "recv_counts")
    if sum(sc) != send.size:
        raise ValueError(f"send_counts add up to {sum(sc)} but send holds {send.size}")
    if rc is not None and sum(rc) != recv.size:
        raise ValueError(f"recv_counts add up to {sum(rc)} but recv holds {recv.size}")
    return sc, rc, [*sc, *(rc if rc is not None else [-1] * p), recv.size]


def run(call: Call, route: Route, compress: bool) -> ExchangeStats:
    """Run the described call compressed or natively."""
    tr = route.tr
    s, r = call.send.data, call.recv.data
    if compress:
        return slot_exchange(route.eng, tr, route.channel, detached(route.eng, s, r),
                             list(zip(offsets(call.send_counts), call.send_counts, strict=True)),
                             r, list(zip(offsets(call.recv_counts), call.recv_counts, strict=True)),
                             op=OP, uniform=not call.uneven,
                             chunk=route.chunk if call.largest is not None else 0,
                             max_count=call.largest, stream=route.stream, loopback=route.loopback)
    isz = s.itemsize
    sc = [isz * c for c in call.send_counts]
    rc = [isz * c for c in call.recv_counts]
    s8, r8 = byte_view(s), byte_view(r)
    tr.alltoallv(detached(route.eng, s8, r8), sc, offsets(sc), r8, rc, offsets(rc), route.stream)
    raw = sum(sc) - sc[tr.rank]
    return ExchangeStats(raw, raw)


def bind(call: Call, route: Route):
    """The transport's native call with its arguments packed (None where it cannot be)."""
    s8, r8 = byte_view(call.send.data), byte_view(call.recv.data)
    if call.uneven or overlap(s8, r8):
        return None
    c = [s8.size // route.tr.size] * route.tr.size
    return route.tr.bind_alltoallv(s8, c, offsets(c), r8, c, offsets(c), route.stream)
