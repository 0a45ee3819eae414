"""Spills (``zipccl.comm.spill``): tails beside the collective, through the progress thread.

Under mpiexec (2 and 4 ranks, ``MPIChannel``) and on 2 gloo ranks (``TorchChannel``),
``tests/mpi/spill_ranks.py`` runs a soak of random spill patterns (on one rank, on all,
toward one peer, on every call, on random calls; tails and slot headers checked byte for
byte; the call blocks held stay bounded) and the error word's paths, on host memory and on
the stand-in CuPy (whose ``RawModule`` runs the kernels' NumPy twins). A hang fails on the
timeout. In-process, two ranks as two threads over an in-memory channel check failures,
``close()`` and the argument checks.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
from conftest import need_torch
from test_comm_mpi import ROOT, clean_env, mpiexec

from zipccl.comm import channels, spill
from zipccl.format import errors
from zipccl.kernels import spill as kern

sys.path.insert(0, str(ROOT / "tests" / "mpi"))
import spill_ranks  # noqa: E402

RANKS_TIMEOUT_S = 180


def _results(out_dir, ranks: int, out: str) -> list[dict]:
    missing = [r for r in range(ranks) if not (out_dir / f"rank{r}.json").exists()]
    assert not missing, f"ranks {missing} wrote no result:\n{out[-4000:]}"
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(ranks)]


def _check(found: list[dict], calls: int, mode: str) -> None:
    for r in found:
        spill_ranks.check(r, calls, mode)


def _env(out_dir) -> dict:
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "mpi"), env["PYTHONPATH"]])
    env["SPILL_OUT"] = str(out_dir)
    return env


@pytest.mark.mpi
@pytest.mark.parametrize("mode,ranks,calls", [  # the long soaks: the slow tier (CI runs it)
    pytest.param("host", 2, 2000, marks=pytest.mark.slow),
    pytest.param("host", 4, 300, marks=pytest.mark.slow),
    ("fake", 2, 600), pytest.param("fake", 4, 150, marks=pytest.mark.slow)])
def test_soak_under_mpiexec(mode, ranks, calls, tmp_path):
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(ROOT / "tests" / "mpi" / "spill_ranks.py"),
           mode, str(calls)]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                           timeout=RANKS_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{ranks} ranks did not finish in {RANKS_TIMEOUT_S} s (a hang?): {e.stdout!r:.4000}")
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-4000:]}"
    _check(_results(tmp_path, ranks, r.stdout), calls, mode)


@pytest.mark.parametrize("mode,calls", [pytest.param("host", 600, marks=pytest.mark.slow), ("fake", 100)])
def test_soak_over_gloo(mode, calls, tmp_path):
    need_torch()
    script = str(ROOT / "tests" / "mpi" / "spill_ranks.py")
    outs = _gloo_ranks([[sys.executable, script, mode, str(calls), "--torch", str(r), "2"]
                        for r in range(2)], tmp_path)
    _check(_results(tmp_path, 2, "\n".join(outs)), calls, mode)


def _gloo_ranks(cmds: list[list[str]], tmp_path) -> list[str]:
    """Run one process per command as the ranks of a gloo job (a free port); their outputs.
    Fails the test if any hangs past RANKS_TIMEOUT_S or exits non-zero."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(_env(tmp_path), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore::FutureWarning")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for cmd in cmds]
    outs = []
    try:
        for pr in procs:
            outs.append(pr.communicate(timeout=RANKS_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"gloo ranks did not finish in {RANKS_TIMEOUT_S} s (a hang?)")
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    assert all(pr.returncode == 0 for pr in procs), "\n".join(o[-4000:] for o in outs)
    return outs


@pytest.mark.slow  # four gloo ranks: the slow tier (CI runs it after make test)
def test_torch_channel_over_a_subgroup_needs_only_its_ranks(tmp_path):
    """Two channels over the subgroup {0, 1} of 4 gloo ranks, made by ranks 0 and 1 alone."""
    need_torch()
    script = str(ROOT / "tests" / "torchdist" / "subgroup_channel.py")
    _gloo_ranks([[sys.executable, script, str(tmp_path), str(r)] for r in range(4)], tmp_path)
    assert [(tmp_path / f"rank{r}").read_text() for r in range(4)] == ["ok"] * 4


def test_torch_channel_sends_to_itself_on_one_rank(tmp_path):
    """One rank looping back (``Policy.loopback``) spills to itself: gloo has no pair to the
    rank itself, so the channel hands those tails over in the process, in order per tag."""
    need_torch()
    code = f"""
import numpy as np, torch.distributed as dist
from zipccl.torch.transport import TorchChannel
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://{tmp_path}/store")
ch = TorchChannel()
a, b = np.arange(40, dtype=np.uint8), np.arange(7, dtype=np.uint8)
ch.isend(a, 0, 5).wait(); ch.isend(b, 0, 5).wait()
out1, out2 = np.empty(40, np.uint8), np.empty(7, np.uint8)
ch.recv(out1, 0, 5); ch.recv(out2, 0, 5)
assert np.array_equal(out1, a) and np.array_equal(out2, b)
try:
    ch.isend(a, 0, 6); ch.recv(out2, 0, 6)
except RuntimeError as e:
    assert "40 bytes, expected 7" in str(e)
else:
    raise AssertionError("a short receive went unnoticed")
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


# -- in-process: two ranks as threads ----------------------------------------------------------

class _Net:
    """Messages between in-process ranks: one FIFO per (source, destination, tag)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.boxes: dict = {}

    def box(self, key) -> queue.Queue:
        with self.lock:
            return self.boxes.setdefault(key, queue.Queue())


class _Done:
    def wait(self) -> None:
        pass

    def test(self) -> bool:
        return True


class LocalChannel:
    def __init__(self, net: _Net, rank: int, size: int, fail_recv_at: int | None = None):
        self.net, self.rank, self.size = net, rank, size
        self.fail_recv_at, self.recvs, self.closed = fail_recv_at, 0, False

    def isend(self, data, peer, tag):
        self.net.box((self.rank, peer, tag)).put(np.array(data))
        return _Done()

    def recv(self, out, peer, tag):
        self.recvs += 1
        if self.recvs == self.fail_recv_at:
            raise ConnectionError("the host channel broke")
        msg = self.net.box((peer, self.rank, tag)).get(timeout=30)
        assert msg.size == out.size
        out[:] = msg

    def close(self):
        self.closed = True


def _transfer(net: _Net, me: int):
    def move(moves, lands):
        for j, buf in moves:
            net.box((me, j, "slots")).put(np.array(buf))
        for i, buf in lands:
            buf[:] = net.box((i, me, "slots")).get(timeout=30)
    return move


def _two_ranks(body, channels):
    """Run ``body(rank, spills)`` on two threads; re-raise the first failure."""
    errors = []

    def run(rank):
        try:
            body(rank, spill.Spills(channels[rank], device=False))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]


