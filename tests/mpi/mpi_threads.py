"""A Communicator called from several threads, on 2 ranks: what the docs promise.

Run by ``tests/test_misuse_comm.py`` as ``mpiexec -n 2 python -m pytest tests/mpi/mpi_threads.py``
under a time limit. A call from a second thread while one runs is refused with a clear
``CollectiveError`` before anything moves (no "message truncated" abort, no misleading frame
error), the running call still completes bit-exact, and the communicator refuses every later
call on that rank. Calls from several threads that the caller orders alike on every rank run
as from one thread.
"""

from __future__ import annotations

import threading
import time

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import zipccl
from zipccl.comm import CollectiveError

WORLD = MPI.COMM_WORLD
P, ME = WORLD.Get_size(), WORLD.Get_rank()
BF16 = np.dtype(ml_dtypes.bfloat16)

if P != 2:
    pytest.skip("the thread cases are written for two ranks", allow_module_level=True)


def values(rank: int, n: int, seed: int) -> np.ndarray:
    """Rank ``rank``'s BF16 values of call ``seed``, from seeds alone."""
    return np.random.default_rng([seed, rank]).normal(0, 0.02, n).astype(BF16)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)


def test_a_second_thread_is_refused_while_a_call_runs():
    """Rank 0's first thread waits inside all_gather for rank 1; rank 0's main thread calls
    all_reduce meanwhile and is refused at once; the all_gather completes bit-exact."""
    comm = zipccl.Communicator(WORLD, policy="always")
    n = 5000
    send = values(ME, n, 1)
    recv = np.zeros(P * n, BF16)
    if ME == 0:
        worker = threading.Thread(target=comm.all_gather, args=(send, recv), name="gatherer")
        worker.start()
        deadline = time.monotonic() + 60
        while comm._calls.owner is None:  # the worker is inside its call (rank 1 waits for us)
            assert time.monotonic() < deadline, "the worker never entered all_gather"
            time.sleep(0.001)
        with pytest.raises(CollectiveError, match=r"all_reduce was called from thread 'MainThread' "
                                                  r"while all_gather ran on thread 'gatherer'"):
            comm.all_reduce(values(ME, n, 2))
        WORLD.send("go", dest=1)  # only now does rank 1 enter the all_gather
        worker.join(60)
        assert not worker.is_alive()
        # the refused call may have been made elsewhere: every later call is refused here
        with pytest.raises(CollectiveError, match="refused since an earlier concurrent call"):
            comm.all_gather(send, recv)
    else:
        assert WORLD.recv(source=0) == "go"
        comm.all_gather(send, recv)
    expected = np.concatenate([values(r, n, 1) for r in range(P)])
    assert np.array_equal(bits(recv), bits(expected))
    comm.close()
    WORLD.Barrier()


def test_threads_that_take_turns_in_one_order_work():
    """Two threads per rank alternate calls, handed over in the same order on every rank: the
    results are those of one thread making the calls."""
    comm = zipccl.Communicator(WORLD, policy="always")
    n, calls = 3000, 8
    turns = [threading.Semaphore(1), threading.Semaphore(0)]
    results: dict[int, np.ndarray] = {}
    failures: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(k, calls, 2):
                turns[k].acquire()
                try:
                    if i % 2:
                        buf = values(ME, n, 100 + i)
                        comm.all_reduce(buf)
                        results[i] = buf
                    else:
                        recv = np.zeros(P * n, BF16)
                        comm.all_gather(values(ME, n, 100 + i), recv)
                        results[i] = recv
                finally:
                    turns[1 - k].release()
        except BaseException as e:  # noqa: BLE001 -- reported on the main thread
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    [t.start() for t in threads]
    assert all(not t.join(120) and not t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures
    check = zipccl.Communicator(WORLD, policy="never")  # the uncompressed reference
    for i in range(calls):
        if i % 2:
            ref = values(ME, n, 100 + i)
            check.all_reduce(ref)
        else:
            ref = np.zeros(P * n, BF16)
            check.all_gather(values(ME, n, 100 + i), ref)
        assert np.array_equal(bits(results[i]), bits(ref)), f"call {i}"
    check.close()
    comm.close()
