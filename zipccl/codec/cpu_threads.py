"""How many threads the CPU codec's parallel loops run on, and the start of Numba's threads.

Ranks that share a node must not each spin as many threads as the node has cores, and a
parallel region costs more than it saves on a small call: ``threads_per_call(n)`` is one
below ``SMALL`` elements, otherwise this process's share of its CPUs (``rank_threads``:
``ZIPCCL_CPU_THREADS``, else the CPUs it may run on over ``local_ranks``), capped by Numba's
own setting. ``call_threads`` sets it for one call and restores it (under Numba's workqueue
layer, calls take turns); the bytes never depend on it. ``start_numba_threads`` starts
Numba's threading layer so that the caller's OpenMP settings, which torch's CPU results
depend on, stay as they were. Why: docs/CPU_CODEC.md, "Threads".
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from contextlib import contextmanager

import numba

# Below this many elements a call runs on one thread: a parallel region costs more than it
# saves there (docs/CPU_CODEC.md).
SMALL = 1 << 16
ENV_THREADS = "ZIPCCL_CPU_THREADS"
# Ranks on this node, as launchers state it: MPICH / Intel MPI (Hydra), Open MPI,
# MVAPICH2, Cray PALS, torchrun.
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "PALS_LOCAL_SIZE", "LOCAL_WORLD_SIZE")


def _positive_int(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _slurm_local_tasks(env) -> int | None:
    """Tasks of this node in a Slurm step: SLURM_STEP_TASKS_PER_NODE (e.g. "4(x2),3", one
    entry per node) at index SLURM_NODEID."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE")
    try:
        node = int(env.get("SLURM_NODEID", "0"))
    except ValueError:
        return None
    if not spec:
        return None
    counts = []
    for part in spec.split(","):
        count, _, times = part.partition("(x")
        counts += [count] * (_positive_int(times.rstrip(")")) or 1)
    return _positive_int(counts[node]) if 0 <= node < len(counts) else None


def local_ranks(env=None) -> int:
    """How many processes of this job the launcher placed on this node (1 if none says).

    >>> local_ranks({"MPI_LOCALNRANKS": "2"}), local_ranks({})
    (2, 1)
    """
    env = os.environ if env is None else env
    for name in _LOCAL_SIZE_VARS:
        if (value := _positive_int(env.get(name))) is not None:
            return value
    return _slurm_local_tasks(env) or 1


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def rank_threads() -> int:
    """This process's share of the CPUs: ``ZIPCCL_CPU_THREADS``, else the CPUs it may run
    on divided by ``local_ranks()`` (at least 1). Read once per process."""
    forced = _positive_int(os.environ.get(ENV_THREADS))
    if forced is not None:
        return forced
    return max(1, _usable_cpus() // local_ranks())


# Shared libraries of the OpenMP runtimes Numba's omp layer may be linked against.
_OPENMP_LIBS = ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so")
_START_LOCK = threading.Lock()
_started = False


def _resident_openmp():
    """The OpenMP runtime already loaded in this process that Numba's omp layer would call
    (looked up as the dynamic linker resolves that layer's symbols: the global scope first,
    then a loaded runtime of a known name), or None; never loads one."""
    handles = []
    try:
        handles.append(ctypes.CDLL(None))
    except (OSError, TypeError):  # no such handle on this platform
        pass
    if hasattr(os, "RTLD_NOLOAD"):
        for name in _OPENMP_LIBS:
            try:
                handles.append(ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NOW))
            except OSError:  # not loaded
                pass
    for lib in handles:
        if all(hasattr(lib, f) for f in ("omp_get_max_threads", "omp_set_num_threads",
                                         "omp_get_max_active_levels", "omp_set_max_active_levels")):
            return lib
    return None


def start_numba_threads() -> None:
    """Start Numba's threading layer (once per process) and leave the OpenMP settings as
    they were: the calling thread's thread count and the nesting depth. Does nothing once
    the layer runs.

    Numba's omp layer, when it starts, sets the starting thread's OpenMP thread count (to
    ``NUMBA_NUM_THREADS``) and enables nested regions. It starts here on a thread that exits
    right after, so a per-thread setting changes there only; what an OpenMP runtime keeps
    for the whole process (the nesting depth in GNU OpenMP) is put back afterwards, when a
    runtime was loaded before (torch's, typically). Numba's parallel regions name their
    thread count explicitly, so they run on Numba's threads either way.

    >>> start_numba_threads(); numba.threading_layer() in ("omp", "tbb", "workqueue")
    True
    """
    global _started
    if _started:
        return
    with _START_LOCK:
        if _started:
            return
        omp = _resident_openmp()
        saved = (omp.omp_get_max_threads(), omp.omp_get_max_active_levels()) if omp else None
        failure: list[BaseException] = []

        def start() -> None:
            try:
                numba.get_num_threads()  # starts the layer on this thread
            except BaseException as e:  # noqa: BLE001 -- raised again on the caller's thread
                failure.append(e)

        starter = threading.Thread(target=start, name="zipccl-numba-start")
        starter.start()
        starter.join()
        if saved is not None:
            if omp.omp_get_max_active_levels() != saved[1]:
                omp.omp_set_max_active_levels(saved[1])
            if omp.omp_get_max_threads() != saved[0]:
                omp.omp_set_num_threads(saved[0])
        if failure:
            raise failure[0]
        _started = True


def threads_per_call(n: int) -> int:
    """Threads a call on ``n`` elements runs on (this thread's Numba setting caps it).

    >>> threads_per_call(1)
    1
    """
    start_numba_threads()
    if n < SMALL:
        return 1
    return max(1, min(rank_threads(), numba.get_num_threads()))


# Numba's workqueue layer (taken where neither OpenMP nor TBB is available) aborts the
# process when two threads run parallel regions at once; under it, calls take turns.
_WORKQUEUE_LOCK = threading.RLock()


@contextmanager
def call_threads(n: int):
    """Run the enclosed parallel loops on ``threads_per_call(n)`` threads, then restore
    (under Numba's workqueue layer, one thread's call at a time)."""
    start_numba_threads()
    serial = numba.threading_layer() == "workqueue"
    if serial:
        _WORKQUEUE_LOCK.acquire()
    before = numba.get_num_threads()
    wanted = threads_per_call(n)
    try:
        if wanted != before:
            numba.set_num_threads(wanted)
        yield
    finally:
        if wanted != before:
            numba.set_num_threads(before)
        if serial:
            _WORKQUEUE_LOCK.release()
