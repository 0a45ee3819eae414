"""The MoE checks that tests/torchdist/ranks.py's two gloo ranks run after their own, and
tests/test_moe.py reads (its docstring says what each checks): the expert-parallel layer of
experiments/moe_ep.py and the exact-length all-to-all of experiments/exact_length.py. Run there,
the ranks' start-up (torch's import above all) is paid once for both files.

Each check writes ``res[name] = {"ok": bool, "detail": str}`` under the names ``LAYER_CHECKS``
and ``EXACT_CHECKS``.
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SPLITS = {"even": ([3, 3], [3, 3]), "none_back": ([5, 0], [7, 2]), "all_out": ([0, 9], [4, 1]),
          "empty": ([0, 0], [0, 0]), "single": ([1, 1], [0, 1])}  # rank 0's / rank 1's input splits
LAYER_CHECKS = [f"layer/{v}/skew{s}" for s in ("1.0", "4.2") for v in ("raw", "slots", "exact")] + \
    ["layer/compressed", "layer/raw_wire", "layer/corruption_detected"]
EXACT_CHECKS = [f"exact/{name}/{kind}" for name in SPLITS for kind in ("gauss", "edges")] + \
    ["exact/mismatch_raises"]


def _bits(t) -> np.ndarray:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.int16).numpy().view(np.uint16).copy()


def _record(res: dict, name: str, ok: bool, detail: str) -> None:
    res[name] = {"ok": bool(ok), "detail": detail}


def check_layer(rank: int, world: int, res: dict) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import moe_ep

    cfg = moe_ep.Config(hidden=32, experts=8, ffn=48, tokens=(96,), skews=(1.0, 4.2), iters=1, warmup=0)
    device = torch.device("cpu")
    params = moe_ep.make_params(cfg, rank, world, device)
    g = torch.Generator().manual_seed(5 + rank)
    x = torch.randn(96, cfg.hidden, generator=g).to(torch.bfloat16).requires_grad_()
    dy = (torch.randn(96, cfg.hidden, generator=g) * 1e-2).to(torch.bfloat16)
    compressed, raw_runs = [], []

    def outcome(a2a, bias):
        x.grad = None
        for p in moe_ep.parameters(params):
            p.grad = None
        out = moe_ep.forward_backward(x, dy, params, [bias], a2a, rank, world)
        return moe_ep.results_of(out, x, params)

    def flipped(out, inp, out_splits, in_splits):  # native, then one bit of the first row flipped
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        if out.shape[0]:
            out.view(torch.int16)[0, 0] ^= 1

    for skew in cfg.skews:
        bias = torch.from_numpy(moe_ep.zipf_bias(moe_ep.solve_alpha(skew, cfg.experts), cfg.experts)).float()
        ref = outcome(moe_ep.Timed("native", False), bias)
        for v in ("raw", "slots", "exact"):
            t = moe_ep.Timed(v, False)
            got = outcome(t, bias)
            diff = [moe_ep.differing_bits(a, b) for a, b in zip(got, ref, strict=True)]
            same = all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(got, ref, strict=True))
            _record(res, f"layer/{v}/skew{skew}", same and sum(diff) == 0,
                    f"differing bits per tensor {diff}")
            if v == "raw":  # the exchange with the codec off: more bytes than raw (the headers), never fewer
                raw_runs.append((t.stats.compressed_calls, t.stats.wire_bytes, t.stats.raw_bytes))
            else:
                compressed.append((t.stats.compressed_calls, t.stats.wire_bytes, t.stats.raw_bytes))
        if skew == cfg.skews[-1]:
            bad = outcome(flipped, bias)
            diff = sum(moe_ep.differing_bits(a, b) for a, b in zip(bad, ref, strict=True))
            _record(res, "layer/corruption_detected", diff > 0, f"{diff} differing bits")
    _record(res, "layer/compressed", all(c >= 4 and 0 < w < r for c, w, r in compressed),
            f"(compressed calls, wire, raw) per run: {compressed}")
    _record(res, "layer/raw_wire", all(c >= 4 and w > r > 0 for c, w, r in raw_runs),
            f"(exchange calls, wire, raw) per raw run: {raw_runs}")


def check_exact_length(rank: int, world: int, res: dict) -> None:
    import torch
    import torch.distributed as dist
    from conftest import edge_corpus, gaussian_bits

    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import exact_length

    import zipccl

    width = 300  # elements per row: rows of a message together are not a multiple of a block
    for name, splits in SPLITS.items():
        send_rows = splits[rank]
        recv_rows = [splits[j][rank] for j in range(world)]
        n = sum(send_rows) * width
        for kind in ("gauss", "edges"):
            if kind == "gauss":
                u = gaussian_bits(n, sigma=0.02 * (rank + 1), seed=40 + rank)
            else:
                u = np.roll(np.resize(edge_corpus(), n), 11 * rank)
            inp = torch.from_numpy(u.view(np.int16).copy()).view(torch.bfloat16).reshape(-1, width)
            want = torch.empty(sum(recv_rows), width, dtype=torch.bfloat16)
            got = torch.full_like(want, 7.0)
            dist.all_to_all_single(want, inp, recv_rows, send_rows)
            stats = exact_length.Stats()
            exact_length.all_to_all_single(got, inp, recv_rows, send_rows, stats=stats)
            a, b = _bits(got), _bits(want)
            bad = np.flatnonzero(a != b)
            sent = (sum(send_rows) - send_rows[rank]) * width
            frames = stats.wire_bytes - exact_length.LENGTH_BYTES * (world - 1)
            counted = stats.calls == 1 and stats.raw_bytes == 2 * sent and \
                (0 < frames <= zipccl.max_compressed_size(sent) if sent else frames == 0)
            _record(res, f"exact/{name}/{kind}", bad.size == 0 and counted,
                    f"{bad.size} of {a.size} elements differ; stats {stats.as_dict()}, {sent} sent")
    # rank 1 expects 4 rows from rank 0, which sends 3: rank 1's decode must refuse the frame
    inp = torch.from_numpy(gaussian_bits(5 * width, sigma=0.02, seed=9 + rank).view(np.int16).copy())
    inp = inp.view(torch.bfloat16).reshape(-1, width)
    send_rows, recv_rows = ([2, 3], [2, 3]) if rank == 0 else ([3, 2], [4, 2])
    out = torch.empty(sum(recv_rows), width, dtype=torch.bfloat16)
    try:
        exact_length.all_to_all_single(out, inp, recv_rows, send_rows)
        outcome = "returned"
    except ValueError as e:
        outcome = f"ValueError: {e}"
    want = "returned" if rank == 0 else "ValueError: frame from rank 0"
    dist.barrier()  # both ranks are past the call: it did not leave a transfer unmatched
    _record(res, "exact/mismatch_raises", outcome.startswith(want), outcome[:300])
