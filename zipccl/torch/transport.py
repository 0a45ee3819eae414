"""The byte movers over a ``torch.distributed`` ProcessGroup: a torchrun job needs no MPI.

``ProcessGroupTransport`` fills ``zipccl.comm.transport.Transport`` with the group's own
collectives (NCCL on GPUs, gloo on CPUs), viewing the engine's NumPy / CuPy buffers as torch
tensors without copies. On a GPU it makes the stream the bytes must follow torch's current
stream for the call, so encode -> transfer -> decode stay in order without a host wait.
``TorchChannel`` is ``zipccl.torch``'s spill channel (``comm.channels.HostChannel``): a gloo
backend of its own among a group's ranks. ``post_failure`` / ``peer_failures`` tell a rank's
failure to its peers through the job's store; ``forget_groups`` drops every group zipccl.torch
holds, at interpreter exit. Agreement across ranks is ``comm.agreement``'s, over this transport's
control exchanges, which run on the host (``control_backend``).

This module imports torch: it is loaded only by ``zipccl.torch``.
"""

from __future__ import annotations

import atexit
import pickle
import weakref
from collections import deque
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..arrays import as_torch
from ..comm.channels import SendHandle
from ..comm.transport import Transport

_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN}


def _backend_name(group, device: torch.device) -> str:
    """The name of the backend that moves ``device``'s tensors in ``group`` ("nccl", "gloo", ...;
    a zipccl group's inner one)."""
    try:
        return str(group._get_backend(device).name()).lower()
    except (RuntimeError, AttributeError, ValueError):
        return str(dist.get_backend(group)).lower()


def resolve_group(group):
    """``group`` itself, or the default (world) group for None."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    return group


class _StreamScope:
    """Makes the CUDA stream ``stream`` (a raw handle, CuPy or torch stream) torch's current one."""

    _cache: dict[int, torch.cuda.Stream] = {}

    def __init__(self, stream, device: bool):
        self._ctx = None
        if device and stream is not None:
            from ..comm.transport import stream_ptr

            ptr = stream_ptr(stream)
            if ptr != torch.cuda.current_stream().cuda_stream:
                s = self._cache.get(ptr)
                if s is None:
                    s = self._cache[ptr] = torch.cuda.ExternalStream(ptr)
                self._ctx = torch.cuda.stream(s)

    def __enter__(self):
        if self._ctx is not None:
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            return self._ctx.__exit__(*exc)
        return None


def _span(counts: Sequence[int], displs: Sequence[int]) -> tuple[int, int] | None:
    """(first byte, total) if the regions lie back to back in rank order, else None."""
    regions = [(int(d), int(c)) for c, d in zip(counts, displs, strict=True) if int(c)]
    if not regions:
        return 0, 0
    pos = regions[0][0]
    for d, c in regions:
        if d != pos:
            return None
        pos += c
    return regions[0][0], pos - regions[0][0]


