"""FP32 and FP16 frames on the device: the ``*_into`` paths of ``gpu.py`` for 4-byte and
half-precision values.

They take the same workspaces and plan cache as BF16 (``gpu_workspace``). FP32 runs the BF16
tile kernels' FP32 builds (an FP32 frame is the BF16 frame of the upper halves plus a section
of low halves), FP16 the encoder's FP16 build and a decoder on the BF16 decoder's tile
structure (``kernels/encode_launch.py``'s ``WidePlan``, ``kernels/decode_fp16.py``). Each has a
plan route (a GPU) and a dispatcher route (the simulator), as BF16 has.
"""

from __future__ import annotations

import numpy as np

from .. import format as fmt
from ..arrays import torch_of
from ..codebook import Codebook
from .gpu_arrays import _check_frame_bytes, _frame_buffer, _raw, _stream_key, _u8, _wide_values
from .gpu_route import _crc_table, _device_pointer, _dispatcher_route, _kernels, _wide
from .gpu_workspace import (
    _PLANS,
    Workspace,
    _check_workspace,
    _remember,
    _template,
    default_workspace,
    launch_kept,
)


def _check_wide_codebook(codebook: Codebook, code: int) -> None:
    fmt.check_codebook(codebook.exponents, code)


def _encode_wide_into(bits, out, codebook: Codebook | None, stream, checksum, shape, workspace, code):
    """``codebook=None`` (FP32 only): the codebook ``stats.choose_codebook`` left in the
    workspace."""
    if codebook is not None:
        _check_wide_codebook(codebook, code)
    exponents = None if codebook is None else codebook.exponents
    if _dispatcher_route():
        return _encode_wide_numba(bits, out, exponents, stream, checksum, shape, workspace, code)
    x_ptr, n = _wide_values(bits, code)
    o_ptr, nbytes = _frame_buffer(out)
    s = _stream_key(stream)
    ws = workspace if workspace is not None else default_workspace(s, n)
    _encode_wide(x_ptr, n, o_ptr, nbytes, exponents, s, checksum, shape, ws, code)


def _wide_lay(n: int, nbytes: int, shape, code: int, ws: Workspace | None):
    lay = fmt.Layout.for_count(n, code)
    if nbytes < lay.raw_size:
        raise ValueError(f"out holds {nbytes} bytes; a frame of {n} {fmt.DTYPE_NAMES[code]} values "
                         f"may need {lay.raw_size} (max_compressed_size)")
    if ws is not None:
        _check_workspace(ws, n, lay)
    return lay, ((n,) if shape is None else tuple(int(d) for d in shape))


def _encode_wide(x_ptr, n, o_ptr, nbytes, exponents, s, checksum, shape, ws, code) -> None:
    plan = _encode_wide_plan(x_ptr, n, o_ptr, nbytes, exponents, checksum, shape, ws, code)
    plan.retarget(x_ptr, o_ptr)
    plan.launch(s)


def _encode_wide_plan(x_ptr, n, o_ptr, nbytes, exponents, checksum, shape, ws, code):
    """The cached plan of ``_encode_wide`` (built, with its checks, on first use)."""
    key = (3, code, n, nbytes, ws.ptr, exponents, bool(checksum), shape)
    plan = _PLANS.get(key)
    if plan is None:
        lay, shp = _wide_lay(n, nbytes, shape, code, ws)
        hdr, crc_base, cb64 = _template(n, shp, exponents, code)
        crc = _crc_table()
        plan = _wide()[0].WidePlan(ws.device, x_ptr, o_ptr, nbytes, ws.ptr, ws.count, lay, hdr, crc_base,
                                   _device_pointer(crc), crc.size, cb64, checksum)
        plan.workspace = ws
        plan = _remember(key, plan)
    return plan


