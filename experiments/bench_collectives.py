"""zipccl's collectives against native NCCL on GPUs: time, bus bandwidth, speed-up, exactness.

Run one link per process (NCCL reads its transport settings once, at start-up)::

    mpirun -n 2 python experiments/bench_collectives.py --link nvlink --out results.jsonl
    mpirun -n 2 python experiments/bench_collectives.py --link shm    --out results.jsonl
    mpirun -n 2 python experiments/bench_collectives.py --link socket --out results.jsonl

(Open MPI as root: ``mpirun --allow-run-as-root``.) ``--link`` sets the NCCL
environment before NCCL starts: ``shm`` = ``NCCL_P2P_DISABLE=1`` (NCCL's
shared-memory transport, ~25 GB/s, like an inter-node link), ``socket`` =
also ``NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1`` (TCP sockets).

For each operation and per-rank size (the ``zipccl.metrics.nccl_tests_size``
convention: all-gather's send buffer, reduce-scatter's receive buffer, the whole
buffer of all-reduce and all-to-all) every rank fills its buffers with its own
N(0, 0.02^2) data of ``--dtype`` (BF16 by default; float32 or float16), then times

- ``nccl``: the NCCL collective called directly (cupy.cuda.nccl; all-to-all as
  grouped send/recv), the baseline;
- ``always`` and ``auto``: ``zipccl.Communicator(policy=...)`` on the same data;
  ``auto`` first calibrates (``Communicator.calibrate``: native and compressed
  calls at ``--calibrate-sizes-mib``, the codec alone, fixed costs) and follows its
  cost model, whose predicted times go into every record beside the measured one.

Timing (CUDA events on one stream, slowest rank): ``time_s`` is nccl-tests' way,
``--iters`` calls back to back between two events after ``--warmup`` calls, divided
by the count (for all-reduce, which works in place, a copy restores the input
before each call, and the time of the copies alone is subtracted); ``latency_s``
is the median of ``--lat-iters`` calls each timed alone between barriers. Then the
outputs of the timed buffers are checked: all-gather and all-to-all must equal
NCCL's bit for bit; reductions must equal zipccl's stated reduction (FP32 in rank
order, one rounding to the type), computed on the host by the NumPy oracle of
``experiments/harness.py`` (not the library) from an uncompressed NCCL exchange of
the same shards. One JSON record per (op, size, link, variant) is appended to ``--out`` as
soon as it is measured (a run cut short keeps what it measured).
``--chunk-sweep OP:MiB,...`` also times ``always`` at each ``--chunks-mib`` pipeline
chunk size, one Communicator per chunk size (records with ``"bench": "collectives_chunks"``).
Timing, data and records come from ``experiments/harness.py``.

Host cost of the native path (records ``"bench": "collectives_host"``): for each
operation at ``--host-sizes-mib``, ``--host-iters`` calls back to back of the direct
transport call and of the same call through ``Communicator(policy="never")`` (an
agreed native call replays its plan), timed on the host (perf_counter around the
enqueueing, before the stream is synchronised: host microseconds per call) and with
CUDA events (device time per call), after ``--warmup`` calls; outputs checked equal.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_records, gaussian_bits, stated_sum, time_calls  # noqa: E402

from zipccl.costmodel import OPS  # noqa: E402  (the operations, defined once)

LINKS = {
    "nvlink": {},
    "shm": {"NCCL_P2P_DISABLE": "1"},
    "socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
}
MiB = 1 << 20


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--link", choices=sorted(LINKS), default="nvlink")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16",
                    help="element type of the data (sizes stay in bytes)")
    ap.add_argument("--sizes-mib", default="16,64,256,1024",
                    help="per-rank sizes in MiB (comma separated)")
    ap.add_argument("--calibrate-sizes-mib", default=None,
                    help="sizes the auto policy calibrates at (default: --sizes-mib)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5, help="calls timed back to back")
    ap.add_argument("--lat-iters", type=int, default=3, help="calls timed one by one")
    ap.add_argument("--variants", default="nccl,always,auto")
    ap.add_argument("--chunk-mib", type=float, default=None,
                    help="pipeline chunk of the zipccl communicators (default: the library's)")
    ap.add_argument("--chunk-sweep", default="", help="OP:MiB,... timed at every --chunks-mib")
    ap.add_argument("--chunks-mib", default="16,32,64,128,256,0",
                    help="chunk sizes of the sweep (0: the two-phase exchange in one round)")
    ap.add_argument("--time-budget-s", type=float, default=1e9,
                    help="start no new measurement after this many seconds")
    ap.add_argument("--host-sizes-mib", default="1",
                    help="sizes at which the native path's host cost per call is measured ('' = none)")
    ap.add_argument("--host-iters", type=int, default=200, help="calls per host-cost measurement")
    ap.add_argument("--machine", default=None, help='e.g. "2 x NVIDIA H200" (default: detected)')
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default=None, metavar="OP:MiB",
                    help="instead of benchmarking, profile 20 compressed calls of OP at MiB on rank 0")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.update(LINKS[args.link])  # before NCCL starts: it reads these once
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    t_start = time.time()
    import cupy
    import numpy as np
    from mpi4py import MPI

    import zipccl
    from zipccl import metrics
    from zipccl.comm.base import offsets
    from zipccl.comm.transport import NCCLTransport, current_gpu_id, shared_gpus
    from zipccl.tools.gpus import mpi_place

    world = MPI.COMM_WORLD  # an experiment's main() may name the world
    p, me = world.Get_size(), world.Get_rank()
    cupy.cuda.Device(mpi_place(world).device).use()  # a node's ranks take its GPUs round robin
    shared = shared_gpus(world.allgather(current_gpu_id()))
    if shared:  # the baseline is NCCL, which refuses two ranks on one GPU: say so, not NCCL's trace
        if me == 0:
            print(f"bench_collectives compares against NCCL, which cannot run two ranks on one GPU "
                  f"(ranks {shared[0]} share one): run one rank per GPU", file=sys.stderr)
        return 2
    stream = cupy.cuda.Stream(non_blocking=True)
    gpu_name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    machine = args.machine or f"{world.allreduce(1)} x {gpu_name}"

    native = NCCLTransport(world.Dup())
    variants = [v for v in args.variants.split(",") if v]
    chunk_bytes = None if args.chunk_mib is None else int(args.chunk_mib * MiB)
    comms = {v: zipccl.Communicator(world, backend="nccl", policy=v, chunk_bytes=chunk_bytes)
             for v in variants if v != "nccl"}
    if not comms:
        comms["always"] = zipccl.Communicator(world, backend="nccl", policy="always",
                                              chunk_bytes=chunk_bytes)
    any_comm = next(iter(comms.values()))
    run_id = world.bcast(datetime.datetime.now().isoformat(timespec="seconds"), root=0)
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "cupy": cupy.__version__, "nccl": cupy.cuda.nccl.get_version(),
                "zipccl": zipccl.__version__, "mpi": MPI.Get_library_version().splitlines()[0]}

    def emit(rec: dict) -> None:
        """Append one record to --out now (rank 0), so a run cut short keeps it."""
        rec.update({"run": run_id, "link": args.link, "nranks": p, "machine": machine,
                    "gpu": gpu_name, "platform": platform.platform(), "versions": versions,
                    "date": datetime.date.today().isoformat()})
        append_records(args.out, [rec], world)

    def in_budget() -> bool:
        return world.bcast(time.time() - t_start < args.time_budget_s, root=0)

    bf16 = args.dtype == "bfloat16"
    isz = 2 if args.dtype != "float32" else 4
    dt = cupy.uint16 if bf16 else np.dtype(args.dtype)  # BF16 travels as its uint16 bits
    kw = {"dtype": "bfloat16"} if bf16 else {}
    kind = "bfloat16" if bf16 else None  # NCCL's type: the buffers' own except for BF16

    def bf16_gaussian(n: int, seed: int):
        """n values of N(0, 0.02^2) of --dtype (BF16: uint16 bits), made on the timed stream."""
        if bf16:
            return gaussian_bits(n, seed=seed, xp=cupy, stream=stream)
        with stream:
            x = cupy.random.RandomState(seed).standard_normal(n, dtype=cupy.float32) * cupy.float32(0.02)
            return x.astype(dt)

    def b2b(fn, reset=None) -> float:
        """nccl-tests' timing: mean of --iters calls back to back (after --warmup)."""
        for _ in range(args.warmup):
            if reset is not None:
                reset()
            fn()
        if reset is None:
            return time_calls(fn, args.iters, stream=stream, comm=world).seconds
        both = time_calls(lambda: (reset(), fn()), args.iters, stream=stream, comm=world).seconds
        return max(0.0, both - time_calls(reset, args.iters, stream=stream, comm=world).seconds)

    def one_by_one(fn, reset=None) -> list[float]:
        out = []
        for _ in range(args.lat_iters):
            if reset is not None:
                reset()
            out.append(time_calls(fn, 1, stream=stream, comm=world).seconds)
        return out

    def case(op: str, x, n: int):
        """(make_out, run_native(out), run_z(comm, out)) of one operation on the per-rank data x."""
        if op == "all_gather":
            return (lambda: cupy.zeros(p * n, dtype=dt),
                    lambda out: native.allgather(x.view(cupy.uint8), out.view(cupy.uint8), stream),
                    lambda c, out: c.all_gather(x, out, stream=stream, **kw))
        if op == "reduce_scatter":
            return (lambda: cupy.zeros(n, dtype=dt),
                    lambda out: native.reduce_scatter(x, out, "sum", stream, dtype=kind),
                    lambda c, out: c.reduce_scatter(x, out, stream=stream, **kw))
        if op == "all_to_all":
            blk = n // p
            counts = [isz * blk] * p
            return (lambda: cupy.zeros(blk * p, dtype=dt),
                    lambda out: native.alltoallv(x.view(cupy.uint8), counts, offsets(counts),
                                                 out.view(cupy.uint8), counts, offsets(counts), stream),
                    lambda c, out: c.all_to_all(x[:blk * p], out, stream=stream, **kw))
        # all_reduce works in place: every timed call starts again from x (reset)
        return (lambda: cupy.empty(n, dtype=dt),
                lambda out: native.allreduce(out, "sum", stream, dtype=kind),
                lambda c, out: c.all_reduce(out, stream=stream, **kw))

    if args.profile:
        return profile_calls(args, cupy, world, me, stream, bf16_gaussian, case, comms, p)

    # -- host cost of the native path: the direct transport call vs through the Communicator -----
    bad = 0
    never = zipccl.Communicator(world, backend="nccl", policy="never")
    for op in [o for o in args.ops.split(",") if o]:
        for size in [int(float(s) * MiB) for s in args.host_sizes_mib.split(",") if s]:
            n = size // isz
            with stream:
                x = bf16_gaussian(n * (p if op == "reduce_scatter" else 1), seed=3000 + me)
                make_out, run_native, run_z = case(op, x, n)
                outs = {v: make_out() for v in ("direct", "communicator")}
            calls = {"direct": lambda out=outs["direct"], f=run_native: f(out),
                     "communicator": lambda out=outs["communicator"], f=run_z: f(never, out)}
            host_us, device_us = {}, {}
            for v, fn in calls.items():
                host_us[v], device_us[v] = host_cost(fn, args, stream, world)
            stream.synchronize()
            wrong = world.allreduce(int(cupy.count_nonzero(outs["direct"].view(_uint(isz))
                                                           != outs["communicator"].view(_uint(isz)))))
            if op == "all_reduce":  # in place, summed again every call: only the sizes compare
                wrong = 0
            assert not never.last_decision.compress
            emit({"bench": "collectives_host", "op": op, "per_rank_bytes": size, "dtype": args.dtype,
                  "host_us_per_call": host_us, "device_us_per_call": device_us,
                  "communicator_extra_host_us": host_us["communicator"] - host_us["direct"],
                  "wrong_elements": wrong, "exact": wrong == 0,
                  "config": {"iters": args.host_iters, "warmup": args.warmup,
                             "env": LINKS[args.link], "direct": "NCCLTransport call",
                             "communicator": 'Communicator(backend="nccl", policy="never")',
                             "timing": "host: perf_counter around iters calls before the stream "
                                       "sync, slowest rank; device: CUDA events, slowest rank"}})
            bad += int(wrong != 0)
            if me == 0:
                print(f"{args.link:6s} host {op:14s} {size / MiB:6.2f} MiB  direct "
                      f"{host_us['direct']:7.2f} us  communicator {host_us['communicator']:7.2f} us"
                      f"  (+{host_us['communicator'] - host_us['direct']:.2f})  device "
                      f"{device_us['direct']:8.2f} / {device_us['communicator']:8.2f} us  "
                      f"wrong {wrong}", flush=True)
            del outs, x
    never.close()

    # -- the auto policy measures its components on this link, now ------------------------------
    profile = None
    if "auto" in comms:
        cal = [int(float(s) * MiB) for s in (args.calibrate_sizes_mib or args.sizes_mib).split(",") if s]
        t0 = time.time()
        profile = comms["auto"].calibrate(device=True, sizes=cal, repeat=2, stream=stream,
                                          ops=[o for o in args.ops.split(",") if o])
        emit({"bench": "collectives_calibration", "seconds": time.time() - t0,
              "profile": json.loads(profile.to_json())})
        if me == 0:
            print(f"calibrated in {time.time() - t0:.1f} s: codec {profile.codec}, "
                  f"round_s {profile.round_s}, fixed_s {profile.fixed_s}", flush=True)

    def predictions(op: str, size: int) -> dict:
        if profile is None:
            return {}
        nb = size * (p if op == "reduce_scatter" else 1)  # the size the policy decides on
        pr = profile.predict(op, nb)
        if pr is None:
            return {}
        return {"predicted_native_s": pr.native_s, "predicted_compressed_s": pr.compressed_s,
                "predicted_rounds": pr.rounds, "predicted_stages_s": pr.stages}

    for op in [o for o in args.ops.split(",") if o]:
        for size in [int(float(s) * MiB) for s in args.sizes_mib.split(",") if s]:
            if not in_budget():
                if me == 0:
                    print(f"time budget spent: {op} {size // MiB} MiB and later not measured", flush=True)
                break
            n = size // isz  # elements of the per-rank buffer (metrics convention)
            # inputs and outputs are made on the timed stream: a non-blocking stream does not
            # wait for the legacy one, so a zero-fill there could land after the collective
            with stream:
                x = bf16_gaussian(n * (p if op == "reduce_scatter" else 1), seed=1000 + me)
            make_out, run_native, run_z = case(op, x, n)
            outs, results, keep = {}, {}, {}
            for v in variants:
                with stream:
                    out = make_out()
                reset = None
                if op == "all_reduce":
                    def reset(out=out, x=x):
                        with stream:
                            out[...] = x
                fn = (lambda out=out, f=run_native: f(out)) if v == "nccl" else \
                    (lambda out=out, c=comms[v], f=run_z: f(c, out))
                results[v] = (b2b(fn, reset), one_by_one(fn, reset))
                if reset is not None:  # the checked output is that of one call on x
                    reset()
                    fn()
                outs[v] = out
                if v != "nccl":
                    st = comms[v].last_stats
                    keep[v] = (comms[v].last_decision, world.allreduce(st.wire_bytes),
                               world.allreduce(st.raw_bytes))

            # -- exactness of the timed buffers ----------------------------------------------
            if op in ("reduce_scatter", "all_reduce"):
                expected = stated_reduction(cupy, native, stream, op, x, p, me, n)
            else:
                expected = outs.get("nccl")
                expected = None if expected is None else expected.view(_uint(isz))
            stream.synchronize()
            base = results["nccl"][0] if "nccl" in results else None
            pred = predictions(op, size)
            for v, (t, lat) in results.items():
                got = outs[v].view(_uint(isz))  # bit patterns: NaN == NaN, -0 != +0
                wrong = int(cupy.count_nonzero(got != expected)) if expected is not None else -1
                wrong_vs_nccl = int(cupy.count_nonzero(got != outs["nccl"].view(_uint(isz)))) \
                    if "nccl" in outs else -1
                wrong = world.allreduce(wrong)
                wrong_vs_nccl = world.allreduce(wrong_vs_nccl)
                nb = metrics.nccl_tests_size(op, size, p)
                rec = {
                    "bench": "collectives", "op": op, "variant": v, "dtype": args.dtype,
                    "per_rank_bytes": size, "nccl_tests_bytes": nb,
                    "time_s": t, "latency_s": statistics.median(lat), "latencies_s": lat,
                    "algbw_gbps": metrics.algbw(nb, t), "busbw_gbps": metrics.busbw(op, nb, t, p),
                    "speedup_vs_nccl": metrics.speedup(base, t) if base else None,
                    "latency_speedup_vs_nccl": metrics.speedup(statistics.median(results["nccl"][1]),
                                                               statistics.median(lat))
                    if base else None,
                    "wrong_elements": wrong, "differs_from_nccl": wrong_vs_nccl,
                    "exact": wrong == 0,
                    "config": {"warmup": args.warmup, "iters": args.iters, "lat_iters": args.lat_iters,
                               "data": f"N(0, 0.02^2) {args.dtype}", "env": LINKS[args.link],
                               "timing": "CUDA events, slowest rank; time_s: mean of iters back to "
                                         "back (all_reduce: minus the input-restoring copies); "
                                         "latency_s: median of calls timed one by one",
                               "chunk_bytes": 2 * any_comm.chunk},
                    **pred,
                }
                if v in keep:
                    d, wire, raw = keep[v]
                    rec.update({"compressed": d.compress, "decision": d.reason,
                                "wire_ratio": metrics.compression_ratio(wire, raw)})
                compressed = rec.get("compressed", False)
                if pred:
                    rec["predicted_s"] = pred["predicted_compressed_s" if compressed else
                                              "predicted_native_s"]
                    rec["prediction_error"] = rec["predicted_s"] / t - 1.0
                emit(rec)
                bad += int(v != "nccl" and not rec["exact"])
                if me == 0:
                    sp = f"{rec['speedup_vs_nccl']:.2f}x" if rec["speedup_vs_nccl"] else "-"
                    pe = f" pred {1e3 * rec['predicted_s']:8.3f} ms" if "predicted_s" in rec else ""
                    print(f"{args.link:6s} {op:14s} {size / MiB:6.0f} MiB {v:6s} {1e3 * t:9.3f} ms "
                          f"(lat {1e3 * rec['latency_s']:8.3f}) busbw {rec['busbw_gbps']:6.1f} "
                          f"{sp:>6s} wrong {wrong}{pe}"
                          + (f" ratio {rec['wire_ratio']:.4f} {'C' if compressed else 'N'}"
                             if "wire_ratio" in rec else ""), flush=True)
            del outs, x
            cupy.get_default_memory_pool().free_all_blocks()

    # -- pipeline chunk sweep ------------------------------------------------------------------
    sweep = [s.split(":") for s in args.chunk_sweep.split(",") if s]
    for op, mib in sweep:
        size = int(float(mib) * MiB)
        n = size // isz
        if op == "all_reduce" or not in_budget():
            continue
        x = bf16_gaussian(n * (p if op == "reduce_scatter" else 1), seed=2000 + me)
        make_out, run_native, run_z = case(op, x, n)
        ref = make_out()
        t_nccl = b2b(lambda ref=ref, f=run_native: f(ref))
        for cm in [float(s) for s in args.chunks_mib.split(",") if s]:
            if not in_budget():
                break
            c = zipccl.Communicator(world, backend="nccl", policy="always", chunk_bytes=int(cm * MiB))
            out = make_out()
            t = b2b(lambda out=out, f=run_z, c=c: f(c, out))
            if op == "reduce_scatter":
                expected = stated_reduction(cupy, native, stream, op, x, p, me, n)
            else:
                expected = ref.view(_uint(isz))
            stream.synchronize()
            wrong = world.allreduce(int(cupy.count_nonzero(out.view(_uint(isz)) != expected)))
            emit({"bench": "collectives_chunks", "op": op, "variant": "always", "dtype": args.dtype,
                  "per_rank_bytes": size, "chunk_bytes": 2 * c.chunk, "time_s": t,
                  "nccl_time_s": t_nccl, "speedup_vs_nccl": t_nccl / t, "wrong_elements": wrong,
                  "exact": wrong == 0, "config": {"warmup": args.warmup, "iters": args.iters,
                                                  "env": LINKS[args.link]}})
            bad += int(wrong != 0)
            if me == 0:
                print(f"{args.link:6s} chunks {op:14s} {size / MiB:6.0f} MiB chunk {cm:6.0f} MiB "
                      f"{1e3 * t:9.3f} ms  {t_nccl / t:.3f}x  wrong {wrong}", flush=True)
            c.close()
        del x, ref
        cupy.get_default_memory_pool().free_all_blocks()

    for cc in comms.values():
        cc.close()
    native.close()
    return 1 if bad else 0


