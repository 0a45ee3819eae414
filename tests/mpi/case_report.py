"""A pytest plugin for the suites that run in other processes: each process writes what its
cases did, so that the test that started it checks cases, not the words of a summary line.

    ZIPCCL_CASE_REPORT=DIR mpiexec -n N python -m pytest -p case_report tests/mpi/SUITE.py

(``tests/mpi`` on ``PYTHONPATH``). Each rank writes ``DIR/rank<R>.json``: ``collected`` (node
ids of the cases selected to run), ``passed`` and ``failed`` (node ids; a collection error or a failing
fixture counts as failed) and ``skipped`` (node id -> reason). ``tests/test_comm_mpi.py``
(``check_cases``) reads them.
"""

from __future__ import annotations

import json
import os

import pytest

ENV = "ZIPCCL_CASE_REPORT"


def _rank() -> int:
    for key in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


class _Report:
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.collected: list[str] = []
        self.passed: list[str] = []
        self.failed: list[str] = []
        self.skipped: dict[str, str] = {}

    @staticmethod
    def _reason(report) -> str:
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            return str(longrepr[2]).removeprefix("Skipped: ")
        return str(longrepr)

    def pytest_collectreport(self, report):
        if report.failed:
            self.failed.append(f"collect:{report.nodeid}")
        elif report.skipped:
            self.skipped[report.nodeid] = self._reason(report)

    def pytest_collection_finish(self, session):
        self.collected = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report):
        if report.failed:
            if report.nodeid not in self.failed:
                self.failed.append(report.nodeid)
        elif report.skipped:
            self.skipped[report.nodeid] = self._reason(report)
        elif report.when == "call":
            self.passed.append(report.nodeid)

    def pytest_sessionfinish(self, session, exitstatus):
        rank = _rank()
        with open(os.path.join(self.out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "collected": self.collected, "passed": self.passed,
                       "failed": self.failed, "skipped": self.skipped, "exitstatus": int(exitstatus)}, f)


@pytest.hookimpl
def pytest_configure(config):
    out_dir = os.environ.get(ENV)
    if not out_dir:
        raise pytest.UsageError(f"case_report: set {ENV} to the directory for the per-rank reports")
    config.pluginmanager.register(_Report(out_dir), "case_report_writer")
