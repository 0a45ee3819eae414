"""``Communicator`` calls replayed from their plans (``tests/mpi/mpi_replay.py``): on 2 ranks,
host arrays and device arrays with CuPy, NCCL and the GPU codec stood in for; one job."""

from __future__ import annotations

import pytest
from test_comm_mpi import check_cases, run_suite_with_fake_cupy

REPLAY = "tests/mpi/mpi_replay.py"
REPLAY_CASES = 13


@pytest.mark.mpi
def test_replayed_calls_match_fresh_ones_and_changes_plan_again(tmp_path):
    r = run_suite_with_fake_cupy(2, [REPLAY], tmp_path)
    check_cases(tmp_path, 2, r, REPLAY_CASES)
