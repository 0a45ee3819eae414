"""The spill kernels on a GPU: ``pytest -m gpu tests/test_spill_gpu.py`` (CuPy and one CUDA device).

In one process: ``zipccl_spill_out`` writes the slot headers ``slots.pack_slot_header``
writes (the CRC computed on the device), the tails and their lengths into the call block;
``zipccl_spill_record`` reaches the sticky word and the next headers.
Over two processes sharing the GPU (gloo for the host channel and the test's slot
transfer): ``tests/mpi/spill_ranks.py gpu``, the soak and the error word's paths with the
real kernels, with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (one hardware queue, where a stream
waiting on later GPU work would deadlock) and with the default.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from zipccl import format as fmt
from zipccl.comm import spill
from zipccl.format import slot as slots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cupy():
    """CuPy with a device, or a skip that names the cause (no CuPy, no driver, no device)."""
    try:
        import cupy
    except ImportError as e:
        pytest.skip(f"CuPy is not installed ({e})")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"no CUDA device: {e}")
    if count < 1:
        pytest.skip("no CUDA device")
    return cupy


class _Recorder:
    """A host channel of rank 0 of 2 that keeps what it is asked to send."""

    rank, size = 0, 2

    def __init__(self):
        self.sent = []

    def isend(self, data, peer, tag):
        self.sent.append((peer, tag, np.array(data)))
        return type("Done", (), {"wait": lambda self: None, "test": lambda self: True})()

    def recv(self, out, peer, tag):
        raise AssertionError("no frame is received here")

    def close(self):
        pass


@pytest.mark.gpu
def test_spill_out_writes_the_reference_slot_headers():
    cp = _cupy()
    ch = _Recorder()
    sp = spill.Spills(ch, device=True)
    code, n = fmt.DTYPE_BF16, 5000
    slot, region = slots.slot_bytes(n, code, 64), slots.region_bytes(n, code)
    lens, escapes = [slot - 128 - 40, slot - 128 + 999], [17, 123456]  # fits, spills 999 bytes
    rng = np.random.default_rng(0)
    host = rng.integers(0, 256, 2 * region, dtype=np.uint8)
    for k in range(2):
        f = host[k * region + 128:(k + 1) * region]
        f[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8] = np.array([lens[k]], "<u8").view(np.uint8)
        f[fmt.N_ESCAPES_AT:fmt.N_ESCAPES_AT + 8] = np.array([escapes[k]], "<u8").view(np.uint8)
    dev = cp.asarray(host)
    bits = cp.asarray(np.array([0x8], np.uint32))
    stream = cp.cuda.Stream()
    sends = [(1, int(dev.data.ptr) + k * region, slot, region, n) for k in range(2)]
    sp.record_error(stream, int(bits.data.ptr))
    sp.begin(1, "all_to_all", code, sends, [])
    sp.launch_out(1, stream)
    sp.launch_in(1, stream)
    stream.synchronize()
    got = cp.asnumpy(dev)
    for k in range(2):
        want = slots.pack_slot_header(slots.SlotHeader(
            seq=1, op=slots.OP_CODES["all_to_all"], dtype=code, n=n, frame_len=lens[k], slot_bytes=slot,
            error=0x8, max_escapes=max(escapes)))
        assert np.array_equal(got[k * region:k * region + 128], want), k
        assert np.array_equal(got[k * region + 128:(k + 1) * region], host[k * region + 128:(k + 1) * region])
    sp.close()
    assert [(peer, tag) for peer, tag, _ in ch.sent] == [(1, 1 * spill.TAG_FRAMES + 1)]
    tail = ch.sent[0][2]
    assert np.array_equal(tail, host[region + slot:region + slot + 999])
    assert sp.error() == 0x8


@pytest.mark.gpu
@pytest.mark.parametrize("connections", ["1", None])
def test_two_processes_share_the_gpu_over_gloo(connections, tmp_path):
    _cupy()
    pytest.importorskip("torch")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    if connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    path = [ROOT, os.path.join(ROOT, "tests", "mpi"), env.get("PYTHONPATH", "")]
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SPILL_OUT=str(tmp_path),
               PYTHONPATH=os.pathsep.join(path))
    script = os.path.join(ROOT, "tests", "mpi", "spill_ranks.py")
    procs = [subprocess.Popen([sys.executable, script, "gpu", "300", "--torch", str(r), "2"], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        outs = [pr.communicate(timeout=300)[0] for pr in procs]
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    assert all(pr.returncode == 0 for pr in procs), "\n".join(o[-4000:] for o in outs)
    sys.path.insert(0, os.path.join(ROOT, "tests", "mpi"))
    import spill_ranks  # every case by name (the tampered-header ones are host-only)

    for r in range(2):
        assert (tmp_path / f"rank{r}.json").exists(), outs[r][-4000:]
        spill_ranks.check(json.loads((tmp_path / f"rank{r}.json").read_text()), 300, "gpu")


class _Loopback:
    """The host channel of a one-rank group (``Policy.loopback``): nothing spills here."""

    rank, size = 0, 1

    def isend(self, data, peer, tag):
        raise AssertionError("no frame spills here")

    def recv(self, out, peer, tag):
        raise AssertionError("no frame spills here")

    def close(self):
        pass


@pytest.mark.gpu
def test_a_steady_stream_of_calls_allocates_no_pinned_memory():
    """Calls block pinned memory until they are handled; a device keeps every block it made, so
    once the pool is as deep as the calls in flight get, no call allocates again (pinned
    allocations of a 64 MiB call's blocks take tens of ms each). The first burst is queued
    behind a spinning kernel (after one call that builds the kernels), so that all its calls are
    in flight at once whatever the timing: the pool, doubling whenever none is free, then holds
    63 blocks for those 40 calls, and a burst as deep or shallower allocates nothing."""
    import time

    cp = _cupy()
    sp = spill.Spills(_Loopback(), device=True)
    code, n = fmt.DTYPE_BF16, 5000
    slot, region = slots.slot_bytes(n, code, 64), slots.region_bytes(n, code)
    host = np.zeros(region, np.uint8)
    host[128 + fmt.FRAME_LEN_AT:128 + fmt.FRAME_LEN_AT + 8] = np.array([slot - 200], "<u8").view(np.uint8)
    dev = cp.asarray(host)
    stream = cp.cuda.Stream()
    frames = [(0, int(dev.data.ptr), slot, region, n)]
    spin = cp.RawKernel(r"""extern "C" __global__ void spin(long long cycles) {
        long long t0 = clock64(); while (clock64() - t0 < cycles) {} }""", "spin")
    seq = 0

    def burst(calls, hold_s=0.0):
        nonlocal seq
        if hold_s:  # the stream runs nothing of the burst before every call is begun
            spin((1,), (1,), (np.int64(hold_s * 2e9),), stream=stream)
        for _ in range(calls):
            seq += 1
            sp.begin(seq, "all_to_all", code, frames, frames)
            sp.launch_out(seq, stream)
            sp.launch_in(seq, stream)
        stream.synchronize()
        deadline = time.monotonic() + 30
        while not all(c.done for c in sp._inflight) and time.monotonic() < deadline:
            time.sleep(0.01)

    burst(1)  # the kernels compiled (CuPy builds them at their first launch) before the hold
    burst(40, hold_s=0.5)
    made = sp.stats()["allocations"]
    assert made == 63, sp.stats()  # none could retire while the stream was held: 1 + 2 + ... + 32
    burst(40, hold_s=0.5)  # as deep again
    burst(30)
    assert sp.stats()["allocations"] == made, sp.stats()
    sp.close()
    assert sp.error() == 0
