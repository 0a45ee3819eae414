"""Misuse that must raise a clear error, never run on coerced values or abort.

- A ``Communicator`` called from a second thread while a call runs: one rank here (the
  running call held inside by a stand-in), two ranks under mpiexec (``tests/mpi/mpi_threads.py``).
- The codec from several threads at once: the same bytes as from one.
- Counts that are not integers (floats, strings, bools), codebook entries that are not
  integers, ``out=`` buffers the frame could not be written into in place: refused.
- ``python -m zipccl analyze`` on tensors zipccl cannot frame: reported, no traceback.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
from conftest import gaussian_bits
from test_comm_mpi import ROOT, clean_env, mpiexec

import zipccl
from zipccl.codebook import Codebook
from zipccl.codec import cpu_threads
from zipccl.comm import CollectiveError
from zipccl.comm.args import as_count, check_counts

MPI = pytest.importorskip("mpi4py.MPI")
BF16 = np.dtype(ml_dtypes.bfloat16)
GOOD_CB = (116, 117, 118, 119, 120, 121, 122)


# -- threads ------------------------------------------------------------------------------------

def held_inside(comm):
    """Make ``comm``'s next call wait inside (in its agreement step) until released:
    (inside, release) events."""
    inside, release = threading.Event(), threading.Event()
    control = comm._agreement.control

    def waiting(*args, **kwargs):
        inside.set()
        assert release.wait(60)
        return control(*args, **kwargs)

    comm._agreement.control = waiting
    return inside, release


@pytest.mark.parametrize("second", ["all_reduce", "all_gather", "synchronize", "close"])
def test_communicator_refuses_a_call_from_a_second_thread(second):
    comm = zipccl.Communicator(MPI.COMM_SELF, policy="never")
    x = np.arange(8, dtype=np.float32)
    out = np.zeros(8, np.float32)
    inside, release = held_inside(comm)
    first = threading.Thread(target=comm.all_gather, args=(x, out), name="first-caller")
    first.start()
    try:
        assert inside.wait(60)
        calls = {"all_reduce": lambda: comm.all_reduce(x.copy()),
                 "all_gather": lambda: comm.all_gather(x, np.zeros(8, np.float32)),
                 "synchronize": comm.synchronize, "close": comm.close}
        with pytest.raises(CollectiveError, match=f"{second} was called from thread 'MainThread' "
                                                  f"while all_gather ran on thread 'first-caller'"):
            calls[second]()
    finally:
        release.set()
        first.join(60)
    assert np.array_equal(out, x)  # the running call completed, undisturbed
    with pytest.raises(CollectiveError, match="refused since an earlier concurrent call"):
        comm.all_reduce(x.copy())
    comm.close()  # still closes


def test_communicator_from_threads_in_turn():
    """Calls from several threads that do not overlap are one caller's calls."""
    comm = zipccl.Communicator(MPI.COMM_SELF, policy="always")
    x = gaussian_bits(5000, seed=3).view(BF16)
    for k in range(3):
        out = np.zeros_like(x)
        t = threading.Thread(target=comm.all_gather, args=(x, out))
        t.start()
        t.join(60)
        assert np.array_equal(out.view(np.uint16), x.view(np.uint16)), k
    comm.close()


def test_communicator_threads_nest_on_one_thread():
    """A thread's own nested call (as ``calibrate`` makes) is admitted."""
    comm = zipccl.Communicator(MPI.COMM_SELF, policy="never")
    x = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    control = comm._agreement.control
    nested = []

    def with_nested_call(*args, **kwargs):
        if not nested:
            nested.append(1)
            comm.all_reduce(np.ones(4, np.float32))  # inside the all_gather, same thread
        return control(*args, **kwargs)

    comm._agreement.control = with_nested_call
    comm.all_gather(x, out)
    assert nested and np.array_equal(out, x)
    comm.close()


