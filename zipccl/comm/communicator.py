"""``zipccl.Communicator``: NCCL-like collectives over mpi4py that move BF16, FP32 and FP16
arrays compressed, bit-exact: the mpi4py / CuPy / NumPy front end of the one call path.

It wraps an mpi4py communicator (duplicated), takes NumPy, CuPy, Numba device and torch arrays
(``args.wrap``), and hands each call to its ``core.Core`` through the collective's own file
(``all_gather``, ``reduce_scatter``, ``all_to_all``, ``all_reduce``). What it adds is MPI's: the
settings agreed at construction, the NCCL bootstrap (device arrays go over NCCL, or MPI where
ranks share a GPU or NCCL is missing), the control row that turns a local argument error into
the same ``CollectiveError`` on every rank. A call whose arrays (by identity) and stream were
seen before replays its plan (``core.Core.call``). Every rank must make the same calls in the
same order; one call at a time per communicator (``_OneCall``). docs/COLLECTIVES.md
("Agreement", "Threads") and docs/ARCHITECTURE.md say what is checked when and how a call travels.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .. import format as fmt
from . import all_gather as _ag
from . import all_reduce as _ar
from . import all_to_all as _aa
from . import reduce_scatter as _rs
from .agreement import Agreement, count_matrix, describe, sig_hash
from .args import call_key, call_stream, reduction_of, wrap
from .base import CollectiveError
from .call import Call
from .core import DEFAULT_CHUNK_BYTES, Core, Front, Link
from .policy import OPS, Decision, Policy, Profile, env_policy
from .transport import MPITransport, Transport, cupy_stream, stream_ptr

BACKENDS = ("auto", "nccl", "mpi")
_log = logging.getLogger("zipccl")
_SAID: set[str] = set()


def _say_once(line: str) -> None:
    """Log ``line`` (a warning: stderr unless the application configures logging) once per process."""
    if line not in _SAID:
        _SAID.add(line)
        _log.warning("%s", line)


_NEXT_CALLS = ("close",)  # what a communicator refused after a concurrent call still does


class _OneCall:
    """Admits one thread's calls at a time to a Communicator and refuses the others.

    A thread may nest calls (``calibrate`` calls the collectives); a call from another
    thread while one runs raises ``CollectiveError`` and leaves the communicator refusing
    every later call but ``close``: its call order may no longer be its peers' (see the
    Communicator's docstring, "Threads").
    """

    __slots__ = ("lock", "owner", "depth", "running", "refused")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: int | None = None  # the thread whose call runs
        self.depth = 0
        self.running = ""  # that call's name
        self.refused: str | None = None

    def enter(self, what: str) -> None:
        me = threading.get_ident()
        if self.lock.acquire(False):  # never waits (positional: the cheaper call)
            self.owner, self.depth, self.running = me, 1, what
        elif self.owner == me:
            self.depth += 1
        else:
            running, owner = self.running, self.owner
            names = {t.ident: repr(t.name) for t in threading.enumerate()}
            self.refused = (f"zipccl Communicator: {what} was called from thread "
                            f"{names.get(me, me)} while {running} ran on thread "
                            f"{names.get(owner, owner)}; a Communicator takes one call "
                            f"at a time, and calls from several threads must be ordered by the "
                            f"caller, the same on every rank. The refused call may have been made "
                            f"on the other ranks, so this communicator refuses every later call: "
                            f"close it")
            raise CollectiveError(self.refused)
        if self.refused is not None and what not in _NEXT_CALLS:
            self.leave()
            raise CollectiveError(f"zipccl {what}: refused since an earlier concurrent call. "
                                  f"{self.refused}")

    def leave(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.owner = None
            self.lock.release()


def _one_call(method):
    """``method``, admitted by the communicator's ``_OneCall`` (one thread at a time)."""
    name = method.__name__.lstrip("_")

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        self._calls.enter(name)
        try:
            return method(self, *args, **kwargs)
        finally:
            self._calls.leave()

    return guarded
VERIFY = ("first", "always")


def _pair(send, recv, dtype):
    """The wrapped (send, recv) of a call (``args.wrap``: recv must be writable)."""
    return wrap(send, dtype, "send"), wrap(recv, dtype, "recv", writable=True)


