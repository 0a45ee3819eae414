"""All-reduce, in place: every rank's buffer becomes the sum over ranks (ncclAllReduce).

Compressed (and natively on a transport without the stated sum, MPI): a reduce-scatter of
near-equal shards (``reduce_scatter.reduce_blocks``), then an all-gather of the reduced
shards (``all_gather.gather``). A transport with its own reduction runs it natively.
"""

from __future__ import annotations

from .all_gather import gather
from .args import Arr
from .base import ExchangeStats, split_counts
from .call import Call, Route
from .reduce_scatter import check_reduction, finish, reduce_blocks, stated

OP = "all_reduce"


def mismatch(p: int, send_n: int, recv_n: int, send_counts=None, recv_counts=None) -> str | None:
    """In place: any one buffer is an all-reduce."""
    return None


def describe(buf: Arr, op: str, p: int, rank: int, stream=None) -> Call:
    """The call ``buf = reduction over ranks of buf`` (in place)."""
    check_reduction(op)
    counts = tuple(split_counts(buf.size, p))
    return Call(OP, buf, buf, counts, counts, reduce=op, rank=rank, stream=stream)


def run(call: Call, route: Route, compress: bool) -> ExchangeStats:
    """Run the described call (see the module docstring)."""
    buf = call.send.data
    if stated(call, route, compress):
        counts = list(call.send_counts)
        shard = route.eng.values_workspace("shard", counts[route.tr.rank], buf.dtype)
        stats = reduce_blocks(route, buf, shard, counts, compress=compress)
        stats.add(gather(route, shard, buf, counts, compress=compress))
        finish(call, route)
        return stats
    kind = "bfloat16" if call.send.bf16 else None
    route.tr.allreduce(buf, call.reduce, route.stream, dtype=kind)
    p = route.tr.size
    raw = 2 * buf.nbytes * (p - 1) // p
    return ExchangeStats(raw, raw)


def bind(call: Call, route: Route):
    """The transport's native call with its arguments packed (None where it cannot be)."""
    if stated(call, route, False):
        return None
    kind = "bfloat16" if call.send.bf16 else None
    return route.tr.bind_allreduce(call.send.data, call.reduce, route.stream, dtype=kind)
