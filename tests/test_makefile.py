"""The Makefiles do what `make help` and the README say, read through `make -n` (nothing runs).

- every target `make help` lists has a rule with a recipe, and help lists every phony target;
- `make clean` removes no file git tracks (the committed figures stay);
- `make figures` redraws every figure whatever the file times say (after a clone they are
  the order git wrote the files in), and `make -C figures out/X.png` redraws the one asked for;
- `make test` and `make demo` install first when the install stamp is missing or older than
  pyproject.toml, and not when it is current;
- the simulator runs (`make test`, `test-sim`, `test-slow`) name every test file that has
  simulator cases, and `.ci/run` runs every tier that needs no GPU.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "figures"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make(*args: str, cwd: Path = ROOT) -> str:
    r = subprocess.run(["make", "--no-print-directory", f"PYTHON={sys.executable}", *args],
                       cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"make {' '.join(args)}: {r.stderr[-2000:]}"
    return r.stdout + r.stderr


def phony_targets() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return re.search(r"^\.PHONY:(.*)$", text, flags=re.M).group(1).split()


def test_help_lists_every_target_and_each_has_a_recipe(tmp_path):
    listed = [line.split("\t")[0] for line in make("help").splitlines() if "\t" in line]
    assert set(listed) == set(phony_targets()), listed
    stamp = tmp_path / "stamp"
    stamp.touch()
    for target in listed:
        out = make("-n", target, f"STAMP={stamp}")
        assert "Nothing to be done" not in out and "is up to date" not in out, (target, out)


def test_clean_removes_no_tracked_file():
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    removed = []
    for line in make("-n", "clean").splitlines():
        if line.startswith("rm "):
            removed += [a for a in line.split()[1:] if not a.startswith("-")]
    assert removed, "make clean removes nothing?"
    for pattern in removed:
        for path in glob.glob(pattern, root_dir=ROOT) or [pattern]:
            tracked = subprocess.run(["git", "ls-files", "--", path], cwd=ROOT, capture_output=True,
                                     text=True, check=True).stdout.split()
            assert not tracked, f"make clean would delete tracked files: {tracked[:5]}"


def figure_targets() -> list[str]:
    return sorted(t for mk in FIGURES.glob("*.mk")
                  for line in mk.read_text().splitlines() if line.startswith("FIGURES +=")
                  for t in line.split("+=", 1)[1].split())


def inputs_treated_as_old() -> list[str]:
    """``-o FILE`` for every file a figure rule can depend on: make then sees no input newer
    than its figure, which is what a fresh clone can look like."""
    files = [*glob.glob("../experiments/results/*.jsonl", root_dir=FIGURES),
             *glob.glob("../experiments/*.py", root_dir=FIGURES),
             *glob.glob("../zipccl/*.py", root_dir=FIGURES), *glob.glob("*.py", root_dir=FIGURES)]
    return [arg for f in files for arg in ("-o", f)]


def test_figures_redraws_every_figure_whatever_the_file_times():
    targets = figure_targets()
    assert len(targets) >= 5
    assert all((FIGURES / t).exists() for t in targets), "the figures are committed"
    out = make("-n", "-C", str(FIGURES), *inputs_treated_as_old())
    for t in targets:
        assert re.search(rf"^\S*python\S* fig_\w+\.py {re.escape(t)} ", out, flags=re.M), (t, out)


def test_one_figure_asked_for_is_redrawn():
    t = figure_targets()[0]
    out = make("-n", "-C", str(FIGURES), *inputs_treated_as_old(), t)
    assert f" {t} " in out and len(re.findall(r"fig_\w+\.py", out)) == 1, out


@pytest.mark.parametrize("target", ["test", "demo"])
def test_install_stamp(tmp_path, target):
    stamp = tmp_path / "installed"
    first = make("-n", target, f"STAMP={stamp}")
    assert "pip install" in first, first  # no stamp: install, then the target
    assert first.index("pip install") < first.index("-m zipccl" if target == "demo" else "pytest")
    assert re.search(rf"touch .*{re.escape(str(stamp))}", first), "install writes the stamp"
    stamp.touch()
    assert "pip install" not in make("-n", target, f"STAMP={stamp}")
    os.utime(stamp, (0, 0))  # older than pyproject.toml: its dependencies may have changed
    assert "pip install" in make("-n", target, f"STAMP={stamp}")


def _recipe(target: str, stamp: Path) -> list[str]:
    """The pytest commands ``make -n target`` prints (``stamp``: a current install stamp)."""
    stamp.touch()
    return [line for line in make("-n", target, f"STAMP={stamp}").splitlines() if "pytest" in line]


def test_simulator_runs_name_every_file_with_simulator_cases(tmp_path):
    """A test file with simulator cases that no simulator run names would never run them
    (the plain pytest run skips them)."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if re.search(r"^from conftest import .*\bsimulator_only\b", p.read_text(), flags=re.M))
    assert len(files) >= 3, files
    for target in ("test", "test-sim", "test-slow"):
        sim = [c for c in _recipe(target, tmp_path / "stamp") if "NUMBA_ENABLE_CUDASIM=1" in c]
        assert len(sim) == 1, (target, sim)
        assert sorted(a for a in sim[0].split() if a.startswith("tests/")) == files, (target, sim)


def test_ci_runs_the_tiers_that_need_no_gpu(tmp_path):
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith("make")]
    assert ci == ["make install", "make test", "make test-slow"], ci
    # together they select every test but the GPU ones and torch's own suite (hours: a target of
    # its own): the quick tier and the slow one
    quick, slow = _recipe("test", tmp_path / "stamp"), _recipe("test-slow", tmp_path / "stamp")
    assert ['-m "not gpu and not slow and not torch_suite"' in c for c in quick].count(True) == 1, quick
    assert ['-m "slow and not gpu"' in c for c in slow].count(True) == 1, slow
