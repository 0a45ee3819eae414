"""A ``TorchChannel`` over a subgroup is made by the subgroup's ranks alone (4 gloo ranks).

    python tests/torchdist/subgroup_channel.py OUT_DIR RANK      (4 processes; the test starts them)

Ranks 0 and 1 make two channels over their subgroup and swap messages on both; ranks 2 and 3
never make one (a job-wide collective would hang them all). Every rank writes "ok" or why not.
"""

from __future__ import annotations

import os
import sys

import numpy as np


def main(out_dir: str, rank: int) -> None:
    import torch.distributed as dist

    from zipccl.torch.transport import TorchChannel

    dist.init_process_group("gloo", rank=rank, world_size=4)
    pair = dist.new_group([0, 1])  # every process makes it (torch's rule for new_group)
    result = "ok"
    if rank in (0, 1):
        peer = 1 - rank
        for k in range(2):  # two channels over the same ranks must not meet
            ch = TorchChannel(pair)
            mine = np.full(1000, 10 * k + rank, np.uint8)
            got = np.zeros(1000, np.uint8)
            h = ch.isend(mine, peer, tag=5)
            ch.recv(got, peer, tag=5)
            h.wait()
            if not (got == 10 * k + peer).all() or (ch.rank, ch.size) != (rank, 2):
                result = f"channel {k}: got {got[:4]} rank/size {(ch.rank, ch.size)}"
            ch.close()
    dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
