"""torch's own generic distributed tests (``DistributedTest._DistTestBase``) on 2 spawned CPU ranks.

    python tests/torchdist/torch_suite.py BACKEND OUT.json [PATTERN ...]
    python tests/torchdist/torch_suite.py BACKEND --list [PATTERN ...]

BACKEND is "gloo" or "zipccl" (``import zipccl.torch`` registers it; ``$ZIPCCL_POLICY`` picks
the policy). The tests run as torch runs them for gloo (its ``test/distributed/
test_distributed_spawn.py``: ``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR`` in the environment,
``TestDistBackend`` + ``_DistTestBase``, each test in 2 fresh spawned processes). A backend
registered from Python is a *plugin* to that suite: it lists which backends a test may run on
(``DistTestCases.backend_feature``), and "zipccl" joins every list gloo is on, so the same tests
run. PATTERNs (regular expressions, ``re.search``) select tests by name; none: the all-gather,
reduce-scatter, all-to-all and all-reduce families. OUT.json gets ``{test: [status, detail]}``
with status "pass", "skip", "fail" or "error".
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import unittest

if __name__ == "__main__":  # the spawned ranks re-import this file and inherit the environment
    os.environ["BACKEND"] = sys.argv[1]
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="zipccl-torch-suite-")
    os.environ.setdefault("ZIPCCL_CACHE_DIR", os.environ["TEMP_DIR"])

import torch.testing._internal.common_distributed as _cd  # noqa: E402

import zipccl.torch  # noqa: E402,F401 -- registers the "zipccl" backend

if os.environ.get("BACKEND") == "zipccl":
    for _feature, _backends in _cd.DistTestCases.backend_feature.items():
        if "gloo" in _backends or _feature == "plugin":
            _backends.add("zipccl")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

FAMILIES = r"^test_(all_gather|reduce_scatter|all_to_all|all_reduce)"


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Tally(unittest.TextTestResult):
    out = ""  # the tally file, rewritten after every test (a run cut short keeps what it did)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tally: dict[str, list[str]] = {}

    def _put(self, test, status, detail=""):
        self.tally[test._testMethodName] = [status, detail[-2000:]]
        with open(self.out, "w") as f:
            json.dump(self.tally, f, indent=1, sort_keys=True)

    def addSuccess(self, test):  # noqa: N802 -- unittest's names
        super().addSuccess(test)
        self._put(test, "pass")

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._put(test, "skip", str(reason))

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._put(test, "error", self._exc_info_to_string(err, test))


def names(patterns: list[str]) -> list[str]:
    return sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_")
                  and any(re.search(p, n) for p in (patterns or [FAMILIES])))


def main(out: str, patterns: list[str]) -> int:
    if out == "--list":  # the selected tests' names, one per line (experiments/torch_suite_tally.py)
        print("\n".join(names(patterns)))
        return 0
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names(patterns))
    _Tally.out = out
    result = unittest.TextTestRunner(resultclass=_Tally, verbosity=1, stream=sys.stderr).run(suite)
    counts = {s: sum(v[0] == s for v in result.tally.values()) for s in ("pass", "skip", "fail", "error")}
    print(os.environ["BACKEND"], os.environ.get("ZIPCCL_POLICY", ""), json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[2], sys.argv[3:]))
