"""Ranks that share one (stand-in) GPU: ``backend="auto"`` moves device arrays over MPI, staged
through host memory, and says so in one line; ``backend="nccl"`` raises the same clear error on
every rank. Run by ``tests/test_comm_mpi.py`` under ``with_fake_cupy.py`` on 2 ranks, with
``FAKE_CUPY_GPU_ID`` giving every rank the same GPU."""

from __future__ import annotations

import logging

import cupy  # the stand-in
import numpy as np
from mpi4py import MPI

import zipccl
from zipccl.comm import CollectiveError

comm = MPI.COMM_WORLD
me, p = comm.Get_rank(), comm.Get_size()
said: list[str] = []
handler = logging.Handler()
handler.emit = lambda record: said.append(record.getMessage())
logging.getLogger("zipccl").addHandler(handler)

x = np.arange(64, dtype=np.uint16) + 100 * me
zc = zipccl.Communicator(comm, policy="never")
out = cupy.zeros(64 * p, dtype=cupy.uint16)
zc.all_gather(cupy.asarray(x), out, dtype="bfloat16")
assert zc.transport_name == "mpi-staged", zc.transport_name
assert np.array_equal(cupy.asnumpy(out), np.concatenate([np.arange(64, dtype=np.uint16) + 100 * r
                                                         for r in range(p)]))
assert len(said) == (1 if me == 0 else 0), said
assert said == [] or ("share one GPU" in said[0] and "over MPI (staged through host memory)" in said[0])
zc.close()

forced = zipccl.Communicator(comm, policy="never", backend="nccl")
try:
    forced.all_gather(cupy.asarray(x), out, dtype="bfloat16")
except CollectiveError as e:
    assert 'backend="nccl" cannot run here: ranks 0 and 1 share one GPU' in str(e), str(e)
    assert 'use backend="auto" or "mpi"' in str(e), str(e)
else:
    raise AssertionError('backend="nccl" on a shared GPU did not raise')
forced.close()
print(f"rank {me}: shared GPU ok")
