"""Two ranks sharing one GPU over gloo run zipccl.torch's GPU checks once; tests/test_torch_gpu.py
reads them (one test per check).

    python tests/torchdist/gpu_ranks.py OUT_DIR [--device cuda|cpu]

``launch`` starts two plain processes on GPU 0 (gloo moves CUDA tensors; NCCL refuses two
ranks on one GPU). Each runs the check groups in order and writes ``OUT_DIR/rank<r>.json``,
``{check: {"ok": bool, "detail": str}}``: ``backend`` (``backend_gpu_check.check_backend``:
the world group is zipccl's over gloo, FSDP2 and DDP included) and ``slots``
(``gpu_slots_check.check_slots``: zipccl.torch's slot and spill paths over a plain gloo
group). Then one process alone runs ``backend_gpu_check.check_nccl_one_rank`` (NCCL, world
size 1) into ``OUT_DIR/nccl.json``. A group that raises is recorded under its own name
and the next still runs. ``--device cpu`` runs the same two-rank groups on CPU tensors (no
NCCL job): a dry run of these scripts on a machine without a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, ROOT]

import backend_gpu_check  # noqa: E402 -- after the path is set
import gpu_slots_check  # noqa: E402

GROUPS = ("backend", "slots")


def names(device: str = "cuda", groups=GROUPS) -> list[str]:
    """Every check the two ranks record on ``device`` (each rank records all of them)."""
    return ((backend_gpu_check.names() if "backend" in groups else [])
            + (gpu_slots_check.names(device) if "slots" in groups else []))


class _Results(dict):
    """The checks' results, written to ``path`` (and named on stdout) as each is recorded, so a
    rank that dies in a later check (a gloo abort) still leaves every earlier one."""

    def __init__(self, path: str, rank: int):
        super().__init__()
        self.path, self.rank = path, rank

    def __setitem__(self, name: str, value: dict) -> None:
        super().__setitem__(name, value)
        if not name.startswith("seconds/"):
            print(f"rank {self.rank}: {name} {'ok' if value.get('ok') else 'FAILED'}", flush=True)
        with open(self.path, "w") as f:
            json.dump(self, f, indent=1)


def rank_main(rank: int, p: int, out_dir: str, device: str, groups) -> None:
    import torch
    import torch.distributed as dist

    import zipccl.torch as zt

    if device == "cuda":
        torch.cuda.set_device(0)  # both ranks on GPU 0
    res = _Results(os.path.join(out_dir, f"rank{rank}.json"), rank)
    dist.init_process_group(backend_gpu_check.backend_spec(device), rank=rank, world_size=p,
                            pg_options=zt.BackendOptions(policy="always", cuda="gloo"))
    gloo = dist.new_group(backend="gloo")
    checks = {"backend": lambda: backend_gpu_check.check_backend(rank, p, res, device, gloo),
              "slots": lambda: gpu_slots_check.check_slots(rank, p, res, device, gloo)}
    for group in groups:
        t0 = time.perf_counter()
        try:
            checks[group]()
        except Exception:  # noqa: BLE001 -- reported under the group's name, the test says which
            res[f"group/{group}"] = {"ok": False, "detail": traceback.format_exc()}
        res[f"seconds/{group}"] = {"ok": True, "detail": f"{time.perf_counter() - t0:.1f}"}
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def nccl_main(out_dir: str) -> None:
    import torch

    torch.cuda.set_device(0)
    res: dict = {}
    try:
        backend_gpu_check.check_nccl_one_rank(res)
    except Exception:  # noqa: BLE001 -- reported under the group's name
        res["group/nccl"] = {"ok": False, "detail": traceback.format_exc()}
    with open(os.path.join(out_dir, "nccl.json"), "w") as f:
        json.dump(res, f, indent=1)


def _run(cmds: list[list[str]], env: dict, timeout: float) -> list[str]:
    """Run ``cmds`` side by side; what went wrong, one entry a process that failed or hung."""
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in cmds]
    outs = []
    try:
        for pr in procs:
            try:
                outs.append(pr.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                pr.kill()
                outs.append(f"(hung past {timeout:.0f} s) " + (pr.communicate()[0] or ""))
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    return [f"{' '.join(pr.args[2:])} exited with {pr.returncode}:\n{out[-6000:]}"
            for pr, out in zip(procs, outs, strict=True) if pr.returncode]


def launch(out_dir: str, device: str = "cuda", groups=GROUPS, nccl: bool = True,
           timeout: float = 420.0) -> list[str]:
    """The two ranks (then, on cuda and with ``nccl``, the one-rank NCCL job, which runs even
    if a rank died); returns what went wrong with the processes (a crash, a hang past
    ``timeout`` seconds), empty if nothing. What each check found is in the JSON files."""
    os.makedirs(out_dir, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               ZIPCCL_CACHE_DIR=os.path.join(out_dir, "cache"),
               ZIPCCL_CALIBRATION_SIZES="65536,1048576", PYTHONWARNINGS="ignore::FutureWarning")
    if device == "cpu":  # a dry run: small calibration, one thread a rank
        env.update(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", ZIPCCL_CALIBRATION_SIZES="4096,65536")
    me = os.path.abspath(__file__)
    bad = _run([[sys.executable, me, out_dir, "--device", device, "--groups", ",".join(groups),
                 "--rank", str(r)] for r in range(2)], env, timeout)
    if device == "cuda" and nccl:
        bad += _run([[sys.executable, me, out_dir, "--nccl"]], env, timeout)
    return bad


def by_hand(argv: list[str], group: str) -> int:
    """``python backend_gpu_check.py`` / ``gpu_slots_check.py``: one group, a line per check."""
    import tempfile

    device = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
    with tempfile.TemporaryDirectory() as d:
        crashed = launch(d, device, (group,), nccl=group == "backend")
        results = [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.endswith(".json")]
    for line in crashed:
        print(f"FAIL {line}", flush=True)
    bad = len(crashed)
    for r, res in enumerate(results):
        for name, v in res.items():
            bad += not v["ok"]
            if r == 0 or not v["ok"]:
                print(f"{'ok  ' if v['ok'] else 'FAIL'} {name} {v['detail'][:300]}", flush=True)
    print(f"{sum(len(r) for r in results) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--nccl" in args:
        nccl_main(args[0])
    elif "--rank" in args:
        rank_main(int(args[args.index("--rank") + 1]), 2, args[0], args[args.index("--device") + 1],
                  args[args.index("--groups") + 1].split(","))
    else:
        for line in launch(args[0], args[args.index("--device") + 1] if "--device" in args else "cuda"):
            print(line, file=sys.stderr)
