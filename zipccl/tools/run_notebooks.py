"""Execute the theory notebooks top to bottom: ``python -m zipccl.tools.run_notebooks theory``.

Notebooks are stored without outputs; this runs each one in a fresh kernel (cwd =
the notebook's folder) with nbclient and reports the time and the lines that state
a prediction beside a measurement. ``ZIPCCL_NOTEBOOK_FULL=1`` (``make notebooks``)
asks the notebooks for full inputs; otherwise they use small ones (``make test``).
Outputs are not written back unless ``--write`` is given.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import zipccl

# the checkout this zipccl comes from: notebooks import the same one, installed or not
_SOURCE_ROOT = str(Path(zipccl.__file__).resolve().parents[1])


def execute(path: Path, timeout: int = 1200, kernel: str = "python3"):
    """Run one notebook; return (the executed notebook, its stdout text). Raises on a cell error."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if _SOURCE_ROOT not in paths:  # the kernel inherits this process's environment
        os.environ["PYTHONPATH"] = os.pathsep.join([_SOURCE_ROOT] + [p for p in paths if p])
    NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                text.append(out.get("text", ""))
    return nb, "".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="notebooks or folders of notebooks")
    ap.add_argument("--write", action="store_true", help="save the executed notebooks (with outputs)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    args = ap.parse_args(argv)
    books = sorted(p for a in args.paths for p in ([a] if a.suffix == ".ipynb" else a.glob("*.ipynb")))
    if not books:
        print("no notebooks found", file=sys.stderr)
        return 1
    failed = 0
    for book in books:
        t0 = time.time()
        try:
            nb, text = execute(book, args.timeout)
        except Exception as exc:  # report every notebook, then fail
            print(f"FAILED {book}: {type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}")
            failed += 1
            continue
        checks = [ln for ln in text.splitlines() if ln.rstrip().endswith(("-> match", "-> MISMATCH"))]
        print(f"ok {book} ({time.time() - t0:.1f} s, {len(checks)} checks)")
        for ln in checks:
            print("   ", ln)
        if args.write:
            import nbformat
            nbformat.write(nb, book)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
