"""Tile-kernel variants of the GPU codec, timed against each other in one run (one GPU).

FP32 (``--dtype float32``): where a tile's loads sit between its stores, and the launch
bounds. Kernel parameters promise no "no alias", so a load of the input cannot move above a
store to the output: the load order decides how many dependent global-memory round trips a
warp waits for per tile. The FP32 tile kernels are built with each setting
(``encode._tiles_kernel(True, ahead, blocks_per_sm)``: ahead 1 or 4;
``decode._tiles_kernel(True, lo_ahead, blocks_per_sm)``: 1, 2 or 4), with launch bounds of 8,
6 or 4 resident blocks per multiprocessor (at most 64, 80 or 128 registers).
BF16 (``--dtype bfloat16``): the library's BF16 kernels with launch bounds of 8, 6 or 4.

Each variant is swapped in for the library's kernel (its plans' grid sized to its launch
bounds) and ``encode_into`` / ``decode_into`` are timed on N(0, 0.02²) data, the variants
interleaved repeat by repeat (CUDA events, ``calls`` calls per timing, median of
``--repeats``). Every variant's frame must equal the library kernel's (checked against the
reference codec by ``bench_dtypes.py gpu`` / ``bench_codec.py``) byte for byte, and every
decode must give the input back bit for bit. Registers and local memory per thread come from
the compiled kernels. -> ``results/fp32_variants.jsonl`` / ``results/bf16_variants.jsonl``::

    python experiments/kernels/tile_variants.py --dtype float32 --sizes 16,256,1024
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from harness import append_records, time_calls  # noqa: E402

import zipccl  # noqa: E402
from zipccl import format as fmt  # noqa: E402

RESULTS = ROOT / "experiments" / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--sizes", default="16,256,1024", help="MiB of input")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    fp32 = args.dtype == "float32"
    out_path = args.out or RESULTS / ("fp32_variants.jsonl" if fp32 else "bf16_variants.jsonl")

    import cupy as cp

    from zipccl.codec import gpu, gpu_codebook, gpu_workspace
    from zipccl.kernels import decode, encode, encode_launch
    from zipccl.kernels import launch as launch_route

    slot = "TILES32" if fp32 else "TILES"
    enc_default, dec_default = getattr(encode_launch, slot), getattr(decode, slot)
    enc_set = ((1, 8), (4, 8), (4, 6)) if fp32 else ((4, 8), (4, 6), (4, 4))
    dec_set = [(a, b) for a in (1, 2, 4) for b in (8, 6, 4)] if fp32 else [(2, 8), (2, 6), (2, 4)]
    dt = fmt.DTYPE_FP32 if fp32 else fmt.DTYPE_BF16
    enc = {k: launch_route.Kernel(encode._tiles_kernel(dt, *k), enc_default.argtypes) for k in enc_set}
    dec = {k: launch_route.Kernel(decode._tiles_kernel(fp32, *k), dec_default.argtypes) for k in dec_set}
    lib = {"encode": (4, 8), "decode": (decode.FP32_LO_AHEAD, decode.FP32_BLOCKS_PER_SM) if fp32 else (2, 8)}
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    common = {"bench": "fp32_variants" if fp32 else "bf16_variants", "dtype": args.dtype,
              "run": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "machine": "an H200", "gpu": name, "cupy": cp.__version__,
              "python": platform.python_version(), "zipccl": zipccl.__version__}
    resources = {}
    for side, ks in (("encode", enc), ("decode", dec)):
        for a, k in ks.items():
            c = k.dispatcher.compile(k.argtypes)
            resources[(side, a)] = {"regs": int(c.regs_per_thread),
                                    "local_bytes": int(c.local_mem_per_thread)}

    from zipccl.kernels import _common, decode_fp16, decode_warps

    # the variants are builds of the block decoder, so no frame takes the warp decoder here
    decode_warps.TILES_PER_WARP = 1 << 40

    def use(side, a):
        bps = a[1]  # the plan's grid: the variant's resident blocks per multiprocessor
        module, plans = (encode_launch, encode_launch) if side == "encode" else \
            (decode, decode_fp16 if fp32 else decode)
        setattr(module, slot, (enc if side == "encode" else dec)[a])
        plans.grid_size = lambda tiles, _bps=None: _common.grid_size(tiles, bps)
        gpu_workspace._PLANS.clear()  # plans hold the kernel they were built with

    stream = cp.cuda.Stream(non_blocking=True)

    def one_size(mib: int) -> list[dict]:
        item = 4 if fp32 else 2
        n = (mib << 20) // item
        x = cp.random.default_rng(1).standard_normal(n, dtype=cp.float32) * 0.02
        if not fp32:  # BF16 bit patterns (truncated: any patterns will do)
            x = (x.view(cp.uint32) >> 16).astype(cp.uint16)
        cp.cuda.Device().synchronize()
        cb = gpu_codebook.sample_codebook(x)
        ws = gpu_workspace.Workspace(n)
        want = cp.empty(fmt.max_compressed_size(n, fmt.DTYPE_FP32 if fp32 else fmt.DTYPE_BF16), cp.uint8)
        out = cp.empty_like(want)
        back = cp.empty_like(x)

        def enc_call():
            gpu.encode_into(x, out, cb, stream=stream, workspace=ws)

        def dec_call():
            gpu.decode_into(want, back, stream=stream, workspace=ws)

        with stream:
            use("encode", lib["encode"])
            gpu.encode_into(x, want, cb, stream=stream, workspace=ws)
            flen = int(cp.asnumpy(want[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8]).view("<i8")[0])
            exact = {}
            for a in enc:
                use("encode", a)
                out.fill(0)
                enc_call()
                stream.synchronize()
                exact[("encode", a)] = bool(cp.array_equal(out[:flen], want[:flen]))
            for a in dec:
                use("decode", a)
                back.fill(0)
                dec_call()
                err = ws.last_error(stream)
                exact[("decode", a)] = err == 0 and bool(cp.array_equal(back.view(cp.uint8),
                                                                        x.view(cp.uint8)))
            times = {key: [] for key in exact}
            for _ in range(args.repeats):
                for key in exact:
                    use(*key)
                    fn = enc_call if key[0] == "encode" else dec_call
                    fn()  # the plan for this variant
                    times[key].append(time_calls(fn, args.calls, stream=stream).seconds)
        recs = []
        for key, same in exact.items():
            t = statistics.median(times[key])
            default = key[1] == lib[key[0]]
            ahead, bps = key[1]
            recs.append({**common, "op": key[0], "ahead": ahead, "blocks_per_sm": bps,
                         "library_default": default, "mib": mib,
                         "n": n, "seconds": t, "gbps": item * n / t / 1e9, "bit_exact": same,
                         "ratio": flen / (item * n), **resources[key], "repeats": args.repeats,
                         "calls": args.calls})
        return recs

    recs = []
    for mib in (int(s) for s in args.sizes.split(",")):
        recs += one_size(mib)
        cp.get_default_memory_pool().free_all_blocks()
    setattr(encode_launch, slot, enc_default)
    setattr(decode, slot, dec_default)
    append_records(out_path, recs)
    print(f"{'op':7} {'ahead':>5} {'bps':>3} {'MiB':>5} {'GB/s':>7} {'regs':>4} {'local':>5} ok",
          file=sys.stderr)
    for r in recs:
        print(f"{r['op']:7} {r['ahead']:5d} {r['blocks_per_sm']:3d} {r['mib']:5d} {r['gbps']:7.0f} "
              f"{r['regs']:4d} "
              f"{r['local_bytes']:5d} {'yes' if r['bit_exact'] else 'NO'}", file=sys.stderr)
    print(json.dumps({"wrote": len(recs), "to": str(out_path)}), file=sys.stderr)
    return 0 if all(r["bit_exact"] for r in recs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