@pytest.mark.mpi
@pytest.mark.slow  # an MPI job of its own: the slow tier (CI runs it after make test)
def test_communicator_threads_on_two_ranks():
    """Two ranks: the refusal while a peer waits, and threads that take turns (the script)."""
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "-W", "ignore::RuntimeWarning", "tests/mpi/mpi_threads.py"]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                           timeout=180)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"2 ranks did not finish in 180 s (a hang?): {(e.stdout or b'')[-3000:]!r}")
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert "2 passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_codec_from_threads_gives_one_threads_bytes(backend):
    sizes = (1000, cpu_threads.SMALL + 77, 3 * cpu_threads.SMALL)  # one thread per call, and parallel loops
    data = [gaussian_bits(n, seed=i).view(BF16) for i, n in enumerate(sizes)]
    frames = [zipccl.compress(x, backend=backend) for x in data]
    wrong: list[str] = []

    def worker(k: int) -> None:
        for i in range(6):
            j = (k + i) % len(data)
            f = zipccl.compress(data[j], backend=backend)
            if not np.array_equal(f, frames[j]):
                wrong.append(f"thread {k}: frame {j}")
            back = zipccl.decompress(f, backend=backend)
            if not np.array_equal(back.view(np.uint16), data[j].view(np.uint16)):
                wrong.append(f"thread {k}: values {j}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert wrong == []


def test_codec_threads_under_the_workqueue_layer():
    """Numba's workqueue layer aborts a process whose threads run parallel regions at once;
    the CPU codec's calls take turns under it."""
    code = ("import threading, numpy as np, ml_dtypes, numba, zipccl\n"
            "from zipccl.codec import cpu_threads\n"
            "xs = [np.random.default_rng(i).normal(0, .02, 3 * cpu_threads.SMALL).astype(ml_dtypes.bfloat16)"
            " for i in range(3)]\n"
            "ref = [zipccl.compress(x) for x in xs]\n"
            "assert numba.threading_layer() == 'workqueue'\n"
            "bad = []\n"
            "def work(k):\n"
            "    for i in range(8):\n"
            "        j = (k + i) % 3\n"
            "        if not np.array_equal(zipccl.compress(xs[j]), ref[j]): bad.append(j)\n"
            "ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "print('wrong', bad)\n")
    env = dict(clean_env(), NUMBA_THREADING_LAYER="workqueue", NUMBA_NUM_THREADS="2",
               ZIPCCL_CPU_THREADS="2")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "wrong []"


# -- counts -------------------------------------------------------------------------------------

@pytest.mark.parametrize("counts, error, match", [
    ([2.5, 2.5], TypeError, r"send_counts\[0\] must be an integer .* got float 2.5"),
    ([2.0, 2.0], TypeError, r"got float 2.0"),
    (["1000", "1000"], TypeError, r"got str '1000'"),
    ([True, 1], TypeError, r"got bool True"),
    ([np.bool_(True), 1], TypeError, r"got bool"),
    ([np.float32(2), 2], TypeError, r"got float32"),
    (np.array([2.0, 2.0]), TypeError, r"got float64"),
    ("22", TypeError, r"must be a sequence of 2 integers, got str"),
    (4, TypeError, r"must be a sequence of 2 integers, got int"),
    ([1, -1], ValueError, r"send_counts\[1\] must be >= 0"),
    ([1, 1, 1], ValueError, r"has 3 entries; 2 ranks need one each"),
    (np.array([[1, 1]]), ValueError, r"must be 1-D"),
])
def test_counts_are_refused_unless_integers(counts, error, match):
    with pytest.raises(error, match=match):
        check_counts(counts, 2, "send_counts")


@pytest.mark.parametrize("counts", [[2, 2], (2, 2), np.array([2, 2], np.int32),
                                    [np.int64(2), np.uint8(2)]])
def test_counts_take_ints_and_numpy_integers(counts):
    out = check_counts(counts, 2, "c")
    assert out == [2, 2] and all(type(c) is int for c in out)


@pytest.mark.parametrize("value", [1.0, "1", True, None])
def test_one_count_must_be_an_integer(value):
    with pytest.raises(TypeError, match="must be an integer"):
        as_count(value, "count")


@pytest.mark.parametrize("send_counts, recv_counts, match", [
    ([2.5], None, r"send_counts\[0\] must be an integer .* got float 2.5"),
    (["4"], None, r"send_counts\[0\] must be an integer .* got str '4'"),
    ([4], [4.0], r"recv_counts\[0\] must be an integer .* got float 4.0"),
])
def test_communicator_all_to_all_refuses_non_integer_counts(send_counts, recv_counts, match):
    comm = zipccl.Communicator(MPI.COMM_SELF)
    x = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    with pytest.raises(CollectiveError, match=match):  # CollectiveError is a ValueError
        comm.all_to_all(x, out, send_counts=send_counts, recv_counts=recv_counts)
    assert not out.any()
    comm.all_to_all(x, out, send_counts=[np.int64(4)], recv_counts=[4])  # still usable
    assert np.array_equal(out, x)
    comm.close()


@pytest.mark.parametrize("value", [4096.0, "4096", True])
def test_communicator_chunk_must_be_an_integer(value):
    comm = zipccl.Communicator(MPI.COMM_SELF)
    with pytest.raises(TypeError, match="chunk must be an integer"):
        comm.chunk = value
    comm.chunk = np.int64(4096)
    assert comm.chunk == 4096 and type(comm.chunk) is int
    comm.close()


# -- codebooks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("exponents, match", [
    ((116.7, 117, 118, 119, 120, 121, 122), r"got float 116.7"),
    ((116.0, 117, 118, 119, 120, 121, 122), r"got float 116.0"),
    (("116", 117, 118, 119, 120, 121, 122), r"got str '116'"),
    ((True, 117, 118, 119, 120, 121, 122), r"got bool True"),
    (np.array(GOOD_CB, np.float32), r"got float32"),
    (116, r"takes a sequence of 7 integer exponents, got int"),
])
def test_codebook_refuses_non_integer_exponents(exponents, match):
    with pytest.raises(TypeError, match=match):
        Codebook(exponents)