class Communicator(Front):
    """Compressed collectives over an mpi4py communicator (collective constructor).

    >>> from mpi4py import MPI
    >>> import ml_dtypes, numpy as np, zipccl
    >>> comm = zipccl.Communicator(MPI.COMM_SELF, policy="always")
    >>> x = np.arange(8, dtype=np.float32).astype(ml_dtypes.bfloat16)
    >>> out = np.empty(8 * comm.size, dtype=ml_dtypes.bfloat16)
    >>> comm.all_gather(x, out)
    >>> bool(np.array_equal(out.view(np.uint16), x.view(np.uint16)))
    True
    >>> comm.close()

    ``chunk_bytes``: BF16 bytes per message per pipeline round of the compressed path
    (default ``core.DEFAULT_CHUNK_BYTES``; 0 = one round); ``policy``: "auto" (a size
    threshold until ``calibrate`` measures a profile), "always", "never", "raw" or a
    ``Policy``; ``verify``: "first" (a signature is checked across ranks the first time it is
    seen) or "always" (every call); see ``agreement``. All ranks must pass the same settings:
    the constructor raises the same ``CollectiveError`` on every rank otherwise.
    ``capacity``: the escape capacity of the compressed calls' slots
    (``comm.capacity.CapacityConfig`` or a dict of its settings; None: the adaptive rule).
    ``stats``: what the calls moved (``comm.stats.Stats``); ``last_stats`` the last call's bytes.
    """

    def __init__(self, comm, *, backend: str = "auto", policy: str | Policy = "auto",
                 checksum: bool = False, min_compress_bytes: int = 1 << 20,
                 compress_host: bool = False, cuda_aware_mpi: bool | None = None,
                 chunk_bytes: int | None = None, verify: str = "first", capacity=None):
        self._calls = _OneCall()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
        chunk_bytes = DEFAULT_CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes)
        if isinstance(policy, str) and policy == "auto":
            policy = env_policy() or "auto"  # $ZIPCCL_POLICY replaces the default, as in torch
        pol = policy if isinstance(policy, Policy) else \
            Policy(policy, min_bytes=min_compress_bytes, compress_host=compress_host)
        self._core = Core(pol, chunk_bytes=chunk_bytes, checksum=checksum, capacity=capacity)
        self.backend = backend
        self.verify = verify
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.mpi = MPITransport(self.comm, cuda_aware=cuda_aware_mpi)
        self._agreement = Agreement(self.mpi, self.size)
        self._link = Link(self._agreement, verify)
        self._settings_changed()  # the settings text, now that it has a home
        self._nccl: Transport | None = None
        self._nccl_tried = False
        self._nccl_error: str | None = None
        self._capture_stream = None  # where zipccl's own graphs are recorded (``graph``)
        try:
            self._agreement.control(
                "Communicator", sig_hash(("settings", self._agreement.settings)), None,
                header="zipccl Communicator: ranks were created with different settings")
        except CollectiveError:
            self.close()
            raise

    @property
    def last_stats(self):
        """Bytes the last call sent (``base.ExchangeStats``: wire and raw)."""
        return self._core.last_stats

    # -- settings: every change drops the plans and agreed signatures (on every rank) --------
    @Front.policy.setter
    def policy(self, value: Policy) -> None:
        if not isinstance(value, Policy):
            raise TypeError(f"policy must be a zipccl.comm.Policy, got {type(value).__name__}")
        self._core.policy = value
        self._settings_changed()

    @Front.chunk.setter
    def chunk(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"chunk must be an integer, got {type(value).__name__} {value!r}")
        value = int(value)
        if value < 0 or value % fmt.BLOCK:
            raise ValueError(f"chunk must be a non-negative multiple of {fmt.BLOCK}, got {value}")
        self._core.chunk = value
        self._settings_changed()

    @contextmanager
    def forcing(self, compress: bool) -> Iterator[Communicator]:
        """Inside the block, BF16 calls on more than one rank take the compressed path
        (``compress=True``) or the native one (``False``) whatever the policy decides:
        what ``calibrate`` times. Other types and one rank follow the policy.

        Collective, like a change of settings: every rank must enter it, and leave it, at
        the same point of its calls. Entering and leaving change the settings text
        (``calibrating=...``), so every plan and agreed signature is dropped on every rank
        alike and a forced call never passes for an unforced one between ranks. On leaving,
        what was forced before (nothing, or an enclosing ``forcing``) holds again.

        >>> from mpi4py import MPI
        >>> import ml_dtypes, numpy as np, zipccl
        >>> comm = zipccl.Communicator(MPI.COMM_SELF)
        >>> with comm.forcing(True):
        ...     comm.all_gather(np.zeros(8, ml_dtypes.bfloat16), np.zeros(8, ml_dtypes.bfloat16))
        >>> comm.last_decision.compress  # one rank: nothing to force, the policy decided
        False
        >>> comm.close()
        """
        if not isinstance(compress, bool):
            raise TypeError(f"forcing takes True (compressed) or False (native), got {compress!r}")
        previous = self._core.force
        self._set_force(compress)
        try:
            yield self
        finally:
            self._set_force(previous)

    def _set_force(self, value: bool | None) -> None:
        self._core.force = value
        self._settings_changed()

    @_one_call
    def _settings_changed(self) -> None:
        core, agreement = self._core, getattr(self, "_agreement", None)
        if agreement is None:  # construction: made once both exist
            return
        pol = core.policy
        fields = {f.name: getattr(pol, f.name) for f in dataclasses.fields(pol) if f.repr}
        prof = fields.pop("profile", None)
        fields["profile"] = None if prof is None else f"{sig_hash((prof.to_json(),)) & 0xFFFFFFFF:08x}"
        text = (f"backend={self.backend!r}, policy=({', '.join(f'{k}={v!r}' for k, v in fields.items())}), "
                f"chunk_bytes={2 * core.chunk}, checksum={core.checksum}, "
                f"capacity={core.capacity!r}, "
                f"verify={self.verify!r}")
        if core.force is not None:
            text += f", calibrating={core.force}"
        agreement.reset(text)
        core.plans.clear()

    # -- plumbing ---------------------------------------------------------------------------
    @_one_call
    def close(self) -> None:
        """Free the duplicated MPI communicator and the NCCL communicator, if any."""
        self._core.plans.clear()
        self._agreement.agreed.clear()
        self._core.close_channels()
        if self._nccl is not None:
            self._nccl.close()
            self._nccl = None
        self.mpi.close()
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    @_one_call
    def synchronize(self, stream=None) -> None:
        """Wait for this rank's device work on ``stream`` (default: the current CuPy stream)
        and raise the same ``CollectiveError`` on every rank if a compressed call of this
        communicator failed on any rank (a frame that did not decode, a slot header that did
        not match the call). Collective: every rank calls it. After an error the communicator
        stays failed: every later compressed device call raises.

        Compressed device calls return without waiting (NCCL's contract), so their errors
        surface here, at the next compressed call on the rank that saw them (a read of
        mapped memory, no wait), and on its peers one call later (the slot headers carry
        them).
        """
        if self.comm is None:
            raise CollectiveError("zipccl synchronize: the communicator is closed")
        if True in self._core.channels():
            import cupy

            (cupy.cuda.get_current_stream() if stream is None else cupy_stream(stream)).synchronize()
        err = None
        for ch in self._core.channels().values():
            err = err or ch.failed or ch.error_text()
        try:
            self._agreement.agree(err, "synchronize")
        except CollectiveError as e:
            for ch in self._core.channels().values():
                ch.fail(str(e))
            raise

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def _host(self):
        return self._core.engine(False)

    def _route(self, device: bool, stream):
        """(engine, transport) for host or device data; the device side is set up lazily."""
        if not device:
            if self.backend == "nccl":
                raise CollectiveError('backend="nccl" moves device arrays only; got host arrays')
            return self._core.engine(False), self.mpi
        tr = self._device_transport()
        return self._core.engine(True, stream), tr

    def _device_transport(self) -> Transport:
        if self.backend == "mpi":
            return self.mpi
        if not self._nccl_tried:
            self._nccl_tried = True
            from .transport import NCCLTransport, choose_device_transport, current_gpu_id

            err = None
            try:
                from cupy.cuda import nccl

                nccl.get_version()
            except Exception as e:  # noqa: BLE001 -- any failure means "no NCCL here"
                err = f"NCCL unavailable: {e}"
            # every rank's NCCL check and GPU in one exchange: ranks sharing a GPU take MPI
            rows = self.mpi.allgather_objects((err, current_gpu_id()))
            choice = choose_device_transport(self.backend, [r[0] for r in rows], [r[1] for r in rows],
                                             cuda_aware=self.mpi.cuda_aware)
            self._nccl_error = choice.error
            if choice.note and self.rank == 0:
                _say_once(choice.note)
            if choice.name == "nccl":
                self._nccl = NCCLTransport(self.comm)
        if self._nccl is None and self.backend == "nccl":
            raise CollectiveError(self._nccl_error)  # the same message on every rank, every call
        return self._nccl if self._nccl is not None else self.mpi

    @property
    def transport_name(self) -> str:
        """Where device arrays go: "nccl", "mpi" (CUDA-aware) or "mpi-staged"; host: "mpi"."""
        if self._nccl is not None:
            return "nccl"
        return "mpi" if self.mpi.cuda_aware else "mpi-staged"

    @_one_call
    def calibrate(self, *, device: bool = False, sizes=(1 << 20, 16 << 20, 64 << 20, 256 << 20),
                  ops=OPS, repeat: int = 3, path: str | None = None, stream=None,
                  machine: str | None = None) -> Profile:
        """Measure the components of the cost model here and make ``policy="auto"`` follow it.

        Measures (after a warm-up each; ``repeat`` calls back to back, the slowest rank's
        mean), on Gaussian BF16 data, host or device (``device=True`` needs CuPy and
        selects this communicator's device transport):

        - every op in ``ops`` natively and compressed at each per-rank size in ``sizes``
          (bytes each rank contributes: all-gather's send buffer, reduce-scatter's
          output, the whole buffer of all-to-all and all-reduce; all-reduce, which works in
          place, restores its input before each call, on both paths);
        - the codec alone (fresh codebook, the largest size and a quarter of it, device
          time): encode, decode and reduction throughput, ratio;
        - the compressed path's fixed costs, per call and per pipeline round, from
          compressed calls on tiny messages in rounds of one escape block.

        The result (``policy.Profile``) predicts both paths' times with the cost model;
        ``"auto"`` compresses wherever the fitted model predicts the compressed path faster,
        beyond the calibrated sizes too (every term is a latency or a bandwidth); ``explain``
        shows both times and their terms. All ranks hold the same numbers, so they decide
        alike. With ``path``, a profile saved there for the same device / transport /
        ranks / machine is loaded instead of measuring, and a newly measured one is saved.
        """
        from .calibrate import calibrate

        return calibrate(self, device=device, sizes=sizes, ops=ops, repeat=repeat, path=path,
                         stream=stream, machine=machine)

    def explain(self, op: str, nbytes: int, *, device: bool = True, quiet: bool = False) -> str:
        """Print and return what the policy does for ``op`` on ``nbytes`` BF16 bytes per rank, and why.

        With a measured profile (``calibrate``) the line holds both predicted times, the
        compressed path's stages and the choice; ``quiet=True`` only returns it.
        ``nbytes`` follows the decisions' convention (see ``zipccl.comm.policy``).
        """
        line = self.policy.explain(op, nbytes, device=device, world=self.size)
        if not quiet:
            print(line, flush=True)
        return line

    # -- the collectives: each one's arguments described by its file, then the one path --------
    @_one_call
    def all_gather(self, send, recv, *, dtype: str | None = None, stream=None) -> None:
        """recv = concatenation over ranks (rank order) of every rank's ``send``.

        ``recv`` holds size x ``send.size`` elements. Like ncclAllGather; ``send``
        may be rank's own slice of ``recv`` (in place).
        """
        self._collective("all_gather", send, recv, dtype, stream, None,
                         lambda: _ag.describe(*_pair(send, recv, dtype), self.size, self.rank))

    @_one_call
    def reduce_scatter(self, send, recv, op: str = "sum", *, dtype: str | None = None,
                       stream=None) -> None:
        """recv = reduction over ranks of each rank's block ``rank`` of ``send``.

        ``send`` holds size x ``recv.size`` elements. BF16, FP32 and FP16 ``op="sum"``:
        the stated sum (``zipccl.comm.reduction.reduce_sum``: FP32 in rank order, one
        rounding to the type) compressed and on the native MPI path; native NCCL uses NCCL's
        sum. ``op="avg"``: the stated sum, then one division (``reduction.divide``), on
        every path, as ``zipccl.torch``'s AVG. Other ops: the transport's own reduction
        (BF16 needs NCCL for them: MPI has no BF16 type).
        """
        def describe_call() -> Call:
            s, r = _pair(send, recv, dtype)
            return _rs.describe(s, r, reduction_of(s, op), self.size, self.rank)

        self._collective("reduce_scatter", send, recv, dtype, stream, op, describe_call)

    @_one_call
    def all_to_all(self, send, recv, send_counts=None, recv_counts=None, *,
                   dtype: str | None = None, stream=None) -> None:
        """Rank i's block j of ``send`` becomes rank j's block i of ``recv``.

        Without counts, both buffers split into ``size`` equal blocks. With
        ``send_counts`` (elements per destination, packed in rank order, summing to
        ``send.size``) blocks may be uneven, as MoE dispatch needs; ``recv_counts``
        (elements per source) may be given or left for zipccl to derive from the
        other ranks' ``send_counts``. The count matrix is exchanged (one control row)
        on every call, except on device arrays with both counts given: then only the
        first call of a dtype exchanges it (see ``agreement``'s module docstring, 5.).
        """
        if send_counts is not None or recv_counts is not None:
            return self._all_to_all_counts(send, recv, send_counts, recv_counts, dtype, stream)
        self._collective("all_to_all", send, recv, dtype, stream, None,
                         lambda: _aa.describe(*_pair(send, recv, dtype), self.size, self.rank))

    @_one_call
    def all_reduce(self, buf, op: str = "sum", *, dtype: str | None = None, stream=None) -> None:
        """In place: ``buf`` = reduction over ranks of every rank's ``buf``.

        Sums and AVG of BF16, FP32, FP16 compressed: a reduce-scatter of near-equal shards,
        then an all-gather, with the reduction stated in ``reduce_scatter``; native NCCL is
        ncclAllReduce (AVG: the stated one); native MPI is the same two steps uncompressed.
        """
        def describe_call() -> Call:
            b = wrap(buf, dtype, "buf", writable=True)
            return _ar.describe(b, reduction_of(b, op), self.size, self.rank)

        self._collective("all_reduce", buf, None, dtype, stream, op, describe_call)

    # -- the one path (``core.Core.call``) and what it asks of this front end ----------------
    def _collective(self, op: str, send, recv, dtype, stream, extra, make) -> None:
        """The call under its plan key (arrays' identity, stream, ``extra``) on the core's path."""
        key, st = call_key(op, send, recv, dtype, stream, extra)
        self._core.call(self, op, key, make, st)

    def described(self, op: str, describe, stream) -> Call:
        """The call ``describe`` gives; a local argument error is reported in the control row
        and raises on every rank."""
        if self.comm is None:
            raise CollectiveError(f"zipccl {op}: the communicator is closed")
        try:
            return describe()
        except (TypeError, ValueError) as e:
            self._agreement.control(op, 0, str(e), describe=f"{op}(invalid arguments)")
            raise AssertionError("unreachable: an error in the control row raises") from e

    def link(self, call: Call, stream):
        call.stream = call_stream(call.send, stream)
        if call.device and not self._nccl_tried and self.backend != "mpi":
            sig = call.sig(self._agreement.settings)
            if sig in self._agreement.agreed:
                # the first device call agrees before the device transport is set up (a
                # collective of its own), even for a signature agreed before
                self._agreement.control(call.op, sig_hash(sig), None, describe=describe(sig))
        return self._link, self.size, None

    def where(self, call: Call, stream):
        return self._route(call.device, call.stream)

    def graph(self, call: Call, stream, record):
        """``record(stream)`` captured on a CuPy stream of this communicator's own, thread-local;
        launched on the call's stream (the legacy default stream too); None where this CuPy
        cannot capture."""
        import cupy

        if not hasattr(cupy.cuda.Stream, "begin_capture"):
            return None
        if self._capture_stream is None:
            self._capture_stream = cupy.cuda.Stream(non_blocking=True)
        cap = self._capture_stream
        cap.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        try:
            record(cap.ptr)
        finally:
            graph = cap.end_capture()
        return functools.partial(graph.launch, cupy_stream(call.stream))

    def capturing(self, call: Call, stream) -> bool:
        import cupy

        try:
            return bool(cupy.cuda.runtime.streamIsCapturing(stream_ptr(call.stream)))
        except cupy.cuda.runtime.CUDARuntimeError as e:  # an invalidated capture
            raise CollectiveError(f"zipccl {call.op}: the CUDA graph capture on this stream was "
                                  f"invalidated by an earlier call") from e

    def spills(self, eng, stream):
        """The spill channel of compressed calls on the engine's memory (host or device, one
        each, made at the first such call, which every rank makes at the same point)."""
        from .channels import MPIChannel
        from .spill import Spills

        return eng.device, lambda: Spills(MPIChannel(self.comm), device=eng.device)

    # -- all-to-all with per-peer counts (``agreement``'s module docstring, 5.) -------------
    def _all_to_all_counts(self, send, recv, send_counts, recv_counts, dtype, stream) -> None:
        """all_to_all with per-peer counts: the count matrix travels in the control row."""
        p, agreement = self.size, self._agreement
        if self.comm is None:
            raise CollectiveError("zipccl all_to_all: the communicator is closed")
        err, extra = None, []
        try:
            s, r = wrap(send, dtype, "send"), wrap(recv, dtype, "recv", writable=True)
            sc, rc, extra = _aa.counts_row(s, r, send_counts, recv_counts, p)
            sig = ("all_to_all", s.dtype, s.device, "per-peer counts", agreement.settings)
        except (TypeError, ValueError) as e:
            err, sig = str(e), None
        if err is not None and agreement.decisions and self.verify == "first":
            # peers may be in a call that makes no host exchange (5.): raise here alone, as
            # NCCL returns an invalid argument to the rank that passed it
            raise CollectiveError(f"zipccl all_to_all: {err}")
        known = agreement.decisions.get(sig) if err is None and rc is not None and s.device else None
        if known is not None and self.verify == "first":
            # both count lists given and the decision agreed: no host exchange (5.)
            return self._counts_call(_aa.describe(s, r, p, self.rank, sc, rc), known, None, stream)
        table = agreement.control("all_to_all", sig_hash(sig) if sig else 0, err, extra,
                                  describe=f"all_to_all({sig[1]}, {sig[2]}, per-peer counts)"
                                  if sig else "all_to_all(invalid arguments)")
        matrix = count_matrix(table, p)  # every rank: the same table, the same checks
        # kept for later calls only if every rank gave recv_counts (read from the table: the
        # same on every rank); a later call takes the host-free path only where it gives them
        every_rank_gave = bool((table[:, p] >= 0).all())
        largest = max([matrix[i][j] for i in range(p) for j in range(p) if i != j] + [0])
        call = _aa.describe(s, r, p, self.rank, matrix[self.rank], [matrix[j][self.rank] for j in range(p)],
                            largest=largest)
        call.nbytes = s.data.itemsize * sum(map(sum, matrix)) // p
        d = self._core.decide(call, p)
        if every_rank_gave and s.device:
            agreement.keep_decision(sig, d)  # every rank: the same table, the same decision
        self._counts_call(call, d, largest, stream)

    def _counts_call(self, call: Call, d: Decision, largest: int | None, stream) -> None:
        """Run a per-peer-count all-to-all as ``d`` decided, agreed here (``largest``: the
        largest message between two ranks, None where it is not known)."""
        call.largest = largest
        self._core.call(self, "all_to_all", None, lambda: call, stream, decided=d, agreed=True)