def host_cost(fn, args, stream, world) -> tuple[float, float]:
    """(host us, device us) per call of ``fn``: ``--host-iters`` calls back to back, slowest rank."""
    for _ in range(max(1, args.warmup)):
        fn()
    t = time_calls(fn, args.host_iters, stream=stream, comm=world)
    return t.host_s * 1e6, t.seconds * 1e6


def profile_calls(args, cupy, world, me, stream, bf16_gaussian, case, comms, p) -> int:
    """cProfile of 20 compressed calls on rank 0 (host time: where the fixed cost goes)."""
    import cProfile
    import pstats

    op, mib = args.profile.split(":")
    n = int(float(mib) * MiB) // (4 if args.dtype == "float32" else 2)
    x = bf16_gaussian(n * (p if op == "reduce_scatter" else 1), seed=1000 + me)
    make_out, _, run_z = case(op, x, n)
    out, c = make_out(), comms.get("always") or next(iter(comms.values()))
    for _ in range(3):
        run_z(c, out)
    stream.synchronize()
    world.Barrier()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    if me == 0:
        prof.enable()
    for _ in range(20):
        run_z(c, out)
    stream.synchronize()
    prof.disable()
    t = (time.perf_counter() - t0) / 20
    if me == 0:
        print(f"profile {op} {mib} MiB: {1e3 * t:.3f} ms per call (host wall time)")
        st = pstats.Stats(prof)
        st.sort_stats("cumulative").print_stats(45)
        st.sort_stats("tottime").print_stats(25)
    return 0


