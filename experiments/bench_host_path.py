"""Main-thread cost of a compressed zipccl.torch call on CUDA tensors, and its host waits.

    python experiments/bench_host_path.py --out experiments/results/host_path.jsonl
    torchrun --nproc-per-node 2 experiments/bench_host_path.py --backend nccl ...   # 2 GPUs

Without torchrun it spawns 2 ranks that share GPU 0 over gloo (gloo moves CUDA tensors;
NCCL refuses two ranks on one GPU). Per collective and size, after two calls (the first
checked bit for bit; zipccl records its own CUDA graph of a kept call over NCCL at the second,
as a training loop's second step would) and warm-up bursts (``--warmup`` calls each, repeated
until one makes no pinned call block, at most ``WARMUP_BURSTS``: ``warmup_bursts``, and the
blocks they made, ``warmup_block_allocations``), it times
``--calls`` calls on the caller's thread (``time.perf_counter``) and, beside it, the time
spent inside the transport's own calls (gloo or NCCL: wrapped and timed the same way), so
``zipccl_us = call_us - transport_us`` is what zipccl itself costs the caller's thread.
Every synchronising entry point is counted meanwhile (torch / CuPy stream and event
synchronisation, ``torch.cuda.synchronize``, device-to-host reads through CuPy): the
``waits`` of a record. One more call runs under the CUDA profiler, which sees every
library's launches: ``launches_per_call`` (kernels), ``copies_per_call`` (copies and sets),
``graph_launches_per_call``. Over gloo the transport itself blocks (it copies through the host);
that is the transport's time, not zipccl's, and is what NCCL removes.

``--graph`` (NCCL only): each call is also captured in a CUDA graph and replayed; its record
(``graph: true``, ``graph_kind: "user"``) times one ``replay()``, the whole call with the
transport inside. ``--side-stream``: the calls run on a stream of their own, where zipccl
replays a kept call over NCCL as its own CUDA graph (``graph: true``, ``graph_kind: "plan"``:
the eager call's time, graph launch included).

``py_ref_us`` in each record times a fixed piece of zipccl's Python (``Stats.add``) in the
same process just before its timed calls: H200 hosts and sessions differ by 2x and more in
Python speed, so compare records through it (or through ``transport_us``), not across
sessions alone.

``--queue-ms`` (NCCL only): a kernel of that many milliseconds is queued on the stream
before each call; ``returned_before_kernel`` says whether the call returned while it still
ran (NCCL's contract). Results are checked bit for bit against the native collective before
anything is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from zipccl.tools.gpus import place  # noqa: E402 -- after the path set-up above

OPS = ("all_gather", "reduce_scatter", "all_to_all")
WARMUP_BURSTS = 4  # warm-up bursts at most, until one makes no pinned call block


@contextlib.contextmanager
def counted(record: dict, transport_cls, cuda: bool = True):
    """Count synchronising calls and time the transport's calls while the block runs (a timed
    call inside another, ``alltoallv_shared`` calling ``alltoallv`` on gloo, counts once)."""
    patches = []
    depth = [0]

    def wrap(owner, name: str, label: str, timed: bool = False):
        real = getattr(owner, name)

        def counting(*a, **k):
            if timed:
                depth[0] += 1
                t0 = time.perf_counter()
                try:
                    return real(*a, **k)
                finally:
                    depth[0] -= 1
                    if depth[0] == 0:
                        record["transport_s"] += time.perf_counter() - t0
            record["waits"][label] = record["waits"].get(label, 0) + 1
            return real(*a, **k)

        patches.append((owner, name, real))
        setattr(owner, name, counting)

    if cuda:
        import cupy

        wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
        wrap(torch.cuda.Stream, "synchronize", "torch Stream.synchronize")
        wrap(torch.cuda.Event, "synchronize", "torch Event.synchronize")
        wrap(cupy.cuda.Stream, "synchronize", "cupy Stream.synchronize")
        wrap(cupy.cuda.Event, "synchronize", "cupy Event.synchronize")
        wrap(cupy.ndarray, "get", "cupy ndarray.get")
        wrap(cupy, "asnumpy", "cupy.asnumpy")
    for name in ("alltoallv", "allgather") + (("alltoallv_shared",) if hasattr(
            transport_cls, "alltoallv_shared") else ()):
        wrap(transport_cls, name, name, timed=True)
    try:
        yield
    finally:
        for owner, name, real in reversed(patches):
            setattr(owner, name, real)


def python_reference_us(repeat: int = 5, number: int = 4000) -> float:
    """µs per ``Stats.add`` (one call's counting in zipccl) in this process: the best of
    ``repeat`` runs of ``number``, a measure of how fast this host runs zipccl's Python."""
    import timeit

    from zipccl.comm.base import ExchangeStats
    from zipccl.comm.stats import Stats

    s, ex = Stats(), ExchangeStats(wire_bytes=70, raw_bytes=100)
    best = min(timeit.repeat(lambda: s.add(True, ex, "all_gather"), number=number, repeat=repeat))
    return 1e6 * best / number


def python_calls(call, by: dict | None = None) -> tuple[int, int]:
    """(zipccl functions, all Python functions) entered on this thread during one ``call()``;
    ``by``: counts each zipccl function's entries in it, under "module.py:function"."""
    pkg = str(HERE.parent / "zipccl")
    counts = [0, 0]

    def prof(frame, event, arg):
        if event == "call":
            counts[1] += 1
            code = frame.f_code
            if code.co_filename.startswith(pkg):
                counts[0] += 1
                if by is not None:
                    name = f"{code.co_filename[len(pkg) + 1:]}:{code.co_name}"
                    by[name] = by.get(name, 0) + 1

    sys.setprofile(prof)
    try:
        call()
    finally:
        sys.setprofile(None)
    return counts[0], counts[1]


def device_work(call, sync) -> dict:
    """What one ``call()`` enqueues on the GPU, from the CUDA profiler (CUPTI sees every library's
    launches: torch's, CuPy's, Numba's): kernels, copies and sets, graph launches."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        sync()
    got = {"kernels": 0, "copies": 0, "graph_launches": 0}
    for e in prof.events():
        name = e.name
        if e.device_type == torch.autograd.DeviceType.CUDA:
            got["copies" if name.startswith(("Memcpy", "Memset")) else "kernels"] += 1
        elif name in ("cudaGraphLaunch", "cuGraphLaunch"):
            got["graph_launches"] += 1
    return got


STAGES = (  # (module, owner, method): the caller's-thread stages --stages times
    ("zipccl.comm.pipeline", "DeviceEngine", "encode_slot"),
    ("zipccl.comm.pipeline", "DeviceEngine", "pipeline_begin"),
    ("zipccl.comm.pipeline", "DeviceEngine", "decode_frame"),
    ("zipccl.comm.pipeline", "DeviceEngine", "pipeline_finish"),
    ("zipccl.comm.pipeline", "DeviceEngine", "reduce_cols"),
    ("zipccl.comm.pipeline", "DeviceEngine", "copy"),
    ("zipccl.comm.pipeline", "DeviceEngine", "workspace"),
    ("zipccl.comm.exchange", "SlotChannel", "begin"),
    ("zipccl.comm.exchange", "SlotChannel", "launch_out"),
    ("zipccl.comm.exchange", "SlotChannel", "launch_in"),
    ("zipccl.comm.exchange", "SlotChannel", "record_error"),
    ("zipccl.comm.exchange", "SlotChannel", "check"),
    ("zipccl.torch.functional", "Collectives", "where"),
    ("zipccl.torch.functional", "Collectives", "capturing"),
    ("zipccl.comm.core", "Core", "agree"),
    ("zipccl.comm.core", "Core", "count"),
)


@contextlib.contextmanager
def staged(totals: dict):
    """Time the caller's thread in each of STAGES (nested stages count in both)."""
    import importlib

    patches = []
    for mod, cls, name in STAGES:
        owner = getattr(importlib.import_module(mod), cls)
        real = owner.__dict__[name]
        fn = real.__func__ if isinstance(real, staticmethod) else real

        def timed(*a, _fn=fn, _key=f"{cls}.{name}", **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                totals[_key] = totals.get(_key, 0.0) + time.perf_counter() - t0

        patches.append((owner, name, real))
        setattr(owner, name, staticmethod(timed) if isinstance(real, staticmethod) else timed)
    try:
        yield
    finally:
        for owner, name, real in reversed(patches):
            setattr(owner, name, real)


def spill_allocations(zc) -> int | None:
    """Call blocks (pinned memory) the slot channels of ``zc`` have allocated so far."""
    core = getattr(zc, "_core", None)
    if core is None:  # an older tree
        return None
    return sum(ch.spills.stats()["allocations"] for ch in core.channels().values())


def spill_pinned_bytes(zc) -> int | None:
    """Pinned bytes the slot channels of ``zc`` hold in call blocks (free and in flight)."""
    core = getattr(zc, "_core", None)
    if core is None:  # an older tree
        return None
    return sum(ch.spills.stats()["pinned_bytes"] for ch in core.channels().values())


def run(rank: int, p: int, args) -> list[dict]:
    import zipccl.torch as zt
    from zipccl.torch.transport import ProcessGroupTransport

    dev = args.device
    cuda = dev == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    from zipccl.comm import Policy

    # (loopback only when asked: the script also measures trees older than Policy.loopback)
    zc = zt.Collectives(Policy("always", compress_host=True,
                               **({"loopback": True} if args.loopback else {})))
    gen = torch.Generator(device=dev).manual_seed(rank)
    recs = []
    for mib in args.sizes_mib:
        n = int(mib * (1 << 20)) // 2
        x = (torch.randn(p * n, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
        for op in args.ops:
            out = torch.empty(p * n if op != "reduce_scatter" else n, dtype=torch.bfloat16, device=dev)
            ref = torch.empty_like(out)

            def call(fn=zc, out=out, op=op, x=x, n=n):
                if op == "all_gather":
                    fn.all_gather_into_tensor(out, x[:n])
                elif op == "reduce_scatter":
                    fn.reduce_scatter_tensor(out, x)
                else:
                    fn.all_to_all_single(out, x)

            call()
            if op == "all_gather":
                dist.all_gather_into_tensor(ref, x[:n])
            elif op == "all_to_all":
                dist.all_to_all_single(ref, x)
            sync()
            exact = op == "reduce_scatter" or bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
            call()  # the second call: where zipccl records its own graph of the call (NCCL)
            sync()
            # warm-up bursts until one makes no call block (at most WARMUP_BURSTS): a burst that
            # grows the pool stalls the host meanwhile, so the device catches up and the burst
            # runs shallower than the next, as a training loop's first steps do
            warm_allocs, bursts = (None if spill_allocations(zc) is None else 0), 0
            while bursts < WARMUP_BURSTS:
                before = spill_allocations(zc)
                for _ in range(args.calls if args.warmup is None else args.warmup):
                    call()
                sync()
                bursts += 1
                if before is None or spill_allocations(zc) == before:
                    break
                warm_allocs += spill_allocations(zc) - before
            dist.barrier()
            by: dict | None = {} if args.calls_by_function and rank == 0 else None
            zc_calls, py_calls = python_calls(call, by)  # one more warm call, counted
            work = device_work(call, sync) if cuda else {}  # every rank: a collective call
            if by is not None:
                with open(args.calls_by_function, "a") as f:
                    f.write(json.dumps({"op": op, "mib_per_rank": mib, "backend": args.backend,
                                        "loopback": args.loopback, "commit": os.environ.get(
                                            "ZIPCCL_COMMIT", ""), "calls": by}) + "\n")
            sync()
            dist.barrier()
            rec = {"waits": {}, "transport_s": 0.0}
            returned_early = []
            prof = None
            if rank == 0 and args.profile and f"{op}:{mib:g}" in args.profile:
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            stages: dict = {}
            py_ref = python_reference_us()
            allocs = spill_allocations(zc)
            with counted(rec, ProcessGroupTransport, cuda), \
                    (staged(stages) if args.stages else contextlib.nullcontext()):
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    if args.queue_ms:
                        torch.cuda._sleep(int(args.queue_ms * 1.98e6))  # ~cycles at 1.98 GHz
                        done = torch.cuda.Event()
                        done.record()
                    call()
                    if args.queue_ms:
                        returned_early.append(not done.query())
                wall = time.perf_counter() - t0
            if prof is not None:
                import pstats

                prof.disable()
                print(f"--- profile of {args.calls} {op} calls of {mib:g} MiB (rank 0, tottime)")
                pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile_lines)
            sync()
            rec.update({
                "bench": "host_path", "op": op, "mib_per_rank": mib, "nranks": p,
                "backend": args.backend, "calls": args.calls, "exact": exact, "device": dev,
                "zipccl_py_calls": zc_calls, "py_calls": py_calls,
                # zipccl's own graph of the kept call (a plan replayed as a CUDA graph)
                "graph": any(bool(pl.graph) for pl in zc._core.plans.values()),
                "graph_kind": "plan", "stream": "side" if args.side_stream else "default",
                "launches_per_call": work.get("kernels"), "copies_per_call": work.get("copies"),
                "graph_launches_per_call": work.get("graph_launches"),
                "loopback": args.loopback,
                "warmup": args.calls if args.warmup is None else args.warmup,
                # pinned call blocks the spill channel allocated during the timed calls
                "spill_block_allocations": None if allocs is None else spill_allocations(zc) - allocs,
                "warmup_block_allocations": warm_allocs,  # made in the warm-up bursts (untimed)
                "warmup_bursts": bursts,
                "spill_pinned_bytes": spill_pinned_bytes(zc),  # call blocks held after the timed calls
                "py_ref_us": py_ref,
                "call_us": 1e6 * wall / args.calls,
                "transport_us": 1e6 * rec.pop("transport_s") / args.calls,
                "compressed": zc.last_decision.compress if zc.last_decision else None,
            })
            rec["zipccl_us"] = rec["call_us"] - rec["transport_us"]
            if stages:
                rec["stage_us"] = {k: 1e6 * v / args.calls for k, v in sorted(stages.items())}
                if rank == 0:
                    print("   stages, us per call: " + ", ".join(
                        f"{k} {v:.0f}" for k, v in sorted(rec["stage_us"].items(), key=lambda kv: -kv[1])))
            rec["waits_per_call"] = sum(rec["waits"].values()) / args.calls
            if args.queue_ms:
                rec["queue_ms"] = args.queue_ms
                rec["returned_before_kernel"] = float(np.mean(returned_early))
            recs.append(rec)
            if args.graph:
                recs.append(graph_record(call, rec, args, out, ref, sync))
            if rank == 0:
                print(f"{op:15s} {mib:7.2f} MiB  call {rec['call_us']:9.1f} us  transport "
                      f"{rec['transport_us']:9.1f}  zipccl {rec['zipccl_us']:7.1f}  waits/call "
                      f"{rec['waits_per_call']:.1f} {rec['waits'] or ''}  py calls {zc_calls}/{py_calls}  "
                      f"blocks made {rec['spill_block_allocations']}  launches "
                      f"{rec['launches_per_call']}/{rec['copies_per_call']}  exact {exact}", flush=True)
    return recs


def graph_record(call, eager: dict, args, out, ref, sync) -> dict:
    """``call`` captured in a CUDA graph (``torch.cuda.graph``, after a warm-up call on a side
    stream) and replayed: the host time of one ``replay()``, which is the whole call (the
    transport's NCCL call is inside the graph), its launches, and whether it stayed exact."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    sync()
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    with torch.cuda.graph(graph):
        call()
    capture_ms = 1e3 * (time.perf_counter() - t0)
    out.zero_()
    graph.replay()
    sync()
    exact = eager["op"] == "reduce_scatter" or bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
    for _ in range(args.calls if args.warmup is None else args.warmup):
        graph.replay()
    sync()
    work = device_work(graph.replay, sync)
    t0 = time.perf_counter()
    for _ in range(args.calls):
        graph.replay()
    us = 1e6 * (time.perf_counter() - t0) / args.calls
    sync()
    rec = {k: eager[k] for k in ("bench", "op", "mib_per_rank", "nranks", "backend", "calls", "device",
                                 "loopback", "warmup", "compressed")}
    rec.update({"graph": True, "graph_kind": "user", "stream": eager["stream"], "exact": exact,
                "call_us": us, "transport_us": 0.0, "zipccl_us": us,
                "launches_per_call": work.get("kernels"), "copies_per_call": work.get("copies"),
                "graph_launches_per_call": work.get("graph_launches"), "capture_ms": capture_ms})
    print(f"{eager['op']:15s} {eager['mib_per_rank']:7.2f} MiB  graph replay {us:7.1f} us host  "
          f"(capture {capture_ms:.0f} ms)  launches {rec['launches_per_call']}/"
          f"{rec['graph_launches_per_call']} graph  exact {exact}", flush=True)
    return rec


def single_process_costs(args) -> list[dict]:
    """Host µs per call of the slot path's launch-bearing pieces in ONE process with the GPU to
    itself: to compare with their cost inside a two-rank call (``--stages``)."""
    import cupy

    from zipccl.arrays import cupy_view as _cupy_view
    from zipccl.comm.pipeline import DeviceEngine
    from zipccl.format import slot as slots
    from zipccl.kernels import spill as kern

    n = 1 << 19  # 1 MiB of BF16
    x = (torch.randn(n, device="cuda") * 0.02).to(torch.bfloat16)
    eng = DeviceEngine()
    eng.set_stream(torch.cuda.current_stream().cuda_stream)
    vals = _cupy_view(x.view(torch.int16)).view(cupy.uint16)
    region = eng.workspace("r", slots.region_bytes(n))
    frame = region[slots.SLOT_HEADER:]
    out = eng.values_workspace("o", n)
    ws = eng.gpu_workspace.Workspace(n)
    words = cupy.zeros(8, dtype=cupy.uint32)
    ctrl = cupy.cuda.alloc_pinned_memory(128)
    ctrl_ptr = np.frombuffer(ctrl, dtype=np.uint8, count=128).ctypes.data
    ev, s2 = cupy.cuda.Event(disable_timing=True), cupy.cuda.Stream(non_blocking=True)
    stream = eng.encode_stream()
    record_fn = kern.function(cupy, "zipccl_spill_record")
    cases = {
        "encode_slot (choice + encoder plans)": lambda: eng.encode_slot(vals, region),
        "decode_into (plan)": lambda: eng.gpu.decode_into(frame, out, stream, workspace=ws),
        "spill record kernel (CuPy RawModule launch)": lambda: kern.run(
            record_fn, 1, (ctrl_ptr, words.data.ptr, words.data.ptr), stream),
        "event record + wait_event": lambda: (ev.record(stream), s2.wait_event(ev)),
        "torch -> CuPy view": lambda: _cupy_view(x.view(torch.int16)),
    }
    recs = []
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls * 10):
            fn()
        us = 1e6 * (time.perf_counter() - t0) / (args.calls * 10)
        torch.cuda.synchronize()
        recs.append({"bench": "host_path_single", "piece": name, "host_us": us, "calls": args.calls * 10})
        print(f"single process: {name:45s} {us:7.1f} us per call", flush=True)
    return recs


def machine(backend: str, p: int, device: str = "cuda") -> dict:
    if device == "cpu":
        import platform

        return {"machine": f"{os.cpu_count()}-core CPU box ({platform.machine()}), {p} ranks over "
                           f"gloo, CPU tensors", "gpu": None, "torch": torch.__version__}
    name = torch.cuda.get_device_name(0)
    one_gpu = backend == "gloo"
    return {"machine": f"1 x {name}, {p} ranks sharing it over gloo" if one_gpu else f"{p} x {name}",
            "gpu": name, "torch": torch.__version__}


def worker(rank: int, p: int, init: str, args) -> None:
    # gloo: every rank on GPU 0 (the one-GPU measurement); NCCL: a GPU per rank, by the one rule
    if args.device == "cuda":
        where = place(rank, p, 1 if args.backend == "gloo" else torch.cuda.device_count())
        if args.backend == "nccl" and where.shared:
            raise SystemExit(f"--backend nccl needs a GPU per rank ({where}); NCCL refuses ranks "
                             f"that share a GPU: use --backend gloo")
        torch.cuda.set_device(where.device)
    dist.init_process_group(args.backend, init_method=init, rank=rank, world_size=p)
    try:
        with (torch.cuda.stream(torch.cuda.Stream()) if args.side_stream else contextlib.nullcontext()):
            recs = run(rank, p, args)
        if rank == 0 and args.out:
            import harness

            stamp = time.strftime("%Y%m%dT%H%M%S")
            info = {**machine(args.backend, p, args.device),
                    "commit": os.environ.get("ZIPCCL_COMMIT", "")}
            harness.append_records(args.out, [{**r, **info, "run": stamp} for r in recs])
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--ranks", type=int, default=2, help="ranks to spawn (without torchrun)")
    ap.add_argument("--loopback", action="store_true",
                    help="one rank: the compressed path through a slot to itself (Policy.loopback)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: CPU tensors over gloo (no GPU; the host path of the CPU codec)")
    ap.add_argument("--sizes-mib", type=lambda s: [float(v) for v in s.split(",")], default=[1, 16, 64, 256])
    ap.add_argument("--ops", type=lambda s: s.split(","), default=list(OPS))
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed calls, back to back, before the timed ones (default: --calls): a "
                         "burst as deep as the timed one, after the call that records zipccl's own "
                         "graph, so that the spill channel's pool of call blocks is as deep as the "
                         "timed calls keep in flight, as after a training loop's first steps")
    ap.add_argument("--queue-ms", type=float, default=0.0)
    ap.add_argument("--out", default="")
    ap.add_argument("--profile", type=lambda s: s.split(","), default=[],
                    help="op:MiB pairs to profile on rank 0 with cProfile (e.g. all_gather:16)")
    ap.add_argument("--profile-lines", type=int, default=30)
    ap.add_argument("--calls-by-function", default="",
                    help="append, per op and size, how often one warm call enters each zipccl "
                         "function (rank 0) to this JSON-lines file")
    ap.add_argument("--side-stream", action="store_true",
                    help="call on a stream of its own (as FSDP2 does): zipccl then replays a kept "
                         "call as its own CUDA graph over NCCL (the default stream cannot be captured)")
    ap.add_argument("--graph", action="store_true",
                    help="also capture each call in a CUDA graph and time its replay (NCCL)")
    ap.add_argument("--single", action="store_true",
                    help="one process: the host cost of the slot path's launch-bearing pieces alone")
    ap.add_argument("--stages", action="store_true",
                    help="time the caller's thread in each zipccl stage (STAGES) and record it")
    args = ap.parse_args(argv)
    if args.loopback and args.ranks != 1:
        ap.error("--loopback needs --ranks 1")
    if args.device == "cpu" and args.backend != "gloo":
        ap.error("--device cpu needs --backend gloo")
    if args.queue_ms and args.backend != "nccl":
        ap.error("--queue-ms needs --backend nccl (gloo blocks inside its transfer)")
    if args.single:
        recs = single_process_costs(args)
        if args.out:
            import harness

            info = {**machine("nccl", 1), "machine": f"1 x {torch.cuda.get_device_name(0)}, one process"}
            harness.append_records(args.out, [{**r, **info, "run": time.strftime("%Y%m%dT%H%M%S")}
                                              for r in recs])
        return 0
    if "RANK" in os.environ:  # under torchrun
        rank, p = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        worker(rank, p, "env://", args)
        return 0
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args.ranks, f"file://{tmp}/store", args), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
