"""The CPU codec's threads: one per call on small inputs, the rank's share of the cores otherwise.

Numba's OpenMP workers spin after a parallel region; ranks that share a node and
each run a thread per core wait for descheduled threads (40-70x slower under
``mpiexec -n 2`` on 2 cores). These tests pin the rule that prevents it and that
the frames never depend on the thread count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from conftest import edge_corpus, gaussian_bits
from test_comm_mpi import ROOT, clean_env, mpiexec

from zipccl.codebook import Codebook
from zipccl.codec import cpu, cpu_threads, reference


@pytest.mark.parametrize("env, expected", [
    ({}, 1),
    ({"MPI_LOCALNRANKS": "2"}, 2),  # MPICH / Intel MPI (Hydra)
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),  # Open MPI
    ({"LOCAL_WORLD_SIZE": "8"}, 8),  # torchrun
    ({"MPI_LOCALNRANKS": "zero"}, 1),
    ({"MPI_LOCALNRANKS": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 3),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "1"}, 4),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}, 3),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "3"}, 1),
    ({"SLURM_STEP_TASKS_PER_NODE": "6"}, 6),
])
def test_local_ranks_from_the_launcher(env, expected):
    assert cpu_threads.local_ranks(env) == expected


def test_threads_per_call(monkeypatch):
    monkeypatch.setattr(cpu_threads, "rank_threads", lambda: 8)
    assert cpu_threads.threads_per_call(0) == 1
    assert cpu_threads.threads_per_call(cpu_threads.SMALL - 1) == 1
    # Large calls: the rank's share, capped by this thread's Numba setting.
    assert cpu_threads.threads_per_call(cpu_threads.SMALL) == min(8, numba.get_num_threads())
    monkeypatch.setattr(cpu_threads, "rank_threads", lambda: 1)
    assert cpu_threads.threads_per_call(1 << 30) == 1


def test_mpiexec_shares_the_cores():
    # Two ranks on this machine: each gets half of the CPUs it may run on (at least one).
    env = clean_env()
    env.pop("NUMBA_NUM_THREADS", None)
    env.pop(cpu_threads.ENV_THREADS, None)
    # rank 0 prints every rank's pair (two ranks printing at once may interleave their lines)
    code = ("from mpi4py import MPI; from zipccl.codec import cpu_threads as t; "
            "pairs = MPI.COMM_WORLD.gather((t.rank_threads(), t.threads_per_call(1 << 30))); "
            "MPI.COMM_WORLD.Get_rank() == 0 and print(pairs)")
    r = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", code], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert r.stdout.strip() == str([(share, share)] * 2)


def test_env_overrides_the_share(monkeypatch):
    monkeypatch.setenv(cpu_threads.ENV_THREADS, "3")
    monkeypatch.setenv("MPI_LOCALNRANKS", "64")
    cpu_threads.rank_threads.cache_clear()
    try:
        assert cpu_threads.rank_threads() == 3
    finally:
        cpu_threads.rank_threads.cache_clear()


@pytest.mark.parametrize("threads", [1, 2])
def test_frames_do_not_depend_on_threads(monkeypatch, threads):
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"Numba has {numba.config.NUMBA_NUM_THREADS} thread(s)")
    monkeypatch.setattr(cpu_threads, "rank_threads", lambda: threads)
    bits = np.concatenate([edge_corpus(), gaussian_bits(3 * cpu_threads.SMALL + 77, seed=5)])
    cb = Codebook.from_sigma(0.02)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for checksum in (True, False):
        frame = cpu.encode(bits, cb, None, checksum)
        assert np.array_equal(frame, reference.encode(bits, cb, None, checksum))
        out, _ = cpu.decode(frame)
        assert np.array_equal(out.view(np.uint16), bits)
    # The caller's Numba setting is left as it was.
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS


# Every public call, on a fresh process, with the OpenMP settings compared after each: the
# thread count torch reads (torch.get_num_threads) and the thread count and nesting depth of
# the OpenMP runtime Numba's layer calls (torch's, when torch is loaded first).
_SETTINGS_SCRIPT = r"""
import ctypes, json, sys
import ml_dtypes, numpy as np
try:
    import torch
