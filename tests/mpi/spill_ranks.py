"""Ranks that drive ``zipccl.comm.spill.Spills`` through thousands of calls; test_spill.py starts them.

    mpiexec -n N python tests/mpi/spill_ranks.py MODE [CALLS]
    python tests/mpi/spill_ranks.py MODE [CALLS] --torch RANK WORLD   (MASTER_ADDR / MASTER_PORT set)

MODE ``host``: ``Spills(device=False)`` on NumPy regions; ``fake``: ``Spills(device=True)`` with
``fake_cupy`` as CuPy (its ``RawModule`` runs the kernels' NumPy twins at once); ``gpu``: the
real kernels on a GPU (``tests/test_spill_gpu.py``). The host channel is ``MPIChannel`` under
mpiexec and ``TorchChannel`` (gloo) with ``--torch``.

Every rank derives every call from seeds alone (``plan``): op, element type, frames per pair,
their sizes, which frames spill and their bytes. The test itself moves each slot (the first
``slot_bytes`` of a region) as the collective's transfer would, point to point; the spills
move the tails. Each receiver then checks the whole region byte for byte: the slot header
against ``slots.pack_slot_header`` (the sender's largest escape count included) and the frame.
Each rank prints one line ``SPILL_RESULT {json}`` (and writes it to ``$SPILL_OUT/rank<r>.json``
when that is set): per case of ``CASES``, whether every rank found it right and the problems
this rank found (``check`` asserts it); a problem makes the rank exit non-zero.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

OPS = ("all_gather", "all_to_all", "reduce_scatter", "all_reduce")
SIZES = (300, 2000, 5000)  # values per frame
CAPACITY = 64  # escape bytes reserved per slot: most frames can spill
PATTERNS = ("one_rank", "all", "one_peer", "random")
WARMUP = 100  # calls before the memory held is noted (at most a quarter of the run)


def plan(seed: int, call: int, size: int, phase: str) -> dict:
    """Call ``call`` as every rank sees it: op, type, and per (sender, receiver) its frames."""
    from zipccl import format as fmt
    from zipccl.format import slot as slots

    rng = np.random.default_rng([seed, call])
    dtypes = (fmt.DTYPE_BF16, fmt.DTYPE_FP32, fmt.DTYPE_FP16)
    op, code = OPS[rng.integers(len(OPS))], dtypes[rng.integers(3)]
    biggest = call == 1  # the first call is the largest: blocks reach their size in warm-up
    if biggest:
        code = fmt.DTYPE_FP32
    if phase == "every":  # some frame spills on every call
        pattern = PATTERNS[call % len(PATTERNS)]
    else:  # on random calls only
        pattern = PATTERNS[rng.integers(len(PATTERNS))] if rng.random() < 0.1 else "none"
    who, toward = int(rng.integers(size)), int(rng.integers(size))
    frames = {}
    for i in range(size):
        for j in range(size):
            if i == j:
                continue
            frames[i, j] = []
            for _ in range(2 if biggest else int(rng.integers(1, 3))):
                n = SIZES[-1] if biggest else SIZES[rng.integers(len(SIZES))]
                slot, region = slots.slot_bytes(n, code, CAPACITY), slots.region_bytes(n, code)
                fit, most = slot - slots.SLOT_HEADER, fmt.max_compressed_size(n, code)
                coin = rng.random() < 0.3
                spill = most > fit and {"none": False, "one_rank": i == who, "all": True,
                                        "one_peer": j == toward, "random": coin}[pattern]
                frame_len = int(rng.integers(fit + 1, most + 1) if spill else rng.integers(128, fit + 1))
                frames[i, j].append({"n": n, "slot": slot, "region": region, "spill": spill,
                                     "frame_len": frame_len, "n_esc": int(rng.integers(0, 1 << 20)),
                                     "seed": [seed, call, i, j, len(frames[i, j])]})
    max_esc = {i: max(f["n_esc"] for j in range(size) if j != i for f in frames[i, j])
               for i in range(size)}
    return {"op": op, "code": code, "frames": frames, "max_esc": max_esc, "pattern": pattern}


def frame_bytes(f: dict) -> np.ndarray:
    """The frame's bytes: random, with frame_len and n_escapes where the frame header has them."""
    from zipccl import format as fmt

    b = np.random.default_rng(f["seed"]).integers(0, 256, f["frame_len"], dtype=np.uint8)
    b[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8] = np.array([f["frame_len"]], "<u8").view(np.uint8)
    b[fmt.N_ESCAPES_AT:fmt.N_ESCAPES_AT + 8] = np.array([f["n_esc"]], "<u8").view(np.uint8)
    return b