class ProcessGroupTransport(Transport):
    """Bytes over a torch ProcessGroup (see the module docstring).

    A ``Transport`` without an mpi4py communicator: its control exchanges (control rows,
    flags, maxima, error messages) go over the group's ranks on the host, on CPU tensors
    (``control_backend``), never through the device.

    >>> # inside an initialised torch.distributed job:
    >>> # tr = ProcessGroupTransport(group, torch.device("cpu"))
    >>> # tr.allgather(send_bytes, recv_bytes)   # NumPy (host) or CuPy (device) uint8 arrays
    """

    name = "torch"
    own_reduction = True
    moves_device = True

    def __init__(self, group=None, device: torch.device | str = "cpu"):
        self.comm = None
        self.group = resolve_group(group)
        self.device = torch.device(device)
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.backend = _backend_name(self.group, self.device)
        self._ctl = None  # the control exchanges' backend (``control_backend``), made at the first one
        # NCCL on CUDA tensors records into a CUDA graph; gloo moves them through the host
        self.capturable = self._cuda and self.backend == "nccl"

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda"

    def alltoallv(self, send, scounts: Sequence[int], sdispls: Sequence[int], recv,
                  rcounts: Sequence[int], rdispls: Sequence[int], stream=None) -> None:
        """Rank i sends scounts[j] bytes at send[sdispls[j]:] to j, receives rcounts[j] at recv[rdispls[j]:].

        One ``all_to_all_single`` with split sizes. Regions lying back to back are
        passed as views; otherwise they are packed into (and unpacked from) a
        contiguous staging tensor. Only the named receive regions are written.
        """
        s8, r8 = as_torch(send).view(torch.uint8), as_torch(recv).view(torch.uint8)
        sc, rc = [int(c) for c in scounts], [int(c) for c in rcounts]
        with _StreamScope(stream, self._cuda):
            sspan, rspan = _span(sc, sdispls), _span(rc, rdispls)
            if sspan is not None:
                inp = s8[sspan[0]:sspan[0] + sspan[1]]
            else:
                inp = torch.cat([s8[int(d):int(d) + c] for c, d in zip(sc, sdispls, strict=True)])
            if rspan is not None:
                out = r8[rspan[0]:rspan[0] + rspan[1]]
            else:
                out = torch.empty(sum(rc), dtype=torch.uint8, device=r8.device)
            dist.all_to_all_single(out, inp, rc, sc, group=self.group)
            if rspan is None:
                pos = 0
                for c, d in zip(rc, rdispls, strict=True):
                    if c:
                        r8[int(d):int(d) + c].copy_(out[pos:pos + c])
                    pos += c

    def alltoallv_shared(self, send, count: int, at: int, recv, rcounts: Sequence[int],
                         rdispls: Sequence[int], stream=None) -> None:
        """Every peer receives the same ``count`` bytes at ``send[at:]`` (every rank sends the
        same count). On NCCL the group's all-gather, so the slot is not copied once per peer; on
        gloo the all-to-all, whose all-gather measured slower (experiments/results/host_path.jsonl,
        the two-rank H200 runs of 2026-12-02)."""
        if self.backend != "nccl":
            return super().alltoallv_shared(send, count, at, recv, rcounts, rdispls, stream)
        s8, r8 = as_torch(send).view(torch.uint8), as_torch(recv).view(torch.uint8)
        count, at = int(count), int(at)
        with _StreamScope(stream, self._cuda):
            out = torch.empty(self.size * count, dtype=torch.uint8, device=r8.device)
            all_gather_single(out, s8[at:at + count], self.group)
            for j, (c, d) in enumerate(zip(rcounts, rdispls, strict=True)):
                if j != self.rank and c:
                    r8[int(d):int(d) + int(c)].copy_(out[j * count:j * count + int(c)])

    def allgather(self, send, recv, stream=None) -> None:
        """Equal blocks: recv = concatenation over ranks of every rank's ``send`` bytes."""
        with _StreamScope(stream, self._cuda):
            all_gather_single(as_torch(recv).view(torch.uint8), as_torch(send).view(torch.uint8),
                              self.group)

    def reduce_scatter(self, send, recv, op: str, stream=None, dtype: str | None = None) -> None:
        """The group's own typed reduce-scatter (BF16 included: the backend's reduction)."""
        with _StreamScope(stream, self._cuda):
            reduce_scatter_single(as_torch(recv, dtype), as_torch(send, dtype), _OPS[op], self.group)

    def allreduce(self, buf, op: str, stream=None, dtype: str | None = None) -> None:
        """The group's own typed in-place all-reduce."""
        with _StreamScope(stream, self._cuda):
            dist.all_reduce(as_torch(buf, dtype), op=_OPS[op], group=self.group)

    def close(self) -> None:
        """Nothing to release: the group belongs to the caller."""

    # -- control exchanges: small host ints and, on failure, objects, on the host ---------------
    # On CPU tensors over the group itself where it moves CPU tensors (gloo, or a CPU backend
    # beside NCCL), else over a gloo backend of the transport's own among the group's ranks
    # (``control_backend``): so they wait for the peers only, never for the device (a device
    # tensor read back would wait for every kernel already on its stream).
    def _control(self):
        pg = self._ctl
        if pg is None:
            pg = self._ctl = control_backend(self.group)
        return pg

    def allgather_ints(self, row: np.ndarray, table: np.ndarray) -> None:
        """table[i] = rank i's ``row`` (``table``: (size, row.size) int64, C-contiguous, written
        in place)."""
        mine = torch.from_numpy(np.ascontiguousarray(row, dtype=np.int64).reshape(-1))
        self._control().allgather([list(torch.from_numpy(table).unbind(0))], [mine]).wait()

    def allgather_objects(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order: lengths first, then the pickles."""
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = np.zeros((self.size, 1), dtype=np.int64)
        self.allgather_ints(np.array([data.size]), sizes)
        width = int(sizes.max())
        mine = torch.zeros(width, dtype=torch.uint8)
        mine[:data.size] = torch.from_numpy(data.copy())
        out = [torch.empty(width, dtype=torch.uint8) for _ in range(self.size)]
        self._control().allgather([out], [mine]).wait()
        return [pickle.loads(o[:int(n)].numpy().tobytes()) for o, n in zip(out, sizes[:, 0], strict=True)]

    def any_flag(self, flag: bool) -> bool:
        """True on every rank if any rank passes True (one 8-byte MAX all-reduce)."""
        t = torch.tensor([1 if flag else 0], dtype=torch.int64)
        self._control().allreduce([t], _max_options()).wait()
        return bool(t[0])

    def max_int(self, n: int) -> int:
        """The maximum of ``n`` over the group's ranks (one 8-byte MAX all-reduce)."""
        t = torch.tensor([int(n)], dtype=torch.int64)
        self._control().allreduce([t], _max_options()).wait()
        return int(t[0])


def _max_options():
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    return opts


_MADE: dict[str, int] = {}  # gloo backends made so far in this process, by purpose and group name


def own_gloo(group, purpose: str):
    """A ``ProcessGroupGloo`` among the ranks of ``group``, built directly over a ``PrefixStore``
    of the job's default store keyed by ``purpose``, the group's name and how many such backends
    this process made before: no job-wide collective (``new_group`` is one), and two backends
    over the same ranks never meet. The group's ranks must make theirs in the same order; its
    timeout is the group's (``group_timeout``)."""
    name = f"zipccl-{purpose}/{_group_name(group)}"
    k = _MADE.get(name, 0)
    _MADE[name] = k + 1
    store = dist.PrefixStore(f"{name}/{k}", dist.distributed_c10d._get_default_store())
    return dist.ProcessGroupGloo(store, dist.get_rank(group), dist.get_world_size(group),
                                 group_timeout(group))


def control_backend(group):
    """What carries the control exchanges of ``group``'s transports: the group's own gloo
    backend where it has one for CPU tensors (the backend itself: a zipccl group's inner one),
    else a gloo backend of its ranks (``own_gloo``; the ranks make theirs at the same call,
    their first control exchange on the group)."""
    try:
        cpu = group._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError, ValueError):
        cpu = None
    if cpu is not None and str(cpu.name()).lower() == "gloo":
        return cpu
    return own_gloo(group, "control")


