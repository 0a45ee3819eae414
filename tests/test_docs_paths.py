"""Every file the documentation names exists: no reference outlives the file it names.

A path-like token in the prose (``experiments/...``, ``zipccl/...``, ``tests/...``,
``figures/...``, ``docs/...``, ``theory/...``, ``examples/...``; in ``experiments/`` also ``results/...`` and
``kernels/...`` relative to it; a results file named alone, ``*.jsonl``) must name a file
or folder of the tree, or a path git ignores (a cache or build output, said to be one). A file that is gone is
named with the commit that holds it, in git's ``REV:PATH`` form
(``f92c9b0^:experiments/kernels/v4_gpu_check.py``), and must be in that commit.
Globs (``v2_*.py``) must match something; braces (``{a,b}``) are expanded.

Checked: the READMEs, ``docs/*.md``, ``experiments/kernels/NOTES.md``, the theory
notebooks' cells, the figure scripts and the Makefiles.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DOCS = sorted(
    [ROOT / "README.md", ROOT / "experiments" / "README.md", ROOT / "experiments" / "kernels" / "NOTES.md",
     ROOT / "Makefile", *ROOT.glob("docs/*.md"), *ROOT.glob("theory/*.ipynb"),
     *ROOT.glob("figures/*.py"), *ROOT.glob("figures/*.mk"), ROOT / "figures" / "Makefile"])

_ROOTS = "experiments|zipccl|tests|figures|docs|theory|examples"
_TOKEN = re.compile(rf"(?<![\w./-])((?:{_ROOTS})/[\w./{{}},*-]*\w)")
# inside experiments/: results/x.jsonl, kernels/x.py are relative to experiments/
_RELATIVE = re.compile(r"(?<![\w./-])((?:results|kernels)/[\w./{},*-]*\w)")
_REV = re.compile(r"([0-9a-f]{7,40}\^?):$")  # git's REV:PATH, right before a token
_RESULTS_FILE = re.compile(r"(?<![\w./-])([\w*{},-]+\.jsonl)\b")


def _text(path: Path) -> str:
    text = path.read_text()
    if path.suffix == ".ipynb":
        return "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
    return text


def _expand(token: str) -> list[str]:
    """``a/{b,c}_d`` -> ``a/b_d``, ``a/c_d``."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [x for alt in m.group(1).split(",") for x in _expand(token[:m.start()] + alt + token[m.end():])]


def _ignored(rel: str) -> bool:
    """git ignores ``rel`` (as a file, or as a folder: ``/experiments/data/``)."""
    return any(subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT).returncode == 0
               for p in (rel, rel + "/"))


def _exists(rel: str) -> bool:
    if "*" in rel:
        return any(ROOT.glob(rel))
    return (ROOT / rel).exists() or _ignored(rel)


def _in_commit(rev: str, rel: str) -> bool:
    """``rel`` (a glob allowed) is a file or folder of commit ``rev``."""
    folder, _, name = rel.rpartition("/")
    listed = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{folder}"], cwd=ROOT,
                            capture_output=True, text=True)
    return listed.returncode == 0 and any(fnmatch.fnmatch(n, name) for n in listed.stdout.split())


def missing_references(path: Path) -> list[str]:
    """``'line: path'`` for each path ``path``'s text names that is not in the tree."""
    text = _text(path)
    found: list[tuple[int, str]] = []
    in_experiments = path.is_relative_to(ROOT / "experiments")
    for pattern, prefix in [(_TOKEN, ""), (_RELATIVE, "experiments/" if in_experiments else None),
                            (_RESULTS_FILE, "experiments/results/")]:
        if prefix is None:
            continue
        for m in pattern.finditer(text):
            token = m.group(1)
            if pattern is _RESULTS_FILE and "/" in text[max(m.start() - 1, 0):m.start()]:
                continue
            rev = _REV.search(text[max(m.start() - 42, 0):m.start()])
            for rel in _expand(token):
                rel = prefix + rel.rstrip(".")
                if pattern is _RESULTS_FILE and rel.count("/") > 2:
                    continue
                if not (_in_commit(rev.group(1), rel) if rev else _exists(rel)):
                    found.append((text[:m.start()].count("\n") + 1, rel))
    return [f"{line}: {rel}" for line, rel in sorted(set(found))]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_named_exists(path):
    assert missing_references(path) == []


def test_every_figure_is_in_the_experiments_map():
    """``experiments/README.md``'s first table maps every figure ``make figures`` draws."""
    drawn = {png for mk in ROOT.glob("figures/*.mk")
             for line in re.findall(r"^FIGURES \+=(.*)$", mk.read_text(), flags=re.M)
             for png in re.findall(r"out/(\S+\.png)", line)}
    table = (ROOT / "experiments" / "README.md").read_text().split("\n## ", 1)[0]
    mapped = set(re.findall(r"^\| `(\S+\.png)` \|", table, flags=re.M))
    assert drawn and drawn == mapped
