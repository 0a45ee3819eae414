"""All-to-all: rank i's block j becomes rank j's block i, equal blocks or per-peer counts.

Compressed, each message is encoded into its own slot (``exchange.slot_exchange``); natively it
is the transport's all-to-all of the same bytes. Per-peer counts differ between ranks by design:
a call that knows the largest message between any two ranks (``Call.largest``) may pipeline in
rounds; one that does not moves in one round.
"""

from __future__ import annotations

from .args import Arr, byte_view, check_counts, check_pair, check_sizes
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
        check_sizes(mismatch(p, send.size, recv.size))
        b = send.size // p
        return Call(OP, send, recv, (b,) * p, (b,) * p, rank=rank, stream=stream,
                    largest=b)
    sc, rc = _counts(send_counts, recv_counts, p, required=True)
    check_sizes(mismatch(p, send.size, recv.size, sc, rc))
    return Call(OP, send, recv, tuple(sc), tuple(rc), uneven=True, rank=rank, stream=stream,
                largest=largest)


def mismatch(p: int, send_n: int, recv_n: int, send_counts=None, recv_counts=None) -> str | None:
    """Why ``send_n`` and ``recv_n`` elements (split by per-peer counts, lists of ``p`` ints,
    where given) are no all-to-all on ``p`` ranks (None: they are)."""
    if send_counts is None:
        if send_n % p or recv_n != send_n:
            return (f"all_to_all without counts needs send and recv of equal size divisible by "
                    f"{p}; got {send_n} and {recv_n}")
        return None
    if sum(send_counts) != send_n:
        return f"send_counts add up to {sum(send_counts)} but send holds {send_n}"
    if recv_counts is not None and sum(recv_counts) != recv_n:
        return f"recv_counts add up to {sum(recv_counts)} but recv holds {recv_n}"
    return None


def counts_row(send: Arr, recv: Arr, send_counts, recv_counts, p: int):
    """Per-peer counts checked before the count matrix is agreed: (send counts, recv counts or
    None, the control row's ints: send counts, recv counts (-1 each when left out), recv's size)."""
    check_pair(send, recv)
    sc, rc = _counts(send_counts, recv_counts, p, required=False)
    check_sizes(mismatch(p, send.size, recv.size, sc, rc))
    return sc, rc, [*sc, *(rc if rc is not None else [-1] * p), recv.size]


def _counts(send_counts, recv_counts, p: int, *, required: bool):
    """Both count lists checked as ``p`` ints (recv_counts may be left out unless ``required``)."""
    if send_counts is None:
        raise ValueError("recv_counts given without send_counts")
    sc = check_counts(send_counts, p, "send_counts")
    rc = None if recv_counts is None and not required else check_counts(recv_counts, p, "recv_counts")
    return sc, rc


def run(call: Call, route: Route, compress: bool) -> ExchangeStats:
    """Run the described call compressed or natively."""
    tr = route.tr
    s, r = call.send.data, call.recv.data
    if compress:
        return slot_exchange(route.eng, tr, route.channel, detached(call, route.eng, s),
                             list(zip(offsets(call.send_counts), call.send_counts, strict=True)),
                             r, list(zip(offsets(call.recv_counts), call.recv_counts, strict=True)),
                             op=OP, uniform=not call.uneven,
                             chunk=route.chunk if call.largest is not None else 0,
                             max_count=call.largest, stream=route.stream, loopback=route.loopback)
    isz = s.itemsize
    sc = [isz * c for c in call.send_counts]
    rc = [isz * c for c in call.recv_counts]
    s8, r8 = byte_view(s), byte_view(r)
    tr.alltoallv(detached(call, route.eng, s8), sc, offsets(sc), r8, rc, offsets(rc), route.stream)
    raw = sum(sc) - sc[tr.rank]
    return ExchangeStats(raw, raw)


def bind(call: Call, route: Route):
    """The transport's native call with its arguments packed (None where it cannot be)."""
    s8, r8 = byte_view(call.send.data), byte_view(call.recv.data)
    if call.uneven or call.overlapping:
        return None
    c = [s8.size // route.tr.size] * route.tr.size
    return route.tr.bind_alltoallv(s8, c, offsets(c), r8, c, offsets(c), route.stream)
