"""One rank over NCCL captures zipccl.torch's compressed collectives in a CUDA graph and replays them.

    python tests/torchdist/graph_check.py OUT.json

``Policy("always", loopback=True)`` runs the whole compressed path through a slot to the rank
itself, so one GPU is enough. A step of three collectives (all-gather, reduce-scatter and
all-to-all, several pipeline rounds each) is run eagerly on a side stream (the warm-up CUDA
graphs ask for: it agrees the signatures and makes the buffers), captured with
``torch.cuda.graph`` and replayed on new data each time, with no escape room in the slots
(``capacity={"nbytes": 0}``), so that frames spill at every replay: every output must equal the
input bit for bit (one rank: the all-gather and all-to-all give back the input, the reduce-scatter
the stated sum of one value, the value itself). Then: eager calls after the replays, the error
word, a second graph of the same step beside the first, and what must be refused inside a
capture (a new signature; a CUDA tensor over gloo). Writes {check: {"ok", "detail"}} to OUT.json;
``tests/test_graph_gpu.py`` runs it with and without ``CUDA_DEVICE_MAX_CONNECTIONS=1``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback

N = 3 << 19  # BF16 values per collective (3 MiB): three pipeline rounds of 1 MiB
CHUNK_BYTES = 1 << 20
REPLAYS = 12
NAMES = ["graph/plan_replayed", "graph/replayed_exact", "graph/spilled", "graph/eager_after",
         "graph/error_word", "graph/second_graph", "graph/new_signature_refused", "graph/gloo_refused",
         "graph/default_stream_replayed", "graph/communicator_default_stream"]


def main(out_path: str) -> int:
    import torch
    import torch.distributed as dist

    res: dict = {}
    init = f"file://{tempfile.mkdtemp()}/store"
    dist.init_process_group("nccl", rank=0, world_size=1, init_method=init)
    try:
        checks(res, torch, dist)
    except Exception:  # noqa: BLE001 -- recorded: the checks after it "did not run"
        res["group/graph"] = {"ok": False, "detail": traceback.format_exc()[-4000:]}
    with open(out_path, "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
    return 0


def checks(res: dict, torch, dist) -> None:
    import zipccl.torch as zt
    from zipccl.comm import CollectiveError, Policy
    from zipccl.kernels import spill as kern

    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(5)
    x = torch.empty(N, dtype=torch.bfloat16, device=dev)
    outs = {op: torch.empty_like(x) for op in ("all_gather", "reduce_scatter", "all_to_all")}
    zc = zt.Collectives(Policy("always", loopback=True), chunk_bytes=CHUNK_BYTES, capacity={"nbytes": 0})

    def fill(k: int) -> None:
        x.copy_((torch.randn(N, device=dev, generator=gen) * 0.02 * (1 + k % 3)).to(torch.bfloat16))

    def step() -> None:
        zc.all_gather_into_tensor(outs["all_gather"], x)
        zc.reduce_scatter_tensor(outs["reduce_scatter"], x)
        zc.all_to_all_single(outs["all_to_all"], x)

    def exact(tag: str) -> list[str]:
        torch.cuda.synchronize()
        want = x.view(torch.int16)
        return [f"{tag}: {op} differs in {int((o.view(torch.int16) != want).sum())} values"
                for op, o in outs.items() if not torch.equal(o.view(torch.int16), want)]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    bad = []
    with torch.cuda.stream(side):  # the warm-up: signatures agreed, buffers made
        for k in range(6):  # from the second call on, zipccl replays each as its own graph
            fill(k)
            for o in outs.values():
                o.zero_()
            step()
            bad += exact(f"side-stream call {k}")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    kept = [bool(p.graph) for p in zc._core.plans.values() if p.call is not None]
    res["graph/plan_replayed"] = {"ok": not bad and kept == [True] * 3,
                                  "detail": "; ".join(bad[:6]) or f"plans recorded as graphs: {kept}"}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    bad = []
    for k in range(REPLAYS):
        fill(k + 3)
        for o in outs.values():
            o.zero_()
        graph.replay()
        bad += exact(f"replay {k}")
    res["graph/replayed_exact"] = {"ok": not bad, "detail": "; ".join(bad[:6]) or f"{REPLAYS} replays"}

    (ch,) = zc._core.channels().values()
    (cap,) = ch._captures.values()
    sites = cap.sites._sites
    tails = sum(int(b.recv[:, kern.D_TAIL_LEN].sum()) for s in sites for b in s.blocks)
    gens = [int(s.words[kern.S_GEN]) for s in sites]
    res["graph/spilled"] = {"ok": tails > 0 and len(sites) >= 9 and gens == [REPLAYS] * len(sites),
                            "detail": f"{len(sites)} sites, calls per site {sorted(set(gens))}, "
                                      f"tail bytes in the last two replays' blocks {tails}"}

    fill(99)
    step()
    bad = exact("eager")
    res["graph/eager_after"] = {"ok": not bad, "detail": "; ".join(bad) or "exact"}
    err = ch.error_text()
    res["graph/error_word"] = {"ok": err is None, "detail": str(err)}

    second = torch.cuda.CUDAGraph()
    with torch.cuda.graph(second):
        step()
    bad = []
    for k in range(4):
        fill(200 + k)
        (graph if k % 2 else second).replay()
        bad += exact(f"alternating replay {k}")
    res["graph/second_graph"] = {"ok": not bad and len(ch._captures) == 2,
                                 "detail": "; ".join(bad[:4]) or f"{len(ch._captures)} captures"}

    def refused(name: str, fn, match: str) -> None:
        g = torch.cuda.CUDAGraph()
        ok, detail = False, "no error"
        try:
            with torch.cuda.graph(g):
                fn()
        except CollectiveError as e:
            ok, detail = match in str(e), str(e)
        except Exception as e:  # noqa: BLE001 -- any other error is the failure
            detail = f"{type(e).__name__}: {e}"
        res[name] = {"ok": ok, "detail": detail[:600]}

    small = torch.empty(N // 2, dtype=torch.bfloat16, device=dev)
    refused("graph/new_signature_refused",
            lambda: zc.all_gather_into_tensor(small, x[:N // 2]), "outside the capture first")
    gloo = dist.new_group(backend="gloo")
    refused("graph/gloo_refused",
            lambda: zc.all_gather_into_tensor(outs["all_gather"], x, group=gloo), "cannot be captured")
    torch.cuda.synchronize()
    default_stream(res, torch)
    communicator_default_stream(res, torch)


def default_stream(res: dict, torch) -> None:
    """zipccl's own graphs of calls on the legacy default stream: recorded on a capture stream
    of zipccl's, launched on the default stream, spills at every launch, each output exact."""
    import zipccl.torch as zt
    from zipccl.comm import Policy

    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(7)
    x = torch.empty(N, dtype=torch.bfloat16, device=dev)
    outs = {op: torch.empty_like(x) for op in ("all_gather", "reduce_scatter", "all_to_all")}
    zc = zt.Collectives(Policy("always", loopback=True), chunk_bytes=CHUNK_BYTES, capacity={"nbytes": 0})
    bad = []
    assert torch.cuda.current_stream(dev) == torch.cuda.default_stream(dev)
    for k in range(8):  # no synchronize between calls: the launches queue on the default stream
        x.copy_((torch.randn(N, device=dev, generator=gen) * 0.02 * (1 + k % 3)).to(torch.bfloat16))
        for o in outs.values():
            o.zero_()
        zc.all_gather_into_tensor(outs["all_gather"], x)
        zc.reduce_scatter_tensor(outs["reduce_scatter"], x)
        zc.all_to_all_single(outs["all_to_all"], x)
        want = x.view(torch.int16).clone()
        torch.cuda.synchronize()
        bad += [f"call {k}: {op} differs in {int((o.view(torch.int16) != want).sum())} values"
                for op, o in outs.items() if not torch.equal(o.view(torch.int16), want)]
    kept = [bool(p.graph) for p in zc._core.plans.values() if p.call is not None]
    (ch,) = zc._core.channels().values()
    err = ch.error_text()
    res["graph/default_stream_replayed"] = {
        "ok": not bad and kept == [True] * 3 and err is None and zc.stats.compressed_calls == 24,
        "detail": "; ".join(bad[:6]) or f"plans recorded as graphs: {kept}, error word {err}, "
                                         f"{zc.stats.compressed_calls} compressed calls counted"}