except ImportError:
    torch = None
import zipccl
from zipccl import analyze
from zipccl.codec import cpu_threads

def openmp():
    # The OpenMP runtime Numba's omp layer calls, looked up as the dynamic linker resolves
    # that layer's symbols: the process's global scope first (torch's runtime, when torch is
    # loaded), then the libraries the layer is linked against.
    handles = [ctypes.CDLL(None)]
    try:
        from numba.np.ufunc import omppool
        handles.append(ctypes.CDLL(omppool.__file__))
    except (ImportError, OSError):
        pass
    for lib in handles:
        if hasattr(lib, "omp_get_max_threads"):
            return lib
    return None

omp = openmp()

def settings():
    return {"torch": torch.get_num_threads() if torch is not None else None,
            "omp_max_threads": omp.omp_get_max_threads() if omp is not None else None,
            "omp_max_active_levels": omp.omp_get_max_active_levels() if omp is not None else None}

rng = np.random.default_rng(0)
bf16 = lambda n: rng.normal(0, 0.02, n).astype(ml_dtypes.bfloat16)
first = int(sys.argv[1])
calls = [("compress %d BF16 values" % first, lambda: zipccl.compress(bf16(first)))]
for n in (0, 10, 3 * cpu_threads.SMALL):
    for dt in (ml_dtypes.bfloat16, np.float32, np.float16):
        x = rng.normal(0, 0.02, n).astype(dt)
        calls.append((f"compress {n} {np.dtype(dt).name}", lambda x=x: zipccl.compress(x)))
        calls.append((f"decompress {n} {np.dtype(dt).name}",
                      lambda x=x: zipccl.decompress(zipccl.compress(x, checksum=False))))
calls.append(("compress reference", lambda: zipccl.compress(bf16(5000), backend="reference")))
calls.append(("analyze_tensor bf16", lambda: analyze.analyze_tensor("f", "t", bf16(3 * cpu_threads.SMALL))))
calls.append(("analyze_tensor fp32", lambda: analyze.analyze_tensor("f", "t", bf16(1000), dtype="float32")))
if torch is not None:
    t = torch.randn(3 * cpu_threads.SMALL)
    calls.append(("compress torch", lambda: zipccl.decompress(zipccl.compress(t))))
try:
    from mpi4py import MPI
except ImportError:
    MPI = None
if MPI is not None:
    def collectives():
        with zipccl.Communicator(MPI.COMM_SELF, policy="always") as comm:
            x = bf16(3 * cpu_threads.SMALL)
            out = np.empty_like(x)
            comm.all_gather(x, out)
            comm.all_reduce(x.copy())
            comm.reduce_scatter(x, out)
    calls.append(("Communicator host collectives", collectives))

start = before = settings()
changed = []
for name, call in calls:
    call()
    if (after := settings()) != before:
        changed.append([name, before, after])  # each change once, by the call that made it
    before = after
print(json.dumps({"start": start, "changed": changed, "calls": len(calls)}))
"""


@pytest.mark.slow  # fresh interpreters per case: the slow tier (CI runs it)
@pytest.mark.parametrize("first, env", [(0, {}), (10, {cpu_threads.ENV_THREADS: "1"})])
def test_calls_leave_the_openmp_settings_alone(first, env):
    # OMP_NUM_THREADS=1 (what torchrun and most launchers set), below Numba's own count, so a
    # call that writes Numba's count into the caller's OpenMP settings shows.
    child = dict(clean_env(), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="2", **env)
    r = subprocess.run([sys.executable, "-c", _SETTINGS_SCRIPT, str(first)], cwd=ROOT, env=child,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    start = report["start"]
    assert start["torch"] is not None or start["omp_max_threads"] is not None, \
        "neither torch nor an OpenMP runtime to read the settings of"
    assert start["omp_max_threads"] in (1, None) and start["torch"] in (1, None), start
    assert report["changed"] == [], report["changed"]
