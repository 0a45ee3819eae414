"""examples/ as a user runs them: ``torchrun --nproc_per_node 2`` on CPUs (gloo), a few steps,
with torch made to look as if it had a GPU that any call into torch.cuda would touch.

Each example trains its model with and without zipccl and prints whether the losses and the
parameters are the same bits, and per rank what zipccl's ``stats`` counted per collective; the
test reads that report line by line: each comparison once and "yes", each collective of each rank.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_torch

ROOT = Path(__file__).resolve().parent.parent

#: the collectives each example's zipccl run must have compressed, on every rank
COLLECTIVES = {"ddp": ["all_reduce"], "fsdp2": ["all_gather", "reduce_scatter"]}
_HEADER = re.compile(r"^(\w+): (\d+) ranks, [\w:,]+ on cpu, (\d+) steps, policy \"always\"$", flags=re.M)
_MATCH = re.compile(r"^(\w+) match: (yes|no) \(bit for bit, every rank\)$", flags=re.M)
_STATS = re.compile(r"^rank (\d) (\w+): (\d+) calls, (\d+) compressed, ([\d,]+) raw -> ([\d,]+) wire bytes",
                    flags=re.M)


# DDP's example in the slow tier (CI runs it after make test), for make test's time bound;
# its all-reduce hook is covered in make test by the torch suites
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "ddp" else n
                                  for n in sorted(COLLECTIVES)])
def test_example_matches_native_and_counts_each_collective(name):
    need_torch()
    # under tests/torchdist/no_cuda.py: torch looks as if it had a GPU and any call into torch.cuda
    # raises, so this also checks that --device cpu never touches CUDA (FSDP2's mesh included)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / "torchdist" / "no_cuda.py"),
           str(ROOT / "examples" / f"{name}.py"), "--steps", "2", "--device", "cpu"]
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    # the example's report, case by case: what ran, each comparison once, each collective per rank
    assert _HEADER.findall(out) == [(name, "2", "2")], out
    assert _MATCH.findall(out) == [("losses", "yes"), ("parameters", "yes")], out
    counted = {(int(rank), op): (int(calls), int(zipped), int(raw.replace(",", "")),
                                 int(wire.replace(",", "")))
               for rank, op, calls, zipped, raw, wire in _STATS.findall(out)}
    assert sorted(counted) == [(rank, op) for rank in (0, 1) for op in COLLECTIVES[name]], out
    for calls, zipped, raw, wire in counted.values():
        assert calls >= 2 and zipped == calls and 0 < wire < raw, out


def test_no_cuda_stand_in_catches_a_cuda_call(tmp_path, monkeypatch):
    """The stand-in the examples run under does fail a script that selects a CUDA device. In this
    process (no interpreter to start): what ``no_cuda.poison`` replaces is put back afterwards;
    the fsdp2 example above runs under the stand-in's command line."""
    torch = pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "torchdist"))
    import no_cuda

    for name in ("is_available", "device_count", *no_cuda.POISONED):
        monkeypatch.setattr(torch.cuda, name, getattr(torch.cuda, name))
    monkeypatch.setattr(torch._C, "_get_accelerator", torch._C._get_accelerator)
    no_cuda.poison()
    script = tmp_path / "touch.py"
    script.write_text("import torch\ntorch.cuda.set_device(0)\n")
    with pytest.raises(no_cuda.CudaTouched, match=r"torch\.cuda\.set_device called"):
        runpy.run_path(str(script), run_name="__main__")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_example_on_the_gpus_present(name):
    """Two ranks on the GPUs there are: NCCL with a GPU each, gloo (and a line saying so) on one."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / f"{name}.py"), "--steps", "2", "--device", "cuda"]
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "losses match: yes" in r.stdout and "parameters match: yes" in r.stdout, r.stdout
    shared = torch.cuda.device_count() < 2
    assert ("NCCL cannot run there" in r.stdout) == shared, r.stdout
    assert f"{'gloo' if shared else 'nccl'} on cuda" in r.stdout, r.stdout
