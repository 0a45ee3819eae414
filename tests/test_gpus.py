"""The rank-to-GPU rule (``zipccl.tools.gpus``) and the device transport choice
(``comm.transport.choose_device_transport``) on stand-in values: no GPU, no MPI job."""

from __future__ import annotations

import pytest

from zipccl.comm.transport import choose_device_transport, shared_gpus
from zipccl.tools.gpus import place, torch_place


@pytest.mark.parametrize(("local_size", "gpus", "devices", "shared"), [
    (1, 1, [0], False),
    (2, 2, [0, 1], False),
    (2, 8, [0, 1], False),          # more GPUs than ranks: the first ones
    (2, 1, [0, 0], True),           # the one-GPU machine
    (4, 2, [0, 1, 0, 1], True),
    (3, 2, [0, 1, 0], True),
    (2, 0, [None, None], False),    # no GPU: the host path
])
def test_local_ranks_take_the_gpus_round_robin(local_size, gpus, devices, shared):
    got = [place(r, local_size, gpus) for r in range(local_size)]
    assert [p.device for p in got] == devices
    assert {p.shared for p in got} == {shared}
    if gpus:
        assert max(devices.count(d) for d in devices) == got[0].ranks_per_gpu


@pytest.mark.parametrize("bad", [(2, 2, 1), (-1, 2, 1), (0, 0, 1), (0, 1, -1)])
def test_placement_rejects_impossible_numbers(bad):
    with pytest.raises(ValueError):
        place(*bad)


def test_torch_place_reads_torchrun_variables_without_asking_cuda():
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}
    p = torch_place(env, gpus=2)
    assert (p.local_rank, p.local_size, p.device, p.shared) == (3, 4, 1, True)
    assert torch_place({}, gpus=1).device == 0  # not under torchrun: one rank alone
    assert "shared" in str(torch_place({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, gpus=1))


def test_shared_gpus_groups_equal_ids_only():
    ids = ["a on n1", "b on n1", "a on n1", "a on n2", None, None, "b on n1"]
    assert shared_gpus(ids) == [[0, 2], [1, 6]]
    assert shared_gpus([None, None]) == []


def test_transport_nccl_when_every_rank_has_its_own_gpu():
    assert choose_device_transport("auto", [None, None], ["g0", "g1"]).name == "nccl"
    assert choose_device_transport("nccl", [None, None], ["g0", "g1"]).name == "nccl"


def test_transport_mpi_on_a_shared_gpu_and_says_so():
    c = choose_device_transport("auto", [None, None], ["g0 on n", "g0 on n"])
    assert c.name == "mpi" and c.error is None
    assert "\n" not in c.note and "ranks 0 and 1 share one GPU (g0 on n)" in c.note
    assert "staged through host memory" in c.note
    assert "CUDA-aware" in choose_device_transport("auto", [None, None], ["g", "g"], cuda_aware=True).note


def test_forced_nccl_on_a_shared_gpu_is_an_error_naming_the_fix():
    c = choose_device_transport("nccl", [None, None, None], ["g", "h", "g"])
    assert c.name is None and "ranks 0 and 2 share one GPU (g)" in c.error
    assert 'backend="auto" or "mpi"' in c.error and "one rank per GPU" in c.error


def test_transport_without_nccl():
    c = choose_device_transport("auto", [None, "no libnccl"], ["g0", "g1"])
    assert (c.name, c.note, c.error) == ("mpi", None, None)
    c = choose_device_transport("nccl", [None, "no libnccl"], ["g0", "g1"])
    assert c.name is None and c.error == "zipccl NCCL set-up failed: rank 1: no libnccl"
    with pytest.raises(ValueError):
        choose_device_transport("mpi", [None], ["g0"])
