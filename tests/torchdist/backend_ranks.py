"""Two CPU ranks under ``init_process_group("cpu:zipccl")`` run the backend's checks once;
tests/test_torch_backend.py reads the results.

``python tests/torchdist/backend_ranks.py OUT_DIR`` runs the ranks (``launch``); each
runs the checks below in the same order and writes ``OUT_DIR/rank<r>.json``:
``{check: {"ok": bool, "detail": str}}``. The world group is zipccl's with
``ZIPCCL_POLICY=always`` (set by ``launch``); a plain gloo group over the same ranks
is the reference every check compares against, bit for bit (uint16 / uint32 views).
The "auto" checks use groups of their own (``new_group(backend="zipccl")``) with
``ZIPCCL_CACHE_DIR`` and ``ZIPCCL_CALIBRATION_SIZES`` from ``launch``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for conftest's generators

from ranks import _batch, _model, bits, first_diff  # noqa: E402 -- after the path is set


def _ok(res: dict, name: str, ok, detail="") -> None:
    res[name] = {"ok": bool(ok), "detail": str(detail)}


def _same(res: dict, name: str, got, want) -> None:
    a, b = bits(got), bits(want)
    _ok(res, name, a.shape == b.shape and np.array_equal(a, b), first_diff(a, b))


def _data(dtype, n: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 0.02).to(dtype)


# ---------------------------------------------------------------------------------------------

def check_registration(rank: int, p: int, res: dict, gloo) -> None:
    import torch.distributed as dist

    import zipccl.torch as zt

    pg = dist.distributed_c10d._get_default_group()
    _ok(res, "registered", isinstance(pg, zt.ZipProcessGroup) and dist.get_backend() == "cpu:zipccl"
        and pg.policy_mode == "always" and pg.name() == "zipccl",
        f"{type(pg).__name__} {dist.get_backend()} {pg.policy_mode} {pg.name()}")


def check_compressed_ops(rank: int, p: int, res: dict, gloo) -> None:
    """Every compressed collective on the zipccl world group equals the same call on gloo."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import zipccl.torch as zt

    R = dist.ReduceOp
    zt.reset_stats()
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        tag = str(dtype).split(".")[-1]
        x = _data(dtype, 4096, 10 + rank)
        outs = [torch.empty(p * 4096, dtype=dtype) for _ in range(2)]
        for o, g in zip(outs, (None, gloo), strict=True):
            dist.all_gather_into_tensor(o, x, group=g)
        _same(res, f"all_gather_into_tensor/{tag}", *outs)
        big = _data(dtype, p * 2048, 20 + rank)
        for red, op in (("sum", R.SUM), ("avg", R.AVG)):
            outs = [torch.empty(2048, dtype=dtype) for _ in range(2)]
            for o, g in zip(outs, (None, gloo), strict=True):
                dist.reduce_scatter_tensor(o, big, op=op, group=g)
            _same(res, f"reduce_scatter_tensor_{red}/{tag}", *outs)
            bufs = [big.clone() for _ in range(2)]
            for b, g in zip(bufs, (None, gloo), strict=True):
                dist.all_reduce(b, op=op, group=g)
            _same(res, f"all_reduce_{red}/{tag}", *bufs)
        # messages of a few thousand values: a slot's fixed part (its 128-byte header, the
        # frame's) is then small beside the saving, as the stats check below asks
        outs = [torch.empty(4096, dtype=dtype) for _ in range(2)]
        for o, g in zip(outs, (None, gloo), strict=True):
            dist.all_to_all_single(o, x, group=g)
        _same(res, f"all_to_all_single/{tag}", *outs)
        # uneven: rank r sends 300 + 10 * (r + j) rows to rank j, rows of 8 values
        send = [300 + 10 * (rank + j) for j in range(p)]
        recv = [300 + 10 * (j + rank) for j in range(p)]
        xi = _data(dtype, sum(send) * 8, 30 + rank).reshape(-1, 8)
        outs = [torch.empty(sum(recv), 8, dtype=dtype) for _ in range(2)]
        for o, g in zip(outs, (None, gloo), strict=True):
            dist.all_to_all_single(o, xi, recv, send, group=g)
        _same(res, f"all_to_all_single_uneven/{tag}", *outs)
        lists = [[torch.empty(64, 8, dtype=dtype) for _ in range(p)] for _ in range(2)]
        for lst, g in zip(lists, (None, gloo), strict=True):
            dist.all_gather(lst, x[:512].reshape(64, 8), group=g)
        _same(res, f"all_gather_list/{tag}", torch.cat(lists[0]), torch.cat(lists[1]))
        outs = [torch.empty(64, 8, dtype=dtype) for _ in range(2)]
        for o, g in zip(outs, (None, gloo), strict=True):
            dist.reduce_scatter(o, list(big[:p * 512].reshape(p, 64, 8)), group=g)
        _same(res, f"reduce_scatter_list/{tag}", *outs)
        a = dist.all_gather_into_tensor(torch.empty(p * 4096, dtype=dtype), x, async_op=True)
        _ok(res, f"async_work/{tag}", a.wait() and a.is_completed(), "")
        # functional collectives (DTensor's path) reach the group's methods from C++
        got = funcol.all_reduce(big, "sum", dist.distributed_c10d._get_default_group()).wait()
        want = big.clone()
        dist.all_reduce(want, group=gloo)
        _same(res, f"functional_all_reduce/{tag}", got, want)
    st = zt.stats()
    ok = all(st[op]["compressed_calls"] > 0 and 0 < st[op]["wire_bytes"] <= st[op]["raw_bytes"]
             and st[op]["saved_bytes"] == st[op]["raw_bytes"] - st[op]["wire_bytes"]
             for op in ("all_gather", "reduce_scatter", "all_to_all", "all_reduce"))
    _ok(res, "stats_per_collective", ok and st["passthrough"] == {}, json.dumps(st))


