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
every rank) or over MPI, directly if MPI reports CUDA support and staged through
pinned host memory otherwise. The user selects the CUDA device before creating
the communicator (``cupy.cuda.Device(i).use()``); nothing touches a GPU until a
device array arrives.

Agreement and plans
-------------------
Every rank must make the same calls in the same order with matching arguments.
zipccl checks this without paying for it on every call:

1. **Settings, once, at construction.** The constructor is collective: the
   ranks exchange every setting that changes the path a call takes (backend,
   policy and its thresholds and profile, chunk size, capacity, checksum, ``verify``) and
   raise the same ``CollectiveError`` on every rank if they differ. Changing
   ``policy`` or ``chunk`` later (``calibrate`` does) must happen on every rank at
   the same point; a change drops every plan and agreed signature.
2. **A call's signature** is what all ranks must share: the operation, dtype,
   host or device memory, the element counts (all-to-all with per-peer counts:
   the count matrix), the reduction op, and the settings. The policy's decision is
   a function of it alone, so ranks that agree on the signature take the same
   path. Its 64-bit hash travels in the *control row*, a fixed-size int64 row
   every rank all-gathers over MPI: [error flag, signature hash, a few ints].
   Any error flag or differing hash makes every rank gather the messages and raise
   the same ``CollectiveError`` (each rank's own problem, or each rank's call).
   Every agreement exchange of every kind of call is this one control row, so
   ranks that disagree about the call still meet in the same MPI operation and
   none can hang there.
3. **Compressed calls** move fixed-size slots (``exchange.slot_exchange``), on host
   and device arrays alike. On device arrays they make no host exchange at all once
   their signature is agreed (the first time it is seen, like a native call; every
   call with ``verify="always"``); on host arrays, whose exchange blocks anyway, every
   call sends the control row first (one small all-gather), so a rank whose call
   differs from its peers' raises there with the others. On device arrays they keep
   NCCL's contract: they enqueue their work on the stream and return; errors found on the device (a frame that
   does not decode, a slot header naming another call) land in a sticky error word
   and raise ``CollectiveError`` at the next compressed call on that rank, or on
   every rank at ``synchronize()`` (docs/COLLECTIVES.md). On host arrays every step
   has run when the call returns, so what it found raises at once on the rank that
   found it (and, through the slot headers, on its peers at their next compressed
   call).
4. **Native calls** are agreed the first time their signature is seen on this
   communicator (one control row), then run from a *plan*: the call's arguments
   looked up by the arrays' addresses, shapes, dtypes and the stream; on NCCL the
   plan is the NCCL call with its pointers packed, so an agreed native call costs a
   few dictionary lookups more than calling NCCL directly and moves the same bytes
   the same way. Agreed signatures are remembered in the same order on every rank
   (a correct program adds the same ones at the same calls), so ranks decide "new"
   or "seen" alike. The price, stated precisely: once a native signature is
   agreed, a rank that calls it while a peer calls something else is the caller's
   mistake exactly as it is with NCCL (the peers are not told; NCCL may hang). It
   is detected when the peer's call is a compressed one or one with a new
   signature, not when it is another agreed native call. ``verify="always"``
   sends the control row before every native call too (one small MPI round trip,
   like torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``), turning every mistake into a
   ``CollectiveError``.
