"""The GPU decoder on hostile input, under Numba's CUDA simulator: errors, not crashes.

A frame that arrives over a link can be anything: a partial transfer, a stale
buffer, bytes from another call. The device decoder must then set error bits (or
raise ValueError before launching), and never read or write outside the buffers it
was given: on a GPU such an access is ``cudaErrorIllegalAddress``, which kills the
whole CUDA context, not just the call.

Under the simulator a kernel's device arrays are NumPy views of exactly the sizes
``codec.gpu`` hands the kernels, so an index past the end raises IndexError. A
negative index would silently wrap around in NumPy, so this module also makes the
simulator's in-kernel arrays reject negative indices. The frames here are built so
that every check the decoder relies on is exercised with the payload it guards
being garbage, and every frame buffer is exactly as long as the frame claims (or
shorter), so any read past it is caught. Like the simulator half of
``test_gpu_codec.py`` its cases run in a pytest process with ``NUMBA_ENABLE_CUDASIM=1``
(``make test``, ``make test-sim``).

The other way a device collective reads garbage is a race between its streams (a
decode before the transfer that fills its buffer has finished, a buffer zeroed or
reused while another stream still uses it). ``test_stream_order`` runs
``tests/mpi/stream_order.py`` on two ranks: the device path with every stream
hand-off checked for happens-before (see that file).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from conftest import SIMULATOR, gaussian_bits, simulator_only


@pytest.mark.mpi
@pytest.mark.skipif(SIMULATOR, reason="runs outside the simulator")
def test_stream_order(tmp_path):
    """Every cross-stream buffer hand-off of the device collectives is ordered by an event or
    a host wait (pipelined and two-phase, growing messages, no host sync between calls)."""
    from test_comm_mpi import ROOT, clean_env, mpiexec

    cmd = [mpiexec(), "-n", "2", sys.executable, str(ROOT / "tests" / "mpi" / "stream_order.py"),
           str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    out = r.stdout[-4000:] + r.stderr[-4000:]
    cases = ["outgrown_workspace_keeps_its_errors", "pipelined", "one_round",
             "negative_control_decode_wait", "negative_control_spill_in"]
    for rank in range(2):
        assert (tmp_path / f"rank{rank}.json").exists(), f"rank {rank} wrote no report:\n{out}"
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert found["failed"] is None, f"rank {rank}: {found['failed']} failed:\n{out}"
        assert found["passed"] == cases, f"rank {rank} passed {found['passed']}, expected {cases}"
    assert r.returncode == 0, out


if SIMULATOR:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NumPy int64 wrap-around
    from numba.cuda.simulator.cudadrv import devicearray as _sim_arrays

    from zipccl import format as fmt
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu, gpu_workspace, reference
    from zipccl.format import errors
    from zipccl.kernels import _common

    def _no_negative(idx):
        if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool) and int(idx) < 0:
            raise IndexError(f"negative index {int(idx)} in a kernel (wraps around in NumPy, "
                             "reads or writes out of bounds on a GPU)")
        if isinstance(idx, tuple):
            for i in idx:
                _no_negative(i)

    _Within = _sim_arrays.FakeWithinKernelCUDAArray
    _get, _set = _Within.__getitem__, _Within.__setitem__

    def _strict_get(self, idx):
        _no_negative(idx)
        return _get(self, idx)

    def _strict_set(self, idx, val):
        _no_negative(idx)
        return _set(self, idx, val)

    _Within.__getitem__, _Within.__setitem__ = _strict_get, _strict_set

GUARD = 0x5A5A
N = 4096 + 300  # two escape blocks: the look-back and the hand-over between blocks run


def _decode(frame: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """(values, error bits) of a GPU decode of exactly ``frame`` into a guarded output of n."""
    guard = np.full(n + 64, GUARD, np.uint16)
    out = guard[32:32 + n]
    ws = gpu_workspace.Workspace(max(n, 1))
    gpu.decode_into(np.ascontiguousarray(frame), out, workspace=ws)
    assert np.all(guard[:32] == GUARD) and np.all(guard[32 + n:] == GUARD), \
        "decoder wrote outside its output"
    slots = np.asarray(ws.array._ary)
    assert slots[_common.WS_TICKET] == 0, "the workspace was not left ready for the next call"
    return out.copy(), ws.last_error()


def _header(n: int, n_escapes: int, frame_len: int, flags: int, codebook=(120, 121, 122, 123, 124,
                                                                          125, 126)) -> np.ndarray:
    return fmt.pack_header(fmt.Header(n=n, n_escapes=n_escapes, frame_len=frame_len, flags=flags,
                                      codebook=tuple(codebook), shape=(n,)))


def _garbage(rng, nbytes: int) -> np.ndarray:
    return rng.integers(0, 256, nbytes, dtype=np.uint8)


def _rejected(frame: np.ndarray, n: int) -> int:
    _, err = _decode(frame, n)
    assert err != 0, "a corrupted frame decoded without an error bit"
    with pytest.raises(ValueError):  # the specification agrees that the frame is bad
        reference.decode(frame)
    return err


@simulator_only
def test_valid_header_over_garbage_payloads():
    """Header fields all consistent (so every block decodes), payload random: counts, code
    planes and escapes disagree in every way; with and without the payload checksum."""
    rng = np.random.default_rng(1)
    lay = fmt.Layout.for_count(N)
    for nesc, flags in ((57, 0), (lay.raw_size - lay.escapes_offset, 2)):
        flen = lay.escapes_offset + nesc
        frame = np.concatenate([_header(N, nesc, flen, flags), _garbage(rng, flen - fmt.HEADER_SIZE)])
        err = _rejected(frame, N)
        assert err & (errors.ERR_COUNTS | errors.ERR_TOTAL | errors.ERR_CHECKSUM)


@simulator_only
def test_corrupted_real_frame_regions():
    """A real frame with one section overwritten: counts at their maximum, every code an
    escape (each escape read lands past the escape section), escape bytes random."""
    bits = gaussian_bits(N, seed=3)
    frame = reference.encode(bits, Codebook.from_sigma(0.02))
    lay = fmt.Layout.for_count(N)
    f = frame.copy()
    f[lay.counts_offset:lay.escapes_offset] = 0xFF
    assert _rejected(f, N) & errors.ERR_COUNTS
    f = frame.copy()
    f[lay.planes_offset:lay.counts_offset] = 0
    assert _rejected(f, N) & (errors.ERR_ESCAPE_RANGE | errors.ERR_COUNTS)


@simulator_only
def test_frames_that_lie_about_their_length():
    """A header whose lengths do not fit the buffer or the layout writes nothing and reads
    nothing past the buffer: truncated transfers, a huge escape count, a RAW flag on a
    short buffer, an odd-sized buffer, the wrong element count."""
    rng = np.random.default_rng(2)
    n = 1000
    bits = gaussian_bits(n, seed=4)
    frame = reference.encode(bits, Codebook.from_sigma(0.02))
    lay = fmt.Layout.for_count(n)
    for cut in (lay.escapes_offset - 1, frame.size - 1):
        assert _rejected(frame[:cut].copy(), n) & errors.ERR_HEADER
    short = lay.escapes_offset + 8
    for nesc, flen, flags in ((1 << 40, lay.escapes_offset + (1 << 40), 0), (0, lay.raw_size, 1)):
        f = np.concatenate([_header(n, nesc, flen, flags), _garbage(rng, short - fmt.HEADER_SIZE)])
        assert _rejected(f, n) & errors.ERR_HEADER
    f = np.concatenate([frame, _garbage(rng, 3)])  # longer, odd-sized buffer: still decodes
    got, err = _decode(f, n)
    assert err == 0 and np.array_equal(got, bits)
    _, err = _decode(frame, n - 1)  # the output disagrees with the header's count
    assert err & errors.ERR_HEADER
    assert _rejected(_garbage(rng, 2 * fmt.HEADER_SIZE), n) & errors.ERR_HEADER


@simulator_only
def test_raw_frames_of_garbage():
    """A RAW frame is a copy: without a checksum garbage is (correctly) taken as data, with
    one it is caught; a tail that is not a whole 16-byte group is copied value by value."""
    rng = np.random.default_rng(3)
    n = 1013
    lay = fmt.Layout.for_count(n)
    payload = _garbage(rng, lay.raw_size - fmt.HEADER_SIZE)
    got, err = _decode(np.concatenate([_header(n, 0, lay.raw_size, 1), payload]), n)
    assert err == 0 and np.array_equal(got, payload.view("<u2"))
    assert _rejected(np.concatenate([_header(n, 0, lay.raw_size, 3), payload]), n) \
        & errors.ERR_CHECKSUM


@simulator_only
def test_short_buffers_raise_before_launching():
    out = np.zeros(N, np.uint16)
    with pytest.raises(ValueError, match="shorter than"):
        gpu.decode_into(np.zeros(fmt.HEADER_SIZE - 1, np.uint8), out)
    with pytest.raises(ValueError, match="workspace"):
        gpu.decode_into(np.zeros(4096, np.uint8), out, workspace=gpu_workspace.Workspace(16))


# -- the simulator's block scheduling (zipccl.kernels.compat) --------------------------------
if SIMULATOR:
    from numba import cuda

    from zipccl.kernels import compat

    @cuda.jit(device=True)
    def _lane():
        return cuda.threadIdx.x

    @cuda.jit(device=True)
    def _lane_nested():
        return _lane() * 10

    @cuda.jit
    def _rotate(out):
        s = cuda.shared.array(64, np.int64)
        i = cuda.threadIdx.x
        for r in range(3):
            s[i] = _lane_nested() + r
            cuda.syncthreads()
            out[r, i] = s[(i + 1) % 64]
            cuda.syncthreads()

    @cuda.jit
    def _lane_fails(out):
        i = cuda.threadIdx.x
        if i == 5:
            raise ValueError("lane 5 fails")
        out[i] = compat.ballot(True)  # the rest of warp 0 waits here for lane 5


@simulator_only
def test_simulator_block_scheduling():
    """The simulator as compat runs it: barriers hold (each lane reads what its neighbour
    wrote before the barrier, three rounds), nested device functions see the simulated cuda
    module, and a failing lane ends the launch at once with its error, the lanes waiting for
    it at a warp exchange included (none is left running until the exchange times out)."""
    import threading
    import time

    from numba.cuda.simulator.kernel import BlockThread

    out = np.zeros((3, 64), np.int64)
    _rotate[1, 64](out)
    assert np.array_equal(out, (np.arange(1, 65) % 64 * 10)[None, :] + np.arange(3)[:, None])

    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"tid=\[5, 0, 0\].*lane 5 fails"):
        _lane_fails[1, 64](np.zeros(64, np.int64))
    while any(isinstance(t, BlockThread) and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() - t0 < compat.EXCHANGE_TIMEOUT_S / 4, "lanes left waiting"
        time.sleep(0.05)