def check_passthrough(rank: int, p: int, res: dict, gloo) -> None:
    """Every other op on the zipccl world group: the same result as on gloo, counted as passed."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    R = dist.ReduceOp
    zt.reset_stats()
    x = _data(torch.bfloat16, 1000, 40 + rank)

    def both(name, fn):
        """fn(group) -> tensor, on the zipccl group (None) and on gloo: the same bits."""
        try:
            _same(res, f"pass/{name}", fn(None), fn(gloo))
        except Exception:  # noqa: BLE001 -- reported per op
            _ok(res, f"pass/{name}", False, traceback.format_exc())

    def bcast(g):
        t = x.clone()
        dist.broadcast(t, src=1, group=g)
        return t

    def ar(op, dtype):
        def f(g):
            t = (x * 100).to(dtype)
            dist.all_reduce(t, op=op, group=g)
            return t
        return f

    def reduce(g):
        t = x.clone()
        dist.reduce(t, dst=0, group=g)
        return t

    def gather(g):
        out = [torch.empty_like(x) for _ in range(p)] if rank == 0 else None
        dist.gather(x, out, dst=0, group=g)
        return torch.cat(out) if rank == 0 else x

    def scatter(g):
        t = torch.empty_like(x)
        dist.scatter(t, [x + i for i in range(p)] if rank == 0 else None, src=0, group=g)
        return t

    def alltoall_list(g):
        outs = [torch.empty(250, dtype=torch.bfloat16) for _ in range(p)]
        dist.all_to_all(outs, list(x[:250 * p].reshape(p, 250)), group=g)
        return torch.cat(outs)

    def sendrecv(g):
        t = x.clone() if rank == 0 else torch.empty_like(x)
        if rank == 0:
            dist.send(t, dst=1, group=g)
        elif rank == 1:
            dist.recv(t, src=0, group=g)
        return t

    def batch_p2p(g):
        peer = (rank + 1) % p
        t = torch.empty_like(x)
        ops = [dist.P2POp(dist.isend, x, group_peer=peer, group=g),
               dist.P2POp(dist.irecv, t, group_peer=(rank - 1) % p, group=g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return t

    def ag_int(g):
        out = torch.empty(p * 7, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.arange(7) * (rank + 3), group=g)
        return out

    def rs_max(g):
        out = torch.empty(500, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, x, op=R.MAX, group=g)
        return out

    def objects(g):
        out = [None] * p
        dist.all_gather_object(out, {"rank": rank, "v": [rank] * 3}, group=g)
        box = [{"from": rank}]
        dist.broadcast_object_list(box, group=g, group_src=1)
        return torch.tensor([o["rank"] for o in out] + [box[0]["from"]], dtype=torch.int32)

    def barriers(g):
        dist.barrier(group=g)
        return torch.zeros(1, dtype=torch.int32)

    for name, fn in (("broadcast", bcast), ("all_reduce_max_bf16", ar(R.MAX, torch.bfloat16)),
                     ("all_reduce_min_fp32", ar(R.MIN, torch.float32)),
                     ("all_reduce_sum_int32", ar(R.SUM, torch.int32)),
                     ("all_reduce_product_fp32", ar(R.PRODUCT, torch.float32)),
                     ("reduce", reduce), ("gather", gather), ("scatter", scatter),
                     ("all_to_all_list", alltoall_list), ("send_recv", sendrecv),
                     ("batch_isend_irecv", batch_p2p), ("all_gather_int64", ag_int),
                     ("reduce_scatter_max", rs_max), ("objects", objects), ("barriers", barriers)):
        both(name, fn)
    st = zt.stats()
    compressed = sum(st[op]["compressed_calls"] for op in ("all_gather", "reduce_scatter",
                                                           "all_to_all", "all_reduce"))
    want = {"broadcast", "allreduce", "reduce", "gather", "scatter", "alltoall", "send", "recv",
            "barrier", "all_gather_single", "allgather", "reduce_scatter_single"}
    _ok(res, "pass/counted", compressed == 0 and want <= set(st["passthrough"]), json.dumps(st))


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- the error itself is what is compared
        text = re.sub(r"\[rank\d+\]:?|\[[A-Z]\d+ [\d:. ]+[^\]]*\]", "", str(e).splitlines()[0])
        return f"{type(e).__name__}: {text.strip()}"
    return "no error"


def check_mismatch_errors(rank: int, p: int, res: dict, gloo) -> None:
    """Calls torch rejects raise the same error type and message on zipccl as on gloo (and one it
    lets through, rows that do not split evenly, is let through alike)."""
    import torch
    import torch.distributed as dist

    bf = torch.bfloat16
    x = torch.ones(8, dtype=bf)
    cases = {
        "all_gather_wrong_size": lambda g: dist.all_gather_into_tensor(torch.empty(p * 8 + 1, dtype=bf), x,
                                                                      group=g),
        "all_gather_wrong_dtype": lambda g: dist.all_gather_into_tensor(torch.empty(p * 8), x, group=g),
        "reduce_scatter_wrong_size": lambda g: dist.reduce_scatter_tensor(torch.empty(3, dtype=bf), x,
                                                                         group=g),
        "all_to_all_bad_splits": lambda g: dist.all_to_all_single(torch.empty(8, dtype=bf), x,
                                                                  [1, 7], [3, 4], group=g),
        "all_to_all_indivisible_rows": lambda g: dist.all_to_all_single(torch.empty(9, dtype=bf),
                                                                   torch.ones(9, dtype=bf), group=g),
        "all_reduce_premul_sum": lambda g: dist.all_reduce(x.clone(), op=dist._make_nccl_premul_sum(0.5),
                                                           group=g),
        "all_gather_list_mixed": lambda g: dist.all_gather(
            [torch.empty(8, dtype=bf), torch.empty(9, dtype=bf)], x, group=g),
    }
    for name, call in cases.items():
        got, want = _error(lambda c=call: c(None)), _error(lambda c=call: c(gloo))
        raises = want != "no error" or name == "all_to_all_indivisible_rows"
        _ok(res, f"error/{name}", got == want and raises, f"zipccl {got!r} vs gloo {want!r}")
    # torch's own check by backend name, as for "cpu:gloo,cuda:nccl" (docs/TORCH.md says so)
    got = _error(lambda: dist.monitored_barrier())
    _ok(res, "error/monitored_barrier_by_name", "only implemented for GLOO" in got, got)


def _fit(rank: int, module, opt, dtype, steps: int = 2) -> np.ndarray:
    """``steps`` optimizer steps on the ranks' batches; the losses' FP32 bits."""
    import torch

    def step(k: int):
        x, y = _batch(rank, k)
        loss = torch.nn.functional.mse_loss(module(x.to(dtype)).float(), y)
        loss.backward()
        opt.step(), opt.zero_grad()
        return bits(loss.detach().reshape(1))
    return np.concatenate([step(k) for k in range(steps)])


def _train_fsdp(rank: int, group):
    """FSDP2 per layer and at the root, BF16 params and reductions, on ``group`` (None: the world)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = _model(7)
    mesh = DeviceMesh.from_group(group, "cpu") if group is not None else None
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for module in [m for m in model if any(True for _ in m.parameters())] + [model]:
        fully_shard(module, mesh=mesh, mp_policy=mp)
    losses = _fit(rank, model, torch.optim.AdamW(model.parameters(), lr=1e-2), torch.float32)
    return losses, np.concatenate([bits(q.to_local()) for q in model.parameters()])


