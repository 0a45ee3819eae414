"""v6a: the decoder's escape prefixes from a scan of the stored counts, not a look-back.

A frame stores every tile's escape count, so a decoder knows all of them before it decodes
anything: one small kernel (``scan_counts``, one block) scans them and writes each tile's
inclusive prefix into the workspace's status word (the word a finished look-back leaves);
the library's tile kernel built with ``scanned`` (``decode._tiles_kernel(..., scanned=True)``)
then reads tile t's prefix with one load (status word t - 1) instead of publishing its count
and walking back, so warp 0 has no polling chain before barrier B. The prediction is in
NOTES.md ("v6").

Check under the CUDA simulator (small sizes; the decoded values must be the input bit for
bit, and equal to the library decoder's)::

    NUMBA_ENABLE_CUDASIM=1 python experiments/kernels/v6_scan.py --sizes-k 9 20 33

On a GPU (``v6_round.sh`` runs it): the same check on every timed buffer set, then CUDA
graph replay of the library decoder and of v6a, one JSON record each to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import v6_sim  # noqa: E402
from numba import cuda  # noqa: E402

from zipccl import format as fmt  # noqa: E402
from zipccl.kernels import _common, decode, runtime  # noqa: E402
from zipccl.kernels._common import LOW32, STATUS_INC, TPB, WS_EPOCH, WS_STATUS  # noqa: E402
from zipccl.kernels.layout import layout_fields, layout_tuple  # noqa: E402

SCAN_TPB = 1024  # one block: each thread scans a contiguous run of ceil(n_blocks / 1024) counts


@cuda.jit
def scan_counts(f32, ws, lay):
    """Status word t := (epoch, INC, sum of the clamped stored counts of tiles 0..t)."""
    n, _, _, counts_off, _, _, _, n_blocks = layout_fields(lay)
    part = cuda.shared.array(SCAN_TPB, dtype=np.int64)
    tid = np.int64(cuda.threadIdx.x)
    per = (n_blocks + SCAN_TPB - 1) // SCAN_TPB
    lo = tid * per
    hi = min(lo + per, n_blocks)
    s = np.int64(0)
    for t in range(lo, hi):
        s += min(np.int64(f32[(counts_off >> 2) + t]), min(n - t * fmt.BLOCK, fmt.BLOCK))
    part[tid] = s
    cuda.syncthreads()
    d = 1
    while d < SCAN_TPB:  # inclusive Hillis-Steele scan of the thread sums
        v = part[tid - d] if tid >= d else np.int64(0)
        cuda.syncthreads()
        part[tid] += v
        cuda.syncthreads()
        d *= 2
    run = part[tid] - s
    tag = (ws[WS_EPOCH] << 34) | (np.int64(STATUS_INC) << 32)
    for t in range(lo, hi):
        run += min(np.int64(f32[(counts_off >> 2) + t]), min(n - t * fmt.BLOCK, fmt.BLOCK))
        ws[WS_STATUS + t] = tag | (run & LOW32)


decode_tiles_scanned = decode._tiles_kernel(False, scanned=True)


def launch(f8, f32, f64, out32, out16, ws, lay: fmt.Layout, stream) -> None:
    """v6a decode of the BF16 frame in f8 (views as in ``decode.launch``) into out16."""
    lt = layout_tuple(lay)
    if lay.n_blocks:
        scan_counts[1, SCAN_TPB, stream](f32, ws, lt)
        decode_tiles_scanned[_common.grid_size(lay.n_blocks), TPB, stream](f8, f32, f64, out32, out16, ws, lt)
    decode.decode_finish[1, TPB, stream](f8, f32, f64, ws, lt, _common.CRC_ZERO, runtime.crc_table())


def _views(fb, ob, n, lay_bytes):
    v = runtime.view
    return (v(fb, lay_bytes, np.uint8), v(fb, lay_bytes // 4, np.uint32), v(fb, lay_bytes // 8, np.int64),
            v(ob, (n & ~7) // 2, np.uint32), v(ob, n, np.uint16))


def check_sim(sizes_k) -> int:
    """Simulator check: v6a's output is the input, and the library decoder's, bit for bit."""
    from zipccl.codebook import Codebook
    from zipccl.codec import gpu_workspace, reference

    cb = Codebook.from_sigma(0.02)
    rng = np.random.default_rng(3)
    bad = 0
    for k in sizes_k:
        n = int(k * 1024) + (5 if int(k) % 2 else 0)
        x = (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        x[::613] = 0x7F80  # escapes in every tile
        for cs in (False, True):
            frame = reference.encode(x, cb, None, cs)
            lay = fmt.Layout.for_count(n)
            ws = gpu_workspace.Workspace(n)
            out = np.zeros(n, np.uint16)
            launch(*_views(frame, out, n, frame.size), ws.array, lay, 0)
            err = ws.last_error(0)
            ok = err == 0 and np.array_equal(out, x)
            bad += not ok
            print(f"v6a n={n} checksum={cs}: {'ok' if ok else f'DIFFERS (error bits {err})'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(v6_sim.sim_main(check_sim, __doc__))
