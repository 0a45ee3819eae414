"""Experimental kernel versions (experiments/kernels/v6*.py, v7*.py) under Numba's CUDA simulator.

A variant is timed on a GPU only after it decodes every buffer it is timed on bit for bit (an
encoder: writes the library's frame for it); this module checks the same on small frames without
a GPU (every tile has escapes, sizes
that are not a multiple of a tile, with and without a checksum). It runs in the simulator
tiers (``make test`` / ``make test-sim`` run this file with ``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

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
def test_v6b_encoder_writes_the_library_frames():
    """v6b (one barrier per tile): the library's and the reference's frames, byte for byte
    (escapes in every tile, an escape-heavy and a RAW input, sizes that are not a multiple of a
    tile, with and without a checksum)."""
    sys.path.insert(0, str(KERNELS))
    import v6b_encode

    assert v6b_encode.check_sim(v6b_encode.launch, "v6b", [2, 9]) == 0


@long_under_simulator
@simulator_only
def test_v7b_fp32_pair_encoder_writes_the_library_frames():
    """v7b (FP32, two tiles a ticket): the library's and the reference's FP32 frames, byte for
    byte, with an odd and an even number of tiles."""
    sys.path.insert(0, str(KERNELS))
    import v7b_encode32

    assert v7b_encode32.check_sim([2, 9, 13]) == 0

