"""The zipccl backend on one GPU (an H200): run by hand, ``python tests/torchdist/backend_gpu_check.py``.

1. NCCL, one rank: ``init_process_group("cpu:gloo,cuda:zipccl")``; every compressible call on
   CUDA tensors and the pass-through ops give NCCL's bits (one rank: the policy keeps them
   native: nothing crosses a link).
2. gloo with CUDA tensors, two ranks sharing the GPU (NCCL refuses that):
   ``BackendOptions(policy="always", cuda="gloo")``; all-gather, reduce-scatter (SUM, AVG),
   all-to-all and all-reduce of BF16 CUDA tensors against a plain gloo group, bit for bit, with
   compressed calls counted; then an "auto" group calibrates on CUDA, caches, and explains.

Prints one line per check and exits non-zero if any fails.
"""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def _report(rank: int, name: str, ok: bool, detail: str = "") -> bool:
    print(f"rank {rank}: {'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    return ok


def _equal(a, b) -> bool:
    from ranks import bits

    return bool((bits(a) == bits(b)).all()) and a.shape == b.shape


def one_rank_nccl() -> bool:
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611")
    dist.init_process_group("cpu:gloo,cuda:zipccl", rank=0, world_size=1)
    ok = _report(0, "registered", isinstance(dist.distributed_c10d._get_default_group(), zt.ZipProcessGroup))
    x = torch.randn(1 << 20, device="cuda").bfloat16()
    out = torch.empty_like(x)
    dist.all_gather_into_tensor(out, x)
    ok &= _report(0, "nccl all_gather 1 rank", _equal(out, x))
    y = x.clone()
    dist.all_reduce(y)
    ok &= _report(0, "nccl all_reduce 1 rank", _equal(y, x))
    dist.broadcast(y, src=0)
    dist.barrier()
    ok &= _report(0, "stats", zt.stats()["all_gather"]["calls"] >= 1, str(zt.stats()))
    dist.destroy_process_group()
    return ok


def _two(rank: int, cache: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29612", ZIPCCL_CACHE_DIR=cache,
                      ZIPCCL_CALIBRATION_SIZES="65536,1048576")
    dist.init_process_group("cpu:zipccl", rank=rank, world_size=2,
                            pg_options=zt.BackendOptions(policy="always", cuda="gloo"))
    gloo = dist.new_group(backend="gloo")
    g = torch.Generator(device="cuda").manual_seed(rank)
    x = (torch.randn(1 << 20, device="cuda", generator=g) * 0.02).bfloat16()
    ok = True
    o1, o2 = torch.empty(2 << 20, dtype=x.dtype, device="cuda"), torch.empty(2 << 20, dtype=x.dtype,
                                                                             device="cuda")
    dist.all_gather_into_tensor(o1, x)
    dist.all_gather_into_tensor(o2, x, group=gloo)
    ok &= _report(rank, "gloo-cuda all_gather", _equal(o1, o2))
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        r1, r2 = torch.empty(1 << 19, dtype=x.dtype, device="cuda"), torch.empty(1 << 19, dtype=x.dtype,
                                                                                device="cuda")
        dist.reduce_scatter_tensor(r1, x, op=op)
        dist.reduce_scatter_tensor(r2, x, op=op, group=gloo)
        ok &= _report(rank, f"gloo-cuda reduce_scatter {op}", _equal(r1, r2))
        a1, a2 = x.clone(), x.clone()
        dist.all_reduce(a1, op=op)
        dist.all_reduce(a2, op=op, group=gloo)
        ok &= _report(rank, f"gloo-cuda all_reduce {op}", _equal(a1, a2))
    t1, t2 = torch.empty_like(x), torch.empty_like(x)
    dist.all_to_all_single(t1, x)
    dist.all_to_all_single(t2, x, group=gloo)
    ok &= _report(rank, "gloo-cuda all_to_all", _equal(t1, t2))
    st = zt.stats()
    ok &= _report(rank, "compressed counted", all(st[k]["compressed_calls"] > 0 for k in
                                                 ("all_gather", "reduce_scatter", "all_to_all",
                                                  "all_reduce")), str(st))
    auto = dist.new_group(backend="zipccl", pg_options=zt.BackendOptions(policy="auto", cuda="gloo"))
    dist.all_gather_into_tensor(o1, x, group=auto)
    cal = zt.autotune.calibration(auto, "cuda")
    ok &= _report(rank, "auto calibrated on cuda", cal is not None, f"{cal and (cal.source, cal.path)}")
    for nbytes in (1 << 16, 1 << 20, 1 << 26):
        print(f"rank {rank}: {zt.explain('all_gather', nbytes, auto, 'cuda')}")
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}"), "w") as f:
        f.write("ok" if ok else "fail")


def two_ranks_gloo_cuda() -> bool:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_two, args=(os.path.join(d, "cache"), d), nprocs=2, join=True)
        return all(open(os.path.join(d, f"rank{r}")).read() == "ok" for r in range(2))


if __name__ == "__main__":
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:  # the one-rank job in its own process: a fresh default group after it
        first = pool.apply(one_rank_nccl)
    second = two_ranks_gloo_cuda()
    print("all ok" if first and second else "FAILED")
    sys.exit(0 if first and second else 1)
