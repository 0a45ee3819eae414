"""One gloo rank, CPU tensors, ``Policy("always", loopback=True)``: the compressed path through a
slot to itself, each collective against its input, bit for bit. Prints one JSON line."""

from __future__ import annotations

import json
import sys
import tempfile

import torch
import torch.distributed as dist

import zipccl.torch as zt
from zipccl.comm import Policy


def main() -> int:
    store = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{store}/s", rank=0, world_size=1)
    out = {}
    try:
        zc = zt.Collectives(Policy("always", loopback=True))
        for dtype in (torch.bfloat16, torch.float32, torch.float16):
            g = torch.Generator().manual_seed(7)
            x = (torch.randn(3 << 12, generator=g) * 0.02).to(dtype)
            bits = torch.int32 if dtype == torch.float32 else torch.int16
            o = torch.empty_like(x)
            zc.all_gather_into_tensor(o, x)
            out[f"all_gather/{dtype}"] = torch.equal(o.view(bits), x.view(bits))
            zc.reduce_scatter_tensor(o, x)
            out[f"reduce_scatter/{dtype}"] = torch.equal(o.view(bits), x.view(bits))
            zc.all_to_all_single(o, x, [x.numel()], [x.numel()])
            out[f"all_to_all_uneven/{dtype}"] = torch.equal(o.view(bits), x.view(bits))
            y = x.clone()
            zc.all_reduce(y)
            out[f"all_reduce/{dtype}"] = torch.equal(y.view(bits), x.view(bits))
        s = zc.stats
        out["counted"] = s.calls == s.compressed_calls == 12 and 0 < s.wire_bytes < s.raw_bytes
        # a planned signature replays its call and route: new contents in the same tensors come
        # back exact, and another tensor (another address) is planned anew
        zc2 = zt.Collectives(Policy("always", loopback=True))
        x = torch.empty(5000, dtype=torch.bfloat16)
        o = torch.empty_like(x)
        exact = []
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x.copy_((torch.randn(5000, generator=g) * 0.02).to(torch.bfloat16))
            zc2.all_gather_into_tensor(o, x)
            exact.append(torch.equal(o.view(torch.int16), x.view(torch.int16)))
        planned = len(zc2._fast)
        y = x.clone() + 1
        zc2.all_gather_into_tensor(o, y)
        exact.append(torch.equal(o.view(torch.int16), y.view(torch.int16)))
        out["replayed"] = all(exact) and planned == 1 and len(zc2._fast) == 2
        out["reason"] = str(zc.last_decision)
    finally:
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
