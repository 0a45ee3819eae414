"""FP16 on the BF16 tile structure: the encoder's table indexed by the high byte.

The library's FP16 encoder (``zipccl/kernels/encode_fp16.py``, ``wide_tiles``) codes one value
per lane: a 2-byte load, a table lookup and six warp votes per value, some 400 instructions per
32 values. An FP16 value's high byte is its sign, its 5 exponent bits and mantissa bits 9..8,
everything the frame's code planes and raw bit planes 3..5 hold (the low byte is the byte
plane as it is), so the BF16 tile kernel serves FP16 with two tables of that byte
(``encode._tiles_kernel(FP16)``): the code bits and escape flag (``_lut_entry`` of the
exponent), and the 3 raw bits, each accumulated per lane as BF16's code bits are (8 values a
round, one byte of each plane); the staged input, the escape scan, the look-back and the
escape placement are BF16's. The format is unchanged: frames are byte-identical to the
reference's and to the library's FP16 encoder's.

Check under the CUDA simulator (every exponent, sign and raw-bit pattern among the inputs)::

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v6_fp16.py --sizes-k 9 20

On a GPU ``v6_bench.py --fp16`` checks every timed frame against the library's and times both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import v6_sim  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.kernels import encode, encode_fp16  # noqa: E402

FP16 = fmt.DTYPE_FP16
encode_tiles16 = encode._tiles_kernel(FP16)


def launch(x32, x16, xu32, xu16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, cb64, checksum, stream):
    """The table encoder of FP16: ``encode_fp16.launch``'s arguments."""
    encode_fp16.launch(x32, x16, xu32, xu16, out8, out32, out64, ws, lay, hdr, crc_base, crc_tab, cb64,
                       checksum, stream, fp16_tiles=encode_tiles16)


def encode_frame(launcher, bits, exponents, checksum: bool, ws, stream=0, out=None):
    """Encode FP16 ``bits`` (uint16) with ``launcher`` (``encode_fp16.launch``'s arguments) into
    ``out`` (or a new buffer); returns it."""
    from zipccl.codec import gpu
    from zipccl.kernels import runtime

    n = int(bits.size)
    lay = fmt.Layout.for_count(n, FP16)
    if out is None:
        out = np.zeros(fmt.max_compressed_size(n, FP16), np.uint8)
    nbytes = int(out.size)
    hdr, crc_base, cb64 = gpu._template(n, (n,), exponents, FP16)
    v = runtime.view
    x16 = v(bits, n, np.uint16)
    launcher(v(bits, 0, np.uint32), x16, v(bits, (n & ~7) // 2, np.uint32), x16, v(out, nbytes, np.uint8),
             v(out, nbytes // 4, np.uint32), v(out, nbytes // 8, np.int64), ws.array, lay, hdr, crc_base,
             runtime.crc_table(), cb64, checksum, stream)
    return out


def sim_inputs(sizes_k, seed=5):
    """(name, FP16 bits): N(0, 0.02) with every 16-bit pattern's high byte spread over it, and an
    escape-heavy set (every 8th value random: ~12% escape, still coded; every 3rd: RAW), sizes not a
    multiple of a tile."""
    rng = np.random.default_rng(seed)
    for k in sizes_k:
        n = int(k * 1024) + (5 if int(k) % 2 else 0)
        x = rng.normal(0, 0.02, n).astype(np.float16).view(np.uint16).copy()
        x[::37] = (np.arange(x[::37].size) * 257 + 11).astype(np.uint16)  # every high byte, low bytes vary
        yield f"n={n} gaussian", x
        for every in (8, 3):
            y = x.copy()
            y[::every] = rng.integers(0, 1 << 16, y[::every].size).astype(np.uint16)
            yield f"n={n} 1/{every} random", y


def check_sim(sizes_k) -> int:
    """Simulator check: the table encoder's frames equal the reference's and the library's."""
    from zipccl.codebook import Codebook
    from zipccl.codec import reference

    cb = Codebook.from_sigma(0.02, dtype="float16")
    return v6_sim.check_frames("fp16 table", sim_inputs(sizes_k),
                               lambda x, cs: reference.encode(x, cb, None, cs, dtype=FP16),
                               lambda x, cs, ws: encode_frame(encode_fp16.launch, x, cb.exponents, cs, ws),
                               lambda x, cs, ws: encode_frame(launch, x, cb.exponents, cs, ws))


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(check_sim, __doc__))
