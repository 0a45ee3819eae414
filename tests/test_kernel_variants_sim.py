"""Experimental kernel versions (experiments/kernels/v6*.py, v7*.py) under Numba's CUDA simulator.

A variant is timed on a GPU only after it decodes every buffer it is timed on bit for bit (an
encoder: writes the library's frame for it); this module checks the same on small frames without
a GPU. Each variant has one quick case, which ``make test``'s simulator step runs (one tile,
partial, with escapes; an encoder's on one Gaussian input, with and without a checksum), and one
long case that ``make test-sim`` / ``make test-slow`` add (every tile has escapes, several tiles,
sizes that are not a multiple of a tile, escape-heavy and RAW inputs, with and without a
checksum). This file runs only with ``NUMBA_ENABLE_CUDASIM=1`` (``simulator_only``).
"""

from __future__ import annotations

import sys
import warnings
from itertools import islice
from pathlib import Path

import numpy as np
from conftest import SIMULATOR, long_under_simulator, simulator_only

if SIMULATOR:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NumPy int64 wrap-around

KERNELS = Path(__file__).resolve().parent.parent / "experiments" / "kernels"


def _import(name: str):
    sys.path.insert(0, str(KERNELS))
    return __import__(name)


@simulator_only
def test_v6a_quick():
    """v6a decodes the reference's frames of one partial tile with escapes exactly."""
    assert _import("v6_scan").check_sim([1]) == 0


@long_under_simulator
@simulator_only
def test_v6a_scanned_prefixes_decode_bit_exact():
    """v6a (prefixes from a scan of the stored counts) decodes reference frames exactly."""
    assert _import("v6_scan").check_sim([9, 14]) == 0


def _encoder_quick(module: str, dtype, library) -> int:
    """The variant's frames of the first (Gaussian) input of its ``sim_inputs([1])`` against the
    reference's and ``library``'s, with and without a checksum."""
    from zipccl.codebook import Codebook
    from zipccl.codec import reference

    mod, v6_sim = _import(module), _import("v6_sim")
    cb = Codebook.from_sigma(0.02)
    return v6_sim.check_frames(module, islice(mod.sim_inputs([1]), 1),
                               lambda x, cs: reference.encode(x, cb, None, cs, dtype=dtype),
                               lambda x, cs, ws: library(x, cb, cs, ws),
                               lambda x, cs, ws: mod.encode_frame(mod.launch, x, cb.exponents, cs, ws))


@simulator_only
def test_v6b_quick():
    from zipccl import format as fmt
    from zipccl.kernels import encode_launch

    v6b = _import("v6b_encode")
    launch = encode_launch.launch
    assert _encoder_quick("v6b_encode", fmt.DTYPE_BF16,
                          lambda x, cb, cs, ws: v6b.encode_frame(launch, x, cb.exponents, cs, ws)) == 0


@long_under_simulator
@simulator_only
def test_v6b_encoder_writes_the_library_frames():
    """v6b (one barrier per tile): the library's and the reference's frames, byte for byte
    (escapes in every tile, an escape-heavy and a RAW input, sizes that are not a multiple of a
    tile, with and without a checksum)."""
    v6b_encode = _import("v6b_encode")
    assert v6b_encode.check_sim(v6b_encode.launch, "v6b", [2, 9]) == 0


@simulator_only
def test_v7b_quick():
    from zipccl import format as fmt
    from zipccl.codec import gpu

    def library(x, cb, cs, ws):
        out = np.zeros(fmt.max_compressed_size(x.size, fmt.DTYPE_FP32), np.uint8)
        gpu.encode_into(x.view(np.float32), out, cb, checksum=cs, workspace=ws)
        return out

    assert _encoder_quick("v7b_encode32", fmt.DTYPE_FP32, library) == 0


@long_under_simulator
@simulator_only
def test_v7b_fp32_pair_encoder_writes_the_library_frames():
    """v7b (FP32, two tiles a ticket): the library's and the reference's FP32 frames, byte for
    byte, with an odd and an even number of tiles."""
    assert _import("v7b_encode32").check_sim([2, 9, 13]) == 0
