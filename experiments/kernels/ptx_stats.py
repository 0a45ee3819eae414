"""Static statistics of the compiled GPU kernels, for one tree or two trees side by side.

Compiles every kernel the library launches (each ``zipccl.kernels.*`` module's
``launch.Kernel`` objects, with their argument types and launch bounds) to PTX for
compute capability 9.0 (``numba.cuda.compile_ptx``: no GPU needed, only NVVM), then, where
the CUDA tools are found, to SASS (``ptxas -v``: registers, spills; ``cuobjdump -sass``: the
instructions). Per kernel it prints PTX instruction counts (all; global / shared loads and
stores; ``cp.async``; ``bar.sync``; atomics; shuffles and votes), registers, spill bytes, the
SASS instruction count and a digest of the SASS opcode sequence: two builds whose digests
agree issue the same instructions in the same order (register numbers and constant-bank
offsets aside).

Before / after a change of kernel source (``--base REV``: that commit's ``zipccl/`` is taken
with ``git archive`` into a temporary folder and compiled in a subprocess)::

    CUDA_HOME=/path/to/cuda python experiments/kernels/ptx_stats.py --base HEAD

Kernels are matched across the two trees by function name and argument types
(``--rename OLD=NEW`` for a kernel whose function was renamed). ``--json`` prints the
statistics of this tree only, as JSON (what the subprocess returns).

Tools: ``CUDA_HOME`` (or ``NUMBA_CUDA_HOME``) names a CUDA toolkit with NVVM and libdevice
(NVRTC is not needed);
``ptxas`` and ``cuobjdump`` are looked up in ``$CUDA_HOME/bin``, then ``--tools``, then PATH.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CC = (9, 0)

_PTX_CLASSES = {
    "ld.global": r"\bld\.global\b",
    "st.global": r"\bst\.global\b",
    "ld.shared": r"\bld\.shared\b",
    "st.shared": r"\bst\.shared\b",
    "ld.generic": r"\bld\.(?!global|shared|param|local|const)",
    "st.generic": r"\bst\.(?!global|shared|param|local)",
    "cp.async": r"\bcp\.async\b",
    "bar.sync": r"\b(bar\.sync|barrier\.sync)\b",
    "atom": r"\b(atom|red)\.",
    "shfl": r"\bshfl\.",
    "vote": r"\bvote\.",
    "membar": r"\b(membar|fence)\.",
}


def _ptx_body_lines(ptx: str) -> list[str]:
    """Instruction lines of the PTX (no directives, declarations, labels, comments)."""
    out = []
    for line in ptx.splitlines():
        s = line.split("//", 1)[0].strip()
        if s and not s.startswith((".", "{", "}")) and s.endswith(";"):
            out.append(s)
    return out


def ptx_counts(ptx: str) -> dict:
    lines = _ptx_body_lines(ptx)
    counts = {"ptx": len(lines)}
    for name, pat in _PTX_CLASSES.items():
        rx = re.compile(pat)
        counts[name] = sum(1 for s in lines if rx.search(s))
    return counts


def _tool(name: str, extra: list[str]) -> str | None:
    for d in [os.environ.get("CUDA_HOME"), os.environ.get("NUMBA_CUDA_HOME"), *extra]:
        if d:
            p = Path(d) / "bin" / name
            if p.exists():
                return str(p)
            p = Path(d) / name
            if p.exists():
                return str(p)
    return shutil.which(name)


def sass_stats(ptx: str, tools: list[str], dump: Path | None = None) -> dict:
    """Registers and spills (``ptxas -v``), SASS count and opcode digest (``cuobjdump``)."""
    ptxas = _tool("ptxas", tools)
    if ptxas is None:
        return {}
    res: dict = {}
    with tempfile.TemporaryDirectory() as d:
        src, cubin = Path(d) / "k.ptx", Path(d) / "k.cubin"
        src.write_text(ptx)
        p = subprocess.run([ptxas, "-v", f"-arch=sm_{CC[0]}{CC[1]}", str(src), "-o", str(cubin)],
                           capture_output=True, text=True, check=True)
        m = re.search(r"Used (\d+) registers", p.stderr)
        res["regs"] = int(m.group(1)) if m else None
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", p.stderr)
        res["spill"] = int(m.group(1)) + int(m.group(2)) if m else None
        m = re.search(r"(\d+) bytes stack frame", p.stderr)
        res["stack"] = int(m.group(1)) if m else None
        cuobjdump = _tool("cuobjdump", tools)
        if cuobjdump is not None:
            env = {**os.environ, "PATH": f"{Path(cuobjdump).parent}:{os.environ.get('PATH', '')}"}
            q = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                               check=True, env=env)  # it runs nvdisasm, looked up on PATH
            ops = []
            for line in q.stdout.splitlines():
                m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
                if m:
                    ops.append(((m.group(1) or "").strip(), m.group(2)))
            if dump is not None:
                dump.with_suffix(".sass").write_text(q.stdout)
            res["sass"] = len(ops)
            res["sass_digest"] = hashlib.sha1(repr(ops).encode()).hexdigest()[:10]
    return res


def kernels_of_tree() -> list[tuple[str, object]]:
    """(label, launch.Kernel) of every kernel object in zipccl.kernels' modules."""
    import zipccl.kernels as pkg
    from zipccl.kernels import launch

    found = []
    seen = set()
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"zipccl.kernels.{info.name}")
        for attr, obj in sorted(vars(mod).items()):
            if isinstance(obj, launch.Kernel) and id(obj) not in seen:
                seen.add(id(obj))
                found.append((f"{info.name}.{attr}", obj))
    return found


