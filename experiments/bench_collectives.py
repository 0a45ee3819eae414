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
BF16 N(0, 0.02^2) data, then times

- ``nccl``: the NCCL collective called directly (cupy.cuda.nccl; all-to-all as
  grouped send/recv), the baseline;
- ``always`` and ``auto``: ``zipccl.Communicator(policy=...)`` on the same data
  (``auto`` first calibrates: it measures both paths of every operation at 1-256 MiB
  on this link and follows the fitted times),

each after warm-up, with CUDA events on one stream between barriers, taking the
slowest rank per iteration and the median over iterations. Then it checks the
outputs of the timed buffers: all-gather and all-to-all must equal NCCL's bit
for bit; reductions must equal zipccl's stated reduction (FP32 in rank order,
one rounding) computed from an uncompressed NCCL exchange of the same shards,
and the elements that differ from NCCL's own BF16 reduction are counted too.
One JSON record per (op, size, link, variant) goes to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

LINKS = {
    "nvlink": {},
    "shm": {"NCCL_P2P_DISABLE": "1"},
    "socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
}
OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")
MiB = 1 << 20


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--link", choices=sorted(LINKS), default="nvlink")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--sizes-mib", default="1,4,16,64,256,1024",
                    help="per-rank sizes in MiB (comma separated)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--variants", default="nccl,always,auto")
    ap.add_argument("--machine", default=None, help='e.g. "2 x NVIDIA H200" (default: detected)')
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default=None, metavar="OP:MiB",
                    help="instead of benchmarking, profile 20 compressed calls of OP at MiB on rank 0")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.update(LINKS[args.link])  # before NCCL starts: it reads these once
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import cupy
    import numpy as np
    from mpi4py import MPI

    import zipccl
    from zipccl import metrics
    from zipccl.comm.collectives import offsets
    from zipccl.comm.pipeline import DeviceEngine
    from zipccl.comm.transport import NCCLTransport

    world = MPI.COMM_WORLD  # an experiment's main() may name the world
    p, me = world.Get_size(), world.Get_rank()
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    cupy.cuda.Device(local.Get_rank() % cupy.cuda.runtime.getDeviceCount()).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    gpu_name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    machine = args.machine or f"{world.allreduce(1)} x {gpu_name}"

    native = NCCLTransport(world.Dup())
    variants = [v for v in args.variants.split(",") if v]
    comms = {v: zipccl.Communicator(world, backend="nccl", policy=v) for v in variants if v != "nccl"}
    engine = DeviceEngine()
    engine.set_stream(stream)
    run_id = world.bcast(datetime.datetime.now().isoformat(timespec="seconds"), root=0)
    profile = None
    if "auto" in comms and not args.profile:  # "auto" follows a profile measured here, now
        profile = comms["auto"].calibrate(device=True, sizes=(1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB),
                                          repeat=2, stream=stream)
        if me == 0:
            print(f"calibrated: {profile.to_json()}", flush=True)

    def bf16_gaussian(n: int, seed: int):
        rs = cupy.random.RandomState(seed)
        with stream:
            x = (rs.standard_normal(n, dtype=cupy.float32) * 0.02).view(cupy.uint32)
            return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(cupy.uint16)

    def timed(fn, reset=None) -> list[float]:
        """Per-iteration time of the slowest rank (CUDA events on ``stream``, barriers around)."""
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        out = []
        for i in range(args.warmup + args.iters):
            if reset is not None:
                reset()
            stream.synchronize()
            world.Barrier()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            t = world.allreduce(cupy.cuda.get_elapsed_time(start, end) / 1e3, op=MPI.MAX)
            if i >= args.warmup:
                out.append(t)
        return out

    def case(op: str, x, n: int):
        """(make_out, run_native(out), run_z(comm, out)) of one operation on the per-rank data x."""
        if op == "all_gather":
            return (lambda: cupy.zeros(p * n, dtype=cupy.uint16),
                    lambda out: native.allgather(x.view(cupy.uint8), out.view(cupy.uint8), stream),
                    lambda c, out: c.all_gather(x, out, dtype="bfloat16", stream=stream))
        if op == "reduce_scatter":
            return (lambda: cupy.zeros(n, dtype=cupy.uint16),
                    lambda out: native.reduce_scatter(x, out, "sum", stream, dtype="bfloat16"),
                    lambda c, out: c.reduce_scatter(x, out, dtype="bfloat16", stream=stream))
        if op == "all_to_all":
            blk = n // p
            counts = [2 * blk] * p
            return (lambda: cupy.zeros(blk * p, dtype=cupy.uint16),
                    lambda out: native.alltoallv(x.view(cupy.uint8), counts, offsets(counts),
                                                 out.view(cupy.uint8), counts, offsets(counts), stream),
                    lambda c, out: c.all_to_all(x[:blk * p], out, dtype="bfloat16", stream=stream))
        # all_reduce works in place: every timed iteration starts again from x (reset, untimed)
        return (lambda: cupy.empty(n, dtype=cupy.uint16),
                lambda out: native.allreduce(out, "sum", stream, dtype="bfloat16"),
                lambda c, out: c.all_reduce(out, dtype="bfloat16", stream=stream))

    if args.profile:
        import cProfile
        import pstats
        import time

        op, mib = args.profile.split(":")
        n = int(float(mib) * MiB) // 2
        x = bf16_gaussian(n * (p if op == "reduce_scatter" else 1), seed=1000 + me)
        make_out, _, run_z = case(op, x, n)
        out, c = make_out(), comms["always"]
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

    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "cupy": cupy.__version__, "nccl": cupy.cuda.nccl.get_version(),
                "zipccl": zipccl.__version__, "mpi": MPI.Get_library_version().splitlines()[0]}
    records = []
    for op in [o for o in args.ops.split(",") if o]:
        for size in [int(float(s) * MiB) for s in args.sizes_mib.split(",") if s]:
            n = size // 2  # BF16 elements of the per-rank buffer (metrics convention)
            x = bf16_gaussian(n * (p if op == "reduce_scatter" else 1), seed=1000 + me)
            outs, keep = {}, {}
            make_out, run_native, run_z = case(op, x, n)
            results = {}
            for v in variants:
                out = make_out()
                reset = None
                if op == "all_reduce":
                    def reset(out=out, x=x):
                        with stream:
                            out[...] = x
                fn = (lambda out=out, f=run_native: f(out)) if v == "nccl" else \
                    (lambda out=out, c=comms[v], f=run_z: f(c, out))
                results[v] = timed(fn, reset)
                outs[v] = out
                if v != "nccl":
                    st = comms[v].last_stats
                    keep[v] = (comms[v].last_decision, world.allreduce(st.wire_bytes),
                               world.allreduce(st.raw_bytes))

            # -- exactness of the timed buffers ----------------------------------------------
            if op in ("reduce_scatter", "all_reduce"):
                expected = stated_reduction(cupy, native, engine, stream, op, x, p, me, n)
            else:
                expected = outs.get("nccl")
            stream.synchronize()
            base = statistics.median(results["nccl"]) if "nccl" in results else None
            for v, ts in results.items():
                wrong = int(cupy.count_nonzero(outs[v] != expected)) if expected is not None else -1
                wrong_vs_nccl = int(cupy.count_nonzero(outs[v] != outs["nccl"])) \
                    if "nccl" in outs else -1
                wrong = world.allreduce(wrong)
                wrong_vs_nccl = world.allreduce(wrong_vs_nccl)
                med = statistics.median(ts)
                nb = metrics.nccl_tests_size(op, size, p)
                rec = {
                    "bench": "collectives", "run": run_id, "op": op, "link": args.link, "variant": v,
                    "per_rank_bytes": size, "nccl_tests_bytes": nb, "nranks": p,
                    "time_s": med, "time_min_s": min(ts), "times_s": ts,
                    "algbw_gbps": metrics.algbw(nb, med), "busbw_gbps": metrics.busbw(op, nb, med, p),
                    "speedup_vs_nccl": metrics.speedup(base, med) if base else None,
                    "wrong_elements": wrong, "differs_from_nccl": wrong_vs_nccl,
                    "exact": wrong == 0,
                    "machine": machine, "gpu": gpu_name, "platform": platform.platform(),
                    "versions": versions, "date": datetime.date.today().isoformat(),
                    "config": {"warmup": args.warmup, "iters": args.iters, "data": "N(0, 0.02^2) BF16",
                               "env": LINKS[args.link], "timing": "CUDA events, max over ranks, median"},
                }
                if v == "auto" and profile is not None:
                    rec["config"]["policy_profile"] = {"key": profile.key, "fits": profile.fits}
                if v in keep:
                    d, wire, raw = keep[v]
                    rec.update({"compressed": d.compress, "decision": d.reason,
                                "wire_ratio": metrics.compression_ratio(wire, raw)})
                records.append(rec)
                if me == 0:
                    sp = f"{rec['speedup_vs_nccl']:.2f}x" if rec["speedup_vs_nccl"] else "-"
                    print(f"{args.link:6s} {op:14s} {size / MiB:7.0f} MiB {v:6s} {1e3 * med:9.3f} ms "
                          f"busbw {rec['busbw_gbps']:7.1f} GB/s  {sp:>6s}  wrong {wrong}"
                          + (f"  ratio {rec['wire_ratio']:.4f}" if "wire_ratio" in rec else ""),
                          flush=True)
            del outs, x
            cupy.get_default_memory_pool().free_all_blocks()
    if me == 0:
        with open(args.out, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    bad = sum(1 for r in records if not r["exact"] and r["variant"] != "nccl")
    for c in comms.values():
        c.close()
    native.close()
    return 1 if bad else 0


def stated_reduction(cupy, native, engine, stream, op, x, p, me, m):
    """zipccl's stated BF16 reduction of the data, from an uncompressed NCCL exchange of shards."""
    from zipccl.comm.collectives import offsets, split_counts

    if op == "reduce_scatter":
        counts = [m] * p
    else:
        counts = split_counts(x.size, p)
    mine = counts[me]
    stage = cupy.empty(p * mine, dtype=cupy.uint16)
    sc = [2 * c for c in counts]
    rc = [2 * mine] * p
    native.alltoallv(x.view(cupy.uint8), sc, offsets(sc), stage.view(cupy.uint8), rc,
                     [2 * j * mine for j in range(p)], stream)
    red = cupy.empty(mine, dtype=cupy.uint16)
    engine.reduce_sum(stage.reshape(p, mine), red)
    if op == "reduce_scatter":
        return red
    full = cupy.empty(x.size, dtype=cupy.uint16)
    b = [2 * c for c in counts]
    native.alltoallv(red.view(cupy.uint8), [2 * mine] * p, [0] * p, full.view(cupy.uint8), b,
                     offsets(b), stream)
    return full


if __name__ == "__main__":
    sys.exit(main())
