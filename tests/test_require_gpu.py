"""``make test-gpu`` (``ZIPCCL_REQUIRE_GPU=1``): a broken GPU environment fails, naming its cause.

``tests/conftest.py`` checks CuPy, Numba's CUDA target and torch's CUDA build before any test
runs, and turns a GPU test's skip into a failure (unless it states that it needs more GPUs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import conftest
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpu_run(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    broken = tmp_path / "cupy"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('libcudart.so.13: cannot open it')\n")
    env = dict(os.environ, **env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), str(ROOT), env.get("PYTHONPATH")]))
    # the check runs before collection: this file (no GPU test) is enough, and quick to collect
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           "tests/test_require_gpu.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_broken_cupy_fails_make_test_gpu_with_its_cause(tmp_path):
    r = _gpu_run({"ZIPCCL_REQUIRE_GPU": "1"}, tmp_path)
    assert r.returncode != 0, r.stdout[-3000:]
    assert "CuPy cannot run on a CUDA device: ImportError: libcudart.so.13" in r.stdout + r.stderr, \
        r.stdout[-3000:] + r.stderr[-3000:]


class _Item:
    def __init__(self, gpu: bool):
        self.gpu = gpu

    def get_closest_marker(self, name):
        return object() if name == "gpu" and self.gpu else None


class _Outcome:
    def __init__(self, rep):
        self.rep = rep

    def get_result(self):
        return self.rep


def _report(reason: str, gpu: bool = True, require: bool = True, monkeypatch=None) -> pytest.TestReport:
    monkeypatch.setattr(conftest, "REQUIRE_GPU", require)
    rep = pytest.TestReport(nodeid="t", location=("t", 0, "t"), keywords={}, outcome="skipped",
                            longrepr=("t.py", 1, f"Skipped: {reason}"), when="setup")
    hook = conftest.pytest_runtest_makereport(_Item(gpu), None)
    next(hook)
    with pytest.raises(StopIteration):
        hook.send(_Outcome(rep))
    return rep


@pytest.mark.parametrize("reason", ["could not import 'cupy': No module named 'cupy'",
                                    "no CUDA device / CuPy"])
def test_a_gpu_tests_skip_becomes_a_failure_naming_it(reason, monkeypatch):
    rep = _report(reason, monkeypatch=monkeypatch)
    assert rep.failed and reason in str(rep.longrepr) and "ZIPCCL_REQUIRE_GPU=1" in str(rep.longrepr)


def test_skips_that_stay_skips(monkeypatch):
    assert _report("needs 2 GPUs: NCCL takes one GPU per rank", monkeypatch=monkeypatch).skipped
    assert _report("no CUDA device / CuPy", gpu=False, monkeypatch=monkeypatch).skipped
    assert _report("no CUDA device / CuPy", require=False, monkeypatch=monkeypatch).skipped
