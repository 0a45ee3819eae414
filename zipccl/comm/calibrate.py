"""Calibration: measure the cost model's components on this machine so that ``"auto"`` follows them.

One harness, ``measure``, for both front ends: ``Communicator.calibrate`` (``calibrate`` below)
and the torch groups' ``zipccl.torch.autotune``. A ``FrontEnd`` gives what differs (its
barrier, slowest-rank maximum, device wait, calls and codec); ``measure`` times every op
natively and compressed at each size, optionally the compressed path's fixed costs, then the
codec alone, fits the cost model and packs a ``policy.Profile`` that every rank holds
identically. Profiles can be saved and loaded again for the same device / transport / ranks /
machine.

Each time is the least of ``CALIBRATION_BEST_OF`` measurements (the number is recorded in the
profile as ``best_of``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager

import numpy as np

from .. import format as fmt
from ..arrays import BF16
from ..codebook import Codebook
from ..costfit import fit_alpha_beta
from ..costmodel import OPS
from ..format import slot as slots
from .policy import Profile
from .transport import cupy_stream

CALIBRATION_BEST_OF = 3  # each calibration time is the least of this many measurements

Thunk = Callable[[], object]  # one call to time


@dataclasses.dataclass(frozen=True)
class FrontEnd:
    """What ``measure`` needs of a front end (every rank of the group passes its own).

    - ``barrier()``, ``slowest(values)`` (each value's maximum over the ranks, a list),
      ``sync()`` (wait for the work enqueued; host: nothing);
    - ``make_call(compressed, op, n)``: a context manager giving ``(call, nbytes)``: ``op`` on
      messages of ``n`` BF16 elements per rank (the metrics convention) on the given path, and
      ``nbytes()``, the bytes the policy saw for the last call; timed inside the block;
    - ``codec(n)``: ``({"encode" | "decode" | "reduce": (bytes, call)}, ratio)``, the codec
      alone on ``n`` elements; ``codec_points``: timed at the largest message (1) or also at a
      quarter of it (2: a fitted slope without the launches' fixed cost); ``codec_clock(call,
      repeat)``: seconds per call of ``repeat`` calls after one untimed (default: the wall clock);
    - ``one_block_rounds()``: where given, a context in which compressed calls run in rounds of
      one escape block, to measure the per-round and per-call costs (else both are 0: the
      per-call cost is then fitted to the compressed calls alone);
    - ``key``, ``world``, ``chunk`` (elements per round), ``device``: the profile's own.
    """

    key: str
    world: int
    chunk: int
    device: bool
    barrier: Thunk
    slowest: Callable[[list[float]], list[float]]
    sync: Thunk
    make_call: Callable[[bool, str, int], AbstractContextManager[tuple[Thunk, Callable[[], int]]]]
    codec: Callable[[int], tuple[dict[str, tuple[int, Thunk]], float]]
    codec_points: int = 1
    codec_clock: Callable[[Thunk, int], float] | None = None
    one_block_rounds: Callable[[], AbstractContextManager] | None = None


def measure(fe: FrontEnd, sizes, ops=OPS, repeat: int = 3) -> Profile:
    """The ``Profile`` of ``fe``'s calls at ``sizes`` (bytes per rank) for every op in ``ops``.

    Collective: every rank of the front end's group calls it at the same point.
    """
    p = fe.world

    def timed(call) -> float:
        """Seconds per call: the mean of ``repeat`` calls back to back (slowest rank), the
        least of CALIBRATION_BEST_OF such measurements after 2 warm-up calls. One
        measurement alone was seen up to 3.5x off on NVLink at 1 GiB (the native path timed
        6.2 ms against 1.8 ms in a steady loop), and that made the model prefer
        compression where it loses."""
        best = float("inf")
        call()
        call()
        fe.sync()
        for _ in range(CALIBRATION_BEST_OF):
            fe.barrier()
            t0 = time.perf_counter()
            for _ in range(repeat):
                call()
            fe.sync()
            best = min(best, fe.slowest([(time.perf_counter() - t0) / repeat])[0])
        return best

    def timed_call(compressed: bool, op: str, n: int) -> tuple[int, float]:
        with fe.make_call(compressed, op, n) as (call, nbytes):
            t = timed(call)
            return int(nbytes()), t

    measured: dict[str, dict[str, list[list[float]]]] = {}
    native, round_s, fixed_s = {}, {}, {}
    for op in ops:
        meas = measured.setdefault(op, {"native": [], "compressed": []})
        for size in sizes:
            for path_name, compressed in (("native", False), ("compressed", True)):
                meas[path_name].append(list(timed_call(compressed, op, max(1, size // 2))))
        try:
            native[op] = fit_alpha_beta([b for b, _ in meas["native"]], [t for _, t in meas["native"]])
        except ValueError:
            continue  # not enough signal for this op: the threshold rule stays for it
        round_s[op], fixed_s[op] = _fixed_costs(fe, op, timed_call)
    codec = _codec(fe, sizes, repeat)
    return Profile(fe.key, p, fe.chunk, fe.device, native, codec, round_s, fixed_s, measured,
                   best_of=CALIBRATION_BEST_OF)


def _fixed_costs(fe: FrontEnd, op: str, timed_call) -> tuple[float, float]:
    """(per round, per call) seconds of the compressed path: one round vs 16 rounds of one block."""
    if fe.one_block_rounds is None:
        return 0.0, 0.0
    per = fe.world if op in ("all_to_all", "all_reduce") else 1
    with fe.one_block_rounds():
        t1 = timed_call(True, op, per * fmt.BLOCK)[1]
        t16 = timed_call(True, op, per * 16 * fmt.BLOCK)[1]
    exchanges = 2 if op == "all_reduce" else 1
    h = max(0.0, (t16 - t1) / (15 * exchanges)) if fe.chunk else 0.0
    return h, max(0.0, t1 - exchanges * h)


def _codec(fe: FrontEnd, sizes, repeat: int) -> dict:
    """Encode / decode / reduction throughput (GB/s of BF16 input) and ratio of the codec alone.

    Timed on the largest calibrated message (and a quarter of it: ``codec_points``); the
    throughput is the fitted slope where two sizes grew, else bytes / time of the largest.
    """
    top = max(fmt.BLOCK, max(sizes) // 2)
    points = (max(fmt.BLOCK, top // 4), top) if fe.codec_points > 1 else (top,)

    def wall_clock(call, repeat: int) -> float:
        call()
        fe.sync()
        t0 = time.perf_counter()
        for _ in range(repeat):
            call()
        fe.sync()
        return (time.perf_counter() - t0) / repeat

    clock = fe.codec_clock or wall_clock
    pts: dict[str, list[tuple[int, float]]] = {}
    ratio = 1.0
    for n in points:
        calls, ratio = fe.codec(n)
        local = [min(clock(call, repeat) for _ in range(CALIBRATION_BEST_OF)) for _, call in calls.values()]
        *worst, ratio = fe.slowest([*local, ratio])
        for (name, (nbytes, _)), t in zip(calls.items(), worst, strict=True):
            pts.setdefault(name, []).append((nbytes, t))
        del calls
        fe.sync()
    rates = {}
    for name, xs in pts.items():
        try:
            rates[f"{name}_gbps"] = fit_alpha_beta([b for b, _ in xs], [t for _, t in xs])[1]
        except ValueError:  # one size, or no growth with size (tiny host messages)
            b, t = xs[-1]
            rates[f"{name}_gbps"] = b / max(t, 1e-9) / 1e9
    return {**rates, "ratio": ratio}


def calibrate(communicator, *, device: bool = False,
              sizes=(1 << 20, 16 << 20, 64 << 20, 256 << 20), ops=OPS, repeat: int = 3,
              path: str | None = None, stream=None, machine: str | None = None) -> Profile:
    """``Communicator.calibrate`` (see there): measure this communicator's cost-model
    components, install the ``Profile`` in its policy and return it.

    Runs on every rank of ``communicator`` (collective), which must be a ``Communicator``.
    """
    if device:
        communicator._route(True, stream)
    key = "|".join([("device" if device else "host"), communicator.transport_name if device else "mpi",
                    f"{communicator.size} ranks", machine or _machine_name(device)])
    if path is not None:
        prof = _load_profile(communicator, path, key)
        if prof is not None:
            communicator.policy = dataclasses.replace(communicator.policy, profile=prof)
            return prof
    prof = measure(_communicator_front_end(communicator, key, device, stream), sizes, ops, repeat)
    communicator.policy = dataclasses.replace(communicator.policy, profile=prof)
    if path is not None and communicator.rank == 0:
        with open(path, "w") as f:
            f.write(prof.to_json())
    return prof


def _communicator_front_end(communicator, key: str, device: bool, stream) -> FrontEnd:
    """``measure``'s view of a ``Communicator``: MPI barriers and maxima, its calls forced to
    one path (``Communicator.forcing``), its fixed costs with one-block rounds, and the
    codec on the engine its calls use (device time: CUDA events on a device)."""
    if device:
        import cupy
    p, MPI, mpi = communicator.size, communicator._MPI, communicator.comm
    eng = communicator._route(True, stream)[0] if device else communicator._host
    rng = np.random.default_rng(12345 + communicator.rank)

    def data(n: int):
        if device:  # generated on the device: large calibration sizes stay quick
            rs = cupy.random.RandomState(12345 + communicator.rank)
            u = (rs.standard_normal(n, dtype=cupy.float32) * 0.02).view(cupy.uint32)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cupy.uint16)
        return rng.normal(0.0, 0.02, n).astype(np.float32).astype(BF16).view(np.uint16)

    def empty(n: int):
        return cupy.zeros(n, dtype=cupy.uint16) if device else np.zeros(n, dtype=np.uint16)

    def sync():
        if device:
            cupy_stream(stream).synchronize()

    def slowest(values: list[float]) -> list[float]:
        buf = np.asarray(values, dtype=np.float64)
        mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
        return [float(v) for v in buf]

    kw = {"dtype": "bfloat16", "stream": stream}

    def call_of(op: str, n: int):
        if op == "all_gather":
            x, out = data(n), empty(p * n)
            return lambda: communicator.all_gather(x, out, **kw)
        if op == "reduce_scatter":
            x, out = data(p * n), empty(n)
            return lambda: communicator.reduce_scatter(x, out, **kw)
        n = max(p, n // p * p)
        x = data(n)
        if op == "all_to_all":
            out = empty(n)
            return lambda: communicator.all_to_all(x, out, **kw)
        # in place: each call starts again from the same input (sums of sums would drift
        # out of the codebook); both paths pay the same copy
        buf = empty(n)

        def call():
            eng.copy(buf, x)
            communicator.all_reduce(buf, **kw)
        return call

    @contextmanager
    def make_call(compressed: bool, op: str, n: int):
        call = call_of(op, n)
        with communicator.forcing(compressed):
            yield call, lambda: communicator.last_decision.nbytes

    @contextmanager
    def one_block_rounds():
        saved = communicator.chunk
        communicator.chunk = fmt.BLOCK if saved else 0
        try:
            yield
        finally:
            communicator.chunk = saved

    def host(a) -> np.ndarray:  # calibration may wait: a copy to the host
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def codec(n: int):
        """A fresh codebook's encode, decode (checked: the round trip) and a p-way reduction."""
        x = data(n)
        frame = eng.workspace("calibrate_frame", slots.region_bytes(n) - slots.SLOT_HEADER)
        out = eng.values_workspace("calibrate_out", n)
        bits = host(x)
        cb = Codebook.from_sample(bits[::max(1, n // 4096)])
        eng.encode(x, frame, cb)
        sync()
        ratio = fmt.parse_header(host(frame[:fmt.HEADER_SIZE]), buffer_len=frame.size).frame_len / (2 * n)
        eng.decode(frame, out, 0)
        sync()
        if not np.array_equal(host(out), bits):
            raise RuntimeError("zipccl calibration: the codec failed its own round trip")
        stage = empty(p * n)
        return {"encode": (2 * n, lambda: eng.encode(x, frame, cb)),
                "decode": (2 * n, lambda: eng.decode(frame, out, 0)),
                "reduce": (2 * p * n, lambda: eng.reduce_cols(stage, p, n, 0, n, out))}, ratio

    return FrontEnd(key, p, communicator.chunk, bool(device), mpi.Barrier, slowest, sync, make_call,
                    codec, codec_points=2, codec_clock=eng.elapsed, one_block_rounds=one_block_rounds)


def _load_profile(communicator, path: str, key: str) -> Profile | None:
    """The profile saved at ``path`` (read on rank 0, shared) if it was measured for ``key``."""
    text = None
    if communicator.rank == 0:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            text = None
    text = communicator.comm.bcast(text, root=0)
    if not text:
        return None
    try:
        prof = Profile.from_json(text)
    except (ValueError, KeyError):
        return None  # another version or a damaged file: measure again
    return prof if prof.key == key and prof.world == communicator.size else None


def _machine_name(device: bool) -> str:
    """Names the machine a profile was measured on: host name, and the GPU for device profiles."""
    import platform

    name = platform.node() or "unknown host"
    if device:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name += f"/{props['name'].decode() if isinstance(props['name'], bytes) else props['name']}"
    return name