class _Device:
    """What numba-cuda's device-function dispatcher asks of the current device (its compute
    capability); with no GPU the real lookup fails, so compilation is pointed at this one."""

    compute_capability = CC


def tree_stats(tools: list[str], dump: str | None = None, only: list[str] | None = None) -> dict:
    from numba import cuda
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import nvrtc

    dispatcher.get_current_device = _Device
    try:  # NVRTC lists the architectures it supports; without it, name the one compiled for
        nvrtc.get_supported_ccs()
    except Exception:  # noqa: BLE001 -- NVRTC missing: NVVM alone compiles to PTX
        from numba.cuda import cuda_paths

        nvrtc.get_supported_ccs = lambda: (CC,)
        # the toolkit lookup (libdevice) also asks for NVRTC's path, which only NVRTC itself uses
        cuda_paths._get_nvrtc_path = lambda: cuda_paths._env_path_tuple("CUDA_HOME", "")

    out = {}
    for label, k in kernels_of_tree():
        if only and label not in only:
            continue
        disp = k.dispatcher
        lb = disp.targetoptions.get("launch_bounds")
        ptx, _ = cuda.compile_ptx(disp.py_func, k.argtypes, device=False, cc=CC, launch_bounds=lb)
        key = f"{disp.py_func.__name__}{tuple(str(t) for t in k.argtypes)}"
        where = None
        if dump:
            where = Path(dump) / f"{label}.ptx"
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(ptx)
        rec = {"label": label, "name": disp.py_func.__name__, "launch_bounds": lb,
               **ptx_counts(ptx), **sass_stats(ptx, tools, where)}
        out[key] = rec
    return out


COLUMNS = ("ptx", "ld.global", "st.global", "ld.shared", "st.shared", "cp.async", "bar.sync", "atom",
           "shfl", "vote", "regs", "spill", "sass", "sass_digest")


def _base_stats(rev: str, tools: list[str], dump: str | None, only: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "zipccl"], capture_output=True,
                              check=True).stdout
        subprocess.run(["tar", "-x", "-C", d], input=arch, check=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (d, os.environ.get("PYTHONPATH"))))}
        cmd = [sys.executable, __file__, "--json", *sum((["--tools", t] for t in tools), [])]
        if dump:
            cmd += ["--dump", str(Path(dump).resolve() / "base")]
        cmd += sum((["--only", o] for o in only), [])
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=d)
        if p.returncode:
            raise SystemExit(p.stderr[-4000:])
        return json.loads(p.stdout)


def _fmt(v) -> str:
    return "-" if v is None else str(v)


def print_table(base: dict | None, new: dict, renames: dict[str, str]) -> None:
    rows = []
    head = ["kernel", "tree", *COLUMNS]
    for key, rec in new.items():
        old = None
        if base is not None:
            old = base.get(key)
            if old is None:
                for okey, orec in base.items():
                    if renames.get(orec["name"]) == rec["name"] and okey.split("(", 1)[1] == \
                            key.split("(", 1)[1]:
                        old = orec
        if old is not None:
            rows.append([old["label"], "base", *(_fmt(old.get(c)) for c in COLUMNS)])
        rows.append([rec["label"], "new" if base is not None else "", *(_fmt(rec.get(c)) for c in COLUMNS)])
        if old is not None:
            same = all(old.get(c) == rec.get(c) for c in COLUMNS)
            rows.append(["", "same" if same else "DIFF", *("" if old.get(c) == rec.get(c) else "*"
                                                          for c in COLUMNS)])
    if base is not None:
        matched = {r["label"] for r in new.values()}
        for key, orec in base.items():
            if key not in new and not any(renames.get(orec["name"]) == r["name"] for r in new.values()):
                rows.append([orec["label"], "base only", *(_fmt(orec.get(c)) for c in COLUMNS)])
        del matched
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a git revision whose zipccl/ to compare against")
    ap.add_argument("--rename", action="append", default=[], help="OLD=NEW kernel function name")
    ap.add_argument("--tools", action="append", default=[], help="a folder holding ptxas / cuobjdump")
    ap.add_argument("--json", action="store_true", help="this tree's statistics as JSON")
    ap.add_argument("--only", action="append", default=[], help="a kernel's label (module.ATTR); repeatable")
    ap.add_argument("--dump", help="write each kernel's PTX and SASS to this folder (LABEL.ptx / .sass)")
    args = ap.parse_args(argv)
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise SystemExit("ptx_stats compiles real kernels: unset NUMBA_ENABLE_CUDASIM")
    if str(ROOT) not in sys.path and "PYTHONPATH" not in os.environ:
        sys.path.insert(0, str(ROOT))
    new = tree_stats(args.tools, args.dump, args.only)
    if args.json:
        print(json.dumps(new))
        return 0
    base = _base_stats(args.base, args.tools, args.dump, args.only) if args.base else None
    renames = dict(r.split("=", 1) for r in args.rename)
    print_table(base, new, renames)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
