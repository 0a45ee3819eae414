"""The README's example is documentation and a test: run its first Python block as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    # the ratio and coverage the README prints are the ones this run prints
    ratio = re.search(r"ratio (\d\.\d{4})", out).group(1)
    assert f"ratio {ratio}" in README.read_text()
    cov = re.search(r"coverage (\d+\.\d\d%)", out).group(1)
    assert f"coverage {cov}" in README.read_text()
