"""Compressed collectives inside CUDA graphs, on one GPU: ``pytest -m gpu tests/test_graph_gpu.py``.

One rank over NCCL (``Policy.loopback``) runs a step of three compressed collectives on a side
stream (from the second call on, zipccl replays each kept call as its own graph), captures the
step with ``torch.cuda.graph`` and replays it, spills at every replay, each output checked bit for bit
(``tests/torchdist/graph_check.py``), once as it is and once under
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (one hardware queue, as Megatron-LM sets it: a stream that
waited on later GPU work would deadlock there; a hang fails on the timeout).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_comm_mpi import ROOT, clean_env

sys.path.insert(0, str(ROOT / "tests" / "torchdist"))
import graph_check  # noqa: E402 -- after the path is set; it imports torch only when run

TIMEOUT_S = 600


@pytest.fixture(scope="module", params=["default", "one_connection"])
def results(request, tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    pytest.importorskip("cupy", reason="zipccl.torch's device engine needs CuPy")
    out = tmp_path_factory.mktemp("graph") / "graph.json"
    env = clean_env()
    if request.param == "one_connection":
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    try:
        r = subprocess.run([sys.executable, str(ROOT / "tests" / "torchdist" / "graph_check.py"), str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"graph_check.py did not finish in {TIMEOUT_S} s ({request.param}): a hang?")
    assert r.returncode == 0 and out.exists(), f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(out.read_text())


@pytest.mark.gpu
@pytest.mark.parametrize("name", graph_check.NAMES)
def test_graph_check(results, name):
    got = results.get(name)
    assert got is not None, f"{name} did not run: {results.get('group/graph', {}).get('detail', '')}"
    assert got["ok"], got["detail"]