class Memory:
    """Regions in host memory (``host``), fake_cupy's "device" memory (``fake``) or a GPU's
    (``gpu``: real CuPy; the test's transfer then stages slots through host memory, waiting
    for the spill-out kernel as any transfer would), 128-byte aligned."""

    def __init__(self, mode: str):
        self.mode = mode
        if mode in ("fake", "gpu"):
            import cupy

            self.cp = cupy
            # blocking streams: ordered after the fills of new buffers on the default stream
            self.streams = (cupy.cuda.Stream(), cupy.cuda.Stream())
        else:
            self.streams = (None, None)

    def buffer(self, nbytes: int):
        """(buffer, its address) of ``nbytes`` not-zero bytes: a host uint8 view, or (gpu) a
        CuPy uint8 array."""
        if self.mode == "host":
            raw = np.full(nbytes + 128, 0x5A, np.uint8)
            ptr = int(raw.ctypes.data)
        else:
            raw = self.cp.full(nbytes + 128, 0x5A, dtype=self.cp.uint8)
            ptr = int(raw.data.ptr)
            if self.mode == "fake":
                raw = raw.view(np.ndarray)
        off = -ptr % 128
        return raw[off:off + nbytes], ptr + off

    def put(self, buf, at: int, data: np.ndarray) -> None:
        if self.mode == "gpu":
            buf[at:at + data.size].set(data, stream=self.streams[0])
        else:
            buf[at:at + data.size] = data

    def get(self, buf, at: int, n: int) -> np.ndarray:
        if self.mode == "gpu":  # after the decode stream's work (the spill-in kernel)
            return buf[at:at + n].get(stream=self.streams[1])
        return np.asarray(buf[at:at + n])

    def staged(self, transfer):
        """``transfer`` (over host buffers) for this memory's regions."""
        if self.mode != "gpu":
            return transfer

        def move(moves, lands):
            enc, dec = self.streams
            out = [(j, b.get(stream=enc)) for j, b in moves]  # waits for the spill-out kernel
            got = [(i, np.empty(b.size, np.uint8)) for i, b in lands]
            transfer(out, got)
            for (_, b), (_, h) in zip(lands, got, strict=True):
                b.set(h, stream=dec)
        return move


