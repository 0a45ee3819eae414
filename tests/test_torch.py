"""zipccl.torch on 2 gloo ranks (CPU): every function against torch.distributed, bit for bit;
FSDP2 and DDP training with and without zipccl; the end-to-end script at toy size.

The ranks run once per session (``tests/torchdist/ranks.py``, started by conftest's
``torch_rank_results``: two plain processes, the checks in one go, a few seconds); each test
below reads its own check from both ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _need_torch():
    from conftest import need_torch

    need_torch()  # missing torch fails, as in every torch suite


COLLECTIVE_CHECKS = [
    f"{name}/{kind}" for kind in ("gauss", "corpus") for name in (
        "all_gather", "all_gather_in_place", "all_gather_chunked",
        *[f"{op}{label}_{red}_{ref}" for red in ("sum", "avg")
          for op, label in (("reduce_scatter", ""), ("reduce_scatter", "_chunked"), ("all_reduce", ""))
          for ref in ("stated", "vs_torch")],
        "all_to_all", "all_to_all_uneven")
] + ["compressed_calls_counted", "passthrough_int32_and_max", "never_is_native", "async_work",
     "megatron", "transport_alltoallv_gaps", "agreement", "agreement_own_control",
     "import_zipccl_without_torch",
     "single_names", "loopback"] + [
    f"wide_{name}_{dtype}/{kind}" for dtype in ("float32", "float16") for kind in ("gauss", "corpus")
    for name in ("all_gather", "all_to_all", "compressed",
                 *[f"{op}_{red}" for red in ("sum", "avg")
                   for op in ("reduce_scatter", "reduce_scatter_chunked", "all_reduce")])]
TRAINING_CHECKS = ["fsdp_never", "fsdp_always", "ddp_never", "ddp_always", "fsdp_fp32_reduce", "ddp_fp32",
                   "ddp_fp32_threads"]


def _assert_check(results, name):
    for r, res in enumerate(results):
        assert name in res, f"rank {r} did not run {name}: {sorted(k for k in res if '/' not in k)}"
        assert res[name]["ok"], f"rank {r}: {name}: {res[name]['detail']}"


@pytest.mark.parametrize("name", COLLECTIVE_CHECKS)
def test_collective_matches(torch_rank_results, name):
    _assert_check(torch_rank_results, name)


@pytest.mark.parametrize("name", TRAINING_CHECKS)
def test_training_bit_identical(torch_rank_results, name):
    """FSDP2 (bf16 params and reductions) and DDP (bf16 model): losses and parameters of every
    rank equal the run without zipccl, bit for bit; "always" compressed some calls."""
    _assert_check(torch_rank_results, name)


def test_no_unexpected_failures(torch_rank_results):
    for r, res in enumerate(torch_rank_results):
        bad = {k: v["detail"] for k, v in res.items() if not v["ok"]}
        assert not bad, f"rank {r}: {bad}"


@pytest.mark.slow  # four modes of the toy model on 2 ranks: the slow tier (CI runs it)
def test_train_e2e_toy(tmp_path):
    """experiments/train_e2e.py under torchrun on 2 CPU ranks (gloo), toy model, every mode
    (native, raw, always, auto): the losses of every step and the final parameters are the
    same bits as native's, "raw" went through zipccl's exchange with the native bytes plus
    headers, "always" compressed, and the job wrote its ratios."""
    _need_torch()
    out = tmp_path / "e2e.jsonl"
    modes = ("native", "raw", "always", "auto")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "experiments", "train_e2e.py"), "--toy", "--steps", "2",
           "--modes", ",".join(modes), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::FutureWarning")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-4000:] + run.stdout[-1000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    steps = {m: [r for r in recs if r["kind"] == "step" and r["mode"] == m] for m in modes}
    assert [len(v) for v in steps.values()] == [2] * len(modes)
    summary = {r["mode"]: r for r in recs if r["kind"] == "summary"}
    for m in modes[1:]:
        assert [r["loss_bits"] for r in steps[m]] == [r["loss_bits"] for r in steps["native"]], m
        assert summary[m]["params_bits_equal_native"] is True and summary[m]["bits_equal_native"] is True, m
    assert summary["native"]["compressed_calls"] == 0
    for m in ("raw", "always"):
        assert summary[m]["compressed_calls"] == summary[m]["calls"] > 0, m
    raw, native = summary["raw"]["step_bytes"], summary["native"]["step_bytes"]
    for op in ("all_gather", "reduce_scatter"):
        assert raw[op]["raw_bytes"] == native[op]["raw_bytes"] > 0
        assert raw[op]["raw_bytes"] < raw[op]["wire_bytes"]  # the values and the headers
        assert summary["always"]["by_op"][op]["wire_ratio"] < 1
    assert summary["always"]["wire_bytes"] < summary["always"]["raw_bytes"]
    assert summary["raw"]["first_step_s"] > 0 and summary["raw"]["timed_steps"] == 2
    ratios = next(r for r in recs if r["kind"] == "ratios")
    assert set(ratios["median_step_s"]) == set(modes) and ratios["path_speedup"] > 0
    assert ratios["bits_equal_native"] == {"native": True, "raw": True, "always": True, "auto": True}