def test_two_ranks_in_one_process():
    """The soak's calls between two threads: every tail and header lands; close() joins."""
    net = _Net()
    mem = spill_ranks.Memory("host")
    out = {}

    def body(rank, sp):
        out[rank] = spill_ranks.soak(sp, rank, 2, 120, mem, _transfer(net, rank))
        thread = sp._thread
        sp.close()
        out[rank]["alive"] = thread.is_alive()
        out[rank]["closed"] = sp.channel.closed

    _two_ranks(body, [LocalChannel(net, r, 2) for r in range(2)])
    for r in range(2):
        assert out[r]["problems"] == [] and out[r]["spilled_calls"] > 40
        assert not out[r]["alive"] and out[r]["closed"]


def test_progress_thread_failure_is_raised_and_frees_the_kernels():
    """Rank 0's channel fails while it waits for a tail: its launch_in returns (the thread
    raised the flag on its way out), the host error bit is set, the next call raises."""
    net = _Net()
    mem = spill_ranks.Memory("host")
    seen = {}

    def body(rank, sp):
        p = spill_ranks.plan(3, 1, 2, "every")
        for (i, _), fs in p["frames"].items():
            for f in fs:  # only rank 1 spills, toward rank 0
                if i == 0 or f["frame_len"] <= f["slot"] - 128:
                    f["spill"], f["frame_len"] = False, min(f["frame_len"], f["slot"] - 128)
        assert any(f["spill"] for f in p["frames"][1, 0])
        spill_ranks.run_call(sp, rank, 2, 1, p, mem, _transfer(net, rank))
        if rank == 0:
            sp._thread.join(10)
            seen["host_bits"] = int(sp._ctrl[kern.C_HOST_ERR])
            with pytest.raises(RuntimeError, match="progress thread failed") as e:
                sp.error()
            seen["cause"] = e.value.__cause__
            with pytest.raises(RuntimeError):
                sp.begin(2, "all_gather", "bfloat16", [], [])
        else:
            sp.close()

    _two_ranks(body, [LocalChannel(net, 0, 2, fail_recv_at=1), LocalChannel(net, 1, 2)])
    assert seen["host_bits"] == errors.ERR_PROGRESS
    assert isinstance(seen["cause"], ConnectionError)


