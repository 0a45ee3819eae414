"""The import graph of ``zipccl/``: arrows run one way, down the layers of docs/ARCHITECTURE.md.

Every import counts, the ones inside functions too (a lazy import that runs upward is still
an upward arrow). Read from the source with ``ast``: nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "zipccl"

#: Bottom to top. A module may import modules of its own layer or of a lower one, never a
#: higher one. The first dotted prefix that matches names a module's layer.
LAYERS = (
    ("format",),
    ("arrays", "codebook", "checkpoints", "metrics"),
    ("kernels", "costmodel", "costfit"),
    ("codec", "scaling"),
    ("api", "comm"),
    ("analyze", "__init__"),
    ("torch", "tools", "demo", "warmup", "cli", "__main__"),
)

#: Circles still in the code (none). A new circle fails the test; one listed here that has gone
#: must leave the list.
KNOWN_CIRCLES: set[frozenset] = set()


def _module(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" and len(rel.parts) > 1 else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The zipccl module (as _module names it) that ``name`` (dotted, inside zipccl) is."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    pkg = "" if mod == "__init__" else mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name[len("zipccl."):] for a in node.names if a.name.startswith("zipccl.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".") if pkg else []
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("zipccl"):
                stem = node.module[len("zipccl."):] if node.module != "zipccl" else ""
            else:
                continue
            targets = [f"{stem}.{a.name}" if stem else a.name for a in node.names]
            targets = [t if _resolve(t, mods) == t else stem for t in targets]
        for t in targets:
            r = _resolve(t, mods)
            if r and r != mod:
                out.add(r)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """The import graph, read once for the tests below (each reads it, none changes it)."""
    return _graph()


def _layer(mod: str) -> int:
    top = mod.split(".")[0] or "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"zipccl.{mod} is in no layer of LAYERS: add it (and to docs/ARCHITECTURE.md)")


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read(graph):
    assert "comm.exchange" in graph["comm.all_gather"]
    assert {"comm.all_gather", "comm.reduce_scatter"} <= graph["comm.all_reduce"]
    assert "format.slot" in graph["kernels.spill"]
    assert len(graph) > 40


def test_no_import_runs_upward(graph):
    up = [f"zipccl.{m} (layer {_layer(m)}) imports zipccl.{t} (layer {_layer(t)})"
          for m, targets in graph.items() for t in sorted(targets) if _layer(t) > _layer(m)]
    assert not up, "\n".join(up)


def test_no_new_import_circle(graph):
    circles = _circles(graph)
    new = [sorted(c) for c in circles if c not in KNOWN_CIRCLES]
    assert not new, f"import circles: {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in circles]
    assert not gone, f"these circles are gone: take them out of KNOWN_CIRCLES: {gone}"


@pytest.mark.parametrize("mod", ["format", "format.frame", "format.slot", "format.errors"])
def test_the_wire_formats_import_nothing_of_zipccl_above_them(graph, mod):
    assert all(t.startswith("format") for t in graph[mod])
