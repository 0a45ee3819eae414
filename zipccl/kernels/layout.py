"""The frame as the tile kernels see it: the layout tuple, its fields by name, the header check.

A kernel takes the frame's ``format.Layout`` as one int64 tuple argument (Numba passes a
tuple as its elements, so it costs no memory load): ``layout_tuple`` for a BF16 frame,
``wide_tuple`` for FP32 and FP16 frames (three more fields), ``finish_tuple`` for the
encoder's finishing kernel of a frame of any type. The ``LAY_*`` constants name the fields
(Numba folds them, so ``lay[LAY_N]`` is the same code as ``lay[0]``); ``layout_fields``
unpacks the ones every tile kernel reads.

``header_ok`` is the decoders' check of the header fields they rely on, one function for
every element type (the magic integer names the type; FP16 codebook entries must be FP16
exponents). Offsets themselves come from ``zipccl.format.Layout`` alone.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import format as fmt
from ._common import dev

LAY_N = 0  # number of values
LAY_SM = 1  # sign-mantissa (byte plane) section offset
LAY_PLANES = 2  # first code plane's offset
LAY_STRIDE = 3  # bytes from one plane to the next
LAY_COUNTS = 4  # escape counts' offset
LAY_ESCAPES = 5  # escape section's offset
LAY_RAW = 6  # size of the RAW frame
LAY_PWORDS = 7  # uint32 words in one code plane
LAY_NBLOCKS = 8  # escape blocks (tiles)
LAY_FIELDS = 9  # fields of layout_tuple; wide_tuple adds:
LAY_LO = 9  # FP32: the low halves' offset
LAY_NPLANES = 10  # bit planes after the byte plane (3, or 6 for FP16)
LAY_DTYPE = 11  # element type (format.DTYPE_*)
WIDE_FIELDS = 12


def layout_tuple(lay: fmt.Layout) -> tuple[int, ...]:
    """The Layout fields the kernels read, as one int tuple (a single kernel argument),
    field k at index ``LAY_*`` = k."""
    return (lay.n, lay.sm_offset, lay.planes_offset, lay.plane_stride, lay.counts_offset,
            lay.escapes_offset, lay.raw_size, lay.plane_words, lay.n_blocks)


def wide_tuple(lay: fmt.Layout) -> tuple[int, ...]:
    """``layout_tuple`` plus the fields of FP32 and FP16 frames: (..., low halves' offset,
    number of bit planes, element type); the FP32 tile kernels and the FP16 kernels read it."""
    return layout_tuple(lay) + (lay.lo_offset, lay.n_planes, lay.dtype)


def finish_tuple(lay: fmt.Layout) -> tuple[int, ...]:
    """``layout_tuple`` as ``encode.encode_finish`` must see a frame of any type: n in 2-byte
    units (its RAW copy moves 2n' bytes) and, for FP32, the counts offset moved so that the
    padding it zeroes after "counts + 4 n_blocks" is the padding after the low halves (the
    padding after the counts is zeroed by the tile kernel). For BF16 it is ``layout_tuple``."""
    units = lay.n * fmt.ITEMSIZE[lay.dtype] // 2
    counts = lay.counts_offset
    if lay.dtype == fmt.DTYPE_FP32:
        counts = lay.lo_offset + lay.lo_size - 4 * lay.n_blocks
    return (units, lay.sm_offset, lay.planes_offset, lay.plane_stride, counts, lay.escapes_offset,
            lay.raw_size, lay.plane_words, lay.n_blocks)


assert (LAY_N, LAY_SM, LAY_PLANES, LAY_STRIDE, LAY_COUNTS, LAY_ESCAPES, LAY_RAW, LAY_PWORDS,
        LAY_NBLOCKS, LAY_FIELDS) == tuple(range(10)), "layout_tuple's order"
assert len(wide_tuple(fmt.Layout.for_count(1, fmt.DTYPE_FP16))) == WIDE_FIELDS, "wide_tuple's order"


@dev
def layout_fields(lay):
    """(n, planes_off, stride, counts_off, eo, raw_size, pwords, n_blocks): the fields of the
    layout tuple the kernels read, by name (``LAY_*`` give the order)."""
    return (lay[LAY_N], lay[LAY_PLANES], lay[LAY_STRIDE], lay[LAY_COUNTS], lay[LAY_ESCAPES],
            lay[LAY_RAW], lay[LAY_PWORDS], lay[LAY_NBLOCKS])


@dev
def lay_lo(lay):
    """The FP32 low halves' offset (a ``wide_tuple`` field)."""
    return lay[LAY_LO]


@dev
def lay_no_lo(lay):
    """``lay_lo`` of a BF16 kernel (no low halves)."""
    return np.int64(0)


def magic48(dtype: int) -> int:
    """Header bytes 0..5 (magic, version, element type) as a little-endian integer."""
    return int.from_bytes(fmt.MAGIC + bytes([fmt.VERSION, dtype]), "little")


MAGIC_BF16 = magic48(fmt.DTYPE_BF16)
MAGIC_FP32 = magic48(fmt.DTYPE_FP32)
MAGIC_FP16 = magic48(fmt.DTYPE_FP16)
FP32 = fmt.DTYPE_FP32
FP16 = fmt.DTYPE_FP16
FP16_EXPONENT_MAX = fmt.EXPONENT_MAX[FP16]


@cuda.jit(device=True)
def header_ok(f64, nbytes, lay, magic):
    """(valid, raw, n_escapes, has_checksum) of the frame header, for an output of lay[LAY_N]
    values; ``magic``: header bytes 0..5 (``magic48`` of the element type)."""
    n = lay[LAY_N]
    eo = lay[LAY_ESCAPES]
    raw_size = lay[LAY_RAW]
    w0 = f64[0]
    flags = (w0 >> 48) & 0xFFFF
    nh = f64[1]
    nesc = f64[2]
    flen = f64[3]
    raw = flags & 1
    ok = (w0 & 0xFFFFFFFFFFFF) == magic and (flags & ~np.int64(3)) == 0 and nh == n
    ok = ok and flen >= 0 and flen <= nbytes and nesc >= 0
    if raw != 0:
        ok = ok and nesc == 0 and flen == raw_size
    else:
        ok = ok and nesc <= n and flen == eo + nesc and flen <= raw_size
    if (flags & 2) == 0 and f64[4] != 0:
        ok = False
    return ok, raw, nesc, (flags >> 1) & 1


@cuda.jit(device=True)
def wide_header_ok(f64, nbytes, lay):
    """``header_ok`` of an FP32 or FP16 frame (the type is lay[LAY_DTYPE]); an FP16 frame's
    codebook entries must also be FP16 exponents (at most 31)."""
    kind = lay[LAY_DTYPE]
    ok, raw, nesc, has_cs = header_ok(f64, nbytes, lay, MAGIC_FP32 if kind == FP32 else MAGIC_FP16)
    if kind == FP16:
        cb = f64[5]
        for i in range(7):
            if ((cb >> (8 * i)) & 0xFF) > FP16_EXPONENT_MAX:
                ok = False
    return ok, raw, nesc, has_cs
