"""The expert-parallel MoE layer (experiments/moe_ep.py) and the exact-length all-to-all
(experiments/exact_length.py), on 2 gloo ranks.

The checks run on the two gloo ranks of ``tests/torchdist/ranks.py`` (``tests/torchdist/moe_ranks.py``,
after the zipccl.torch checks of tests/test_torch.py; conftest's ``torch_rank_results`` starts
them once per session); the tests read them. Checks:

- the layer forward and backward with dispatch and combine through the native all-to-all,
  zipccl's (``slots``), zipccl's with the codec off (``raw``) and the exact-length one
  (``exact``): output and every gradient the same bits (skewed and balanced routing); the
  compressed runs really compressed, the raw runs went through the exchange uncompressed; a corrupted
  all-to-all (one bit flipped) is caught by the same comparison;
- the exact-length all-to-all on uneven BF16 splits (zero rows one way, every row one way,
  none at all, edge-case bit patterns, NaN payloads) against
  ``torch.distributed.all_to_all_single``, bit for bit; a receiver expecting more rows than
  its peer sends raises ValueError, and the ranks go on (their transfers stayed matched).
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "torchdist"))
from moe_ranks import EXACT_CHECKS, LAYER_CHECKS  # noqa: E402


@pytest.mark.parametrize("name", LAYER_CHECKS + EXACT_CHECKS)
def test_rank_check(torch_rank_results, name):
    for r, res in enumerate(torch_rank_results):
        assert name in res, f"rank {r} did not run {name}"
        assert res[name]["ok"], f"rank {r}: {name}: {res[name]['detail']}"


def test_skew_is_reached():
    """The router bias solved for a target skew gives at least that ratio on the calibration sample."""
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import moe_ep

    assert moe_ep.solve_alpha(1.0, 8) == 0.0
    for skew in (1.5, 4.2):
        assert moe_ep.rank0_ratio(moe_ep.solve_alpha(skew, 8), 8) >= skew
