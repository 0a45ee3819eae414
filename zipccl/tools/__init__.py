"""Developer tools: executing the theory notebooks, and printing predictions beside measurements.

``check`` is how every notebook states a result: the prediction, the measurement,
the tolerance, and ``match`` or ``MISMATCH``. The notebook test runs the notebooks
and requires the ``match`` lines and no ``MISMATCH``.
"""

from __future__ import annotations

import os


def full_inputs() -> bool:
    """True when notebooks should use full inputs (``ZIPCCL_NOTEBOOK_FULL=1``, as ``make notebooks``)."""
    return os.environ.get("ZIPCCL_NOTEBOOK_FULL", "") not in ("", "0")


def check(label: str, predicted: float, measured: float, tol: float, *, unit: str = "",
          fmt: str = ".4f", strict: bool = True) -> bool:
    """Print ``label: prediction P | measurement M | |diff| D <= tol -> match`` and return the verdict.

    With ``strict`` (the default) a mismatch also raises AssertionError, so a
    notebook run stops at the first prediction the measurement contradicts.

    >>> check("coverage", 0.9787, 0.9790, 0.001)
    coverage: prediction 0.9787 | measurement 0.9790 | |diff| 0.0003 <= 0.0010 -> match
    True
    """
    diff = abs(measured - predicted)
    ok = diff <= tol
    print(f"{label}: prediction {predicted:{fmt}}{unit} | measurement {measured:{fmt}}{unit} | "
          f"|diff| {diff:{fmt}} {'<=' if ok else '>'} {tol:{fmt}}{unit} -> {'match' if ok else 'MISMATCH'}")
    if strict and not ok:
        raise AssertionError(f"{label}: measurement {measured} differs from prediction {predicted} "
                             f"by more than {tol}")
    return ok


def check_at_most(label: str, bound: float, measured: float, *, unit: str = "", fmt: str = ".4f",
                  strict: bool = True) -> bool:
    """Like ``check`` for a one-sided claim: print ``-> match`` when ``measured <= bound``.

    >>> check_at_most("ratio", 0.705, 0.7038)
    ratio: prediction <= 0.7050 | measurement 0.7038 -> match
    True
    """
    ok = measured <= bound
    print(f"{label}: prediction <= {bound:{fmt}}{unit} | measurement {measured:{fmt}}{unit} -> "
          f"{'match' if ok else 'MISMATCH'}")
    if strict and not ok:
        raise AssertionError(f"{label}: measurement {measured} is above {bound}")
    return ok