def test_close_times_out_when_a_calls_kernels_never_run():
    sp = spill.Spills(LocalChannel(_Net(), 0, 2), device=False)
    sp.begin(1, "all_gather", "bfloat16", [], [])
    with pytest.raises(TimeoutError, match=r"calls \[1\]"):
        sp.close(timeout=0.2)


def test_close_without_calls_and_twice():
    ch = LocalChannel(_Net(), 0, 2)
    sp = spill.Spills(ch, device=False)
    sp.close()
    sp.close()
    assert ch.closed and sp.closed
    with pytest.raises(RuntimeError, match="after close"):
        sp.begin(1, "all_gather", "bfloat16", [], [])


def test_arguments_are_checked():
    sp = spill.Spills(LocalChannel(_Net(), 0, 2), device=False)
    buf = np.zeros(8192, np.uint8)
    ptr = int(buf.ctypes.data) + (-int(buf.ctypes.data) % 128)
    good = (1, ptr, 1024, 2048, 1000)
    for bad, match in [((0, ptr, 1024, 2048, 1000), "peers"), ((2, ptr, 1024, 2048, 1000), "peers"),
                       ((1, ptr + 8, 1024, 2048, 1000), "aligned"), ((1, ptr, 4096, 2048, 1000), "slot"),
                       ((1, ptr, 64, 2048, 1000), "slot"), ((1, ptr, 1024, 2048, 0), "n > 0")]:
        with pytest.raises(ValueError, match=match):
            sp.begin(1, "all_gather", "bfloat16", [bad], [])
    with pytest.raises(ValueError, match="frames are|peer"):
        sp.begin(1, "all_gather", "bfloat16", [(1, ptr, 1024)], [])
    with pytest.raises(ValueError, match="unknown collective"):
        sp.begin(1, "broadcast", "bfloat16", [good], [])
    with pytest.raises(TypeError):
        sp.begin(1, "all_gather", "int8", [good], [])
    with pytest.raises(ValueError, match="not begun"):
        sp.launch_out(1)
    sp.begin(5, "all_gather", "bfloat16", [], [])
    with pytest.raises(ValueError, match="increase"):
        sp.begin(5, "all_gather", "bfloat16", [], [])
    with pytest.raises(RuntimeError, match="before launch_out"):
        sp.launch_in(5)
    sp.launch_out(5)
    with pytest.raises(RuntimeError, match="twice"):
        sp.launch_out(5)
    sp.launch_in(5)
    sp.close()