def test_codebook_takes_integers_of_any_kind():
    for given in (GOOD_CB, list(GOOD_CB), np.array(GOOD_CB, np.uint8), iter(GOOD_CB)):
        cb = Codebook(given)
        assert cb.exponents == GOOD_CB and all(type(e) is int for e in cb.exponents)


# -- out= ---------------------------------------------------------------------------------------

def _x():
    return gaussian_bits(1000, seed=9).view(BF16)


@pytest.mark.parametrize("make, error, match", [
    (lambda n: [0] * n, TypeError, "got list: the frame would go to a copy"),
    (lambda n: (0,) * n, TypeError, "got tuple"),
    (lambda n: "x" * n, TypeError, "got str"),
    (lambda n: bytes(n), ValueError, r"read-only \(bytes\)"),
    (lambda n: memoryview(bytes(n)), ValueError, r"read-only \(memoryview\)"),
    (lambda n: np.zeros(2 * n, np.uint8)[::2], ValueError, "strided"),
])
def test_compress_refuses_out_it_cannot_write_in_place(make, error, match):
    x = _x()
    with pytest.raises(error, match=match):
        zipccl.compress(x, out=make(zipccl.max_compressed_size(x.size)))


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "numpy", "numpy-float32"])
def test_compress_writes_out_in_place(kind):
    x = _x()
    n = zipccl.max_compressed_size(x.size)
    out = {"bytearray": lambda: bytearray(n), "memoryview": lambda: memoryview(bytearray(n)),
           "numpy": lambda: np.zeros(n, np.uint8),
           "numpy-float32": lambda: np.zeros(-(-n // 4), np.float32)}[kind]()
    frame = zipccl.compress(x, out=out)
    mem = np.frombuffer(out, np.uint8) if not isinstance(out, np.ndarray) else out.view(np.uint8)
    assert np.shares_memory(frame, mem)
    assert np.array_equal(mem[:frame.size], zipccl.compress(x))
    assert np.array_equal(zipccl.decompress(frame).view(np.uint16), x.view(np.uint16))


def test_compress_writes_a_torch_out_in_place():
    torch = pytest.importorskip("torch")
    x = _x()
    out = torch.zeros(zipccl.max_compressed_size(x.size) // 2 + 1, dtype=torch.bfloat16)
    frame = zipccl.compress(x, out=out)
    assert frame.dtype == torch.uint8 and frame.data_ptr() == out.data_ptr()
    assert np.array_equal(frame.numpy(), zipccl.compress(x))
    with pytest.raises(ValueError, match="strided"):
        zipccl.compress(x, out=torch.zeros(2 * out.numel(), dtype=torch.bfloat16)[::2])


def test_compress_refuses_more_than_eight_dimensions():
    with pytest.raises(ValueError, match="at most 8 dimensions, got 9"):
        zipccl.compress(np.zeros((1,) * 9, BF16))


# -- analyze ------------------------------------------------------------------------------------

def _analyze(capsys, *args):
    """(exit status, stdout, stderr) of ``python -m zipccl analyze ARGS``, in this process."""
    from zipccl import analyze

    status = analyze.main(["--no-progress", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_analyze_reports_a_tensor_it_cannot_frame(tmp_path, capsys):
    f = tmp_path / "mixed.npz"
    np.savez(f, deep=np.ones((1,) * 9 + (3,), np.float32),
             fine=np.random.default_rng(0).normal(0, 0.02, 1000).astype(np.float32))
    status, out, err = _analyze(capsys, str(f))
    assert status == 0, err
    assert ("not analyzed: deep of shape (1, 1, 1, 1, 1, 1, 1, 1, 1, 3): cannot be framed: "
            "10 dimensions; a zipccl frame holds at most 8") in out
    assert "total: 1 tensors, 1,000 values" in out


def test_analyze_json_reports_a_tensor_it_cannot_frame(tmp_path, capsys):
    import json

    f = tmp_path / "mixed.npz"
    np.savez(f, deep=np.ones((1,) * 9, np.float32), fine=np.ones(100, np.float32))
    status, out, err = _analyze(capsys, "--json", str(f))
    assert status == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert {"file": str(f), "name": "deep", "shape": [1] * 9,
            "error": "cannot be framed: 9 dimensions; a zipccl frame holds at most 8"} in lines
    assert lines[-1]["unframed"] == ["deep"] and lines[-1]["total"]["tensors"] == 1


def test_analyze_refuses_a_file_of_unframable_tensors(tmp_path, capsys):
    f = tmp_path / "deep.npy"
    np.save(f, np.ones((1,) * 9, np.float32))
    status, out, err = _analyze(capsys, str(f))
    assert status == 2
    assert err.strip().splitlines() == [
        f"python -m zipccl analyze: error: {f}: no tensor zipccl can frame (deep cannot be "
        f"framed: 9 dimensions; a zipccl frame holds at most 8)"]