def run_call(spills, me: int, size: int, call: int, p: dict, mem: Memory, transfer,
             errors: dict | None = None) -> list[str]:
    """One call on rank ``me``: frames encoded (written), begin, spill out, the slots moved,
    spill in, every received region checked (``errors``: the error word each sender's slot
    headers carry, 0 if not named). Returns the problems found."""
    from zipccl.format import slot as slots

    frames = p["frames"]
    out_list = [(j, f) for j in range(size) if j != me for f in frames[me, j]]
    in_list = [(i, f) for i in range(size) if i != me for f in frames[i, me]]
    send_buf, send_ptr = mem.buffer(sum(f["region"] for _, f in out_list))
    recv_buf, recv_ptr = mem.buffer(sum(f["region"] for _, f in in_list))
    sends, recvs, moves, lands = [], [], [], []
    at = 0
    for j, f in out_list:
        mem.put(send_buf, at + 128, frame_bytes(f))
        sends.append((j, send_ptr + at, f["slot"], f["region"], f["n"]))
        moves.append((j, send_buf[at:at + f["slot"]]))
        at += f["region"]
    at, starts = 0, []
    for i, f in in_list:
        recvs.append((i, recv_ptr + at, f["slot"], f["region"], f["n"]))
        lands.append((i, recv_buf[at:at + f["slot"]]))
        starts.append(at)
        at += f["region"]
    enc, dec = mem.streams
    spills.begin(call, p["op"], p["code"], sends, recvs)
    spills.launch_out(call, enc)
    mem.staged(transfer)(moves, lands)
    spills.launch_in(call, dec)
    problems = []
    for (i, f), at in zip(in_list, starts, strict=True):
        want = slots.pack_slot_header(slots.SlotHeader(
            seq=call, op=slots.OP_CODES[p["op"]], dtype=p["code"], n=f["n"], frame_len=f["frame_len"],
            slot_bytes=f["slot"], error=(errors or {}).get(i, 0), max_escapes=p["max_esc"][i]))
        if not np.array_equal(mem.get(recv_buf, at, 128), want):
            problems.append(f"call {call}: slot header from rank {i} differs")
        if not np.array_equal(mem.get(recv_buf, at + 128, f["frame_len"]), frame_bytes(f)):
            problems.append(f"call {call}: frame from rank {i} (spill={f['spill']}) differs")
    return problems


