"""``comm.core.refusal``: the one decision of whether zipccl takes a call, as ``zipccl.torch``
(``translate.refused``) and the torch backend ask it (no process group needed)."""

from __future__ import annotations

import pytest

from zipccl.comm.core import INVALID, NATIVE, refusal

torch = pytest.importorskip("torch")
from zipccl.torch.translate import refused  # noqa: E402

ReduceOp = torch.distributed.ReduceOp
P = 2


def verdict(*args, **kw):
    got = refused(*args, **kw)
    return None if got is None else got[0]


def test_coded_calls_of_fitting_sizes_are_taken():
    x, out = torch.zeros(6, dtype=torch.bfloat16), torch.zeros(12, dtype=torch.bfloat16)
    assert verdict("all_gather", P, (x, out), 6, 12) is None
    assert verdict("reduce_scatter", P, (out, x), 12, 6, ReduceOp.AVG) is None
    assert verdict("all_reduce", P, (x, x), 6, 6, ReduceOp.SUM) is None
    rows = torch.zeros(4, 3, dtype=torch.float16)
    assert verdict("all_to_all", P, (rows, rows.clone()), 12, 12, splits=(None, None)) is None
    assert refused("all_to_all", P, (rows, rows.clone()), 12, 12, splits=([1, 3], [2, 2])) is None


def test_types_and_reductions_zipccl_does_not_code_are_native():
    x, out = torch.zeros(6, dtype=torch.float64), torch.zeros(12, dtype=torch.float64)
    assert refused("all_gather", P, (x, out), 6, 12)[0] == NATIVE
    mixed = torch.zeros(12, dtype=torch.float32)
    assert verdict("all_gather", P, (torch.zeros(6, dtype=torch.bfloat16), mixed), 6, 12) == NATIVE
    y = torch.zeros(6, dtype=torch.bfloat16)
    no = refused("all_reduce", P, (y, y), 6, 6, ReduceOp.MAX)
    assert no[0] == NATIVE and "max" in no[1]
    # a type zipccl does not code goes native even with sizes that fit no call
    assert verdict("all_gather", P, (x, x), 6, 6) == NATIVE


def test_arguments_that_form_no_call_are_invalid():
    x = torch.zeros(6, dtype=torch.bfloat16)
    assert refused("all_gather", P, (x, torch.zeros(11, dtype=torch.bfloat16)), 6, 11)[0] == INVALID
    assert verdict("reduce_scatter", P, (x, x), 6, 6, ReduceOp.SUM) == INVALID
    strided = torch.zeros(6, 2, dtype=torch.bfloat16)[:, 0]
    assert verdict("all_reduce", P, (strided, strided), 6, 6, ReduceOp.SUM) == INVALID
    rows = torch.zeros(3, 2, dtype=torch.bfloat16)
    assert verdict("all_to_all", P, (rows, rows.clone()), 6, 6, splits=(None, None)) == INVALID
    four = torch.zeros(4, 2, dtype=torch.bfloat16)
    assert verdict("all_to_all", P, (four, four.clone()), 8, 8, splits=([1, 2], None)) == INVALID
    assert verdict("all_to_all", P, (four, four.clone()), 8, 8, splits=([1, 3, 0], None)) == INVALID


def test_the_collectives_describe_with_the_same_rule():
    """``describe`` raises the very text ``refusal`` gives for sizes that fit no call."""
    import numpy as np

    from zipccl.comm import all_gather
    from zipccl.comm.args import wrap

    why = refusal("all_gather", P, ["float32", "float32"], None, 6, 11)[1]
    with pytest.raises(ValueError) as e:
        all_gather.describe(wrap(np.zeros(6, np.float32), None, "send"),
                            wrap(np.zeros(11, np.float32), None, "recv"), P, 0)
    assert str(e.value) == why
