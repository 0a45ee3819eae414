"""`make figures` works from committed results and leaves the tree as committed.

- every rule's command runs and writes a PNG; drawn with the matplotlib that drew the committed
  figures, it is the committed file byte for byte;
- every derived results file a rule rebuilds (the scaling projection) is rebuilt to the
  committed bytes, so a fresh clone's `make figures` rewrites nothing git tracks;
- (slow) `make -B -C figures` in a copy of the tree changes no tracked file and adds none.

The commands come from `make -B -n` (so the tests follow the Makefile fragments as they
are) and write into a temporary folder instead of figures/out or experiments/results.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "figures"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def rule_commands() -> list[list[str]]:
    """Each command `make -B -C figures` would run, as argv (a shell redirection dropped)."""
    dry = subprocess.run(["make", "-B", "-n", "-C", str(FIGURES), f"PYTHON={sys.executable}"],
                         capture_output=True, text=True, check=True).stdout
    out = []
    for line in dry.splitlines():
        if line.startswith(sys.executable):
            argv = shlex.split(line)
            out.append(argv[:argv.index(">")] if ">" in argv else argv)
    return out


def png_software(data: bytes) -> str | None:
    """The ``Software`` text chunk of a PNG (matplotlib writes its version there)."""
    key = b"tEXtSoftware\x00"
    at = data.find(key)
    if at < 0:
        return None
    length = int.from_bytes(data[at - 4:at], "big")
    return data[at + len(key):at + 4 + length].decode("latin-1")


@pytest.mark.slow  # ~13 s on a 2-core box: make test-slow (and CI) draws every figure
def test_every_figure_rule_draws_the_committed_png(tmp_path):
    commands = rule_commands()
    assert sum(any(a.endswith(".png") for a in argv) for argv in commands) >= 5, commands
    env = {**os.environ, "MPLBACKEND": "Agg"}
    ours = f"Matplotlib version{matplotlib.__version__}"
    for argv in commands:
        target = next((a for a in argv if a.startswith("out/") and a.endswith(".png")), None)
        if target is None:  # a step that refreshes a derived results file: the next test
            continue
        out = tmp_path / Path(target).name
        r = subprocess.run([str(out) if a == target else a for a in argv], cwd=FIGURES, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{shlex.join(argv)}\n{r.stderr[-2000:]}"
        drawn = out.read_bytes()
        assert len(drawn) > 10_000 and drawn[:8] == b"\x89PNG\r\n\x1a\n"
        committed = (FIGURES / target).read_bytes()
        if (png_software(committed) or "").startswith(ours):  # another matplotlib draws other bytes
            assert drawn == committed, f"{target} is not what `make figures` draws from the results"


def test_derived_results_are_what_their_rules_rebuild(tmp_path):
    """A results file that a figure rule regenerates (``--out FILE``) is committed as it
    regenerates: else a fresh clone's `make figures`, whose file times are the order git wrote
    the files in, rewrites it."""
    derived = [argv for argv in rule_commands() if "--out" in argv]
    assert derived, "no rule rebuilds a derived results file (the scaling projection did)"
    for argv in derived:
        i = argv.index("--out") + 1
        target = (FIGURES / argv[i]).resolve()
        out = tmp_path / target.name
        r = subprocess.run(argv[:i] + [str(out)] + argv[i + 1:], cwd=FIGURES, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"{shlex.join(argv)}\n{r.stderr[-2000:]}"
        rel = target.relative_to(ROOT)
        assert out.read_bytes() == target.read_bytes(), \
            f"{rel} is not what its rule writes from the committed results: rebuild it " \
            f"(make -C figures -B ../{rel}) and commit it"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout


@pytest.mark.slow
def test_make_figures_changes_no_tracked_file(tmp_path):
    """The whole `make figures`, every rule forced, in a copy of the tracked files (as they are in
    the working tree): afterwards git sees no change and no new file."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    tree = tmp_path / "tree"
    ours = f"Matplotlib version{matplotlib.__version__}"
    other_matplotlib = set()  # committed PNGs that another matplotlib drew: they may change
    for rel in _git("ls-files", "-z", cwd=ROOT).split("\0"):
        if rel and (ROOT / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tree / rel)
            if rel.endswith(".png") and not (png_software((ROOT / rel).read_bytes()) or "").startswith(ours):
                other_matplotlib.add(rel)
    _git("init", "-q", cwd=tree)
    _git("add", "-A", cwd=tree)
    _git("commit", "-q", "-m", "as checked out", cwd=tree)
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    r = subprocess.run(["make", "-B", "-C", "figures", f"PYTHON={sys.executable}"], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    status = _git("status", "--porcelain", "--untracked-files=all", cwd=tree)
    changed = {line[3:] for line in status.splitlines()}
    assert sorted(changed - other_matplotlib) == [], status
