"""The theory notebooks run top to bottom on small inputs, and state their checks.

Each notebook prints every prediction beside its measurement through
``zipccl.tools.check``, which ends the line with ``-> match`` (or raises on a
mismatch). This test executes each one in a fresh kernel, as ``make notebooks``
does with full inputs, and requires no error, some ``match`` lines, no ``MISMATCH``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from zipccl.tools.run_notebooks import execute  # noqa: E402

THEORY = Path(__file__).resolve().parents[1] / "theory"
NOTEBOOKS = {  # notebook -> checks it must state (label fragments)
    "01_sigma_codebook.ipynb": ["Monte-Carlo coverage vs closed form", "coverage lower bound",
                                "coverage upper bound", "frame length of zipccl.compress"],
    "02_real_tensors.ipynb": ["checkpoint coverage, sigma window vs histogram",
                              "training traffic, all steps", "stale sigma"],
    "03_when_compression_pays.ipynb": ["fitted link model vs measured NCCL busbw",
                                       "all-gather break-even on NVLink"],
}


@pytest.mark.slow  # a notebook kernel each: the slow tier (CI runs it after make test)
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_and_its_predictions_match(name, monkeypatch):
    monkeypatch.delenv("ZIPCCL_NOTEBOOK_FULL", raising=False)  # small inputs
    nb, text = execute(THEORY / name, timeout=300)
    lines = text.splitlines()
    assert not [ln for ln in lines if "MISMATCH" in ln]
    checks = [ln for ln in lines if ln.rstrip().endswith("-> match")]
    for fragment in NOTEBOOKS[name]:
        assert any(fragment in ln for ln in checks), f"{name} did not state the check {fragment!r}"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


def test_notebooks_are_stored_without_outputs():
    import nbformat

    for name in NOTEBOOKS:
        nb = nbformat.read(THEORY / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(not c.outputs and c.execution_count is None for c in code), name


def test_full_input_switch_is_read_from_the_environment(monkeypatch):
    from zipccl.tools import full_inputs

    monkeypatch.setenv("ZIPCCL_NOTEBOOK_FULL", "1")
    assert full_inputs()
    monkeypatch.setenv("ZIPCCL_NOTEBOOK_FULL", "0")
    assert not full_inputs()
    monkeypatch.delenv("ZIPCCL_NOTEBOOK_FULL")
    assert not full_inputs()
