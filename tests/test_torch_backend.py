"""The torch.distributed backend "zipccl" on 2 CPU ranks, and its "auto" calibration.

The ranks run once per module (``tests/torchdist/backend_ranks.py``: two plain processes under
``init_process_group("cpu:zipccl")``, ``ZIPCCL_POLICY=always``, a temporary cache dir); each test
reads its checks from both ranks. The rest runs in this process, without a group.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "torchdist"))

pytestmark = pytest.mark.usefixtures("torch_installed")  # missing torch: each test fails saying so

DTYPES = ("bfloat16", "float32", "float16")
COMPRESSED = [f"{name}/{dt}" for dt in DTYPES for name in (
    "all_gather_into_tensor", "reduce_scatter_tensor_sum", "reduce_scatter_tensor_avg",
    "all_reduce_sum", "all_reduce_avg", "all_to_all_single", "all_to_all_single_uneven",
    "all_gather_list", "reduce_scatter_list", "async_work", "functional_all_reduce")]
PASSED = [f"pass/{n}" for n in (
    "broadcast", "all_reduce_max_bf16", "all_reduce_min_fp32", "all_reduce_sum_int32",
    "all_reduce_product_fp32", "reduce", "gather", "scatter", "all_to_all_list", "send_recv",
    "batch_isend_irecv", "all_gather_int64", "reduce_scatter_max", "objects", "barriers", "counted")]
ERRORS = [f"error/{n}" for n in (
    "all_gather_wrong_size", "all_gather_wrong_dtype", "reduce_scatter_wrong_size", "all_to_all_bad_splits",
    "all_to_all_indivisible_rows", "all_reduce_premul_sum", "all_gather_list_mixed",
    "monitored_barrier_by_name")]
TRAINING = ["train/fsdp2", "train/ddp_fp32", "train/ddp_bf16"]
AUTO = [f"auto/{n}" for n in ("not_calibrated_before_use", "first_call_result", "calibrated_and_cached",
                              "explain", "same_on_every_rank", "reloaded_from_cache",
                              "damaged_cache_measured_again")] + ["never/result", "never/not_compressed",
                                                             "never/all_gather_list_shaped"]


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    import backend_ranks

    out = tmp_path_factory.mktemp("backend_ranks")
    backend_ranks.launch(str(out), 2)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _assert_check(results, name):
    """``name`` ran and passed on every rank (the failing ranks' details otherwise)."""
    bad = [f"rank {r}: " + (res[name]["detail"] if name in res else "did not run")
           for r, res in enumerate(results) if not res.get(name, {}).get("ok")]
    assert not bad, f"{name}: " + "; ".join(bad)


def test_registered_as_the_world_group(rank_results):
    _assert_check(rank_results, "registered")


@pytest.mark.parametrize("name", COMPRESSED + ["stats_per_collective"])
def test_compressed_equals_gloo(rank_results, name):
    """Each compressed collective on the zipccl group gives gloo's bits; stats() counts them."""
    _assert_check(rank_results, name)


@pytest.mark.parametrize("name", PASSED)
def test_passthrough_equals_gloo(rank_results, name):
    _assert_check(rank_results, name)


@pytest.mark.parametrize("name", ERRORS)
def test_mismatched_calls_raise_torchs_errors(rank_results, name):
    _assert_check(rank_results, name)


@pytest.mark.parametrize("name", TRAINING)
def test_training_bit_identical(rank_results, name):
    """FSDP2 (BF16 params and reductions) and DDP (FP32, BF16) through init_process_group
    ("cpu:zipccl") with ZIPCCL_POLICY=always: gloo's losses and parameters, bit for bit, with
    compressed all-gathers and reduce-scatters (FSDP2) / all-reduces (DDP)."""
    _assert_check(rank_results, name)


@pytest.mark.parametrize("name", AUTO)
def test_auto(rank_results, name):
    _assert_check(rank_results, name)


def test_no_unexpected_failures(rank_results):
    for r, res in enumerate(rank_results):
        bad = {k: v["detail"] for k, v in res.items() if not v["ok"]}
        assert not bad, f"rank {r}: {bad}"


# -- without a group -----------------------------------------------------------------------------

def test_registration_is_idempotent():
    import torch.distributed as dist

    import zipccl.torch as zt

    zt.register()
    zt.register()
    assert "ZIPCCL" in dist.Backend._plugins and dist.Backend.ZIPCCL == "zipccl"
    assert dist.Backend.backend_capability["zipccl"] == ["cpu", "cuda"]
    # the defaults for plain "gloo" / "nccl" jobs are untouched
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_env_policy(monkeypatch):
    from zipccl.comm.policy import POLICY_ENV, Policy, env_policy
    from zipccl.torch import autotune

    monkeypatch.delenv(POLICY_ENV, raising=False)
    assert env_policy() is None
    base = Policy("auto", min_bytes=123)
    assert autotune.policy_for_mode(base) is base
    monkeypatch.setenv(POLICY_ENV, "Always")
    forced = autotune.policy_for_mode(base)
    assert (forced.mode, forced.min_bytes) == ("always", 123)
    assert autotune.policy_for_mode(base) is forced  # one object: its decisions stay memoised
    never = Policy("never")
    assert autotune.policy_for_mode(never) is never  # an explicit mode in code stays
    monkeypatch.setenv(POLICY_ENV, "sometimes")
    with pytest.raises(ValueError, match="ZIPCCL_POLICY"):
        env_policy()


def test_backend_options():
    import zipccl.torch as zt

    assert zt.BackendOptions().policy is None
    with pytest.raises(ValueError, match="policy"):
        zt.BackendOptions(policy="fast")


def test_cache_dir_and_sizes(monkeypatch, tmp_path):
    import torch

    from zipccl.torch import autotune

    monkeypatch.setenv(autotune.CACHE_ENV, str(tmp_path))
    assert autotune.cache_dir() == tmp_path
    assert autotune.profile_path("k").parent == tmp_path
    assert autotune.profile_path("k") != autotune.profile_path("k2")
    monkeypatch.delenv(autotune.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert autotune.cache_dir() == tmp_path / "xdg" / "zipccl"
    monkeypatch.delenv(autotune.SIZES_ENV, raising=False)
    assert autotune.calibration_sizes(torch.device("cpu")) == autotune.HOST_SIZES
    assert autotune.calibration_sizes(torch.device("cuda")) == autotune.DEVICE_SIZES
    monkeypatch.setenv(autotune.SIZES_ENV, "65536, 4096")
    assert autotune.calibration_sizes(torch.device("cpu")) == (4096, 65536)
    monkeypatch.setenv(autotune.SIZES_ENV, "4096")
    with pytest.raises(ValueError, match="two sizes"):
        autotune.calibration_sizes(torch.device("cpu"))
