"""Two gloo ranks on the CPU run every zipccl.torch check once, then the MoE checks of
``moe_ranks.py``; tests/test_torch.py and tests/test_moe.py read the results (``conftest``'s
``torch_rank_results``: once per session).

``python tests/torchdist/ranks.py OUT_DIR [NPROC]`` starts the ranks (``launch``); each
runs the checks below in the same order and writes ``OUT_DIR/rank<r>.json``:
``{check: {"ok": bool, "detail": str}}``. A check compares bit patterns (uint16 or uint32
views), never values. Every rank derives every rank's inputs from seeds, so
each can compute the expected result of a reduction itself.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for conftest's generators


def bits(t) -> np.ndarray:
    """The bit patterns of a tensor (16- or 32-bit), as a NumPy array."""
    import torch

    t = t.detach().contiguous().reshape(-1).cpu()
    if t.element_size() == 2:
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    if t.element_size() == 4:
        return t.view(torch.int32).numpy().view(np.uint32).copy()
    return t.view(torch.uint8).numpy().copy()


def bf16(u16: np.ndarray):
    """A BF16 tensor holding exactly the bit patterns ``u16``."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(u16, dtype=np.uint16).view(np.int16).copy()).view(
        torch.bfloat16)


def rank_input(kind: str, n: int, r: int) -> np.ndarray:
    from conftest import edge_corpus, gaussian_bits

    if kind == "gauss":
        return gaussian_bits(n, sigma=0.02 * (r + 1), seed=100 + r)
    c = edge_corpus()
    return np.roll(np.resize(c, n), 37 * r)  # each rank its own alignment of the corpus


def avg_bits(summed: np.ndarray, p: int) -> np.ndarray:
    """zipccl's AVG from its stated sum, in NumPy: BF16(FP32(sum) / p), NaN -> 0x7FC0."""
    from zipccl.comm.reduction import bf16_bits_to_f32, f32_to_bf16_bits

    with np.errstate(invalid="ignore"):
        return f32_to_bf16_bits(bf16_bits_to_f32(summed) / np.float32(p))


