"""Calibration: measure the cost model's components on this machine so that ``"auto"`` follows them.

``Communicator.calibrate`` delegates here. Calibration times real calls of the
communicator (native and compressed, forced by ``Communicator.forcing``), the codec alone on the
engine the calls use, and the compressed path's fixed costs, and packs them into a
``policy.Profile`` that every rank holds identically. Profiles can be saved and
loaded again for the same device / transport / ranks / machine.

Each time is the least of ``CALIBRATION_BEST_OF`` measurements (the number is
recorded in the profile as ``best_of``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import format as fmt
from ..arrays import BF16
from ..costmodel import OPS
from .policy import Profile
from .transport import cupy_stream

CALIBRATION_BEST_OF = 3  # each calibration time is the least of this many measurements


def calibrate(communicator, *, device: bool = False,
              sizes=(1 << 20, 16 << 20, 64 << 20, 256 << 20), ops=OPS, repeat: int = 3,
              path: str | None = None, stream=None, machine: str | None = None) -> Profile:
    """``Communicator.calibrate`` (see there): measure this communicator's cost-model
    components, install the ``Profile`` in its policy and return it.

    Runs on every rank of ``communicator`` (collective), which must be a ``Communicator``.
    """
    from ..costfit import fit_alpha_beta

    if device:
        import cupy

        communicator._route(True, stream)
    key = "|".join([("device" if device else "host"), communicator.transport_name if device else "mpi",
                    f"{communicator.size} ranks", machine or _machine_name(device)])
    if path is not None:
        prof = _load_profile(communicator, path, key)
        if prof is not None:
            communicator.policy = dataclasses.replace(communicator.policy, profile=prof)
            return prof
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

    def timed(call) -> float:
        """Seconds per call: the mean of ``repeat`` calls back to back (slowest rank), the
        least of CALIBRATION_BEST_OF such measurements after 2 warm-up calls. One
        measurement alone was seen up to 3.5x off on NVLink at 1 GiB (the native path timed
        6.2 ms against 1.8 ms in a steady loop), and that made the model prefer
        compression where it loses."""
        best = float("inf")
        call()
        call()
        sync()
        for _ in range(CALIBRATION_BEST_OF):
            mpi.Barrier()
            t0 = MPI.Wtime()
            for _ in range(repeat):
                call()
            sync()
            best = min(best, mpi.allreduce((MPI.Wtime() - t0) / repeat, op=MPI.MAX))
        return best

    kw = {"dtype": "bfloat16", "stream": stream}

    def make_call(op: str, n: int):
        """The call of ``op`` whose messages hold ``n`` elements per rank (metrics convention)."""
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

    measured: dict[str, dict[str, list[list[float]]]] = {}
    native, round_s, fixed_s = {}, {}, {}
    saved_chunk = communicator.chunk
    try:
        for op in ops:
            meas = measured.setdefault(op, {"native": [], "compressed": []})
            for size in sizes:
                call = make_call(op, max(1, size // 2))
                for path_name, force in (("native", False), ("compressed", True)):
                    with communicator.forcing(force):
                        t = timed(call)
                    meas[path_name].append([communicator.last_decision.nbytes, t])
                del call
            try:
                native[op] = fit_alpha_beta([b for b, _ in meas["native"]],
                                            [t for _, t in meas["native"]])
            except ValueError:
                continue  # not enough signal for this op: the threshold rule stays for it
            # fixed costs of the compressed path: one round vs 16 rounds of one block
            with communicator.forcing(True):
                communicator.chunk = fmt.BLOCK if saved_chunk else 0
                per = p if op in ("all_to_all", "all_reduce") else 1
                t1 = timed(make_call(op, per * fmt.BLOCK))
                t16 = timed(make_call(op, per * 16 * fmt.BLOCK))
                communicator.chunk = saved_chunk
            exchanges = 2 if op == "all_reduce" else 1
            h = max(0.0, (t16 - t1) / (15 * exchanges)) if saved_chunk else 0.0
            round_s[op] = h
            fixed_s[op] = max(0.0, t1 - exchanges * h)
        codec = _calibrate_codec(communicator, eng, data, empty, sync, timed, sizes)
    finally:
        communicator.chunk = saved_chunk
    prof = Profile(key, p, communicator.chunk, bool(device), native, codec, round_s, fixed_s, measured,
                   best_of=CALIBRATION_BEST_OF)
    communicator.policy = dataclasses.replace(communicator.policy, profile=prof)
    if path is not None and communicator.rank == 0:
        with open(path, "w") as f:
            f.write(prof.to_json())
    return prof


def _calibrate_codec(communicator, eng, data, empty, sync, timed, sizes) -> dict:
    """Encode / decode / reduction throughput (GB/s of BF16 input) and ratio of the codec alone.

    Timed on the largest calibrated message and a quarter of it; the throughput is the
    fitted slope, fixed launch costs being part of the per-round cost measured separately.
    """
    from ..codebook import Codebook
    from ..costfit import fit_alpha_beta
    from ..format import slot as slots

    p, MPI, mpi = communicator.size, communicator._MPI, communicator.comm
    top = max(fmt.BLOCK, max(sizes) // 2)
    pts = {"encode": [], "decode": [], "reduce": []}
    ratio = 1.0

    def device_time(call) -> float:
        """Seconds per call on the engine's clock (CUDA events on a device), slowest rank."""
        return mpi.allreduce(eng.elapsed(call, 3), op=MPI.MAX)

    def host(a) -> np.ndarray:  # calibration may wait: a copy to the host
        return a.get() if hasattr(a, "get") else np.asarray(a)

    # the largest calibrated message and a quarter of it: kernels long enough that the
    # time is the device's, not the launches' (those are in the per-round cost)
    for n in (max(fmt.BLOCK, top // 4), top):
        x = data(n)
        frame = eng.workspace("calibrate_frame", slots.region_bytes(n) - slots.SLOT_HEADER)
        out = eng.values_workspace("calibrate_out", n)
        bits = host(x)
        cb = Codebook.from_sample(bits[::max(1, n // 4096)])
        eng.encode(x, frame, cb)
        sync()
        ratio = fmt.parse_header(host(frame[:fmt.HEADER_SIZE]), buffer_len=frame.size).frame_len / (2 * n)
        pts["encode"].append((2 * n, device_time(lambda x=x, f=frame, cb=cb: eng.encode(x, f, cb))))
        pts["decode"].append((2 * n, device_time(lambda f=frame, o=out: eng.decode(f, o, 0))))
        if not np.array_equal(host(out), bits):
            raise RuntimeError("zipccl calibration: the codec failed its own round trip")
        stage = empty(p * n)
        pts["reduce"].append((2 * p * n, device_time(lambda s=stage, o=out, n=n: eng.reduce_cols(
            s, p, n, 0, n, o))))
        del x, stage
        sync()
    ratio = mpi.allreduce(ratio, op=MPI.MAX)
    rates = {}
    for name, xs in pts.items():
        try:
            rates[f"{name}_gbps"] = fit_alpha_beta([b for b, _ in xs], [t for _, t in xs])[1]
        except ValueError:  # no growth with size (tiny host messages): bytes / time of the larger
            b, t = xs[-1]
            rates[f"{name}_gbps"] = b / max(t, 1e-9) / 1e9
    return {**rates, "ratio": ratio}


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