def test_mpi_channel_needs_thread_multiple(monkeypatch):
    MPI = pytest.importorskip("mpi4py.MPI")  # noqa: N806
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_SERIALIZED)
    with pytest.raises(RuntimeError, match="MPI_THREAD_MULTIPLE"):
        channels.MPIChannel(MPI.COMM_SELF)


def test_error_bits_do_not_meet_the_decode_bits():
    from zipccl.format import errors

    bits = [*errors.FRAME_ERRORS, *errors.SLOT_ERRORS]
    assert max(errors.FRAME_ERRORS) <= errors.FRAME_MASK < min(errors.SLOT_ERRORS)
    assert len(set(bits)) == len(bits) and all(b & (b - 1) == 0 for b in bits)  # one bit each


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_source_compiles(tmp_path):
    """The kernels' CUDA C compiles (to PTX for sm_90, as NVRTC would on an H200)."""
    src = tmp_path / "spill.cu"
    src.write_text(kern.source())
    r = subprocess.run(["nvcc", "-arch=sm_90", "--std=c++14", "-ptx", "-o", str(tmp_path / "spill.ptx"),
                        str(src)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    ptx = (tmp_path / "spill.ptx").read_text()
    for name in kern.HOST_TWINS:
        assert f".entry {name}(" in ptx
    assert "nanosleep" in ptx and "membar.sys" in ptx and "ld.global.cv" in ptx


def test_spill_kernels_launch_from_words_packed_in_place(monkeypatch):
    """``launch.words``: a CuPy kernel's launch is one driver call whose ``void**`` array points
    at the call's 64-bit words, reused launch after launch; a driver error raises; a stand-in
    without a CUfunction is called as CuPy calls a kernel."""
    import ctypes
    import types

    from zipccl.kernels import launch

    seen = []

    def cu_launch(fn, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        ptrs = (ctypes.c_uint64 * 5).from_address(params)
        seen.append((fn, gx, bx, stream, [ctypes.c_uint64.from_address(p).value for p in ptrs]))
        return (0,) if fn == 7 else (999,)

    driver = types.SimpleNamespace(cuLaunchKernel=cu_launch, cuGetErrorName=lambda e: (0, b"CUDA_ERROR_X"))
    monkeypatch.setattr(launch, "_DRIVER", [driver])
    go = launch.words(types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=7)), kern.THREADS)
    go(3, 11, (1, 2, 3, 4, 2**64 - 1))
    go(1, 12, (5, 6))  # fewer words: the rest keep the last values, as a kernel of two reads two
    assert seen == [(7, 3, kern.THREADS, 11, [1, 2, 3, 4, 2**64 - 1]),
                    (7, 1, kern.THREADS, 12, [5, 6, 3, 4, 2**64 - 1])]
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: CUDA_ERROR_X"):
        launch.words(types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=8)), 32)(1, 0, (1,))
    called = []
    launch.words(lambda *a, **k: called.append((a, k)), 32)(2, 5, (9,))
    assert called == [(((2,), (32,), (np.uint64(9),)), {"stream": 5})]



def test_a_device_pool_with_none_free_doubles(monkeypatch):
    """With a device, a call that finds no free block makes as many more as the calls in flight
    hold: the pool grows at depths 1, 2, 4, 8 (1 + 2 + 4 + 8 blocks), not at every new depth."""
    sp = spill.Spills(LocalChannel(_Net(), 0, 2), device=False)
    monkeypatch.setattr(sp, "device", True)
    monkeypatch.setattr(sp, "_pinned", lambda n: (None, np.zeros(n, np.uint8)))
    monkeypatch.setattr(sp, "_device_words", lambda n: (None, 0))
    made = []
    for _ in range(9):  # one more call in flight each time
        sp._inflight.append(types.SimpleNamespace(block=sp._take(5000)))
        made.append(sp.stats()["allocations"])
    assert made == [1, 3, 3, 7, 7, 7, 7, 15, 15]
    assert sp.stats()["blocks"] == 15 and len(sp._free) == 6
    sp._inflight.clear()
    sp.close()