def soak(spills, me: int, size: int, calls: int, mem: Memory, transfer, seed: int = 21) -> dict:
    """``calls`` calls: the first half spill on every call, the second half on random calls."""
    problems, spilled, stats_warm = [], 0, None
    t0 = time.perf_counter()
    for call in range(1, calls + 1):
        p = plan(seed, call, size, "every" if call <= calls // 2 else "random")
        spilled += any(f["spill"] for fs in p["frames"].values() for f in fs)
        problems += run_call(spills, me, size, call, p, mem, transfer)
        if call == min(WARMUP, calls // 4):
            stats_warm = spills.stats()
    stats_end = spills.stats()
    err = spills.error()
    if err:
        problems.append(f"sticky error word {err:#x} after the soak")
    # On the host the pool holds at most ``entries`` blocks; a device never waits for the
    # progress thread, so a thread that stalls for many calls makes more (still a bound, not
    # a growth with the calls)
    most = spills.entries if not spills.device else 4 * spills.entries
    if stats_end["allocations"] > most:
        problems.append(f"{stats_end['allocations']} call blocks allocated over {calls} calls")
    block_bytes = stats_warm["pinned_bytes"] // max(1, stats_warm["blocks"])
    if stats_end["pinned_bytes"] > most * block_bytes:
        problems.append(f"pinned memory grew: {stats_warm} -> {stats_end}")
    return {"problems": problems[:20], "calls": calls, "spilled_calls": spilled,
            "stats_warm": stats_warm, "stats_end": stats_end, "seconds": time.perf_counter() - t0}


#: the fields of a received slot header that ``errors`` tampers with, one case each
TAMPERED = ("seq", "op", "dtype", "n", "slot_bytes", "crc")
#: every case a rank reports, in order (``gpu`` mode skips the tampered ones: host-side edits)
CASES = ("soak", "close", "record_error", *[f"tampered_{name}" for name in TAMPERED], "op_mismatch")
GPU_SKIPS = {f"tampered_{name}": "host-side header edits" for name in TAMPERED}


def errors(make_spills, me: int, size: int, mem: Memory, transfer) -> dict[str, list[str]]:
    """The sticky word: a recorded decode error reaches every peer through the next slot
    headers; each tampered received header sets its bit and only it; a call whose op
    disagrees between ranks is flagged on every rank while its spills keep the channel in
    step. Returns the problems found per case."""
    import dataclasses

    from zipccl.format import errors
    from zipccl.format import slot as slots

    cases = {}
    problems = cases["record_error"] = []
    # 1. record_error on rank 0, then one call: its slot headers carry the bits to every peer
    spills = make_spills()
    bits, bits_ptr = mem.buffer(4)
    mem.put(bits, 0, np.array([0x24 if me == 0 else 0], "<u4").view(np.uint8))
    spills.record_error(mem.streams[0], bits_ptr)  # the stream that wrote the bits
    problems += run_call(spills, me, size, 1, plan(5, 1, size, "every"), mem, transfer, {0: 0x24})
    want = 0x24 if me == 0 else 0x24 | errors.ERR_PEER
    if spills.error() != want:
        problems.append(f"after record_error: error word {spills.error():#x}, expected {want:#x}")
    spills.close()
    # 2. one received header tampered with before launch_in (no frame spills in these calls)
    tamper = {
        "seq": (lambda h: dataclasses.replace(h, seq=h.seq + 1), errors.ERR_SLOT_SEQ),
        "op": (lambda h: dataclasses.replace(h, op=h.op % 4 + 1), errors.ERR_SLOT_CALL),
        "dtype": (lambda h: dataclasses.replace(h, dtype=h.dtype % 3 + 1), errors.ERR_SLOT_CALL),
        "n": (lambda h: dataclasses.replace(h, n=h.n + 1), errors.ERR_SLOT_CALL),
        "slot_bytes": (lambda h: dataclasses.replace(h, slot_bytes=h.slot_bytes + 128), errors.ERR_SLOT_SIZE),
        "crc": (None, errors.ERR_SLOT_HEADER),
    }
    assert tuple(tamper) == TAMPERED
    for name, (change, bit) in tamper.items() if mem.mode != "gpu" else ():  # host-side edits
        problems = cases[f"tampered_{name}"] = []
        spills = make_spills()
        p = plan(6, 1, size, "random")
        for fs in p["frames"].values():
            for f in fs:
                f["spill"], f["frame_len"] = False, min(f["frame_len"], f["slot"] - 128)

        def tampered(moves, lands, change=change):
            transfer(moves, lands)
            buf = lands[0][1]
            if change is None:
                buf[5] ^= 0x40
            else:
                buf[:128] = slots.pack_slot_header(change(slots.parse_slot_header(buf)))

        run_call(spills, me, size, 1, p, mem, tampered)
        if spills.error() != bit:
            problems.append(f"tampered {name}: error word {spills.error():#x}, expected {bit:#x}")
        if name == "crc":  # the next clean call carries every rank's bits to its peers
            run_call(spills, me, size, 2, plan(7, 2, size, "every"), mem, transfer,
                     {i: bit for i in range(size)})
            if spills.error() != bit | errors.ERR_PEER:
                problems.append(f"after a peer's error: error word {spills.error():#x}")
        spills.close()
    # 3. rank 0 names another op and every frame that can spills: flagged on every rank; the
    # spills of the next call still arrive (the channel stayed in step)
    problems = cases["op_mismatch"] = []
    spills = make_spills()
    p = plan(8, 1, size, "every")
    if me == 0:
        p = dict(p, op="all_gather" if p["op"] != "all_gather" else "all_to_all")
    run_call(spills, me, size, 1, p, mem, transfer)
    if spills.error() != errors.ERR_SLOT_CALL:
        problems.append(f"op mismatch: error word {spills.error():#x}")
    later = run_call(spills, me, size, 2, plan(8, 2, size, "every"), mem, transfer,
                     {i: errors.ERR_SLOT_CALL for i in range(size)})
    problems += [f"after an op mismatch: {x}" for x in later]
    spills.close()
    return cases


def check(found: dict, calls: int, mode: str) -> None:
    """Assert one rank's result: every case of ``CASES`` ran (but the stated ``gpu`` skips),
    none found a problem on any rank, and the soak made ``calls`` calls, a third spilling."""
    skipped = GPU_SKIPS if mode == "gpu" else {}
    want = [c for c in CASES if c not in skipped]
    assert list(found["cases"]) == want, f"rank {found['rank']} ran {list(found['cases'])}, expected {want}"
    assert found["skipped"] == skipped, found["skipped"]
    bad = {c: r["problems"] or "a peer's" for c, r in found["cases"].items() if not r["ok"]}
    assert not bad, f"rank {found['rank']}: {bad}"
    assert found["ok"] and found["calls"] == calls and found["spilled_calls"] > calls // 3, found


def close_check(spills) -> list[str]:
    problems = []
    thread = spills._thread
    spills.close()
    if thread is not None and thread.is_alive():
        problems.append("close() returned with the progress thread alive")
    try:
        spills.begin(10**9, "all_gather", "bfloat16", [], [])
        problems.append("begin after close() did not raise")
    except RuntimeError:
        pass
    return problems


def main(mode: str, calls: int, torch_rank: tuple[int, int] | None) -> int:
    if mode == "fake":
        import fake_cupy

        fake_cupy.install()
    from zipccl.comm.channels import MPIChannel
    from zipccl.comm.spill import Spills

    mem = Memory(mode)
    if torch_rank is None:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        me, size = world.Get_rank(), world.Get_size()

        def make_channel():
            return MPIChannel(world)

        def transfer(moves, lands):
            reqs = [world.Isend(buf, dest=j, tag=3) for j, buf in moves]
            reqs += [world.Irecv(buf, source=i, tag=3) for i, buf in lands]
            MPI.Request.Waitall(reqs)

        def gather(x):
            return world.allgather(x)
    else:
        import torch
        import torch.distributed as dist

        from zipccl.torch.transport import TorchChannel

        me, size = torch_rank
        dist.init_process_group("gloo", rank=me, world_size=size)

        def make_channel():
            return TorchChannel(None)

        def transfer(moves, lands):
            works, k = [], {}
            for j, buf in moves:
                k[j] = k.get(j, -1) + 1
                works.append(dist.isend(torch.from_numpy(buf), dst=j, tag=k[j]))
            k = {}
            for i, buf in lands:
                k[i] = k.get(i, -1) + 1
                works.append(dist.irecv(torch.from_numpy(buf), src=i, tag=k[i]))
            for w in works:
                w.wait()

        def gather(x):
            out = [None] * size
            dist.all_gather_object(out, x)
            return out

    def make_spills():
        return Spills(make_channel(), device=mode != "host")

    spills = make_spills()
    result = soak(spills, me, size, calls, mem, transfer)
    cases = {"soak": result.pop("problems"), "close": close_check(spills),
             **errors(make_spills, me, size, mem, transfer)}
    everyone = gather(cases)  # a case is ok where no rank found a problem in it
    result["cases"] = {c: {"ok": not any(e[c] for e in everyone), "problems": cases[c]} for c in cases}
    result["skipped"] = GPU_SKIPS if mode == "gpu" else {}
    result["problems"] = [f"{c}: {x}" for c in cases for x in cases[c]]
    result["ok"] = all(r["ok"] for r in result["cases"].values())
    line = json.dumps({"rank": me, **result})
    print("SPILL_RESULT " + line, flush=True)
    if os.environ.get("SPILL_OUT"):  # ranks' stdout lines may interleave: a file each
        with open(os.path.join(os.environ["SPILL_OUT"], f"rank{me}.json"), "w") as f:
            f.write(line)
    if torch_rank is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    torch_rank = None
    if "--torch" in args:
        at = args.index("--torch")
        torch_rank = (int(args[at + 1]), int(args[at + 2]))
        args = args[:at]
    mode, calls = args[0], int(args[1]) if len(args) > 1 else 2000
    try:
        code = main(mode, calls, torch_rank)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        if torch_rank is None:
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(1)
        os._exit(1)
    sys.exit(code)
