"""torch's generic distributed tests with gloo and with zipccl, side by side, on many cores.

    python experiments/torch_suite_tally.py --jobs 12 --out experiments/results/torch_suite.jsonl \\
        [--deadline 540] [PATTERN ...]

Runs ``tests/torchdist/torch_suite.py`` (``DistributedTest._DistTestBase`` on 2 spawned CPU
ranks; see its docstring) for gloo, zipccl under ``ZIPCCL_POLICY=always`` and zipccl under
``auto``, on the tests PATTERNs select (none: every test of the suite whose name has no
"cuda"). Tests go out in small batches to ``--jobs`` worker processes at once (each batch is
one runner process; each test spawns its 2 ranks), so the whole suite takes minutes on a
machine with many cores instead of hours on 2. No batch starts after ``--deadline`` seconds;
what did not run is named in the record. The GPU is hidden (``CUDA_VISIBLE_DEVICES=""``): the
comparison is the one torch makes for gloo on CPUs.

One record per backend/policy: the tally (pass / skip / fail / error / not run) and every
test's status; a last record lists the tests that ended differently with zipccl than with
gloo, with zipccl's detail. The table printed last is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "torchdist"))
from gates import gated  # noqa: E402  (the suite's skips by a backend's name)

SUITE = ROOT / "tests" / "torchdist" / "torch_suite.py"
CONFIGS = (("gloo", ""), ("zipccl", "always"), ("zipccl", "auto"))
STATUSES = ("pass", "skip", "fail", "error", "not run")


def _env(policy: str, tmp: str) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", ZIPCCL_CACHE_DIR=tmp,
               ZIPCCL_CALIBRATION_SIZES="4096,65536",
               PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    env.pop("ZIPCCL_POLICY", None)
    if policy:
        env["ZIPCCL_POLICY"] = policy
    return env


def list_tests(patterns: list[str]) -> list[str]:
    pats = patterns or [r"^test_(?!.*cuda)"]
    out = subprocess.run([sys.executable, str(SUITE), "gloo", "--list", *pats], env=_env("", "/tmp"),
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"listing the suite failed:\n{out.stderr[-3000:]}")
    out = out.stdout
    return [n for n in out.split() if n.startswith("test_")]


def _batch(backend: str, policy: str, names: list[str], tmp: str) -> dict:
    out = Path(tmp) / f"{backend}-{policy}-{names[0]}.json"
    run = subprocess.run([sys.executable, str(SUITE), backend, str(out), *[f"^{n}$" for n in names]],
                         env=_env(policy, tmp), capture_output=True, text=True)
    got = json.loads(out.read_text()) if out.exists() else {}
    for n in names:  # a runner that died: its unfinished tests are errors, with its last words
        got.setdefault(n, ["error", f"runner exited {run.returncode}: {run.stderr[-1500:]}"])
    return got


def combine(paths: list[str], out: str) -> int:
    """One tally from runs that each ran part of the suite (a test's later outcome wins)."""
    recs = [json.loads(line) for p in paths for line in open(p) if line.strip()]
    tallies: dict[tuple[str, str], dict] = {c: {} for c in CONFIGS}
    names: list[str] = []
    for rec in recs:
        if rec["backend"] == "compare":
            continue
        names += [n for n in rec["status"] if n not in names]
        got = tallies[(rec["backend"], rec["policy"])]
        for n, st in rec["status"].items():
            if st != "not run":
                got[n] = [st, rec.get("detail", {}).get(n, "")]
    for rec in recs:  # records before "detail" was kept: a differing test's detail is in "compare"
        for key, row in {**rec.get("differ", {}), **rec.get("gated_by_name", {})}.items():
            policy, n = key.split(":", 1)
            if tallies[("zipccl", policy)].get(n, [""])[0] == row["zipccl"]:
                tallies[("zipccl", policy)][n][1] = row["detail"]
    commits = sorted({r["commit"] for r in recs})
    base = {"bench": "torch_suite", "run": max(r["run"] for r in recs), "machine": recs[0]["machine"],
            "cpus": recs[0]["cpus"], "torch": recs[0]["torch"], "commit": ",".join(commits),
            "tests": len(names), "selection": ["combined: " + ", ".join(sorted({r["run"] for r in recs}))],
            "seconds": round(sum({r["run"]: r["seconds"] for r in recs}.values()), 1)}
    return report(tallies, names, base, out)


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("patterns", nargs="*")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) * 3 // 4))
    ap.add_argument("--batch", type=int, default=3, help="tests per runner process")
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds; 0: none")
    ap.add_argument("--machine", default=platform.node())
    ap.add_argument("--out", default="")
    ap.add_argument("--combine", nargs="+", metavar="JSONL",
                    help="run nothing: merge earlier runs' records (parts of one suite, one commit)")
    args = ap.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    import torch

    t0 = time.time()
    names = list_tests(args.patterns)
    batches = [names[i:i + args.batch] for i in range(0, len(names), args.batch)]
    work = [(b, p, batch) for batch in batches for b, p in CONFIGS]  # configs interleaved
    tallies: dict[tuple[str, str], dict] = {c: {} for c in CONFIGS}
    tmp = tempfile.mkdtemp(prefix="zipccl-suite-")

    def one(item):
        backend, policy, batch = item
        if args.deadline and time.time() - t0 > args.deadline:
            return
        tallies[(backend, policy)].update(_batch(backend, policy, batch, tmp))

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, work))
    run = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t0))
    base = {"bench": "torch_suite", "run": run, "machine": args.machine, "cpus": os.cpu_count(),
            "torch": torch.__version__, "commit": commit(), "tests": len(names),
            "selection": args.patterns or ["every test without 'cuda' in its name"],
            "seconds": round(time.time() - t0, 1)}
    return report(tallies, names, base, args.out)


