"""Experimental kernel versions (experiments/kernels/v6*.py) under Numba's CUDA simulator.

A variant is timed on a GPU only after it decodes every buffer it is timed on bit for bit (an
encoder: writes the library's frame for it); this module checks the same on small frames without
a GPU (every tile has escapes, sizes
that are not a multiple of a tile, with and without a checksum). It runs in the simulator
tiers (``make test`` / ``make test-sim`` run this file with ``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest
from conftest import SIMULATOR, long_under_simulator, simulator_only

if SIMULATOR:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NumPy int64 wrap-around

KERNELS = Path(__file__).resolve().parent.parent / "experiments" / "kernels"


@long_under_simulator
@simulator_only
def test_v6a_scanned_prefixes_decode_bit_exact():
    """v6a (prefixes from a scan of the stored counts) decodes reference frames exactly."""
    sys.path.insert(0, str(KERNELS))
    import v6_scan

    assert v6_scan.check_sim([9, 14]) == 0


@long_under_simulator
@simulator_only
@pytest.mark.parametrize("variant", ["v6b_encode", "v6c_encode"])
def test_v6_encoders_write_the_library_frames(variant):
    """v6b (one barrier per tile) and v6c (two tiles a ticket): the library's and the reference's
    frames, byte for byte (escapes in every tile, an escape-heavy and a RAW input, sizes that
    are not a multiple of a tile, with and without a checksum)."""
    sys.path.insert(0, str(KERNELS))
    import v6b_encode

    module = importlib.import_module(variant)
    assert v6b_encode.check_sim(module.launch, variant, [2, 9]) == 0


@long_under_simulator
@simulator_only
def test_fp16_table_encoder_writes_the_library_frames():
    """The FP16 table encoder (the BF16 tile kernel's FP16 build): the library's and the
    reference's FP16 frames, byte for byte (every high byte, escape-heavy and RAW inputs)."""
    sys.path.insert(0, str(KERNELS))
    import v6_fp16

    assert v6_fp16.check_sim([9]) == 0
