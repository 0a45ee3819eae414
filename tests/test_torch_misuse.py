"""A mistake one rank makes never hangs its peers nor aborts a process (2 CPU ranks over gloo).

Each case runs ``tests/torchdist/misuse_ranks.py`` in 2 fresh processes whose groups time out
after ``TIMEOUT`` seconds; a process that outlives ``WALL`` seconds is killed and the case fails.
What each rank raised and how long its call took are checked: a peer of the rank that made the
mistake must return within three times the group's timeout (the first compressed call of a
process also loads the codec; a fixed 30-minute channel would not return at all).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

# the 2-rank cases are slow (each starts 2 fresh processes and may wait out a 5 s timeout)
SCRIPT = Path(__file__).parent / "torchdist" / "misuse_ranks.py"
TIMEOUT = 5  # misuse_ranks.TIMEOUT
WALL = 240  # seconds for the whole pair, start-up included


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(case: str, tmp_path: Path) -> list[dict]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               ZIPCCL_CACHE_DIR=str(tmp_path))
    env.pop("ZIPCCL_POLICY", None)
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), case, str(tmp_path), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=WALL)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{case}: a rank was still running after {WALL} s (a hang)")
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"{case}: rank {r} exited with {p.returncode}:\n{logs[r][-3000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def _in_time(res: dict) -> None:
    assert res["seconds"] < 3 * TIMEOUT, f"returned after {res['seconds']:.1f} s: {res}"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["wrong_output_functional", "wrong_output_backend"])
def test_wrong_output_on_first_call_fails_the_peer_in_time(case, tmp_path):
    bad, peer = _run(case, tmp_path)
    assert bad["raised"] in ("ValueError", "RuntimeError", "DistBackendError"), bad
    assert peer["raised"] == "CollectiveError", peer
    assert "rank 0" in peer["message"] and "all_gather" in peer["message"], peer
    _in_time(bad)
    _in_time(peer)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dtype_all_gather_functional", "dtype_all_reduce_functional",
                                  "dtype_all_gather_backend", "dtype_all_reduce_backend"])
def test_dtypes_that_differ_raise_on_every_rank(case, tmp_path):
    results = _run(case, tmp_path)
    for res in results:
        assert res["raised"] == "CollectiveError", res
        assert "ranks disagree on the call" in res["message"], res
        _in_time(res)
    other = "float32" if "gather" in case else "float16"
    assert "bfloat16" in results[0]["message"] and other in results[0]["message"]


@pytest.mark.slow
def test_spill_channel_times_out_with_the_group(tmp_path):
    alone, _ = _run("spill_channel_alone", tmp_path)
    assert alone["raised"] is not None, alone  # its peer never comes
    _in_time(alone)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["not_member_functional", "not_member_backend"])
def test_group_without_the_caller_warns_and_returns(case, tmp_path):
    member, outsider = _run(case, tmp_path)
    assert member["raised"] is None, member
    assert outsider["raised"] is None and outsider["message"] == "None", outsider
    assert any("does not belong to the given group" in w for w in outsider["warned"]), outsider


CHANNEL_TIMEOUTS = """
import datetime, os, sys
import torch.distributed as dist
import zipccl.torch  # registers "zipccl"
from zipccl.torch.transport import TorchChannel
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=7))
g = dist.new_group([0], timeout=datetime.timedelta(seconds=3))
z = dist.new_group([0], backend="zipccl", timeout=datetime.timedelta(seconds=4))
print([TorchChannel(x).timeout.total_seconds() for x in (None, g, z)])
"""


@pytest.mark.slow  # a torch process of its own: the slow tier (CI runs it after make test)
def test_spill_channels_take_their_groups_timeout():
    """One rank: the spill channel of the world, of a gloo subgroup and of a zipccl group each
    run under that group's own timeout (7, 3 and 4 s), not a fixed one."""
    run = subprocess.run([sys.executable, "-c", CHANNEL_TIMEOUTS, str(_free_port())],
                         capture_output=True, text=True, timeout=WALL)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-2] == "[7.0, 3.0, 4.0]", run.stdout


SPLIT_SIZES = """
import os, sys, torch
import torch.distributed as dist
import zipccl.torch as zt
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
x = torch.zeros(4, dtype=torch.bfloat16)
for splits in ([4.0], ["4"], [True]):
    try:
        zt.all_to_all_single(torch.empty_like(x), x, splits, splits, policy="always")
        print("accepted", splits)
    except TypeError as e:
        print("refused", e)
"""


@pytest.mark.slow  # a torch process of its own: the slow tier (CI runs it after make test)
def test_torch_split_sizes_are_never_coerced():
    """One rank: float, string and bool split sizes are refused (TypeError naming the entry),
    not truncated or parsed as int() would."""
    run = subprocess.run([sys.executable, "-c", SPLIT_SIZES, str(_free_port())],
                         capture_output=True, text=True, timeout=WALL)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(("refused", "accepted"))]
    assert len(lines) == 3 and all(ln.startswith("refused") for ln in lines), run.stdout
    assert "input_split_sizes[0] must be an integer" in lines[0], lines[0]
