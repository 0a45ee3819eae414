"""One misuse case on 2 CPU ranks: what each rank raises, and how long it took.

    python tests/torchdist/misuse_ranks.py CASE OUT_DIR RANK     (2 processes; the test starts them)

Each rank joins a job whose groups time out after ``TIMEOUT`` seconds, makes the case's call
(one rank makes the mistake) and writes ``OUT_DIR/rankN.json``: {"raised": exception type or
null, "message", "seconds" (the call alone), "warned"}. Once both ranks have written, it
leaves at once (``os._exit``): what is tested is the call, and a group left with a failed
exchange is not torn down politely.
A rank killed inside the call (gloo's abort) writes nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import warnings

TIMEOUT = 5  # seconds: every group of the job


def _tensors(rank: int, case: str):
    import torch

    n = 64
    if case.startswith("wrong_output"):
        x = torch.ones(n, dtype=torch.bfloat16)
        out = torch.empty((2 * n - 1) if rank == 0 else 2 * n, dtype=torch.bfloat16)
        return out, x
    if case.startswith("dtype_all_gather"):
        dt = torch.bfloat16 if rank == 0 else torch.float32
        return torch.empty(2 * n, dtype=dt), torch.ones(n, dtype=dt)
    dt = torch.bfloat16 if rank == 0 else torch.float16  # dtype_all_reduce
    return None, torch.ones(n, dtype=dt)


def run(case: str, rank: int) -> dict:
    import torch.distributed as dist

    import zipccl.torch as zt

    backend = "cpu:zipccl" if case.endswith("_backend") else "gloo"
    if backend != "gloo":
        os.environ["ZIPCCL_POLICY"] = "always"
    dist.init_process_group(backend, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    if case == "spill_channel_alone":
        call = _spill_channel_alone(rank)
    elif case.startswith("not_member"):
        call = _not_member(case, rank)
    else:
        out, x = _tensors(rank, case)
        gather = dist.all_gather_into_tensor if backend != "gloo" else \
            (lambda o, i: zt.all_gather_into_tensor(o, i, policy="always"))
        reduce = dist.all_reduce if backend != "gloo" else (lambda t: zt.all_reduce(t, policy="always"))
        call = (lambda: reduce(x)) if case.startswith("dtype_all_reduce") else (lambda: gather(out, x))
    dist.barrier()  # both ranks start the call together: a late start is not a hang
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = call()
            raised, message = None, repr(result)
        except Exception as e:  # noqa: BLE001 -- what was raised is the result
            raised, message = type(e).__name__, str(e)
    return {"raised": raised, "message": message[:2000], "seconds": time.monotonic() - t0,
            "warned": [str(w.message) for w in caught]}


def _spill_channel_alone(rank: int):
    """Rank 0 makes a spill channel over the world; rank 1 never does."""
    from zipccl.torch.transport import TorchChannel

    return (lambda: TorchChannel().close()) if rank == 0 else (lambda: None)


def _not_member(case: str, rank: int):
    """A group of rank 0 alone; both ranks call a collective on it (rank 1 is not in it)."""
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    if case == "not_member_backend":
        g = dist.new_group([0], backend="zipccl", pg_options=zt.BackendOptions(policy="always"))
        t = torch.ones(64, dtype=torch.bfloat16)
        return lambda: dist.all_reduce(t, group=g)
    g = dist.new_group([0])
    out, x = torch.empty(64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    return lambda: zt.all_gather_into_tensor(out, x, group=g, policy="always")


def main(case: str, out_dir: str, rank: int) -> None:
    res = run(case, rank)
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(path + ".tmp", path)
    # stay until the peer is done too: rank 0 holds the job's store, where failures are posted
    peer = os.path.join(out_dir, f"rank{1 - rank}.json")
    deadline = time.monotonic() + 20 * TIMEOUT
    while not os.path.exists(peer) and time.monotonic() < deadline:
        time.sleep(0.1)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