def _train_ddp(rank: int, group, dtype):
    """DDP of a ``dtype`` model in several buckets on ``group`` (None: the world)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(11).to(dtype), process_group=group, bucket_cap_mb=0.01)
    losses = _fit(rank, ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), dtype)
    return losses, np.concatenate([bits(q) for q in ddp.parameters()])


def check_training(rank: int, p: int, res: dict, gloo) -> None:
    """FSDP2 and DDP on the zipccl world group ("always") == the same on gloo, bit for bit."""
    import torch

    import zipccl.torch as zt

    runs = {"fsdp2": lambda g: _train_fsdp(rank, g),
            "ddp_fp32": lambda g: _train_ddp(rank, g, torch.float32),
            "ddp_bf16": lambda g: _train_ddp(rank, g, torch.bfloat16)}
    for name, run in runs.items():
        base_l, base_p = run(gloo)
        zt.reset_stats()
        loss, params = run(None)
        st = zt.stats()
        need = ("all_gather", "reduce_scatter") if name == "fsdp2" else ("all_reduce",)
        counted = all(st[op]["compressed_calls"] > 0 for op in need)
        _ok(res, f"train/{name}", np.array_equal(loss, base_l) and np.array_equal(params, base_p)
            and counted, f"losses {first_diff(loss, base_l)}; params {first_diff(params, base_p)}; "
            f"{json.dumps({op: st[op] for op in need})}")


def check_auto(rank: int, p: int, res: dict, gloo) -> None:
    """"auto" groups: calibrate on first use, cache, reload, explain, decide alike on every rank."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt
    from zipccl.costmodel import OPS
    from zipccl.torch import autotune

    auto = zt.BackendOptions(policy="auto")
    g1 = dist.new_group(backend="zipccl", pg_options=auto)
    _ok(res, "auto/not_calibrated_before_use", "not calibrated yet" in zt.explain("all_gather", 1 << 20, g1),
        zt.explain("all_gather", 1 << 20, g1))
    x = _data(torch.bfloat16, 4096, 50 + rank)
    out, want = torch.empty(p * 4096, dtype=torch.bfloat16), torch.empty(p * 4096, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, x, group=g1)  # the first eligible call: calibrates
    dist.all_gather_into_tensor(want, x, group=gloo)
    _same(res, "auto/first_call_result", out, want)
    cal = autotune.calibration(g1, "cpu")
    path = cal.path if cal else None
    on_disk = rank != 0 or (path is not None and os.path.exists(path))
    _ok(res, "auto/calibrated_and_cached", cal is not None and cal.source == "measured" and on_disk
        and path.startswith(os.environ["ZIPCCL_CACHE_DIR"]), f"{cal and (cal.source, cal.path)}")
    sizes = [1 << k for k in range(10, 31, 2)]
    lines = [zt.explain(op, b, g1) for op in OPS for b in sizes]
    shown = all("predicted native" in s and "compressed" in s and "->" in s for s in lines)
    _ok(res, "auto/explain", shown, lines[len(sizes) // 2])
    pol = g1.collectives(torch.device("cpu")).policy
    mine = [(op, b, d.compress, d.native_s, d.compressed_s) for op in OPS for b in sizes
            for d in [pol.decide(op, b, dtype="bfloat16", device=False, world=p)]]
    every: list = [None] * p
    dist.all_gather_object(every, {"decisions": mine, "profile": cal.profile.to_json()}, group=gloo)
    _ok(res, "auto/same_on_every_rank", all(e == every[0] for e in every),
        f"{sum(d[2] for d in mine)} of {len(mine)} compressed")
    # a second group over the same ranks (what the next job does): the profile comes from the cache
    g2 = dist.new_group(backend="zipccl", pg_options=auto)
    dist.all_reduce(x.clone(), group=g2)
    cal2 = autotune.calibration(g2, "cpu")
    _ok(res, "auto/reloaded_from_cache", cal2 is not None and cal2.source == "cache"
        and cal2.profile.to_json() == cal.profile.to_json() and cal2.path == path,
        f"{cal2 and (cal2.source, cal2.path, round(cal2.seconds, 3))}")
    # a damaged cache file is measured again and replaced
    if rank == 0:
        with open(path, "w") as f:
            f.write("{not json")
    dist.barrier(group=gloo)
    g3 = dist.new_group(backend="zipccl", pg_options=auto)
    dist.all_reduce(x.clone(), group=g3)
    cal3 = autotune.calibration(g3, "cpu")
    ok = cal3 is not None and cal3.source == "measured"
    if rank == 0:
        with open(path) as f:
            ok = ok and json.loads(f.read())["key"] == cal.profile.key
    _ok(res, "auto/damaged_cache_measured_again", ok, f"{cal3 and cal3.source}")
    # "never" as an argument: nothing compressed, the same bits
    g4 = dist.new_group(backend="zipccl", pg_options=zt.BackendOptions(policy="never"))
    o4 = torch.empty(p * 4096, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(o4, x, group=g4)
    st = zt.stats(g4)
    _same(res, "never/result", o4, want)
    ag = st["all_gather"]
    _ok(res, "never/not_compressed", ag["calls"] == 1 and ag["compressed_calls"] == 0
        and "never" in zt.explain("all_gather", 1 << 20, g4), json.dumps(ag))
    # the list form of shaped tensors left native (torch's generic test_all_gather: (1, 1, 1))
    lists = [[torch.empty(8, 4, 2, dtype=torch.bfloat16) for _ in range(p)] for _ in range(2)]
    for lst, g in zip(lists, (g4, gloo), strict=True):
        dist.all_gather(lst, x[:64].reshape(8, 4, 2), group=g)
    _same(res, "never/all_gather_list_shaped", torch.cat(lists[0]), torch.cat(lists[1]))


def main(rank: int, p: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import zipccl.torch  # noqa: F401 -- registers the backend

    torch.set_num_threads(1)
    res: dict = {}
    dist.init_process_group("cpu:zipccl", rank=rank, world_size=p)
    gloo = dist.new_group(backend="gloo")
    for check in (check_registration, check_compressed_ops, check_passthrough, check_mismatch_errors,
                  check_training, check_auto):
        t0 = time.perf_counter()
        try:
            check(rank, p, res, gloo)
            res[f"seconds/{check.__name__}"] = {"ok": True, "detail": f"{time.perf_counter() - t0:.2f}"}
        except Exception:  # noqa: BLE001 -- reported per check, the test says which
            res[check.__name__] = {"ok": False, "detail": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f, indent=1)
    dist.destroy_process_group()


def _rank(rank: int, nproc: int, out_dir: str, env: dict) -> None:
    os.environ.update(env)  # before torch.distributed and zipccl read them
    main(rank, nproc, out_dir)


def launch(out_dir: str, nproc: int = 2) -> None:
    """Run ``nproc`` ranks (``torch.multiprocessing.spawn``: fresh interpreters) with
    ``ZIPCCL_POLICY=always`` and a fresh cache dir; raises if a rank fails."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
           "ZIPCCL_POLICY": "always", "ZIPCCL_CACHE_DIR": os.path.join(out_dir, "cache"),
           "ZIPCCL_CALIBRATION_SIZES": "4096,65536"}
    mp.spawn(_rank, args=(nproc, out_dir, env), nprocs=nproc, join=True)


if __name__ == "__main__":
    launch(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