def report(tallies: dict, names: list[str], base: dict, out: str) -> int:
    """Write one record per config and a comparison with gloo's; print the table."""
    records, rows = [], []
    for (backend, policy), got in tallies.items():
        status = {n: got.get(n, ["not run", ""])[0] for n in names}
        detail = {n: got[n][1][-300:] for n in names if n in got and got[n][0] != "pass" and got[n][1]}
        counts = {s: sum(v == s for v in status.values()) for s in STATUSES}
        records.append({**base, "backend": backend, "policy": policy, "counts": counts,
                        "status": status, "detail": detail})
        rows.append((f"{backend} {policy}".strip(), counts))
    gloo = tallies[CONFIGS[0]]
    differ, by_name = {}, {}
    for backend, policy in CONFIGS[1:]:
        for n in names:
            g, z = gloo.get(n, ["not run", ""]), tallies[(backend, policy)].get(n, ["not run", ""])
            if "not run" not in (g[0], z[0]) and g[0] != z[0]:
                row = {"gloo": g[0], "zipccl": z[0], "detail": z[1][-600:] or g[1][-600:]}
                (by_name if gated(*z) else differ)[f"{policy}:{n}"] = row
    records.append({**base, "backend": "compare", "differ": differ, "gated_by_name": by_name,
                    "same": not differ})
    if out:
        with open(out, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    print(f"{len(names)} tests, {base['seconds']} s, torch {base['torch']}, commit {base['commit']}")
    print(f"{'':16}" + "".join(f"{s:>9}" for s in STATUSES))
    for name, counts in rows:
        print(f"{name:16}" + "".join(f"{counts[s]:>9}" for s in STATUSES))
    print(f"skipped for zipccl by the suite's check of the backend's name: {len(by_name)}")
    for k, v in by_name.items():
        print(f"  {k}: {v['detail'][-80:]!r}")
    print(f"ended differently from gloo otherwise: {len(differ)}")
    for k, v in list(differ.items())[:40]:
        print(f"  {k}: gloo {v['gloo']}, zipccl {v['zipccl']}: {v['detail'][-200:]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
