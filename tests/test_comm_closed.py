"""A Communicator after ``close()``: every collective raises CollectiveError saying so.

(Before, a call after ``close()`` failed with ``AttributeError: 'NoneType' object has no
attribute ...`` from deep inside the exchange.) Closing twice is harmless.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import zipccl
from zipccl.comm import CollectiveError

BF16 = ml_dtypes.bfloat16


def _calls(c):
    x = np.ones(8, BF16)
    return {
        "all_gather": lambda: c.all_gather(x, np.zeros(8, BF16)),
        "reduce_scatter": lambda: c.reduce_scatter(x, np.zeros(8, BF16)),
        "all_to_all": lambda: c.all_to_all(x, np.zeros(8, BF16)),
        "all_to_all counts": lambda: c.all_to_all(x, np.zeros(8, BF16), [8], [8]),
        "all_reduce": lambda: c.all_reduce(x.copy()),
    }


@pytest.mark.parametrize("policy", ["always", "never", "auto"])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all", "all_to_all counts",
                                "all_reduce"])
def test_collective_after_close_raises_collective_error(policy, op):
    from mpi4py import MPI

    c = zipccl.Communicator(MPI.COMM_SELF, policy=policy)
    _calls(c)[op]()  # works while open
    c.close()
    c.close()  # a second close is harmless
    with pytest.raises(CollectiveError, match="closed"):
        _calls(c)[op]()
