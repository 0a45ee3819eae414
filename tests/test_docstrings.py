"""Modules stay small enough to read: a short module docstring, at most ``MAX_MODULE_LINES`` lines.

A module docstring says what the module is for and why, in at most ``MAX_DOCSTRING_LINES``
lines; a longer narrative goes to docs/ and the docstring links to it. A module longer than
``MAX_MODULE_LINES`` lines holds more than one concern. Read from the source with ``ast``:
nothing is imported.

The modules that do not comply yet are listed below with the reason. The lists can only
shrink: a listed module that now complies fails ``test_the_allow_lists_are_not_stale`` until
it leaves its list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "zipccl"

MAX_DOCSTRING_LINES = 15
MAX_MODULE_LINES = 600

#: Modules (paths under zipccl/) whose docstring is longer than MAX_DOCSTRING_LINES.
LONG_DOCSTRINGS: dict[str, str] = {}

#: Modules (paths under zipccl/) longer than MAX_MODULE_LINES lines.
LONG_MODULES: dict[str, str] = {}

MODULES = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py"))


def docstring_lines(rel: str) -> int | None:
    """Lines of the module docstring of ``zipccl/rel`` (None: it has none)."""
    doc = ast.get_docstring(ast.parse((PKG / rel).read_text()))
    return None if doc is None else len(doc.splitlines())


def module_lines(rel: str) -> int:
    return len((PKG / rel).read_text().splitlines())


def test_the_modules_are_found():
    assert "__init__.py" in MODULES and "format/frame.py" in MODULES and len(MODULES) > 40


@pytest.mark.parametrize("rel", MODULES)
def test_module_docstring_is_short(rel):
    n = docstring_lines(rel)
    assert n is not None, f"zipccl/{rel} has no module docstring: say what it is for and why"
    if rel not in LONG_DOCSTRINGS:
        assert n <= MAX_DOCSTRING_LINES, (
            f"zipccl/{rel}: module docstring of {n} lines (at most {MAX_DOCSTRING_LINES}); "
            f"move the narrative to docs/ and link it")


@pytest.mark.parametrize("rel", MODULES)
def test_module_is_short(rel):
    if rel not in LONG_MODULES:
        n = module_lines(rel)
        assert n <= MAX_MODULE_LINES, f"zipccl/{rel}: {n} lines (at most {MAX_MODULE_LINES}); split it"


def test_the_allow_lists_are_not_stale():
    """Every listed module exists and still breaks its rule: one that complies leaves the list."""
    stale = []
    for rel in LONG_DOCSTRINGS:
        n = docstring_lines(rel) if rel in MODULES else None
        if n is None or n <= MAX_DOCSTRING_LINES:
            stale.append(f"LONG_DOCSTRINGS[{rel!r}]: " + ("no such module" if rel not in MODULES
                                                          else f"docstring of {n} lines"))
    for rel in LONG_MODULES:
        if rel not in MODULES or module_lines(rel) <= MAX_MODULE_LINES:
            stale.append(f"LONG_MODULES[{rel!r}]: " + ("no such module" if rel not in MODULES
                                                       else f"{module_lines(rel)} lines"))
    assert not stale, f"remove from the allow-lists: {stale}"