# -- a rank's failure, told to its peers through the job's store ------------------------------
# A rank whose call fails its own checks never reaches the exchange its peers wait in; they fail
# when the group's timeout runs out (every channel zipccl makes runs under it), and then read
# here why. Posting costs one store write, and only on failure; nothing is read on success.
_POSTS: dict[str, int] = {}  # failures this process posted, per key
_SEEN: dict[str, int] = {}  # the latest post read, per key


def _group_name(group) -> str:
    """The group's name, or its ranks where it has none: a key the group's ranks agree on."""
    return str(getattr(group, "group_name", "") or dist.get_process_group_ranks(group))


def _fail_key(group, rank: int) -> str:
    return f"zipccl-failed/{_group_name(group)}/{rank}"


def post_failure(group, text: str) -> None:
    """Record in the job's store that this rank's call on ``group`` (None: the world) failed,
    and why."""
    try:
        group = resolve_group(group)
        key = _fail_key(group, dist.get_rank(group))
        n = _POSTS[key] = _POSTS.get(key, 0) + 1
        dist.distributed_c10d._get_default_store().set(key, f"{n}|{text[:400]}")
    except Exception:  # noqa: BLE001 -- best effort: the caller raises its own error next
        pass


def peer_failures(group) -> str:
    """The failures ``group``'s other ranks posted since this rank last read them ("" if none)."""
    try:
        group = resolve_group(group)
        store = dist.distributed_c10d._get_default_store()
        me = dist.get_rank(group)
        found = []
        for r in range(dist.get_world_size(group)):
            key = _fail_key(group, r)
            if r == me or not store.check([key]):
                continue
            n, text = store.get(key).decode().split("|", 1)
            if int(n) > _SEEN.get(key, 0):
                _SEEN[key] = int(n)
                found.append(f"rank {r}: {text}")
        return "; ".join(found)
    except Exception:  # noqa: BLE001 -- the store itself may be gone: then nothing to name
        return ""


