"""The zipccl torch.distributed backend on one GPU: two groups of ``gpu_ranks.py``'s checks
(``tests/test_torch_gpu.py`` reads them, one test per check); by hand, these groups alone:

    python tests/torchdist/backend_gpu_check.py [--device cpu]     # needs one GPU and CuPy

1. ``check_backend`` (two ranks sharing the GPU; NCCL refuses that): the world group is
   ``init_process_group("cpu:gloo,cuda:zipccl", pg_options=BackendOptions(policy="always",
   cuda="gloo"))``, gloo moving the CUDA tensors. All-gather, reduce-scatter and all-reduce
   (SUM, AVG), all-to-all (even and uneven) of BF16, FP32 and FP16 CUDA tensors against a
   plain gloo group, bit for bit, with compressed calls counted; FSDP2 (BF16) and DDP (FP32,
   BF16) trained on CUDA through the world group give the losses and parameter bits of the
   same training on the gloo group, with compressed all-gathers / reduce-scatters / all-reduces;
   an "auto" group calibrates on CUDA and explains.
2. ``check_nccl_one_rank`` (one process): ``init_process_group("cpu:gloo,cuda:zipccl")`` over
   NCCL with world size 1; the calls give NCCL's bits (one rank: nothing crosses a link, so
   the policy keeps them native) and are counted.

``--device cpu``: check 1 on CPU tensors with ``"cpu:zipccl"`` (a dry run of this script
without a GPU); check 2 needs a GPU.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpu_slots_check import _record, bits  # noqa: E402 -- after the path is set

DTYPES = ("bfloat16", "float32", "float16")
OPS = ("all_gather_into_tensor", "reduce_scatter_tensor_sum", "reduce_scatter_tensor_avg",
       "all_reduce_sum", "all_reduce_avg", "all_to_all_single", "all_to_all_single_uneven")
TRAINING = ("fsdp2", "ddp_fp32", "ddp_bf16")


def names() -> list[str]:
    """Every check ``check_backend`` records, in order."""
    return (["backend/registered"] + [f"backend/{op}/{dt}" for dt in DTYPES for op in OPS]
            + ["backend/compressed_counted"] + [f"backend/train_{t}" for t in TRAINING]
            + ["backend/auto_calibrated", "backend/auto_result"])


NCCL_NAMES = ["nccl/registered", "nccl/all_gather", "nccl/all_reduce", "nccl/broadcast", "nccl/counted",
              "nccl/loopback_replayed", "nccl/captured"]


def backend_spec(device: str) -> str:
    return "cpu:gloo,cuda:zipccl" if device == "cuda" else "cpu:zipccl"


def _data(dtype: str, n: int, seed: int, device: str):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 0.02).to(getattr(torch, dtype)).to(device)


def _both(res: dict, name: str, call, gloo) -> None:
    """``call(group)`` -> tensor on the zipccl world group (None) and on gloo: the same bits."""
    try:
        _record(res, name, bits(call(None)), bits(call(gloo)))
    except Exception as e:  # noqa: BLE001 -- recorded per check
        res[name] = {"ok": False, "detail": f"{type(e).__name__}: {e}"}


def _collectives(rank: int, p: int, res: dict, device: str, gloo, dtype: str) -> None:
    import torch
    import torch.distributed as dist

    R, tdt = dist.ReduceOp, getattr(torch, dtype)
    x = _data(dtype, 1 << 16, 10 + rank, device)
    big = _data(dtype, p * (1 << 15), 20 + rank, device)

    def ag(g):
        out = torch.empty(p * x.numel(), dtype=tdt, device=device)
        dist.all_gather_into_tensor(out, x, group=g)
        return out

    def rs(op):
        def f(g):
            out = torch.empty(big.numel() // p, dtype=tdt, device=device)
            dist.reduce_scatter_tensor(out, big, op=op, group=g)
            return out
        return f

    def ar(op):
        def f(g):
            t = big.clone()
            dist.all_reduce(t, op=op, group=g)
            return t
        return f

    def a2a(g):
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=g)
        return out

    def a2a_uneven(g):  # rank r sends 3000 + 100 (r + j) rows of 8 values to rank j
        send = [3000 + 100 * (rank + j) for j in range(p)]
        recv = [3000 + 100 * (j + rank) for j in range(p)]
        xi = _data(dtype, sum(send) * 8, 30 + rank, device).reshape(-1, 8)
        out = torch.empty(sum(recv), 8, dtype=tdt, device=device)
        dist.all_to_all_single(out, xi, recv, send, group=g)
        return out

    calls = (ag, rs(R.SUM), rs(R.AVG), ar(R.SUM), ar(R.AVG), a2a, a2a_uneven)
    for op, call in zip(OPS, calls, strict=True):
        _both(res, f"backend/{op}/{dtype}", call, gloo)


def _train(rank: int, kind: str, group, device: str) -> np.ndarray:
    """Loss and parameter bits after 3 steps of ``kind`` on ``group`` (None: the world)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(7)
    dtype = torch.bfloat16 if kind == "ddp_bf16" else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    model = model.to(device=device, dtype=dtype)
    if kind == "fsdp2":
        mesh = DeviceMesh.from_group(group, device) if group is not None else None
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        for m in (model[0], model[2], model):
            fully_shard(m, mesh=mesh, mp_policy=mp)
        params = lambda: [q.to_local() for q in model.parameters()]  # noqa: E731
        module = model
    else:
        module = DDP(model, process_group=group, bucket_cap_mb=0.01,
                     device_ids=[0] if device == "cuda" else None)
        params = lambda: list(module.parameters())  # noqa: E731
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    losses = []
    for step in range(3):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(module(x.to(device, dtype)).float(), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(bits(loss.detach().reshape(1)))
    return np.concatenate(losses + [bits(q).view(np.uint16) for q in params()])


def check_backend(rank: int, p: int, res: dict, device: str, gloo) -> None:
    """Every check of ``names()``; the world group is zipccl's ("always"), ``gloo`` plain gloo."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    pg = dist.distributed_c10d._get_default_group()
    res["backend/registered"] = {"ok": isinstance(pg, zt.ZipProcessGroup) and pg.policy_mode == "always",
                                 "detail": f"{type(pg).__name__} {dist.get_backend()}"}
    zt.reset_stats()
    for dtype in DTYPES:
        _collectives(rank, p, res, device, gloo, dtype)
    st = zt.stats()
    res["backend/compressed_counted"] = {
        "ok": all(st[op]["compressed_calls"] > 0 for op in ("all_gather", "reduce_scatter", "all_to_all",
                                                             "all_reduce")), "detail": json.dumps(st)}
    for kind in TRAINING:
        name = f"backend/train_{kind}"
        try:
            want = _train(rank, kind, gloo, device)
            zt.reset_stats()
            got = _train(rank, kind, None, device)
            st = zt.stats()
            need = ("all_gather", "reduce_scatter") if kind == "fsdp2" else ("all_reduce",)
            _record(res, name, got, want)
            res[name]["ok"] &= all(st[op]["compressed_calls"] > 0 for op in need)
            res[name]["detail"] += "; " + json.dumps({op: st[op] for op in need})
        except Exception as e:  # noqa: BLE001 -- recorded per check
            res[name] = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
    auto = dist.new_group(backend="zipccl", pg_options=zt.BackendOptions(policy="auto", cuda="gloo"))
    x = _data("bfloat16", 1 << 16, 50 + rank, device)
    outs = [torch.empty(p * x.numel(), dtype=x.dtype, device=device) for _ in range(2)]
    dist.all_gather_into_tensor(outs[0], x, group=auto)  # the first eligible call calibrates
    dist.all_gather_into_tensor(outs[1], x, group=gloo)
    _record(res, "backend/auto_result", bits(outs[0]), bits(outs[1]))
    cal = zt.autotune.calibration(auto, device)
    res["backend/auto_calibrated"] = {
        "ok": cal is not None and cal.source == "measured",
        "detail": f"{cal and (cal.source, cal.path)}; " + zt.explain("all_gather", 1 << 26, auto, device)}


def check_nccl_one_rank(res: dict) -> None:
    """Every check of ``NCCL_NAMES``, in a process of world size 1 over NCCL."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    dist.init_process_group("cpu:gloo,cuda:zipccl", rank=0, world_size=1)
    pg = dist.distributed_c10d._get_default_group()
    res["nccl/registered"] = {"ok": isinstance(pg, zt.ZipProcessGroup), "detail": type(pg).__name__}
    x = _data("bfloat16", 1 << 20, 3, "cuda")
    out = torch.empty_like(x)
    dist.all_gather_into_tensor(out, x)
    _record(res, "nccl/all_gather", bits(out), bits(x))
    y = x.clone()
    dist.all_reduce(y)
    _record(res, "nccl/all_reduce", bits(y), bits(x))
    dist.broadcast(y, src=0)
    _record(res, "nccl/broadcast", bits(y), bits(x))
    dist.barrier()
    torch.cuda.synchronize()
    st = zt.stats()
    res["nccl/counted"] = {"ok": st["all_gather"]["calls"] >= 1 and st["all_reduce"]["calls"] >= 1,
                           "detail": json.dumps(st)}
    check_loopback_and_capture(res, x)
    dist.destroy_process_group()


def check_loopback_and_capture(res: dict, x) -> None:
    """One rank over NCCL, ``Policy.loopback``: the compressed path planned, then replayed from
    its plan, bit-exact; then captured in a CUDA graph (over the group's inner NCCL) and
    replayed, bit-exact (tests/test_graph_gpu.py checks graphs further)."""
    import torch

    import zipccl.torch as zt
    from zipccl.comm import Policy

    zc = zt.Collectives(Policy("always", loopback=True))
    out = torch.empty_like(x)
    for _ in range(3):
        out.zero_()
        zc.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()
    _record(res, "nccl/loopback_replayed", bits(out), bits(x))
    ok, detail = False, ""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            zc.all_gather_into_tensor(out, x)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        ok = bool(torch.equal(out.view(torch.int16), x.view(torch.int16)))
        detail = "replayed, exact" if ok else "replayed, differs"
    except Exception as e:  # noqa: BLE001 -- recorded: any error is the failure
        detail = f"{type(e).__name__}: {e}"
    res["nccl/captured"] = {"ok": ok, "detail": detail[:500]}


if __name__ == "__main__":
    import gpu_ranks

    sys.exit(gpu_ranks.by_hand(sys.argv[1:], "backend"))
