"""zipccl.torch's slot and spill paths on CUDA tensors, 2 processes sharing one GPU over gloo.

    python tests/torchdist/gpu_slots_check.py            # needs one GPU and CuPy

Two ranks share GPU 0 (gloo moves CUDA tensors; NCCL refuses two ranks on one GPU). Every
compressed collective is compared bit for bit with its oracle: all-gathers and all-to-alls
with gloo's own result, sums with the stated reduction (``collectives.reduce_sum``) of the
gathered inputs. Data: Gaussian (slots fit), random bit patterns (RAW frames: every frame
spills) and a mix; capacity: the default rule, and none at all (``{"nbytes": 0}``: any escape
spills). After the calls the sticky error word must be clear. Prints one line per case and
``N passed, M failed`` last; exits 1 on any failure.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

DTYPES = (torch.bfloat16, torch.float32, torch.float16)
KINDS = ("gaussian", "bits", "mixed")
SIZES = (4097, 300_000)
CAPACITIES = (None, {"nbytes": 0})


def data(kind: str, dtype, rank: int, n: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng([seed, rank, n, DTYPES.index(dtype), KINDS.index(kind)])
    if kind == "gaussian":
        x = torch.from_numpy(rng.normal(0, 0.02, n).astype(np.float32)).to(dtype)
    else:
        isz = torch.empty(0, dtype=dtype).element_size()
        raw = rng.integers(0, 1 << (8 * isz), n, dtype=np.uint64)
        if kind == "mixed":
            g = rng.normal(0, 0.02, n).astype(np.float32)
            bits = torch.from_numpy(g).to(dtype).view(torch.int16 if isz == 2 else torch.int32)
            raw[: n // 2] = bits.numpy()[: n // 2].astype(np.int64).astype(np.uint64) & ((1 << 8 * isz) - 1)
        ints = raw.astype(np.uint16 if isz == 2 else np.uint32).view(np.int16 if isz == 2 else np.int32)
        x = torch.from_numpy(ints.copy()).view(dtype)
    return x.cuda()


def bits(t: torch.Tensor) -> np.ndarray:
    isz = t.element_size()
    return t.detach().cpu().contiguous().view(torch.int16 if isz == 2 else torch.int32).numpy().copy()


def stated_sum(parts: list[torch.Tensor]) -> np.ndarray:
    from zipccl.comm.collectives import reduce_sum

    stack = np.stack([_engine_view(p) for p in parts])
    out = np.empty_like(stack[0])
    reduce_sum(stack, out)
    return out.view(np.int16 if out.dtype.itemsize == 2 else np.int32)


def _engine_view(t: torch.Tensor) -> np.ndarray:
    a = t.detach().cpu().contiguous()
    if a.dtype == torch.bfloat16:
        return a.view(torch.int16).numpy().view(np.uint16)
    return a.numpy()


def run_cases(rank: int, p: int) -> tuple[int, int]:
    import zipccl.torch as zt

    passed = failed = 0
    for capacity in CAPACITIES:
        zc = zt.Collectives("always", capacity=capacity)
        for dtype in DTYPES:
            for kind in KINDS:
                for n in SIZES:
                    name = f"cap={capacity} {str(dtype)[6:]} {kind} n={n}"
                    x = data(kind, dtype, rank, p * n, 1)
                    parts = [data(kind, dtype, r, p * n, 1) for r in range(p)]
                    got, want = {}, {}
                    out = torch.empty(p * n, dtype=dtype, device="cuda")
                    zc.all_gather_into_tensor(out, x[:n], async_op=True).wait()  # orders the stream
                    got["all_gather"] = bits(out)
                    want["all_gather"] = np.concatenate([bits(q[:n]) for q in parts])
                    rs = torch.empty(n, dtype=dtype, device="cuda")
                    zc.reduce_scatter_tensor(rs, x)
                    got["reduce_scatter"] = bits(rs)
                    want["reduce_scatter"] = stated_sum([q[rank * n:(rank + 1) * n] for q in parts])
                    a2a = torch.empty(p * n, dtype=dtype, device="cuda")
                    zc.all_to_all_single(a2a, x)
                    got["all_to_all"] = bits(a2a)
                    want["all_to_all"] = np.concatenate([bits(q[rank * n:(rank + 1) * n]) for q in parts])
                    splits = [n + 7, n - 7] if p == 2 else None
                    if splits:
                        recv = [parts[r][:splits[0]] if rank == 0 else parts[r][splits[0]:] for r in range(p)]
                        rsplits = [q.numel() for q in recv]
                        un = torch.empty(sum(rsplits), dtype=dtype, device="cuda")
                        zc.all_to_all_single(un, x, rsplits, splits)
                        got["all_to_all_uneven"] = bits(un)
                        want["all_to_all_uneven"] = np.concatenate([bits(q) for q in recv])
                    ar = x.clone()
                    zc.all_reduce(ar)
                    got["all_reduce"] = bits(ar)
                    want["all_reduce"] = stated_sum(parts)
                    torch.cuda.synchronize()
                    for op in got:
                        ok = np.array_equal(got[op], want[op])
                        passed, failed = passed + ok, failed + (not ok)
                        if rank == 0 or not ok:
                            print(f"rank {rank} {'ok  ' if ok else 'FAIL'} {op:18s} {name}", flush=True)
        torch.cuda.synchronize()
        for ch in zc._channels.values():
            err = ch.error_text()
            if err:
                failed += 1
                print(f"rank {rank} FAIL sticky error after cap={capacity}: {err}", flush=True)
            else:
                passed += 1
            stats = ch.spills.stats()
            print(f"rank {rank} spills cap={capacity}: {stats}", flush=True)
    return passed, failed


def worker(rank: int, p: int, init: str, results: str) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=p)
    try:
        passed, failed = run_cases(rank, p)
        with open(f"{results}.{rank}", "w") as f:
            f.write(f"{passed} {failed}\n")
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main() -> int:
    p = 2
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        results = f"{tmp}/result"
        mp.spawn(worker, args=(p, init, results), nprocs=p, join=True)
        totals = [tuple(map(int, open(f"{results}.{r}").read().split())) for r in range(p)]
    passed, failed = sum(t[0] for t in totals), sum(t[1] for t in totals)
    print(f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'default')}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
