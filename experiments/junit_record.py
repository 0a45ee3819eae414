"""One ``pytest_gpu`` record (experiments/results/gpu_tests.jsonl) from a pytest JUnit file.

    python experiments/junit_record.py RUN/gpu_tests.xml --run 20261202T174122 --commit b2dcf61 \\
        --out experiments/results/gpu_tests.jsonl

Counts cases, passes, failures, errors and skips (with their reasons, cut to 100 characters) and
lists the failed cases by name, as the earlier records do.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter

COMMAND = "ZIPCCL_REQUIRE_GPU=1 python -m pytest -q -m gpu (experiments/run_one_gpu.sh, STEPS=tests)"


def record(path: str, run: str, commit: str) -> dict:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    failed, errors, skips = [], 0, Counter()
    cases = 0
    for tc in suite.iter("testcase"):
        cases += 1
        for child in tc:
            name = f"{tc.get('classname')}::{tc.get('name')}"
            if child.tag == "failure":
                failed.append(name)
            elif child.tag == "error":
                errors += 1
                failed.append(name)
            elif child.tag == "skipped":
                skips[(child.get("message") or "")[:100]] += 1
    skipped = sum(skips.values())
    return {"bench": "pytest_gpu", "run": run, "gpu": "NVIDIA H200", "machine": "1 x H200",
            "command": COMMAND, "cases": cases, "passed": cases - len(failed) - skipped,
            "failed": len(failed) - errors, "errors": errors, "skipped": skipped,
            "seconds": round(float(suite.get("time", 0.0)), 1), "skip_reasons": dict(skips),
            "failed_cases": failed, "commit": commit}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("junit")
    ap.add_argument("--run", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    rec = record(args.junit, args.run, args.commit)
    if args.note:
        rec["note"] = args.note
    line = json.dumps(rec)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    print(line[:400])
    return 0


if __name__ == "__main__":
    sys.exit(main())
