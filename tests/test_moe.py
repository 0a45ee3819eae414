"""The expert-parallel MoE layer (experiments/moe_ep.py) and the exact-length all-to-all
(experiments/exact_length.py), on 2 gloo ranks.

Two CPU ranks (two plain processes with the variables torchrun would set) run this file's
``worker`` once per session and write their checks to JSON; the tests read them. Checks:

- the layer forward and backward with dispatch and combine through the native all-to-all,
  zipccl's (``slots``), zipccl's with the codec off (``raw``) and the exact-length one
  (``exact``): output and every gradient the same bits (skewed and balanced routing); the
  compressed runs really compressed, the raw runs went through the exchange uncompressed; a corrupted
  all-to-all (one bit flipped) is caught by the same comparison;
- the exact-length all-to-all on uneven BF16 splits (zero rows one way, every row one way,
  none at all, edge-case bit patterns, NaN payloads) against
  ``torch.distributed.all_to_all_single``, bit for bit; a receiver expecting more rows than
  its peer sends raises ValueError, and the ranks go on (their transfers stayed matched).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LAYER_CHECKS = [f"layer/{v}/skew{s}" for s in ("1.0", "4.2") for v in ("raw", "slots", "exact")] + \
    ["layer/compressed", "layer/raw_wire", "layer/corruption_detected"]
SPLITS = {"even": ([3, 3], [3, 3]), "none_back": ([5, 0], [7, 2]), "all_out": ([0, 9], [4, 1]),
          "empty": ([0, 0], [0, 0]), "single": ([1, 1], [0, 1])}  # rank 0's / rank 1's input splits
EXACT_CHECKS = [f"exact/{name}/{kind}" for name in SPLITS for kind in ("gauss", "edges")] + \
    ["exact/mismatch_raises"]


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    from conftest import need_torch

    need_torch()  # missing torch fails, as in every torch suite
    out = tmp_path_factory.mktemp("moe_ranks")
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(out)], cwd=ROOT,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        outs = [pr.communicate(timeout=300)[0] for pr in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("the MoE ranks did not finish in 300 s (a hang?)")
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    assert all(pr.returncode == 0 for pr in procs), "\n".join(o[-3000:] for o in outs)
    return [json.load(open(out / f"rank{r}.json")) for r in range(2)]


@pytest.mark.parametrize("name", LAYER_CHECKS + EXACT_CHECKS)
def test_rank_check(rank_results, name):
    for r, res in enumerate(rank_results):
        assert name in res, f"rank {r} did not run {name}"
        assert res[name]["ok"], f"rank {r}: {name}: {res[name]['detail']}"


def test_skew_is_reached():
    """The router bias solved for a target skew gives at least that ratio on the calibration sample."""
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import moe_ep

    assert moe_ep.solve_alpha(1.0, 8) == 0.0
    for skew in (1.5, 4.2):
        assert moe_ep.rank0_ratio(moe_ep.solve_alpha(skew, 8), 8) >= skew


# -- the ranks ----------------------------------------------------------------------------------------

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


def worker(out_dir: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, HERE)  # conftest's generators
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    res: dict = {}
    for check in (check_layer, check_exact_length):
        try:
            check(rank, world, res)
        except Exception:  # recorded, so that the test names what failed
            _record(res, f"{check.__name__}/crashed", False, traceback.format_exc()[-2000:])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    worker(sys.argv[1])