def first_diff(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"shapes {a.shape} vs {b.shape}"
    bad = np.flatnonzero(a != b)
    if not bad.size:
        return "equal"
    i = int(bad[0])
    return f"{bad.size} of {a.size} differ; first at {i}: {a[i]:#06x} vs {b[i]:#06x}"


# ---------------------------------------------------------------------------------------------

def record(res: dict, name: str, a: np.ndarray, b: np.ndarray) -> None:
    """``res[name]``: do the bit patterns ``a`` and ``b`` agree?"""
    res[name] = {"ok": bool(a.shape == b.shape and np.array_equal(a, b)), "detail": first_diff(a, b)}


def record_nan_rule(res: dict, name: str, ours: np.ndarray, torch_bits: np.ndarray) -> None:
    """As ``record``, torch's NaNs counted as 0x7FC0: torch's BF16 division writes NaN as
    0xFFFF (vectorised loop) or 0x7FC0 (scalar tail), by position; zipccl always 0x7FC0."""
    nan = (torch_bits & 0x7F80) == 0x7F80
    nan &= (torch_bits & 0x007F) != 0
    a, b = ours.copy(), torch_bits.copy()
    b[nan] = 0x7FC0
    res[name] = {"ok": bool(np.array_equal(a, b)),
                 "detail": f"{first_diff(a, b)} ({int(nan.sum())} NaNs in torch's result)"}


#: (input kind, elements per rank) of the BF16 collective checks
KINDS = (("gauss", 5003), ("corpus", 9118))


def _collectives():
    """(always, chunked: many pipeline rounds of 4096 elements) for one check."""
    import zipccl.torch as zt

    return zt.Collectives("always"), zt.Collectives("always", chunk_bytes=8192)


def check_all_gather(rank: int, p: int, res: dict) -> None:
    """Out of place, in place (FSDP2's call), chunked; torch's own as reference."""
    import torch
    import torch.distributed as dist

    always, chunked = _collectives()
    for kind, n in KINDS:
        x = bf16(rank_input(kind, n, rank))
        ref = torch.empty(p * n, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(ref, x)
        out = torch.empty_like(ref)
        always.all_gather_into_tensor(out, x)
        record(res, f"all_gather/{kind}", bits(out), bits(ref))
        out = torch.zeros_like(ref)
        out[rank * n:(rank + 1) * n].copy_(x)
        always.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
        record(res, f"all_gather_in_place/{kind}", bits(out), bits(ref))
        out = torch.empty_like(ref)
        chunked.all_gather_into_tensor(out, x)
        record(res, f"all_gather_chunked/{kind}", bits(out), bits(ref))


def _stated(kind: str, n: int, rank: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """(every rank's input cut to p equal blocks, zipccl's stated sum of them), from seeds."""
    from zipccl.comm.reduction import reduce_sum_bf16

    m = n // p
    full = np.stack([rank_input(kind, n, r)[:p * m] for r in range(p)])
    total = np.empty(p * m, dtype=np.uint16)
    reduce_sum_bf16(np.ascontiguousarray(full), total)
    return full, total


def check_reduce_scatter(rank: int, p: int, res: dict) -> None:
    """SUM and AVG, in one round and chunked: zipccl's stated reduction, and torch's bits."""
    import torch
    import torch.distributed as dist

    always, chunked = _collectives()
    for kind, n in KINDS:
        full, total = _stated(kind, n, rank, p)
        m = n // p
        stated = total[rank * m:(rank + 1) * m]  # the sum is element-wise: this rank's block
        xs = bf16(full[rank])
        for opname, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
            ref = torch.empty(m, dtype=torch.bfloat16)
            dist.reduce_scatter_tensor(ref, xs.clone(), op=op)
            for label, coll in (("", always), ("_chunked", chunked)):
                out = torch.empty(m, dtype=torch.bfloat16)
                coll.reduce_scatter_tensor(out, xs, op)
                expect = stated if opname == "sum" else avg_bits(stated, p)
                record(res, f"reduce_scatter{label}_{opname}_stated/{kind}", bits(out), expect)
                (record if opname == "sum" else record_nan_rule)(
                    res, f"reduce_scatter{label}_{opname}_vs_torch/{kind}", bits(out), bits(ref))


def check_all_reduce(rank: int, p: int, res: dict) -> None:
    """SUM and AVG of the whole buffer (near-equal shards): the stated reduction, torch's bits."""
    import torch.distributed as dist

    always, _ = _collectives()
    for kind, n in KINDS:
        full, total = _stated(kind, n, rank, p)
        xs = bf16(full[rank])
        for opname, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
            buf, ref = xs.clone(), xs.clone()
            dist.all_reduce(ref, op=op)
            always.all_reduce(buf, op)
            expect = total if opname == "sum" else avg_bits(total, p)
            record(res, f"all_reduce_{opname}_stated/{kind}", bits(buf), expect)
            (record if opname == "sum" else record_nan_rule)(
                res, f"all_reduce_{opname}_vs_torch/{kind}", bits(buf), bits(ref))


def check_all_to_all(rank: int, p: int, res: dict) -> None:
    """Equal blocks and uneven row splits (2-D tensors: splits count rows)."""
    import torch
    import torch.distributed as dist

    always, _ = _collectives()
    for kind, _n in KINDS:
        rows = 2 * p * 7
        x2 = bf16(rank_input(kind, rows * 33, rank)).reshape(rows, 33)
        ref, out = torch.empty_like(x2), torch.empty_like(x2)
        dist.all_to_all_single(ref, x2)
        always.all_to_all_single(out, x2)
        record(res, f"all_to_all/{kind}", bits(out), bits(ref))
        split = [[(3 * s + 1 + r) for s in range(p)] for r in range(p)]  # rank r sends split[r][s]
        for r in range(p):
            split[r][-1] = rows - sum(split[r][:-1])
        recv = [split[r][rank] for r in range(p)]
        ref = torch.empty(sum(recv), 33, dtype=torch.bfloat16)
        out = torch.empty_like(ref)
        dist.all_to_all_single(ref, x2, recv, split[rank])
        always.all_to_all_single(out, x2, recv, split[rank])
        record(res, f"all_to_all_uneven/{kind}", bits(out), bits(ref))


def check_stats(rank: int, p: int, res: dict) -> None:
    """``stats`` counts every call, in total and per collective, and the bytes it saved."""
    import torch
    import torch.distributed as dist

    always, _ = _collectives()
    x = bf16(rank_input("gauss", 4096, rank))
    always.all_gather_into_tensor(torch.empty(p * 4096, dtype=torch.bfloat16), x)
    always.all_gather_into_tensor(torch.empty(p * 4096, dtype=torch.bfloat16), x)
    always.reduce_scatter_tensor(torch.empty(4096 // p, dtype=torch.bfloat16), x.clone())
    always.all_reduce(x.clone(), dist.ReduceOp.AVG)
    always.all_to_all_single(torch.empty_like(x), x)
    st = always.stats
    per = st.per_op()
    counts = {op: (c["calls"], c["compressed_calls"]) for op, c in per.items()}
    summed = {k: sum(c[k] for c in per.values()) for k in st.as_dict()}
    ok = (counts == {"all_gather": (2, 2), "reduce_scatter": (1, 1), "all_reduce": (1, 1),
                     "all_to_all": (1, 1)}
          and summed == st.as_dict() and st.compressed_calls == st.calls == 5
          and all(0 < c["wire_bytes"] < c["raw_bytes"] for c in per.values()))
    res["compressed_calls_counted"] = {"ok": bool(ok), "detail": f"{st} {per}"}


def check_passthrough(rank: int, p: int, res: dict) -> None:
    """Other dtypes and other ops pass through torch.distributed's own collective."""
    import torch
    import torch.distributed as dist

    always, _ = _collectives()
    f = torch.arange(12, dtype=torch.int32) * (rank + 1)
    ref, out = f.clone(), f.clone()
    dist.all_reduce(ref)
    always.all_reduce(out)
    xm = bf16(rank_input("gauss", 64, rank))
    ref_max, out_max = xm.clone(), xm.clone()
    dist.all_reduce(ref_max, op=dist.ReduceOp.MAX)
    always.all_reduce(out_max, op=dist.ReduceOp.MAX)
    ok = np.array_equal(bits(out), bits(ref)) and np.array_equal(bits(out_max), bits(ref_max))
    st = always.stats
    res["passthrough_int32_and_max"] = {
        "ok": bool(ok and st.compressed_calls == 0 and st.of("all_reduce").calls == 2),
        "detail": f"{st} {st.per_op()}"}


def check_never(rank: int, p: int, res: dict) -> None:
    """policy="never" is torch.distributed itself."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    never = zt.Collectives("never")
    x = bf16(rank_input("gauss", 4096, rank))
    ref, out = torch.empty(p * 4096, dtype=torch.bfloat16), torch.empty(p * 4096, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(ref, x)
    never.all_gather_into_tensor(out, x)
    res["never_is_native"] = {"ok": bool(np.array_equal(bits(out), bits(ref))
                                         and never.stats.compressed_calls == 0 and never.stats.calls == 1),
                              "detail": str(never.stats)}


def check_async_work(rank: int, p: int, res: dict) -> None:
    """async_op=True: a Work whose wait() returns, result already in place; the module-level
    functions count into the ``stats`` they are given, per collective too."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    x = bf16(rank_input("gauss", 4096, rank))
    ref = torch.empty(p * 4096, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(ref, x)
    out = torch.empty(p * 4096, dtype=torch.bfloat16)
    stats = zt.Stats()
    work = zt.all_gather_into_tensor(out, x, async_op=True, policy="always", stats=stats)
    waited = work.wait()
    ok = (isinstance(work, dist.Work) and waited and np.array_equal(bits(out), bits(ref))
          and stats.compressed_calls == 1 and list(stats.per_op()) == ["all_gather"]
          and stats.of("all_gather").as_dict() == stats.as_dict())
    res["async_work"] = {"ok": bool(ok), "detail": f"{type(work).__name__} wait={waited} {stats}"}


def check_megatron(rank: int, p: int, res: dict) -> None:
    """Megatron-shaped: handle with .wait() even for async_op=False."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    x = bf16(rank_input("gauss", 4096, rank))
    ref = torch.empty(p * 4096, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(ref, x)
    mc = zt.MegatronComm(policy="always")
    out = torch.empty(p * 4096, dtype=torch.bfloat16)
    h = mc.all_gather(out, x, group=None, async_op=False)
    h.wait()
    xs = bf16(rank_input("gauss", p * 1000, rank))
    rs, rs_ref = torch.empty(1000, dtype=torch.bfloat16), torch.empty(1000, dtype=torch.bfloat16)
    mc.reduce_scatter(rs, xs, op=dist.ReduceOp.SUM, group=None, async_op=True).wait()
    dist.reduce_scatter_tensor(rs_ref, xs)
    ok = np.array_equal(bits(out), bits(ref)) and np.array_equal(bits(rs), bits(rs_ref))
    res["megatron"] = {"ok": bool(ok and mc.stats.compressed_calls == 2), "detail": str(mc.stats)}


def check_transport(rank: int, p: int, res: dict) -> None:
    """The transport's alltoallv with gaps between regions (packed into and out of staging);
    regions not named must stay untouched."""
    import zipccl.torch as zt

    tr = zt.ProcessGroupTransport(None, "cpu")
    send = np.arange(64, dtype=np.uint8) + 64 * rank
    sc, sd = [5, 7], [40, 3]  # to rank k: sc[k] bytes at sd[k]; out of order and apart
    rd = [50, 10]  # from rank j: into recv[rd[j]:]
    recv = np.full(64, 255, dtype=np.uint8)
    tr.alltoallv(send, sc, sd, recv, [sc[rank]] * p, rd)
    expect = np.full(64, 255, dtype=np.uint8)
    for j in range(p):
        peer_send = np.arange(64, dtype=np.uint8) + 64 * j
        expect[rd[j]:rd[j] + sc[rank]] = peer_send[sd[rank]:sd[rank] + sc[rank]]
    record(res, "transport_alltoallv_gaps", recv, expect)


def check_agreement(rank: int, p: int, res: dict) -> None:
    """A problem on one rank raises the same error on every rank."""
    from zipccl.comm.agreement import Agreement
    from zipccl.torch.transport import ProcessGroupTransport

    agree = Agreement(ProcessGroupTransport(None, "cpu"), p).agree
    try:
        agree("bad frame" if rank == 1 else None)
        res["agreement"] = {"ok": False, "detail": "no error raised"}
    except Exception as e:  # noqa: BLE001
        res["agreement"] = {"ok": type(e).__name__ == "CollectiveError" and "rank 1: bad frame" in str(e),
                            "detail": str(e)}
    check_own_control(rank, p, res)


def check_own_control(rank: int, p: int, res: dict) -> None:
    """A group with no backend for CPU tensors (here gloo for CUDA tensors only, as an NCCL
    group is): the control exchanges go over a gloo backend of zipccl's own among its ranks,
    on the host; ints, flags, maxima and objects arrive in rank order."""
    import torch
    import torch.distributed as dist

    from zipccl.comm.agreement import Agreement
    from zipccl.torch.transport import ProcessGroupTransport

    group = dist.new_group(backend="cuda:gloo")
    tr = ProcessGroupTransport(group, "cpu")
    table = np.zeros((p, 3), dtype=np.int64)
    tr.allgather_ints(np.array([rank, 10 * rank, -rank]), table)
    wrong = [] if table.tolist() == [[r, 10 * r, -r] for r in range(p)] else [f"ints {table.tolist()}"]
    if tr.any_flag(rank == p - 1) is not True or tr.any_flag(False) is not False:
        wrong.append("any_flag")
    if tr.max_int(7 * (rank + 1)) != 7 * p:
        wrong.append("max_int")
    got = tr.allgather_objects({"rank": rank, "text": "x" * (5 * rank)})
    if got != [{"rank": r, "text": "x" * (5 * r)} for r in range(p)]:
        wrong.append(f"objects {got}")
    try:
        Agreement(tr, p).agree("bad frame" if rank == 0 else None)
        wrong.append("no error raised")
    except Exception as e:  # noqa: BLE001
        if type(e).__name__ != "CollectiveError" or "rank 0: bad frame" not in str(e):
            wrong.append(str(e))
    own = tr._ctl is not None and tr._ctl is not group._get_backend(torch.device("cuda"))
    res["agreement_own_control"] = {"ok": not wrong and own,
                                    "detail": "; ".join(wrong) or f"control over {type(tr._ctl).__name__}"}


def run_checks(checks, rank: int, p: int, res: dict) -> None:
    """Each check in turn; one that raises is recorded under its own name (the test that
    reads a result it did not write names it) and the next still runs."""
    for check in checks:
        try:
            check(rank, p, res)
        except Exception:  # noqa: BLE001 -- reported per check, the test says which
            res[check.__name__] = {"ok": False, "detail": traceback.format_exc()}


def check_collectives(rank: int, p: int, res: dict) -> None:
    """The BF16 collectives and the layer around them, one named check after another."""
    run_checks((check_all_gather, check_reduce_scatter, check_all_reduce, check_all_to_all, check_stats,
                check_passthrough, check_never, check_async_work, check_megatron, check_transport,
                check_agreement), rank, p, res)


# ---------------------------------------------------------------------------------------------

def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 96),
                               torch.nn.GELU(), torch.nn.Linear(96, 8))


def _batch(rank: int, step: int, dims: tuple[int, int] = (48, 8)):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, dims[0], generator=g), torch.randn(16, dims[1], generator=g)


def train_fsdp(rank: int, variant: str, steps: int = 4, reduce_dtype=None):
    """Losses (fp32 bits) and local parameter shards (fp32 bits) after ``steps`` AdamW steps."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import zipccl.torch as zt

    model = _model(7)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype or torch.bfloat16)
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    hooks = zt.compress_fsdp(model, policy=variant) if variant != "native" else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    params = np.concatenate([bits(p.to_local()) for p in model.parameters()])
    return np.concatenate([bits(v.reshape(1)) for v in losses]), params, hooks


def train_ddp(rank: int, variant: str, steps: int = 4, dtype=None, model=None,
              bucket_cap_mb: float = 0.01, dims: tuple[int, int] = (48, 8)):
    """Like ``train_fsdp``, DDP on a BF16 model (``dtype``: another, e.g. torch.float32);
    ``model`` builds another model (seeded) of ``dims`` inputs and outputs."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zipccl.torch as zt

    dtype = dtype or torch.bfloat16
    model = (model or (lambda: _model(11)))().to(dtype)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)  # by default, several buckets
    state = None
    if variant != "native":
        state = zt.DDPCommState(policy=variant)
        ddp.register_comm_hook(state, zt.ddp_comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x, y = _batch(rank, step, dims)
        loss = torch.nn.functional.mse_loss(ddp(x.to(dtype)).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    params = np.concatenate([bits(p) for p in ddp.parameters()])
    return np.concatenate([bits(v.reshape(1)) for v in losses]), params, state


def check_training(rank: int, p: int, res: dict) -> None:
    for name, train in (("fsdp", train_fsdp), ("ddp", train_ddp)):
        base_l, base_p, _ = train(rank, "native")
        for variant in ("never", "always"):
            loss, params, hooks = train(rank, variant)
            st = hooks.stats
            want = st.compressed_calls > 0 if variant == "always" else st.compressed_calls == 0
            res[f"{name}_{variant}"] = {
                "ok": bool(np.array_equal(loss, base_l) and np.array_equal(params, base_p) and want
                           and st.calls > 0),
                "detail": f"losses {first_diff(loss, base_l)}; params {first_diff(params, base_p)}; {st}"}


def wide_input(dtype: str, kind: str, n: int, r: int) -> np.ndarray:
    """FP32 / FP16 values of rank ``r``: Gaussian, or with every FP16 pattern / FP32 edge
    patterns (every exponent, NaN payloads, subnormals, +-0, +-inf) among them."""
    rng = np.random.default_rng(300 + r)
    x = rng.normal(0.0, 0.02 * (r + 1), n).astype(dtype)
    if kind == "corpus":
        u = np.uint32 if dtype == "float32" else np.uint16
        edges = (np.array([(s << 31) | (e << 23) | m for s in (0, 1) for e in range(256)
                           for m in (0, 1, 0x400000, 0x7FFFFF)] + [0x7FA5A5A5, 0xFFC00001], u)
                 if dtype == "float32" else np.arange(1 << 16).astype(np.uint16))
        k = min(n, edges.size)
        x.view(u)[rng.permutation(n)[:k]] = np.roll(edges, 37 * r)[:k]
    return x


def check_wide_collectives(rank: int, p: int, res: dict) -> None:
    """FP32 and FP16 through zipccl.torch, compressed, against torch.distributed (gloo) bit for
    bit; NaN results compared by position (zipccl writes the canonical quiet NaN)."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    always = zt.Collectives("always")
    chunked = zt.Collectives("always", chunk_bytes=16384)

    def record(name: str, ours, theirs, canonical: int | None = None) -> None:
        """Equal bits; with ``canonical`` (reductions) torch's NaNs count as that pattern."""
        a, b = bits(ours), bits(theirs)
        dt = np.float32 if a.dtype == np.uint32 else np.float16
        nan = np.isnan(b.view(dt)) if canonical is not None else np.zeros(b.size, bool)
        if canonical is not None:
            b[nan] = canonical
        res[name] = {"ok": bool(np.array_equal(a, b)),
                     "detail": f"{first_diff(a, b)} ({int(nan.sum())} NaNs in torch's result)"}

    for dtype, canonical in (("float32", 0x7FC00000), ("float16", 0x7E00)):
        tdt = getattr(torch, dtype)
        for kind, n in (("gauss", 20_011), ("corpus", 70_002)):
            before = always.stats.compressed_calls
            x = torch.from_numpy(wide_input(dtype, kind, n, rank))
            ref = torch.empty(p * n, dtype=tdt)
            dist.all_gather_into_tensor(ref, x)
            out = torch.empty_like(ref)
            always.all_gather_into_tensor(out, x)
            record(f"wide_all_gather_{dtype}/{kind}", out, ref)  # moves bits: NaN payloads too
            m = n // p
            xs = x[:p * m].clone()
            for opname, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
                for label, coll in (("", always), ("_chunked", chunked)):
                    ref, out = torch.empty(m, dtype=tdt), torch.empty(m, dtype=tdt)
                    dist.reduce_scatter_tensor(ref, xs.clone(), op=op)
                    coll.reduce_scatter_tensor(out, xs, op)
                    record(f"wide_reduce_scatter{label}_{opname}_{dtype}/{kind}", out, ref, canonical)
                buf, ref = xs.clone(), xs.clone()
                dist.all_reduce(ref, op=op)
                always.all_reduce(buf, op)
                record(f"wide_all_reduce_{opname}_{dtype}/{kind}", buf, ref, canonical)
            ref, out = torch.empty_like(xs), torch.empty_like(xs)
            dist.all_to_all_single(ref, xs)
            always.all_to_all_single(out, xs)
            record(f"wide_all_to_all_{dtype}/{kind}", out, ref)
            calls = always.stats.compressed_calls - before
            res[f"wide_compressed_{dtype}/{kind}"] = {"ok": calls == 6, "detail": f"{calls} compressed"}


def _all_compressed_and_same_bits(res: dict, name: str, train, rank: int, **kw) -> None:
    """``train`` natively and with zipccl "always": the same loss and parameter bits, and every
    call compressed."""
    base_l, base_p, _ = train(rank, "native", **kw)
    loss, params, hooks = train(rank, "always", **kw)
    st = hooks.stats
    res[name] = {
        "ok": bool(np.array_equal(loss, base_l) and np.array_equal(params, base_p)
                   and 0 < st.compressed_calls == st.calls),
        "detail": f"losses {first_diff(loss, base_l)}; params {first_diff(params, base_p)}; {st}"}


def check_fsdp_fp32_reduce(rank: int, p: int, res: dict) -> None:
    """FP32 reduce buffers are compressed too: every call, and the same bits as without zipccl."""
    import torch

    _all_compressed_and_same_bits(res, "fsdp_fp32_reduce", train_fsdp, rank, reduce_dtype=torch.float32)


def check_ddp_fp32(rank: int, p: int, res: dict) -> None:
    """DDP's default, FP32 gradient buckets: compressed by the hook, the same bits as without it."""
    import torch

    _all_compressed_and_same_bits(res, "ddp_fp32", train_ddp, rank, dtype=torch.float32)


def check_ddp_fp32_threads(rank: int, p: int, res: dict) -> None:
    """DDP of an FP32 model (Linear 256 -> 1024 -> 10, SGD, 5 steps; DDP's default buckets:
    one of 273,418 gradients) through the hook with "always", and nothing holding torch's
    thread count: the same loss and parameter bits as native DDP, and torch's thread count
    as the process started (the CPU codec must leave the caller's OpenMP settings alone;
    torch's CPU kernels give other bits on another thread count). Runs before any other
    check, so that its compressions are the process's first."""
    import torch

    def model():
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10))

    threads = torch.get_num_threads()
    expect = int(os.environ.get("OMP_NUM_THREADS", threads))
    _all_compressed_and_same_bits(res, "ddp_fp32_threads", train_ddp, rank, steps=5,
                                  dtype=torch.float32, model=model, bucket_cap_mb=25, dims=(256, 10))
    after = torch.get_num_threads()
    res["ddp_fp32_threads"]["ok"] &= threads == expect == after
    res["ddp_fp32_threads"]["detail"] += (f"; torch threads: OMP_NUM_THREADS {expect}, "
                                          f"before {threads}, after {after}")


def check_single_names(rank: int, p: int, res: dict) -> None:
    """torch 2.13's names, all_gather_single / reduce_scatter_single, as functions and as
    Collectives methods: the same functions as the old names, torch.distributed's bits (or
    its stated sum), and no FutureWarning from zipccl's own calls into torch (compressed or
    native)."""
    import warnings

    import torch
    import torch.distributed as dist

    import zipccl.torch as zt
    from zipccl.comm.reduction import reduce_sum_bf16

    n, m = 4099, 2048
    x = bf16(rank_input("gauss", n, rank))
    full = np.stack([rank_input("gauss", p * m, r) for r in range(p)])
    stated = np.empty(m, dtype=np.uint16)
    reduce_sum_bf16(np.ascontiguousarray(full[:, rank * m:(rank + 1) * m]), stated)
    ref = torch.empty(p * n, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old name on torch >= 2.13
        dist.all_gather_into_tensor(ref, x)
    same = (zt.all_gather_single is zt.all_gather_into_tensor
            and zt.reduce_scatter_single is zt.reduce_scatter_tensor
            and zt.Collectives.all_gather_single is zt.Collectives.all_gather_into_tensor
            and zt.Collectives.reduce_scatter_single is zt.Collectives.reduce_scatter_tensor)
    wrong = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for policy in ("always", "never"):
            out, rs = torch.empty_like(ref), torch.empty(m, dtype=torch.bfloat16)
            zt.all_gather_single(out, x, policy=policy)
            zt.reduce_scatter_single(rs, bf16(full[rank]), policy=policy)
            wrong += [f"{policy} all_gather_single"] * (not np.array_equal(bits(out), bits(ref)))
            wrong += [f"{policy} reduce_scatter_single"] * (not np.array_equal(bits(rs), stated))
            coll = zt.Collectives(policy)
            out = torch.empty_like(ref)
            coll.all_gather_single(out, x)
            wrong += [f"{policy} Collectives.all_gather_single"] * (
                not np.array_equal(bits(out), bits(ref)))
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    res["single_names"] = {"ok": bool(same and not wrong and not future),
                           "detail": f"aliases {same}; wrong {wrong}; FutureWarnings {future}"}


def check_loopback(rank: int, p: int, res: dict) -> None:
    """``Policy("always", loopback=True)`` on a one-rank group of each rank: the compressed path
    through a slot to itself gives each collective its input back (BF16, FP32, FP16; the sums of
    one rank, the value); a planned signature replays, new contents exact, and another tensor is
    planned anew."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt
    from zipccl.comm import Policy

    groups = [dist.new_group([r]) for r in range(p)]  # every rank makes every group
    me = groups[rank]
    zc = zt.Collectives(Policy("always", loopback=True), chunk_bytes=8 << 10)  # several rounds
    wrong = []
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        g = torch.Generator().manual_seed(7 + rank)
        x = (torch.randn(3 << 12, generator=g) * 0.02).to(dtype)
        view = torch.int32 if dtype == torch.float32 else torch.int16
        o = torch.empty_like(x)
        for name in ("all_gather", "reduce_scatter", "all_to_all", "all_to_all_uneven"):
            o.zero_()
            if name == "all_gather":
                zc.all_gather_into_tensor(o, x, group=me)
            elif name == "reduce_scatter":
                zc.reduce_scatter_tensor(o, x, group=me)
            elif name == "all_to_all":
                zc.all_to_all_single(o, x, group=me)
            else:
                zc.all_to_all_single(o, x, [x.numel()], [x.numel()], group=me)
            wrong += [f"{name}/{dtype}"] * (not torch.equal(o.view(view), x.view(view)))
        y = x.clone()
        zc.all_reduce(y, group=me)
        wrong += [f"all_reduce/{dtype}"] * (not torch.equal(y.view(view), x.view(view)))
    s = zc.stats
    counted = s.calls == s.compressed_calls == 15 and 0 < s.wire_bytes < s.raw_bytes
    loop = "loopback" in str(zc.last_decision)
    x = torch.empty(5000, dtype=torch.bfloat16)
    o = torch.empty_like(x)
    zc2 = zt.Collectives(Policy("always", loopback=True))
    for seed in range(3):
        x.copy_((torch.randn(5000, generator=torch.Generator().manual_seed(seed)) * 0.02).to(x.dtype))
        zc2.all_gather_into_tensor(o, x, group=me)
        wrong += [f"replay {seed}"] * (not torch.equal(o.view(torch.int16), x.view(torch.int16)))
    planned = len(zc2._core.plans)
    y = x.clone() + 1
    zc2.all_gather_into_tensor(o, y, group=me)
    wrong += ["another tensor"] * (not torch.equal(o.view(torch.int16), y.view(torch.int16)))
    replans = planned == 1 and len(zc2._core.plans) == 2
    res["loopback"] = {"ok": not wrong and counted and loop and replans,
                       "detail": f"wrong {wrong}; counted {counted}; decision {zc.last_decision}; "
                                 f"plans {planned} then {len(zc2._core.plans)}"}


def main(rank: int, p: int, out_dir: str) -> None:
    import zipccl  # noqa: F401 -- before torch: does it load torch?
    import zipccl.comm  # noqa: F401

    res: dict = {}
    lazy = "torch" not in sys.modules and "zipccl.torch" not in sys.modules
    res["import_zipccl_without_torch"] = {"ok": lazy, "detail": f"import zipccl loaded torch: {not lazy}"}
    import torch.distributed as dist

    # No torch.set_num_threads here: OMP_NUM_THREADS (``launch``) sets torch's thread count,
    # and zipccl must leave it as it is (check_ddp_fp32_threads, first, checks that).
    dist.init_process_group("gloo", rank=rank, world_size=p)
    import moe_ranks

    for check in (check_ddp_fp32_threads, check_collectives, check_wide_collectives, check_training,
                  check_fsdp_fp32_reduce, check_ddp_fp32, check_single_names, check_loopback,
                  moe_ranks.check_layer, moe_ranks.check_exact_length):
        try:
            check(rank, p, res)
        except Exception:  # noqa: BLE001 -- reported per check, the test says which
            res[check.__name__] = {"ok": False, "detail": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f, indent=1)
    dist.destroy_process_group()


def launch(out_dir: str, nproc: int = 2, timeout: float = 240.0) -> None:
    """Start ``nproc`` ranks of this script (plain processes: the parent never imports torch)."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore::FutureWarning")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), out_dir, str(nproc), str(r)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(nproc)]
    try:
        for pr in procs:
            out, _ = pr.communicate(timeout=timeout)
            if pr.returncode:
                raise RuntimeError(f"a rank exited with {pr.returncode}:\n{out[-4000:]}")
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()


if __name__ == "__main__":
    out, nproc = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    if len(sys.argv) > 3:
        main(int(sys.argv[3]), nproc, out)
    else:
        launch(out, nproc)