5. **All-to-all with per-peer counts** exchanges its count matrix in the control
   row on every call on host arrays, and on device arrays when ``recv_counts`` is
   left out (this rank's receive counts are the other ranks' send counts). On device
   arrays with ``recv_counts`` given, as NCCL and MPI's all-to-all-v take them, a
   call makes no host exchange once its decision is agreed: the first such call of
   a dtype exchanges the matrix and agrees the decision (the policy's, on the mean
   message size), later calls keep it, and counts that disagree between ranks are
   found in the slot headers (a sticky error, as in 3.) or, like NCCL's, not at all
   (a rank that expects more from itself than it sends raises alone; a native call
   with mismatched counts is the caller's mistake, as with NCCL).

Local argument errors (sizes, dtype, contiguity, alignment, writability) are
found before anything moves and reported in the control row, so they raise on
every rank that takes part in the exchange. On a failed call the caller's output
buffers hold unspecified contents (a rank may have copied its own block).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import format as fmt
from .args import (
    Arr,
    byte_view,
    call_key,
    call_stream,
    check_pair,
    int_list,
    overlap,
    ptr_range,
    wrap,
)
from .collectives import (
    CollectiveError,
    ExchangeStats,
    all_gather_values,
    all_reduce_values,
    all_to_all_values,
    chunk_elements,
    offsets,
    reduce_scatter_values,
)
from .host import HostEngine
from .policy import OPS, Decision, Policy, Profile
from .transport import REDUCE_OPS, MPITransport, Transport

BACKENDS = ("auto", "nccl", "mpi")
VERIFY = ("first", "always")
DEFAULT_CHUNK_BYTES = 64 << 20  # bytes per message per pipeline round (see experiments/README.md)
MAX_AGREED = 4096  # agreed signatures kept; then all are forgotten at once (the same call on every rank)
MAX_PLANS = 256  # plans kept per communicator; then all are dropped (local: costs re-planning only)


@dataclass(eq=False)
class _Plan:
    """What one call signature needs, decided once: the agreed hash, the decision, the bound call."""

    sig: tuple  # what every rank must share (see the module docstring)
    crc: int  # its 64-bit hash, the one carried in the control row
    decision: Decision
    compress: bool  # the compressed exchange (else the native collective)
    run: Callable[[], None] | None = None  # a native call with its arguments packed: the whole call
    stats: ExchangeStats | None = None  # bytes a native call moves


def _sig_hash(sig: tuple) -> int:
    """A 64-bit hash of a signature, the same in every process (``hash`` is salted per process).

    >>> _sig_hash(("all_gather", "bfloat16", 8)) == _sig_hash(("all_gather", "bfloat16", 8))
    True
    """
    return int.from_bytes(hashlib.blake2b(repr(sig).encode(), digest_size=8).digest(), "little",
                          signed=True)


def _failure_message(info: list, header: str | None = None) -> str:
    """The one message every rank raises, built from every rank's (op, error, call, settings)."""
    ops = sorted({i[0] for i in info})
    head = header or (f"zipccl {ops[0]}" if len(ops) == 1 else "zipccl collective")
    errs = [(r, i[1]) for r, i in enumerate(info) if i[1]]
    if errs:
        return f"{head}: " + "; ".join(f"rank {r}: {e}" for r, e in errs)
    differ = len({i[3] for i in info}) > 1  # name the settings only where they differ
    calls = [" with ".join(filter(None, [i[2], i[3] if differ else ""])) for i in info]
    return f"{head}: ranks disagree on the call (" + "; ".join(
        f"rank {r}: {c}" for r, c in enumerate(calls)) + ")"


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
    time it is seen) or "always" (before every call); see the module docstring. All
    ranks must pass the same settings: the constructor raises the same
    ``CollectiveError`` on every rank otherwise. ``capacity``: the escape capacity of the
    compressed calls' slots (``comm.capacity.CapacityConfig`` or a dict of its settings; None: the
    adaptive default rule; see ``comm.exchange.SlotChannel``).
    """

    def __init__(self, comm, *, backend: str = "auto", policy: str | Policy = "auto",
                 checksum: bool = False, min_compress_bytes: int = 1 << 20,
                 compress_host: bool = False, cuda_aware_mpi: bool | None = None,
                 chunk_bytes: int | None = None, verify: str = "first", capacity=None):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
        chunk_bytes = DEFAULT_CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes)
        if chunk_bytes < 0:
            raise ValueError(f"chunk_bytes must be >= 0, got {chunk_bytes}")
        from .capacity import as_config

        self.capacity = as_config(capacity)
        self._plans: dict = {}
        self._agreed: set = set()
        self._settings_text = ""
        self.backend = backend
        self.verify = verify
        self._checksum = bool(checksum)
        self._force_value: bool | None = None  # set only while calibrating
        # elements per pipeline round, whole escape blocks (0: one round)
        self._chunk = 0 if chunk_bytes == 0 else max(fmt.BLOCK, chunk_bytes // 2 // fmt.BLOCK * fmt.BLOCK)
        self.policy = policy if isinstance(policy, Policy) else \
            Policy(policy, min_bytes=min_compress_bytes, compress_host=compress_host)
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # the control row (module docstring): [error flag, signature hash, 2p + 2 ints]
        self._row = np.zeros(4 + 2 * self.size, dtype=np.int64)
        self._table = np.zeros((self.size, 4 + 2 * self.size), dtype=np.int64)
        self.mpi = MPITransport(self.comm, cuda_aware=cuda_aware_mpi)
        self._nccl: Transport | None = None
        self._nccl_tried = False
        self._nccl_error: str | None = None
        self._host = HostEngine(checksum=self._checksum)
        self._device_engine = None
        self._slot_channels: dict = {}  # host (False) / device (True): exchange.SlotChannel
        self._a2a_decisions: dict = {}  # per-peer-count all-to-all with recv_counts: agreed
        self.last_decision: Decision | None = None
        self.last_stats: ExchangeStats | None = None
        try:
            self._control("Communicator", _sig_hash(("settings", self._settings_text)), None,
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
        value = int(value)
        if value < 0 or value % fmt.BLOCK:
            raise ValueError(f"chunk must be a non-negative multiple of {fmt.BLOCK}, got {value}")
        self._chunk = value
        self._settings_changed()

    @property
    def _force(self) -> bool | None:
        return self._force_value

    @_force.setter
    def _force(self, value: bool | None) -> None:
        self._force_value = value
        self._settings_changed()

    def _settings_changed(self) -> None:
        pol = getattr(self, "_policy", None)
        if pol is None:
            return
        fields = {f.name: getattr(pol, f.name) for f in dataclasses.fields(pol) if f.repr}
        prof = fields.pop("profile", None)
        fields["profile"] = None if prof is None else f"{_sig_hash((prof.to_json(),)) & 0xFFFFFFFF:08x}"
        text = (f"backend={self.backend!r}, policy=({', '.join(f'{k}={v!r}' for k, v in fields.items())}), "
                f"chunk_bytes={2 * self._chunk}, checksum={self._checksum}, "
                f"capacity={getattr(self, 'capacity', None)!r}, "
                f"verify={self.verify!r}")
        if self._force_value is not None:
            text += f", calibrating={self._force_value}"
        self._settings_text = text
        self._plans.clear()
        self._agreed.clear()
        if getattr(self, "_a2a_decisions", None):
            self._a2a_decisions.clear()

    # -- plumbing ---------------------------------------------------------------------------
    def close(self) -> None:
        """Free the duplicated MPI communicator and the NCCL communicator, if any."""
        self._plans.clear()
        self._agreed.clear()
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
            self._agree(err, "synchronize")
        except CollectiveError as e:
            for ch in self._slot_channels.values():
                ch.fail(str(e))
            raise

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _control(self, op: str, crc: int, err: str | None, ints=(), *, describe: str = "",
                 header: str | None = None) -> np.ndarray:
        """The control row (module docstring): all-gather [error flag, ``crc``, ``ints``].

        Returns a (size, 2 * size + 2) view of every rank's ints (valid until the next
        call), or raises the same CollectiveError on every rank if any rank reports an
        error or the hashes differ. ``describe`` is this rank's call in words.
        """
        row, table = self._row, self._table
        row[:] = 0
        row[0] = 1 if err else 0
        row[1] = crc
        row[2:2 + len(ints)] = ints
        self.mpi.allgather_ints(row, table)
        if table[:, 0].any() or (table[:, 1] != table[0, 1]).any():
            # every rank sees the same table: all take this branch together
            info = self.mpi.allgather_objects((op, err, describe, self._settings_text))
            raise CollectiveError(_failure_message(info, header))
        return table[:, 2:]

    def _agree(self, err: str | None, op: str = "collective") -> None:
        """Raise the same CollectiveError on every rank if any rank reports ``err``.

        One 8-byte all-reduce when all is well; the messages travel only on failure.
        """
        if self.mpi.any_flag(bool(err)):
            errs = self.mpi.allgather_objects(err)
            bad = [(r, e) for r, e in enumerate(errs) if e]
            raise CollectiveError(f"zipccl {op} failed: " + "; ".join(f"rank {r}: {e}" for r, e in bad))

    def _prepare(self, op: str, key, plan: _Plan | None, check, stream):
        """Run the local ``check`` and agree on the call; returns (plan, arrays, stream).

        ``check()`` -> (common, nbytes, arrays): ``common`` the signature's values (see the
        module docstring), ``nbytes`` what the policy decides on, ``arrays`` the wrapped
        arguments (the first one's kind decides host or device). A local error is reported
        in the control row and raises on every rank that takes part.
        """
        if self.comm is None:
            raise CollectiveError(f"zipccl {op}: the communicator is closed")
        try:
            common, nbytes, arrays = check()
        except (TypeError, ValueError) as e:
            self._control(op, 0, str(e), describe=f"{op}(invalid arguments)")
            raise AssertionError("unreachable: an error in the control row raises") from e
        a = arrays[0] if isinstance(arrays, tuple) else arrays
        if key is None or stream is None:
            stream = call_stream(a, stream)
        if plan is None:
            sig = (op, *common, self._settings_text)
            d = self._decide(op, nbytes, a)
            plan = _Plan(sig, _sig_hash(sig), d, bool(a.code is not None and d.compress))
            if key is not None:
                if len(self._plans) >= MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = plan
        else:
            self.last_decision = plan.decision
        first_device = a.device and not self._nccl_tried and self.backend != "mpi"
        if first_device or (not plan.compress and (plan.sig not in self._agreed
                                                   or self.verify == "always")):
            # native: agreed once per signature; the first device call also agrees before
            # the device transport is set up (a collective of its own)
            self._control(op, plan.crc, None, describe=self._describe(plan))
            if not plan.compress:
                self._remember(plan.sig)
        return plan, arrays, stream

    def _replay(self, plan: _Plan) -> None:
        """An agreed native call from its plan: the bound transport call, nothing else."""
        plan.run()
        self.last_decision, self.last_stats = plan.decision, plan.stats

    def _remember(self, sig: tuple) -> None:
        if len(self._agreed) >= MAX_AGREED:  # the same call on every rank: all forget together
            self._agreed.clear()
            self._plans.clear()
        self._agreed.add(sig)

    @staticmethod
    def _describe(plan: _Plan) -> str:
        op, *common, _ = plan.sig
        return f"{op}({', '.join(map(str, common))})"

    def _bind(self, key, plan: _Plan, run) -> None:
        """Keep a native plan's bound call (agreed signature, verify="first") for the next calls."""
        if key is not None and run is not None and self.verify == "first" and \
                self._plans.get(key) is plan and plan.sig in self._agreed:
            plan.run = run

    def _slots(self, eng, op: str, plan: _Plan):
        """The slot channel of a compressed call on the engine's memory (host or device, one
        each, made at the first such call, which every rank makes at the same point). A
        compressed signature is agreed across ranks the first time it is seen (every call
        with ``verify="always"``, and on host arrays); afterwards a device call makes no
        host exchange at all, as NCCL's do."""
        if plan.crc and (plan.sig not in self._agreed or self.verify == "always" or not eng.device):
            # host arrays: every call (their exchange blocks anyway; a control row costs one
            # small all-gather), so that a mismatch raises the same error on every rank
            self._control(op, plan.crc, None, describe=self._describe(plan))
            self._remember(plan.sig)
        ch = self._slot_channels.get(eng.device)
        if ch is None:
            from .capacity import CapacityRule
            from .exchange import SlotChannel
            from .spill import MPIChannel, Spills

            ch = self._slot_channels[eng.device] = SlotChannel(
                Spills(MPIChannel(self.comm), device=eng.device), CapacityRule(self.capacity))
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
            err = None
            try:
                from cupy.cuda import nccl

                nccl.get_version()
            except Exception as e:  # noqa: BLE001 -- any failure means "no NCCL here"
                err = f"NCCL unavailable: {e}"
            errs = self.mpi.allgather_objects(err)
            if any(errs):
                self._nccl_error = "zipccl NCCL set-up failed: " + "; ".join(
                    f"rank {r}: {e}" for r, e in enumerate(errs) if e)
            else:
                from .transport import NCCLTransport

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
        if self._force is not None and arr.bf16 and self.size > 1:
            d = Decision(op, nbytes, self._force, "calibration")
        else:
            d = self.policy.decide(op, nbytes, dtype=None if arr.code is None else arr.dtype,
                                   device=arr.device, world=self.size)
        self.last_decision = d
        return d

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
        """Elements per pipeline round for ``a``'s type (``collectives.chunk_elements``)."""
        return chunk_elements(self._chunk, a.data.itemsize)

    # -- the collectives --------------------------------------------------------------------
    # Each one: look the call up by its key; an agreed native plan with a bound call is the
    # whole call. Otherwise check, agree (``_prepare``) and run, binding the native call for
    # next time where the transport can.
    def all_gather(self, send, recv, *, dtype: str | None = None, stream=None) -> None:
        """recv = concatenation over ranks (rank order) of every rank's ``send``.

        ``recv`` holds size x ``send.size`` elements. Like ncclAllGather; ``send``
        may be rank's own slice of ``recv`` (in place).
        """
        key, st = call_key("all_gather", send, recv, dtype, stream)
        plan = self._plans.get(key)
        if plan is not None and plan.run is not None:
            return self._replay(plan)

        def check():
            s = wrap(send, dtype, "send")
            r = wrap(recv, dtype, "recv", writable=True)
            check_pair(s, r)
            if r.size != self.size * s.size:
                raise ValueError(f"recv holds {r.size} elements; all_gather of {s.size} per rank "
                                 f"on {self.size} ranks needs {self.size * s.size}")
            return (s.dtype, s.device, s.size), s.nbytes, (s, r)

        plan, (s, r), st = self._prepare("all_gather", key, plan, check, st)
        eng, tr = self._route(s.device, st)
        if plan.compress:
            sdata = self._detached(eng, s.data, r.data)
            self.last_stats = all_gather_values(eng, tr, sdata, r.data, [s.size] * self.size,
                                                compress=True, stream=st, chunk=self._chunk_of(s),
                                                channel=self._slots(eng, "all_gather", plan))
            return
        if plan.stats is None:
            raw = s.nbytes * (self.size - 1)
            plan.stats = ExchangeStats(raw, raw)
        s8, r8 = byte_view(s.data), byte_view(r.data)
        in_place = ptr_range(s8)[0] == ptr_range(r8)[0] + self.rank * s.nbytes
        if in_place or not overlap(s8, r8):  # NCCL's own in-place form, or no overlap
            self._bind(key, plan, tr.bind_allgather(s8, r8, st))
        tr.allgather(self._detached(eng, s8, r8), r8, st)
        self.last_stats = plan.stats

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

        def check():
            s = wrap(send, dtype, "send")
            r = wrap(recv, dtype, "recv", writable=True)
            check_pair(s, r)
            if op not in REDUCE_OPS:
                raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
            if s.bf16 and op != "sum":
                raise ValueError(f"BF16 reductions support op='sum' only, got {op!r}")
            if op != "sum":  # zipccl computes sums only: any other op is the native one
                s.code = r.code = None
            if s.size != self.size * r.size:
                raise ValueError(f"send holds {s.size} elements; reduce_scatter into {r.size} "
                                 f"per rank on {self.size} ranks needs {self.size * r.size}")
            return (s.dtype, s.device, r.size, op), s.nbytes, (s, r)

        plan, (s, r), st = self._prepare("reduce_scatter", key, plan, check, st)
        eng, tr = self._route(s.device, st)
        if s.code is not None and (plan.compress or tr.name != "nccl"):
            sdata = self._detached(eng, s.data, r.data)
            self.last_stats = reduce_scatter_values(
                eng, tr, sdata, r.data, [r.size] * self.size, compress=plan.compress,
                stream=st, chunk=self._chunk_of(s),
                channel=self._slots(eng, "reduce_scatter", plan) if plan.compress else None)
            return
        if plan.stats is None:
            raw = s.nbytes - r.nbytes
            plan.stats = ExchangeStats(raw, raw)
        kind = "bfloat16" if s.bf16 else None
        in_place = ptr_range(s.data)[0] + self.rank * r.nbytes == ptr_range(r.data)[0]
        if in_place or not overlap(s.data, r.data):  # NCCL's own in-place form, or no overlap
            self._bind(key, plan, tr.bind_reduce_scatter(s.data, r.data, op, st, dtype=kind))
        tr.reduce_scatter(self._detached(eng, s.data, r.data), r.data, op, st, dtype=kind)
        self.last_stats = plan.stats

    def all_to_all(self, send, recv, send_counts=None, recv_counts=None, *,
                   dtype: str | None = None, stream=None) -> None:
        """Rank i's block j of ``send`` becomes rank j's block i of ``recv``.

        Without counts, both buffers split into ``size`` equal blocks. With
        ``send_counts`` (elements per destination, packed in rank order, summing to
        ``send.size``) blocks may be uneven, as MoE dispatch needs; ``recv_counts``
        (elements per source) may be given or left for zipccl to derive from the
        other ranks' ``send_counts``. The count matrix is exchanged (one control row)
        on every call, except on device arrays with both counts given: then only the
        first call of a dtype exchanges it (see the module docstring, 5.).
        """
        p = self.size
        if send_counts is not None or recv_counts is not None:
            self._all_to_all_counts(send, recv, send_counts, recv_counts, dtype, stream)
            return
        key, st = call_key("all_to_all", send, recv, dtype, stream)
        plan = self._plans.get(key)
        if plan is not None and plan.run is not None:
            return self._replay(plan)

        def check():
            s = wrap(send, dtype, "send")
            r = wrap(recv, dtype, "recv", writable=True)
            check_pair(s, r)
            if s.size % p or r.size != s.size:
                raise ValueError(f"all_to_all without counts needs send and recv of equal size "
                                 f"divisible by {p}; got {s.size} and {r.size}")
            return (s.dtype, s.device, s.size), s.nbytes, (s, r)

        plan, (s, r), st = self._prepare("all_to_all", key, plan, check, st)
        b = s.size // p
        if plan.compress:
            self._run_all_to_all(s, r, [b] * p, [b] * p, b if p > 1 else 0, plan, st, True)
            return
        eng, tr = self._route(s.device, st)
        if plan.stats is None:
            raw = s.nbytes - s.nbytes // p
            plan.stats = ExchangeStats(raw, raw)
        s8, r8 = byte_view(s.data), byte_view(r.data)
        c = [s.nbytes // p] * p
        if not overlap(s8, r8):
            self._bind(key, plan, tr.bind_alltoallv(s8, c, offsets(c), r8, c, offsets(c), st))
        tr.alltoallv(self._detached(eng, s8, r8), c, offsets(c), r8, c, offsets(c), st)
        self.last_stats = plan.stats

    def _all_to_all_counts(self, send, recv, send_counts, recv_counts, dtype, stream) -> None:
        """all_to_all with per-peer counts: the count matrix travels in the control row."""
        p = self.size
        if self.comm is None:
            raise CollectiveError("zipccl all_to_all: the communicator is closed")
        err, extra = None, []
        try:
            s = wrap(send, dtype, "send")
            r = wrap(recv, dtype, "recv", writable=True)
            check_pair(s, r)
            if send_counts is None:
                raise ValueError("recv_counts given without send_counts")
            sc = int_list(send_counts, p, "send_counts")
            rc = None if recv_counts is None else int_list(recv_counts, p, "recv_counts")
            if sum(sc) != s.size:
                raise ValueError(f"send_counts add up to {sum(sc)} but send holds {s.size}")
            if rc is not None and sum(rc) != r.size:
                raise ValueError(f"recv_counts add up to {sum(rc)} but recv holds {r.size}")
            extra = [*sc, *(rc if rc is not None else [-1] * p), r.size]
            sig = ("all_to_all", s.dtype, s.device, "per-peer counts", self._settings_text)
        except (TypeError, ValueError) as e:
            err, sig = str(e), None
        if err is not None and self._a2a_decisions and self.verify == "first":
            # peers may be in a call that makes no host exchange (5.): raise here alone, as
            # NCCL returns an invalid argument to the rank that passed it
            raise CollectiveError(f"zipccl all_to_all: {err}")
        known = self._a2a_decisions.get(sig) if err is None and rc is not None and s.device else None
        if known is not None and self.verify == "first":
            # both count lists given and the decision agreed: no host exchange (module docstring, 5.)
            self.last_decision = known
            st = call_stream(s, stream)
            if s.code is not None and known.compress:
                self._run_all_to_all(s, r, sc, rc, None, _Plan(sig, 0, known, True), st, False)
                return
            self._native_all_to_all(s, r, sc, rc, st)
            return
        table = self._control("all_to_all", _sig_hash(sig) if sig else 0, err, extra,
                              describe=f"all_to_all({sig[1]}, {sig[2]}, per-peer counts)"
                              if sig else "all_to_all(invalid arguments)")
        extras = table[:, :2 * p + 1].copy()
        # Cross-rank consistency, computed identically on every rank.
        matrix = [[int(c) for c in row[:p]] for row in extras]
        problems = []
        for i, row in enumerate(extras):
            rc = None if row[p] < 0 else [int(c) for c in row[p:2 * p]]
            rsize = int(row[2 * p])
            column = [matrix[j][i] for j in range(p)]
            if rc is None:
                if sum(column) != rsize:
                    problems.append(f"rank {i}: recv holds {rsize} elements, peers send {sum(column)}")
            elif rc != column:
                problems.append(f"rank {i}: recv_counts {rc} but peers send {column}")
        if problems:
            raise CollectiveError("zipccl all_to_all: " + "; ".join(problems))
        my_recv_counts = [matrix[j][self.rank] for j in range(p)]
        itemsize = s.data.itemsize
        mean_bytes = itemsize * sum(sum(row) for row in matrix) // p
        d = self._decide("all_to_all", mean_bytes, s)
        if rc is not None and s.device:
            if len(self._a2a_decisions) >= MAX_AGREED:
                self._a2a_decisions.clear()
            self._a2a_decisions[sig] = d  # every rank: the same table, the same decision
        st = call_stream(s, stream)
        if s.code is not None and d.compress:
            largest = max([matrix[i][j] for i in range(p) for j in range(p) if i != j] + [0])
            plan = _Plan(sig, 0, d, True)
            self._run_all_to_all(s, r, matrix[self.rank], my_recv_counts, largest, plan, st, False)
            return
        self._native_all_to_all(s, r, matrix[self.rank], my_recv_counts, st)

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
                        plan: _Plan, st, uniform: bool) -> None:
        eng, tr = self._route(s.device, st)
        sdata = self._detached(eng, s.data, r.data)
        ch = self._slots(eng, "all_to_all", plan)
        self.last_stats = all_to_all_values(eng, tr, sdata, r.data, send_counts, recv_counts,
                                            compress=True, stream=st,
                                            chunk=self._chunk_of(s) if largest is not None else 0,
                                            max_count=largest, channel=ch, uniform=uniform)

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

        def check():
            b = wrap(buf, dtype, "buf", writable=True)
            if op not in REDUCE_OPS:
                raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
            if b.bf16 and op != "sum":
                raise ValueError(f"BF16 reductions support op='sum' only, got {op!r}")
            if op != "sum":
                b.code = None
            return (b.dtype, b.device, b.size, op), b.nbytes, b

        plan, b, st = self._prepare("all_reduce", key, plan, check, st)
        eng, tr = self._route(b.device, st)
        if b.code is not None and (plan.compress or tr.name != "nccl"):
            self.last_stats = all_reduce_values(
                eng, tr, b.data, compress=plan.compress, stream=st, chunk=self._chunk_of(b),
                channel=self._slots(eng, "all_reduce", plan) if plan.compress else None)
            return
        if plan.stats is None:
            raw = 2 * b.nbytes * (self.size - 1) // self.size
            plan.stats = ExchangeStats(raw, raw)
        kind = "bfloat16" if b.bf16 else None
        self._bind(key, plan, tr.bind_allreduce(b.data, op, st, dtype=kind))
        tr.allreduce(b.data, op, st, dtype=kind)
        self.last_stats = plan.stats

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

