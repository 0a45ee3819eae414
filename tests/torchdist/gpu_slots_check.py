"""zipccl.torch's slot and spill paths on CUDA tensors, 2 processes sharing one GPU over gloo.

``check_slots`` is one group of ``gpu_ranks.py``'s checks (``tests/test_torch_gpu.py`` reads
them, one test per case); by hand, this group alone:

    python tests/torchdist/gpu_slots_check.py [--device cpu]     # needs one GPU and CuPy

Two ranks share GPU 0 (gloo moves CUDA tensors; NCCL refuses two ranks on one GPU). Every
compressed collective of ``zt.Collectives("always")`` over a plain gloo group is compared bit
for bit with its oracle: all-gathers and all-to-alls with every rank's input (derived from
seeds), sums with the stated reduction (``collectives.reduce_sum``) of the gathered inputs.
Data: Gaussian (slots fit), random bit patterns (RAW frames: every frame spills) and a mix;
capacity: the default rule, and none at all (``{"nbytes": 0}``: any escape spills). After the
calls the sticky error word must be clear. ``--device cpu``: the same checks on CPU tensors
(the host engine), smaller, to check this script without a GPU.
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DTYPES = ("bfloat16", "float32", "float16")
KINDS = ("gaussian", "bits", "mixed")
SIZES = {"cuda": (4097, 300_000), "cpu": (4097, 20_011)}
CAPACITIES = {"default": None, "none": {"nbytes": 0}}
OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_to_all_uneven", "all_reduce")


def names(device: str = "cuda") -> list[str]:
    """Every check ``check_slots`` records on ``device``, in order."""
    cases = [f"slots/{op}/{dt}/{kind}/n{n}/cap_{cap}" for cap in CAPACITIES for dt in DTYPES
             for kind in KINDS for n in SIZES[device] for op in OPS]
    return cases + [f"slots/sticky_error_clear/cap_{cap}" for cap in CAPACITIES]


def data(kind: str, dtype: str, rank: int, n: int, seed: int, device: str):
    """Rank ``rank``'s input: a function of the arguments only."""
    import torch

    rng = np.random.default_rng([seed, rank, n, DTYPES.index(dtype), KINDS.index(kind)])
    tdt = getattr(torch, dtype)
    if kind == "gaussian":
        return torch.from_numpy(rng.normal(0, 0.02, n).astype(np.float32)).to(tdt).to(device)
    isz = 2 if dtype != "float32" else 4
    raw = rng.integers(0, 1 << (8 * isz), n, dtype=np.uint64)
    if kind == "mixed":  # the first half Gaussian, the rest random bit patterns
        g = torch.from_numpy(rng.normal(0, 0.02, n).astype(np.float32)).to(tdt)
        raw[: n // 2] = bits(g)[: n // 2]
    ints = raw.astype(np.uint16 if isz == 2 else np.uint32).view(np.int16 if isz == 2 else np.int32)
    return torch.from_numpy(ints.copy()).view(tdt).to(device)


def bits(t) -> np.ndarray:
    """Bit patterns (uint16 / uint32) of a tensor, on the host."""
    import torch

    t = t.detach().cpu().contiguous().reshape(-1)
    if t.element_size() == 2:
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    return t.view(torch.int32).numpy().view(np.uint32).copy()


def stated_sum(parts) -> np.ndarray:
    """The stated reduction of ``parts`` (FP32 in rank order, one rounding), as bit patterns."""
    import torch

    from zipccl.comm.reduction import reduce_sum

    def engine_view(t):
        a = t.detach().cpu().contiguous()
        return a.view(torch.int16).numpy().view(np.uint16) if a.dtype == torch.bfloat16 else a.numpy()

    stack = np.stack([engine_view(q) for q in parts])
    out = np.empty_like(stack[0])
    reduce_sum(stack, out)
    return out.view(np.uint16 if out.dtype.itemsize == 2 else np.uint32)


def _record(res: dict, name: str, got: np.ndarray, want: np.ndarray) -> None:
    bad = np.flatnonzero(got != want) if got.shape == want.shape else None
    ok = bad is not None and bad.size == 0
    detail = "equal" if ok else (f"shapes {got.shape} vs {want.shape}" if bad is None
                                 else f"{bad.size} of {got.size} differ, first at {bad[0]}")
    res[name] = {"ok": bool(ok), "detail": detail}


def _one_case(zc, group, rank: int, p: int, dtype: str, kind: str, n: int, device: str) -> dict:
    """{op: (got bits, expected bits)} of one input: the five collectives."""
    import torch

    tdt = getattr(torch, dtype)
    parts = [data(kind, dtype, r, p * n, 1, device) for r in range(p)]
    x = parts[rank]
    out = {}
    ag = torch.empty(p * n, dtype=tdt, device=device)
    zc.all_gather_into_tensor(ag, x[:n], group=group, async_op=True).wait()  # orders the stream
    out["all_gather"] = (bits(ag), np.concatenate([bits(q[:n]) for q in parts]))
    rs = torch.empty(n, dtype=tdt, device=device)
    zc.reduce_scatter_tensor(rs, x, group=group)
    out["reduce_scatter"] = (bits(rs), stated_sum([q[rank * n:(rank + 1) * n] for q in parts]))
    a2a = torch.empty(p * n, dtype=tdt, device=device)
    zc.all_to_all_single(a2a, x, group=group)
    out["all_to_all"] = (bits(a2a), np.concatenate([bits(q[rank * n:(rank + 1) * n]) for q in parts]))
    splits = [n + 7 * (1 - 2 * (s % 2)) for s in range(p)]  # n + 7, n - 7, ...: uneven
    starts = np.concatenate([[0], np.cumsum(splits)])
    recv = [parts[r][starts[rank]:starts[rank + 1]] for r in range(p)]
    un = torch.empty(sum(q.numel() for q in recv), dtype=tdt, device=device)
    zc.all_to_all_single(un, x, [q.numel() for q in recv], splits, group=group)
    out["all_to_all_uneven"] = (bits(un), np.concatenate([bits(q) for q in recv]))
    ar = x.clone()
    zc.all_reduce(ar, group=group)
    out["all_reduce"] = (bits(ar), stated_sum(parts))
    return out


def check_slots(rank: int, p: int, res: dict, device: str, group) -> None:
    """Every case of ``names(device)`` over the plain gloo ``group``."""
    import torch

    import zipccl.torch as zt

    for cap, capacity in CAPACITIES.items():
        zc = zt.Collectives("always", capacity=capacity, compress_host=True)
        for dtype in DTYPES:
            for kind in KINDS:
                for n in SIZES[device]:
                    case = f"{dtype}/{kind}/n{n}/cap_{cap}"
                    try:
                        for op, (got, want) in _one_case(zc, group, rank, p, dtype, kind, n,
                                                         device).items():
                            _record(res, f"slots/{op}/{case}", got, want)
                    except Exception as e:  # noqa: BLE001 -- recorded under every op of the case
                        for op in OPS:
                            res[f"slots/{op}/{case}"] = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
        if device == "cuda":
            torch.cuda.synchronize()
        errors = [ch.error_text() for ch in zc._core.channels().values()]
        res[f"slots/sticky_error_clear/cap_{cap}"] = {
            "ok": bool(zc._core.channels()) and not any(errors),
            "detail": f"{len(zc._core.channels())} channels; errors {errors}"}


if __name__ == "__main__":
    import gpu_ranks

    sys.exit(gpu_ranks.by_hand(sys.argv[1:], "slots"))