def communicator_default_stream(res: dict, torch) -> None:
    """The same through ``zipccl.Communicator`` on CuPy arrays over one-rank NCCL, CuPy's
    current stream being the legacy default one."""
    import cupy
    import numpy as np
    from mpi4py import MPI

    import zipccl
    from zipccl.comm import Policy

    rng = np.random.default_rng(11)
    bad, kept = [], []
    with zipccl.Communicator(MPI.COMM_SELF, backend="nccl", policy=Policy("always", loopback=True),
                             chunk_bytes=CHUNK_BYTES, capacity={"nbytes": 0}) as c:
        x = cupy.empty(N, dtype=cupy.uint16)
        out = cupy.empty_like(x)
        for k in range(6):
            host = (rng.standard_normal(N) * 0.02 * (1 + k % 3)).astype(np.float32)
            x.set((host.view(np.uint32) >> 16).astype(np.uint16))
            out.fill(0)
            c.all_gather(x, out, dtype="bfloat16")
            if not bool((out == x).all()):
                bad.append(f"call {k}: differs in {int((out != x).sum())} values")
        kept = [bool(p.graph) for p in c._core.plans.values() if p.call is not None]
        moved = type(c._nccl).__name__
        ok = not bad and kept == [True] and c.stats.compressed_calls == 6 and moved == "NCCLTransport"
        detail = "; ".join(bad) or f"plans recorded as graphs: {kept}, transport {moved}"
    res["graph/communicator_default_stream"] = {"ok": ok, "detail": detail}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