# -- the spill channel ----------------------------------------------------------------------
class TorchChannel:
    """A host channel over a gloo backend of its own among the ranks of ``group`` (default: the
    world), made by those ranks alone.

    The backend is ``own_gloo``'s: no job-wide collective (``new_group`` would need every process
    of the job, also those outside ``group``), two channels over the same ranks never meet, and
    the group's ranks make their channels in the same order (a channel is made at the group's
    first compressed call, which every rank of the group makes). Ranks and peers are ranks in
    ``group``. Its timeout is the group's (``group_timeout``), so a peer that never comes fails
    this rank in that time, as the group's own collectives would.
    """

    def __init__(self, group=None):
        group = group if group is not None else dist.group.WORLD
        self._over = group
        self._own: dict[int, deque] = {}  # tails this rank sent itself, by tag
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.timeout = group_timeout(group)
        self.group = own_gloo(group, "spill")

    def isend(self, data: np.ndarray, peer: int, tag: int) -> SendHandle:
        if peer == self.rank:  # one rank looping back (Policy.loopback): gloo has no pair to itself
            self._own.setdefault(tag, deque()).append(np.array(data))
            return SendHandle(_nothing, lambda: True, None)
        t = torch.from_numpy(data)
        work = self.group.send([t], peer, tag)
        return SendHandle(work.wait, work.is_completed, t)

    def recv(self, out: np.ndarray, peer: int, tag: int) -> None:
        if peer == self.rank:  # sent before by the same thread (a call's sends come first)
            got = self._own[tag].popleft()
            if got.size != out.size:
                raise RuntimeError(f"spill to itself (tag {tag}): {got.size} bytes, expected {out.size}")
            out[:] = got
            return
        self.group.recv([torch.from_numpy(out)], peer, tag).wait()

    def twin(self) -> TorchChannel:
        """Another channel over the same ranks (its ranks make theirs in the same order)."""
        return TorchChannel(self._over)

    def close(self) -> None:
        self.group = None  # the backend goes with its last reference; nothing collective


def _nothing() -> None:
    pass


def group_timeout(group):
    """The timeout ``group``'s collectives run under (a ``datetime.timedelta``): its CPU or CUDA
    backend's options, else torch's default for groups. A zipccl backend group answers with
    the gloo group it wraps, made with its timeout."""
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
    return dist.distributed_c10d.default_pg_timeout


# -- what zipccl.torch keeps of process groups, dropped at interpreter exit -----------------------
HOLDERS: weakref.WeakSet = weakref.WeakSet()  # objects whose forget() drops theirs (Collectives)
FORGET: list = []  # module-level caches' clear() (the shared Collectives, autotune's calibrations)


def forget_groups() -> None:
    """Drop every reference zipccl.torch holds to process groups (``HOLDERS``, ``FORGET``), then
    collect; run at interpreter exit, so that no gloo group survives into finalization."""
    import gc

    for holder in list(HOLDERS):
        holder.forget()
    for forget in FORGET:
        forget()
    gc.collect()


atexit.register(forget_groups)


# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single (the old names
# warn there); the earlier versions zipccl.torch supports (torch >= 2.11) have only the old ones.
_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_single(output: torch.Tensor, input: torch.Tensor, group, async_op: bool = False):
    """torch.distributed's own all-gather into one tensor, under whichever name this torch has."""
    return _AG(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, op, group, async_op: bool = False):
    """torch.distributed's own reduce-scatter of one tensor, under whichever name this torch has."""
    return _RS(output, input, op=op, group=group, async_op=async_op)
