"""zipccl.torch on one GPU, one test per check: ``pytest -m gpu tests/test_torch_gpu.py``.

Two ranks share GPU 0 over gloo (NCCL refuses two ranks on one GPU) and run every check once
(``tests/torchdist/gpu_ranks.py``, a few minutes at most, most of it the kernels' compilation
in each process): the torch.distributed backend with ``BackendOptions(policy="always",
cuda="gloo")`` as the world group against plain gloo, BF16 / FP32 / FP16 collectives, FSDP2
and DDP training bit-identical to gloo (``backend_gpu_check.py``), and zipccl.torch's slot and
spill paths (``gpu_slots_check.py``); then one process runs the backend over NCCL alone
(world size 1). Each test below reads its own check from every rank.

``test_dry_run_on_cpu`` (slow) runs the same two-rank scripts on CPU tensors, so they are
checked on machines without a GPU too.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "torchdist"))

import backend_gpu_check  # noqa: E402 -- after the path is set; neither imports torch here
import gpu_ranks  # noqa: E402


def _torch():
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"torch is not installed ({e})")
    return torch


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory):
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    pytest.importorskip("cupy", reason="zipccl.torch's device engine needs CuPy")
    out = tmp_path_factory.mktemp("torch_gpu_ranks")
    crashed = gpu_ranks.launch(str(out), "cuda")
    files = [out / f"rank{r}.json" for r in range(2)] + [out / "nccl.json"]
    res = [json.loads(f.read_text()) if f.exists() else {} for f in files]
    return res[:2], res[2], crashed


def _assert_check(results: list[dict], name: str) -> None:
    """``name`` ran and passed on every rank (the failing ranks' details otherwise)."""
    bad = [f"rank {r}: " + (res[name]["detail"] if name in res else "did not run"
                             + "".join(f"; {k}: {v['detail'][-2000:]}" for k, v in res.items()
                                       if k.startswith("group/")))
           for r, res in enumerate(results) if not res.get(name, {}).get("ok")]
    assert not bad, f"{name}: " + "; ".join(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("name", gpu_ranks.names("cuda"))
def test_two_ranks_share_one_gpu(gpu_results, name):
    """Backend checks (``backend/...``) and slot / spill checks (``slots/...``), bit for bit."""
    _assert_check(gpu_results[0], name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", backend_gpu_check.NCCL_NAMES)
def test_one_rank_over_nccl(gpu_results, name):
    _assert_check([gpu_results[1]], name)


@pytest.mark.gpu
def test_every_process_exited_cleanly(gpu_results):
    """No rank crashed or hung (a crash leaves the checks after it "did not run")."""
    assert not gpu_results[2], "\n".join(gpu_results[2])


@pytest.mark.gpu
def test_no_unexpected_failures(gpu_results):
    """Nothing else failed (a check group that raised, a check no test names)."""
    for who, res in [*enumerate(gpu_results[0]), ("nccl", gpu_results[1])]:
        bad = {k: v["detail"][-3000:] for k, v in res.items() if not v["ok"]}
        assert not bad, f"rank {who}: {bad}"


@pytest.mark.slow
def test_dry_run_on_cpu(tmp_path):
    """The two-rank scripts on CPU tensors ("cpu:zipccl"): every check of the CPU run is
    recorded under its name on both ranks and passes."""
    _torch()
    assert not gpu_ranks.launch(str(tmp_path), "cpu")
    want = set(gpu_ranks.names("cpu"))
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        checks = {k for k in res if not k.startswith("seconds/")}
        assert checks == want, f"rank {r}: missing {sorted(want - checks)[:5]}, extra {sorted(checks - want)}"
        bad = {k: v["detail"] for k, v in res.items() if not v["ok"]}
        assert not bad, f"rank {r}: {bad}"