def _uint(isz: int):
    """The unsigned integer type of an element size: outputs are compared as bit patterns."""
    import cupy

    return cupy.uint32 if isz == 4 else cupy.uint16


def stated_reduction(cupy, native, stream, op, x, p, me, m):
    """zipccl's stated reduction of the data, as bit patterns: the ranks' shards exchanged
    uncompressed by NCCL, reduced on the host by the NumPy oracle (``harness.stated_sum``),
    not the library."""
    from zipccl.comm.base import offsets, split_counts

    if op == "reduce_scatter":
        counts = [m] * p
    else:
        counts = split_counts(x.size, p)
    mine = counts[me]
    isz = x.itemsize
    stage = cupy.empty(p * mine, dtype=x.dtype)
    sc = [isz * c for c in counts]
    rc = [isz * mine] * p
    native.alltoallv(x.view(cupy.uint8), sc, offsets(sc), stage.view(cupy.uint8), rc,
                     [isz * j * mine for j in range(p)], stream)
    rows = cupy.asnumpy(stage, stream=stream).reshape(p, mine)  # synchronises the stream
    with stream:
        red = cupy.asarray(stated_sum(list(rows)))
    if op == "reduce_scatter":
        return red
    full = cupy.empty(x.size, dtype=red.dtype)
    b = [isz * c for c in counts]
    native.alltoallv(red.view(cupy.uint8), [isz * mine] * p, [0] * p, full.view(cupy.uint8), b,
                     offsets(b), stream)
    return full


if __name__ == "__main__":
    from mpi4py import MPI

    from zipccl.tools.mpijob import run_main

    sys.exit(run_main(main, MPI.COMM_WORLD))  # one rank failing ends the job
