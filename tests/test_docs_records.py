"""Every run a document cites is in the committed records; the demo's quoted ratio is its own.

A run id in the prose (``20261202T012150``, or the older ``2026-11-30T21:23:07``) must be the
``run`` / ``run_id`` of a record in ``experiments/results/*.jsonl`` (``experiments/records.py``
reads them); an id the records wrote with a time zone (``...+0000``) may be cited without it.
Where the line that cites a run names a results file before it, the run must be in the last
file named (write ``codec_peers.jsonl`` run X, not X beside another file's name).
Every results file a document names must be tracked by git (``tests/test_docs_paths.py``
checks that the paths exist).

The demo's transcript in the README (``wire bytes, compressed / plain: W / R = ratio X``) must
print X = W / R; ``test_demo_transcript_is_what_the_demo_computes`` (slow: the whole checkpoint)
runs the demo and compares W and R.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"

DOCS = sorted([ROOT / "README.md", ROOT / "experiments" / "README.md",
               ROOT / "experiments" / "kernels" / "NOTES.md", *ROOT.glob("docs/*.md")])

_RUN = re.compile(r"(?<![\w:-])(\d{8}T\d{6}|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?![\w:])")
_RESULTS_FILE = re.compile(r"(?<![\w-])([\w-]+\.jsonl)\b")
_DEMO_WIRE = re.compile(r"^wire bytes, compressed / plain: ([\d,]+) / ([\d,]+) = ratio ([\d.]+)$", re.M)


@cache
def runs_by_file() -> dict[str, frozenset[str]]:
    """results file name -> the run ids of its records (time zone suffixes dropped)."""
    out = {}
    for path in sorted(RESULTS.glob("*.jsonl")):
        ids = set()
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                run = str(rec.get("run", rec.get("run_id", "")) or "")
                if run:
                    ids.add(re.sub(r"(\+0000|Z)$", "", run))
        out[path.name] = frozenset(ids)
    return out


@cache
def tracked_results() -> frozenset[str]:
    listed = subprocess.run(["git", "ls-files", "experiments/results"], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    return frozenset(Path(p).name for p in listed.stdout.split())


def uncited_runs(path: Path) -> list[str]:
    """``'line: run (why)'`` for each run id ``path`` cites that the records do not hold."""
    by_file = runs_by_file()
    every = frozenset().union(*by_file.values())
    bad = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for m in _RUN.finditer(line):
            run = m.group(1)
            before = [f for f in _RESULTS_FILE.findall(line[:m.start()]) if f in by_file]
            if run not in every:
                bad.append(f"{number}: {run} (in no record)")
            elif before and run not in by_file[before[-1]]:
                bad.append(f"{number}: {run} (not in {before[-1]}, the file named before it)")
    return bad


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_run_is_recorded(path):
    assert uncited_runs(path) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_results_file_is_committed(path):
    """A results file in the tree but not committed (an absent one: ``test_docs_paths.py``)."""
    named = {n for n in _RESULTS_FILE.findall(path.read_text()) if (RESULTS / n).exists()}
    assert sorted(named - tracked_results()) == []


def test_the_check_catches_a_run_off_by_seconds(tmp_path):
    doc = tmp_path / "doc.md"
    run = sorted(runs_by_file()["kernel_variants_v6.jsonl"])[-1]
    off = run[:-2] + f"{(int(run[-2:]) + 1) % 60:02d}"
    other = sorted(runs_by_file()["host_path.jsonl"])[-1]
    doc.write_text(f"runs {run} and {off}\n`kernel_variants_v6.jsonl` run {other}\n"
                   f"`kernel_variants_v6.jsonl`, as `host_path.jsonl` run {other}\n")
    assert uncited_runs(doc) == [f"1: {off} (in no record)",
                                 f"2: {other} (not in kernel_variants_v6.jsonl, the file named before it)"]


def _demo_transcripts() -> list[tuple[str, int, int, str]]:
    return [(str(p.relative_to(ROOT)), int(w.replace(",", "")), int(r.replace(",", "")), x)
            for p in DOCS for w, r, x in _DEMO_WIRE.findall(p.read_text())]


def test_demo_transcript_prints_its_own_ratio():
    quoted = _demo_transcripts()
    assert quoted, "no demo transcript found in the documents (README.md's make demo section)"
    for doc, wire, raw, ratio in quoted:
        assert ratio == f"{wire / raw:.4f}", f"{doc}: {wire:,} / {raw:,} is not {ratio}"


@pytest.mark.slow  # the whole checkpoint through the demo on 2 ranks
@pytest.mark.mpi
def test_demo_transcript_is_what_the_demo_computes():
    from test_comm_mpi import clean_env, mpiexec

    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "zipccl", "demo", "--repeat", "1", "--host"]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wire, raw, ratio), = _DEMO_WIRE.findall(r.stdout)
    assert ratio == f"{int(wire.replace(',', '')) / int(raw.replace(',', '')):.4f}", r.stdout
    for doc, q_wire, q_raw, q_ratio in _demo_transcripts():
        assert (f"{q_wire:,}", f"{q_raw:,}", q_ratio) == (wire, raw, ratio), f"{doc} quotes another run"