def _encode_wide_numba(bits, out, exponents, stream, checksum, shape, workspace, code) -> None:
    """``encode_into`` of FP32 / FP16 through Numba's dispatcher (the simulator's route)."""
    runtime = _kernels()[3]
    _wide_values(bits, code)  # the checks
    xb = bits.view(torch_of(bits).int32 if code == fmt.DTYPE_FP32 else torch_of(bits).int16) \
        if torch_of(bits) is not None else bits
    n = _raw(bits)[1] // fmt.ITEMSIZE[code]
    ob, nbytes = _u8(out)
    ws = workspace if workspace is not None else default_workspace(stream, n)
    lay, shp = _wide_lay(n, nbytes, shape, code, ws)
    hdr, crc_base, cb64 = _template(n, shp, exponents, code)
    units = n * fmt.ITEMSIZE[code] // 2
    v = runtime.view
    fp32 = code == fmt.DTYPE_FP32
    _wide()[0].launch_wide(v(xb, n if fp32 else 0, np.uint32), v(xb, 0 if fp32 else n, np.uint16),
                           v(xb, (units & ~7) // 2, np.uint32), v(xb, units, np.uint16),
                           v(ob, nbytes, np.uint8), v(ob, nbytes // 4, np.uint32),
                           v(ob, nbytes // 8, np.int64), ws.array, lay, hdr, crc_base, runtime.crc_table(),
                           cb64, checksum, runtime.stream(stream))


def _decode_wide_into(frame, out, stream, workspace, code) -> None:
    if _dispatcher_route():
        return _decode_wide_numba(frame, out, stream, workspace, code)
    f_ptr, nbytes = _frame_buffer(frame)
    o_ptr, n = _wide_values(out, code)
    s = _stream_key(stream)
    ws = workspace if workspace is not None else default_workspace(s, n)
    _decode_wide(f_ptr, nbytes, o_ptr, n, s, ws, code)


def _decode_wide(f_ptr, nbytes, o_ptr, n, s, ws, code) -> None:
    launch_kept((4, code, nbytes, n, ws.ptr),
                lambda: _decode_wide_plan(f_ptr, nbytes, o_ptr, n, ws, code), f_ptr, o_ptr, s)


def _decode_wide_plan(f_ptr, nbytes, o_ptr, n, ws, code):
    """A new plan of ``_decode_wide`` (its checks first)."""
    _check_frame_bytes(nbytes)
    lay = fmt.Layout.for_count(n, code)
    _check_workspace(ws, n, lay)
    crc = _crc_table()
    plan = _wide()[1].Plan(ws.device, f_ptr, nbytes, o_ptr, lay, ws.ptr, ws.count, _kernels()[0].CRC_ZERO,
                           _device_pointer(crc), crc.size)
    plan.workspace = ws
    return plan


def _decode_wide_numba(frame, out, stream, workspace, code) -> None:
    """``decode_into`` of FP32 / FP16 through Numba's dispatcher (the simulator's route)."""
    _common, _, _, runtime, _ = _kernels()
    fb, nbytes = _u8(frame)
    _, n = _wide_values(out, code)
    torch = torch_of(out)
    ob = out.view(torch.int32 if code == fmt.DTYPE_FP32 else torch.int16) if torch is not None else out
    _check_frame_bytes(nbytes)
    lay = fmt.Layout.for_count(n, code)
    ws = workspace if workspace is not None else default_workspace(stream, n)
    _check_workspace(ws, n, lay)
    v = runtime.view
    fp32 = code == fmt.DTYPE_FP32
    _wide()[1].launch(v(fb, nbytes, np.uint8), v(fb, nbytes // 2, np.uint16), v(fb, nbytes // 4, np.uint32),
                      v(fb, nbytes // 8, np.int64), v(ob, n if fp32 else (n & ~7) // 2, np.uint32),
                      v(ob, 2 * n if fp32 else n, np.uint16), ws.array, lay, _common.CRC_ZERO,
                      runtime.crc_table(), runtime.stream(stream))
