"""``zipccl.Communicator``: NCCL-like collectives that move BF16, FP32 and FP16 tensors
compressed, bit-exact.

It wraps an mpi4py communicator (duplicated, so zipccl's messages never meet
the caller's) and exposes ``all_gather``, ``reduce_scatter``, ``all_to_all``
(with per-peer counts) and ``all_reduce`` on NumPy (``ml_dtypes.bfloat16``,
float32, float16, or integer bit patterns with ``dtype="bfloat16"`` /
``"float32"`` / ``"float16"``), torch, CuPy and Numba device arrays. Calls on
those three types go compressed or native as the policy decides (reductions:
sums only); any other dtype or reduction goes through the native collective
unchanged.

Host arrays travel over MPI and are coded by the CPU codec. Device arrays
travel over NCCL (``backend="nccl"``, or ``"auto"`` when CuPy's NCCL works on
every rank and no two ranks share a GPU) or over MPI, directly if MPI reports CUDA
support and staged through pinned host memory otherwise. Ranks that share a GPU (two
ranks on a one-GPU machine) cannot use NCCL: ``"auto"`` takes MPI and says so in one
logged line; ``backend="nccl"`` raises ``CollectiveError`` naming the fix. The user
selects the CUDA device before creating the communicator
(``cupy.cuda.Device(i).use()``; ``zipccl.tools.gpus.mpi_place`` gives the usual choice);
nothing touches a GPU until a device array arrives.

Every rank must make the same calls in the same order with matching arguments;
zipccl checks this without paying for it on every call, and says precisely what it
catches and when (``agreement``'s module docstring: settings agreed at construction,
each call's signature in one control row, native calls replayed from plans once
agreed, compressed device calls without a host exchange, all-to-all counts).

Local argument errors (sizes, dtype, contiguity, alignment, writability) are
found before anything moves and reported in the control row, so they raise on
every rank that takes part in the exchange. On a failed call the caller's output
buffers hold unspecified contents (a rank may have copied its own block).

Threads: a Communicator takes one call at a time. Calls may come from several threads
if the caller orders them, the same on every rank (one thread hands over to the next,
e.g. through a lock and a turn), as MPI and NCCL require of their communicators: a
collective matches its peers' by order alone, so no lock inside zipccl could keep
two threads' calls in one order across ranks (rank 0's threads may run A then B, rank
1's B then A, and a serialised B would meet A: a "message truncated" abort, a frame
error or, with equal signatures, silently crossed data). What zipccl can see is overlap
on one rank: a call (any collective, ``synchronize``, ``calibrate``, ``close``, a change
of settings) that starts while another thread's call runs raises ``CollectiveError``
there before anything moves, and, as the refused call may have been made on the other
ranks, the communicator then refuses every later call but ``close``. Overlap on no rank
is not detected; calls from threads other than MPI's main one need MPI initialised
with ``MPI_THREAD_SERIALIZED`` or more (mpi4py's default is ``MPI_THREAD_MULTIPLE``, which
the spill channel needs anyway). See docs/COLLECTIVES.md, "Threads".

The pieces, each in its own module: ``args`` normalises and checks the arguments
(the same for every entry point); ``agreement`` holds the control row and what the
ranks have agreed; ``plans`` keeps each signature's decision and bound native call;
``collectives`` says what each collective moves, over the transports of ``transport``.
This class holds the settings and puts them together: each collective looks its call
up, checks it, agrees and runs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from .. import format as fmt
from .agreement import Agreement, count_matrix, describe, sig_hash
from .args import (
    Arr,
    all_gather_args,
    all_reduce_args,
    all_to_all_args,
    byte_view,
    call_key,
    call_stream,
    counts_args,
    overlap,
    ptr_range,
    reduce_scatter_args,
)
from .base import CollectiveError, ExchangeStats, chunk_elements, offsets
from .collectives import (
    all_gather_values,
    all_reduce_values,
    all_to_all_values,
    reduce_scatter_values,
)
from .host import HostEngine
from .plans import Plan, Plans
from .policy import OPS, Decision, Policy, Profile
from .transport import MPITransport, Transport

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
DEFAULT_CHUNK_BYTES = 64 << 20  # bytes per message per pipeline round (see experiments/README.md)


class Communicator:
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
    (default ``DEFAULT_CHUNK_BYTES``, measured on 2 x H200; 0 = one round); ``policy``: "auto" (a
    size threshold until ``calibrate`` measures a profile), "always" or "never";
    ``verify``: "first" (a native call's signature is checked across ranks the first
    time it is seen) or "always" (before every call); see ``agreement``. All
    ranks must pass the same settings: the constructor raises the same
    ``CollectiveError`` on every rank otherwise. ``capacity``: the escape capacity of the
    compressed calls' slots (``comm.capacity.CapacityConfig`` or a dict of its settings; None: the
    adaptive default rule; see ``comm.exchange.SlotChannel``).
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
        if chunk_bytes < 0:
            raise ValueError(f"chunk_bytes must be >= 0, got {chunk_bytes}")
        from .capacity import as_config

        self.capacity = as_config(capacity)
        self._plans = Plans()
        self.backend = backend
        self.verify = verify
        self._checksum = bool(checksum)
        self._force_value: bool | None = None  # set only inside ``forcing``
        # elements per pipeline round, whole escape blocks (0: one round)
        self._chunk = 0 if chunk_bytes == 0 else max(fmt.BLOCK, chunk_bytes // 2 // fmt.BLOCK * fmt.BLOCK)
        self.policy = policy if isinstance(policy, Policy) else \
            Policy(policy, min_bytes=min_compress_bytes, compress_host=compress_host)
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.mpi = MPITransport(self.comm, cuda_aware=cuda_aware_mpi)
        self._agreement = Agreement(self.mpi, self.size)
        self._settings_changed()  # the settings text, now that it has a home
        self._nccl: Transport | None = None
        self._nccl_tried = False
        self._nccl_error: str | None = None
        self._host = HostEngine(checksum=self._checksum)
        self._device_engine = None
        self._slot_channels: dict = {}  # host (False) / device (True): exchange.SlotChannel
        self.last_decision: Decision | None = None
        self.last_stats: ExchangeStats | None = None
        try:
            self._agreement.control(
                "Communicator", sig_hash(("settings", self._agreement.settings)), None,
                header="zipccl Communicator: ranks were created with different settings")
        except CollectiveError:
            self.close()
            raise

    # -- settings: every change drops the plans and agreed signatures (on every rank) --------
    @property
    def policy(self) -> Policy:
        """The policy deciding compressed or native (``calibrate`` replaces it)."""
        return self._policy

    @policy.setter
    def policy(self, value: Policy) -> None:
        if not isinstance(value, Policy):
            raise TypeError(f"policy must be a zipccl.comm.Policy, got {type(value).__name__}")
        self._policy = value
        self._settings_changed()

    @property
    def chunk(self) -> int:
        """Elements per message per pipeline round of the compressed path (0: one round)."""
        return self._chunk

    @chunk.setter
    def chunk(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"chunk must be an integer, got {type(value).__name__} {value!r}")
        value = int(value)
        if value < 0 or value % fmt.BLOCK:
            raise ValueError(f"chunk must be a non-negative multiple of {fmt.BLOCK}, got {value}")
        self._chunk = value
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
        previous = self._force_value
        self._set_force(compress)
        try:
            yield self
        finally:
            self._set_force(previous)

    def _set_force(self, value: bool | None) -> None:
        self._force_value = value
        self._settings_changed()

    @_one_call
    def _settings_changed(self) -> None:
        pol = getattr(self, "_policy", None)
        agreement = getattr(self, "_agreement", None)
        if pol is None or agreement is None:  # construction: made once both exist
            return
        fields = {f.name: getattr(pol, f.name) for f in dataclasses.fields(pol) if f.repr}
        prof = fields.pop("profile", None)
        fields["profile"] = None if prof is None else f"{sig_hash((prof.to_json(),)) & 0xFFFFFFFF:08x}"
        text = (f"backend={self.backend!r}, policy=({', '.join(f'{k}={v!r}' for k, v in fields.items())}), "
                f"chunk_bytes={2 * self._chunk}, checksum={self._checksum}, "
                f"capacity={getattr(self, 'capacity', None)!r}, "
                f"verify={self.verify!r}")
        if self._force_value is not None:
            text += f", calibrating={self._force_value}"
        agreement.reset(text)
        self._plans.clear()

    # -- plumbing ---------------------------------------------------------------------------
    @_one_call
    def close(self) -> None:
        """Free the duplicated MPI communicator and the NCCL communicator, if any."""
        self._plans.clear()
        self._agreement.agreed.clear()
        for ch in getattr(self, "_slot_channels", {}).values():
            ch.close()
        self._slot_channels = {}
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
        if True in self._slot_channels:
            import cupy

            from .transport import cupy_stream

            (cupy.cuda.get_current_stream() if stream is None else cupy_stream(stream)).synchronize()
        err = None
        for ch in self._slot_channels.values():
            err = err or ch.failed or ch.error_text()
        try:
            self._agreement.agree(err, "synchronize")
        except CollectiveError as e:
            for ch in self._slot_channels.values():
                ch.fail(str(e))
            raise

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- agreement and plans (``agreement``, ``plans``) -------------------------------------
    def _prepare(self, op: str, key, plan: Plan | None, check, stream):
        """Run the local ``check`` and agree on the call; returns (plan, arrays, stream).

        ``check()`` -> (common, nbytes, arrays) (``args``' per-collective checks): ``common``
        the signature's values, ``nbytes`` what the policy decides on, ``arrays`` the wrapped
        arguments (the first one's kind decides host or device). A local error is reported
        in the control row and raises on every rank that takes part.
        """
        if self.comm is None:
            raise CollectiveError(f"zipccl {op}: the communicator is closed")
        agreement = self._agreement
        try:
            common, nbytes, arrays = check()
        except (TypeError, ValueError) as e:
            agreement.control(op, 0, str(e), describe=f"{op}(invalid arguments)")
            raise AssertionError("unreachable: an error in the control row raises") from e
        a = arrays[0] if isinstance(arrays, tuple) else arrays
        if key is None or stream is None:
            stream = call_stream(a, stream)
        if plan is None:
            sig = (op, *common, agreement.settings)
            d = self._decide(op, nbytes, a)
            plan = Plan(sig, sig_hash(sig), d, bool(a.code is not None and d.compress))
            self._plans.add(key, plan)
        else:
            self.last_decision = plan.decision
        first_device = a.device and not self._nccl_tried and self.backend != "mpi"
        if first_device or (not plan.compress and (plan.sig not in agreement.agreed
                                                   or self.verify == "always")):
            # native: agreed once per signature; the first device call also agrees before
            # the device transport is set up (a collective of its own)
            agreement.control(op, plan.crc, None, describe=describe(plan.sig))
            if not plan.compress:
                self._remember(plan.sig)
        return plan, arrays, stream

    def _replay(self, plan: Plan) -> None:
        """An agreed native call from its plan: the bound transport call, nothing else."""
        plan.run()
        self.last_decision, self.last_stats = plan.decision, plan.stats

    def _remember(self, sig: tuple) -> None:
        if self._agreement.remember(sig):  # all agreed signatures forgotten: their plans too
            self._plans.clear()

    def _native(self, key, plan: Plan, raw: int, bound, run: Callable[[], None]) -> None:
        """A native call: its bytes counted once, its bound transport call (``bound``; None
        where the arguments cannot be bound) kept for next time where the signature is agreed
        and ``verify="first"``, then ``run``."""
        if plan.stats is None:
            plan.stats = ExchangeStats(raw, raw)
        self._plans.bind(key, plan, bound,
                         agreed=self.verify == "first" and plan.sig in self._agreement.agreed)
        run()
        self.last_stats = plan.stats

    def _slots(self, eng, op: str, plan: Plan):
        """The slot channel of a compressed call on the engine's memory (host or device, one
        each, made at the first such call, which every rank makes at the same point). A
        compressed signature is agreed across ranks the first time it is seen (every call
        with ``verify="always"``, and on host arrays); afterwards a device call makes no
        host exchange at all, as NCCL's do."""
        if plan.crc and (plan.sig not in self._agreement.agreed or self.verify == "always"
                         or not eng.device):
            # host arrays: every call (their exchange blocks anyway; a control row costs one
            # small all-gather), so that a mismatch raises the same error on every rank
            self._agreement.control(op, plan.crc, None, describe=describe(plan.sig))
            self._remember(plan.sig)
        ch = self._slot_channels.get(eng.device)
        if ch is None:
            from .capacity import CapacityRule
            from .exchange import SlotChannel
            from .spill import MPIChannel, Spills

            ch = self._slot_channels[eng.device] = SlotChannel(
                Spills(MPIChannel(self.comm), device=eng.device), CapacityRule(self.capacity))
        ch.raw = plan.decision.raw  # policy "raw": this call's frames go RAW
        return ch

    def _route(self, device: bool, stream):
        """(engine, transport) for host or device data; the device side is set up lazily."""
        if not device:
            if self.backend == "nccl":
                raise CollectiveError('backend="nccl" moves device arrays only; got host arrays')
            return self._host, self.mpi
        if self._device_engine is None:
            from .pipeline import DeviceEngine

            self._device_engine = DeviceEngine(checksum=self._checksum)
        self._device_engine.set_stream(stream)
        return self._device_engine, self._device_transport()

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

    def _decide(self, op: str, nbytes: int, arr: Arr) -> Decision:
        if self._force_value is not None and arr.bf16 and self.size > 1:
            d = Decision(op, nbytes, self._force_value, "calibration")
        else:
            d = self.policy.decide(op, nbytes, dtype=None if arr.code is None else arr.dtype,
                                   device=arr.device, world=self.size)
        self.last_decision = d
        return d

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

    def _chunk_of(self, a: Arr) -> int:
        """Elements per pipeline round for ``a``'s type (``base.chunk_elements``)."""
        return chunk_elements(self._chunk, a.data.itemsize)

    # -- the collectives --------------------------------------------------------------------
    # Each one: look the call up by its key; an agreed native plan with a bound call is the
    # whole call. Otherwise check (``args``), agree (``_prepare``) and run, binding the native
    # call for next time where the transport can.
    @_one_call
    def all_gather(self, send, recv, *, dtype: str | None = None, stream=None) -> None:
        """recv = concatenation over ranks (rank order) of every rank's ``send``.

        ``recv`` holds size x ``send.size`` elements. Like ncclAllGather; ``send``
        may be rank's own slice of ``recv`` (in place).
        """
        key, st = call_key("all_gather", send, recv, dtype, stream)
        plan = self._plans.get(key)
        if plan is not None and plan.run is not None:
            return self._replay(plan)
        plan, (s, r), st = self._prepare("all_gather", key, plan,
                                         lambda: all_gather_args(send, recv, dtype, self.size), st)
        eng, tr = self._route(s.device, st)
        if plan.compress:
            sdata = self._detached(eng, s.data, r.data)
            self.last_stats = all_gather_values(eng, tr, sdata, r.data, [s.size] * self.size,
                                                compress=True, stream=st, chunk=self._chunk_of(s),
                                                channel=self._slots(eng, "all_gather", plan))
            return
        s8, r8 = byte_view(s.data), byte_view(r.data)
        in_place = ptr_range(s8)[0] == ptr_range(r8)[0] + self.rank * s.nbytes
        # bound where NCCL's own in-place form applies, or where the buffers do not overlap
        bound = tr.bind_allgather(s8, r8, st) if in_place or not overlap(s8, r8) else None
        self._native(key, plan, s.nbytes * (self.size - 1), bound,
                     lambda: tr.allgather(self._detached(eng, s8, r8), r8, st))

    @_one_call
    def reduce_scatter(self, send, recv, op: str = "sum", *, dtype: str | None = None,
                       stream=None) -> None:
        """recv = reduction over ranks of each rank's block ``rank`` of ``send``.

        ``send`` holds size x ``recv.size`` elements. BF16: ``op="sum"`` only. BF16,
        FP32 and FP16 sums: the reduction of ``zipccl.comm.collectives.reduce_sum``
        (FP32 in rank order, one rounding to the type) on the compressed path and on
        the native MPI path; native NCCL uses NCCL's sum. Other dtypes and other FP32 /
        FP16 ops: the native reduction.
        """
        key, st = call_key("reduce_scatter", send, recv, dtype, stream, op)
        plan = self._plans.get(key)
        if plan is not None and plan.run is not None:
            return self._replay(plan)
        plan, (s, r), st = self._prepare(
            "reduce_scatter", key, plan,
            lambda: reduce_scatter_args(send, recv, op, dtype, self.size), st)
        eng, tr = self._route(s.device, st)
        if s.code is not None and (plan.compress or tr.name != "nccl"):
            sdata = self._detached(eng, s.data, r.data)
            self.last_stats = reduce_scatter_values(
                eng, tr, sdata, r.data, [r.size] * self.size, compress=plan.compress,
                stream=st, chunk=self._chunk_of(s),
                channel=self._slots(eng, "reduce_scatter", plan) if plan.compress else None)
            return
        kind = "bfloat16" if s.bf16 else None
        in_place = ptr_range(s.data)[0] + self.rank * r.nbytes == ptr_range(r.data)[0]
        # bound where NCCL's own in-place form applies, or where the buffers do not overlap
        bound = (tr.bind_reduce_scatter(s.data, r.data, op, st, dtype=kind)
                 if in_place or not overlap(s.data, r.data) else None)
        self._native(key, plan, s.nbytes - r.nbytes, bound, lambda: tr.reduce_scatter(
            self._detached(eng, s.data, r.data), r.data, op, st, dtype=kind))

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
        p = self.size
        if send_counts is not None or recv_counts is not None:
            return self._all_to_all_counts(send, recv, send_counts, recv_counts, dtype, stream)
        key, st = call_key("all_to_all", send, recv, dtype, stream)
        plan = self._plans.get(key)
        if plan is not None and plan.run is not None:
            return self._replay(plan)
        plan, (s, r), st = self._prepare("all_to_all", key, plan,
                                         lambda: all_to_all_args(send, recv, dtype, p), st)
        if plan.compress:
            b = s.size // p
            self._run_all_to_all(s, r, [b] * p, [b] * p, b if p > 1 else 0, plan, st, True)
            return
        eng, tr = self._route(s.device, st)
        s8, r8 = byte_view(s.data), byte_view(r.data)
        c = [s.nbytes // p] * p
        bound = None if overlap(s8, r8) else tr.bind_alltoallv(s8, c, offsets(c), r8, c,
                                                                offsets(c), st)
        self._native(key, plan, s.nbytes - s.nbytes // p, bound, lambda: tr.alltoallv(
            self._detached(eng, s8, r8), c, offsets(c), r8, c, offsets(c), st))

    @_one_call
    def all_reduce(self, buf, op: str = "sum", *, dtype: str | None = None, stream=None) -> None:
        """In place: ``buf`` = reduction over ranks of every rank's ``buf``.

        BF16 (``op="sum"``): compressed = reduce-scatter of near-equal shards, then
        all-gather, with the reduction stated in ``reduce_scatter``; native NCCL is
        ncclAllReduce; native MPI is the same two steps uncompressed.
        """
        key, st = call_key("all_reduce", buf, None, dtype, stream, op)
        plan = self._plans.get(key)
        if plan is not None and plan.run is not None:
            return self._replay(plan)
        plan, b, st = self._prepare("all_reduce", key, plan,
                                    lambda: all_reduce_args(buf, op, dtype), st)
        eng, tr = self._route(b.device, st)
        if b.code is not None and (plan.compress or tr.name != "nccl"):
            self.last_stats = all_reduce_values(
                eng, tr, b.data, compress=plan.compress, stream=st, chunk=self._chunk_of(b),
                channel=self._slots(eng, "all_reduce", plan) if plan.compress else None)
            return
        kind = "bfloat16" if b.bf16 else None
        self._native(key, plan, 2 * b.nbytes * (self.size - 1) // self.size,
                     tr.bind_allreduce(b.data, op, st, dtype=kind),
                     lambda: tr.allreduce(b.data, op, st, dtype=kind))

    # -- all-to-all with per-peer counts (``agreement``'s module docstring, 5.) -------------
    def _all_to_all_counts(self, send, recv, send_counts, recv_counts, dtype, stream) -> None:
        """all_to_all with per-peer counts: the count matrix travels in the control row."""
        p, agreement = self.size, self._agreement
        if self.comm is None:
            raise CollectiveError("zipccl all_to_all: the communicator is closed")
        err, extra = None, []
        try:
            s, r, sc, rc, extra = counts_args(send, recv, send_counts, recv_counts, dtype, p)
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
            self.last_decision = known
            return self._counts_call(s, r, sc, rc, None, sig, known, stream)
        table = agreement.control("all_to_all", sig_hash(sig) if sig else 0, err, extra,
                                  describe=f"all_to_all({sig[1]}, {sig[2]}, per-peer counts)"
                                  if sig else "all_to_all(invalid arguments)")
        matrix = count_matrix(table, p)  # every rank: the same table, the same checks
        # kept for later calls only if every rank gave recv_counts (read from the table: the
        # same on every rank); a later call takes the host-free path only where it gives them
        every_rank_gave = bool((table[:, p] >= 0).all())
        d = self._decide("all_to_all", s.data.itemsize * sum(map(sum, matrix)) // p, s)
        if every_rank_gave and s.device:
            agreement.keep_decision(sig, d)  # every rank: the same table, the same decision
        largest = max([matrix[i][j] for i in range(p) for j in range(p) if i != j] + [0])
        self._counts_call(s, r, matrix[self.rank], [matrix[j][self.rank] for j in range(p)],
                          largest, sig, d, stream)

    def _counts_call(self, s: Arr, r: Arr, send_counts, recv_counts, largest: int | None,
                     sig: tuple, d: Decision, stream) -> None:
        """Run a per-peer-count all-to-all as ``d`` decided (``largest``: the largest message
        between two ranks, None where it is not known)."""
        st = call_stream(s, stream)
        if s.code is not None and d.compress:
            self._run_all_to_all(s, r, send_counts, recv_counts, largest, Plan(sig, 0, d, True),
                                 st, False)
        else:
            self._native_all_to_all(s, r, send_counts, recv_counts, st)

    def _native_all_to_all(self, s: Arr, r: Arr, send_counts, recv_counts, st) -> None:
        eng, tr = self._route(s.device, st)
        itemsize = s.data.itemsize
        sc = [itemsize * c for c in send_counts]
        rc = [itemsize * c for c in recv_counts]
        s8, r8 = byte_view(s.data), byte_view(r.data)
        tr.alltoallv(self._detached(eng, s8, r8), sc, offsets(sc), r8, rc, offsets(rc), st)
        raw = sum(sc) - sc[self.rank]
        self.last_stats = ExchangeStats(raw, raw)

    def _run_all_to_all(self, s: Arr, r: Arr, send_counts, recv_counts, largest: int | None,
                        plan: Plan, st, uniform: bool) -> None:
        eng, tr = self._route(s.device, st)
        sdata = self._detached(eng, s.data, r.data)
        ch = self._slots(eng, "all_to_all", plan)
        self.last_stats = all_to_all_values(eng, tr, sdata, r.data, send_counts, recv_counts,
                                            compress=True, stream=st,
                                            chunk=self._chunk_of(s) if largest is not None else 0,
                                            max_count=largest, channel=ch, uniform=uniform)

    @staticmethod
    def _detached(eng, send, recv):
        """``send`` itself, or a copy of it if it overlaps ``recv`` (in-place calls)."""
        if not overlap(send, recv):
            return send
        # an engine buffer, not a temporary: the device work reading it outlives this call's
        # Python frame, and a freed temporary goes back to CuPy's pool unordered with that work
        copy = eng.workspace("detach", send.nbytes).view(send.dtype)
        eng.copy(copy, send)
        return copy

