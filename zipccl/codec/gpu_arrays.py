"""Device arrays and streams as the GPU codec's kernels take them.

CuPy arrays, Numba device arrays and CUDA torch tensors (through their own attributes, or
``__cuda_array_interface__``) become a device pointer, a length and an element type
(``element_code``: BF16, FP32 or FP16, with ``dtype=`` for integer bit patterns), checked once:
C-contiguous, 16-byte aligned, frame buffers uint8. Accepted argument kinds are remembered, so a
steady-state call re-checks only the array itself. What kind an array is, its pointer, new
arrays in the caller's framework and its current stream come from ``zipccl.arrays``; here only
the simulator's stand-ins (NumPy memory, Numba's fake device arrays) are added to them.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import format as fmt
from ..arrays import (
    BF16,
    CUPY,
    TORCH,
    check_cuda_tensor,
    device_buffer,
    empty_like,
    kind,
    torch_of,
    value_type,
)
from .gpu_route import _kernels

_ALIGN = 16
_FRAMEWORK = (CUPY, TORCH)  # kinds read through their own attributes; the rest through _kernels


def _bits_view(x, dtype: str | None):
    """(object exposing the interface as 16-bit integers, shape). Raises TypeError for non-BF16."""
    torch = torch_of(x)
    if torch is not None:
        check_cuda_tensor(x)
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16), tuple(x.shape)
        if x.dtype in (torch.int16, torch.uint16) and dtype in ("bfloat16", "bf16"):
            return x, tuple(x.shape)
        raise TypeError(f"zipccl compresses BF16 tensors; got a torch tensor of dtype {x.dtype}"
                        + (" (pass dtype=\"bfloat16\" to read 16-bit integers as BF16)"
                           if x.dtype in (torch.int16, torch.uint16) else ""))
    if kind(x) == CUPY:
        dt, shape = x.dtype, x.shape
    else:
        _, _, dt, shape = _kernels()[3].interface(x)
    if dt.kind in "ui" and dt.itemsize == 2:
        if dtype not in ("bfloat16", "bf16"):
            raise TypeError(f"zipccl compresses BF16 tensors; got a device array of dtype {dt} "
                            "(pass dtype=\"bfloat16\" to read uint16 bit patterns as BF16)")
        return x, shape
    raise TypeError(f"zipccl compresses BF16 tensors; got a device array of dtype {dt}")


def _dtype_name(x) -> str:
    """The dtype of a device array as text ('float32', 'torch.float16', 'uint16', ...)."""
    if kind(x) in _FRAMEWORK:
        return str(x.dtype)
    return str(_kernels()[3].interface(x)[2])


def element_code(x, dtype: str | None = None) -> int:
    """The element type (``format.DTYPE_*``) a device array holds for the codec's ``*_into``
    calls: float32 and 32-bit integers are FP32, float16 (or 16-bit integers with
    ``dtype="float16"``) FP16, bfloat16 and other 16-bit integers BF16. Raises TypeError
    otherwise."""
    if dtype is None:
        key = (type(x), getattr(x, "dtype", None))
        code = _ELEMENT.get(key) if key[1] is not None else None
        if code is None:
            code = _element_code(x, None)
            if key[1] is not None and len(_ELEMENT) < 256:
                _ELEMENT[key] = code
        return code
    return _element_code(x, dtype)


_ELEMENT: dict[tuple, int] = {}


def _element_code(x, dtype: str | None) -> int:
    name = _dtype_name(x).replace("torch.", "")
    want = fmt.dtype_code(dtype) if dtype is not None else None
    if name == "float32" or (name in ("uint32", "int32") and want in (None, fmt.DTYPE_FP32)):
        code = fmt.DTYPE_FP32
    elif name == "float16" or (name in ("uint16", "int16") and want == fmt.DTYPE_FP16):
        code = fmt.DTYPE_FP16
    elif name in ("bfloat16", "uint16", "int16"):
        code = fmt.DTYPE_BF16
    else:
        raise TypeError(f"zipccl compresses bfloat16, float32 and float16 tensors; got a device "
                        f"array of dtype {name}")
    if want is not None and want != code:
        raise TypeError(f"a device array of dtype {name} cannot be read as {fmt.DTYPE_NAMES[want]}")
    return code


# (type, dtype, dtype=) of an argument ``_typed_view`` accepted -> (element code, the torch
# dtype to view it as or None): a later argument of the same kind skips the name checks.
_TYPED: dict[tuple, tuple[int, object]] = {}


def _typed_view(x, dtype: str | None):
    """(object exposing the values as integers of their size, shape, element code) for
    ``compress``: BF16 through ``_bits_view`` (its checks and messages); float32 / float16
    arrays as they are (torch tensors viewed as int32 / int16); integer bit patterns of
    FP32 / FP16 with ``dtype=``. What an accepted (type, dtype, ``dtype=``) gives is
    remembered, so a steady-state call only re-checks the array itself."""
    key = (type(x), getattr(x, "dtype", None), dtype)
    known = _TYPED.get(key) if key[1] is not None else None
    if known is not None:
        code, as_torch = known
        if as_torch is not None:
            check_cuda_tensor(x)
            return (x.view(as_torch) if as_torch is not x.dtype else x), tuple(x.shape), code
        return x, tuple(x.shape), code
    xb, shape, code = _typed_view_checked(x, dtype)
    if key[1] is not None and len(_TYPED) < 256:
        torch = torch_of(x)
        _TYPED[key] = (code, xb.dtype if torch is not None else None)
    return xb, shape, code


def _typed_view_checked(x, dtype: str | None):
    """``_typed_view`` the long way: every name check, every message."""
    name = _dtype_name(x)
    short = name.replace("torch.", "")
    if short not in ("float32", "float16") and dtype in (None, "bfloat16", "bf16"):
        xb, shape = _bits_view(x, dtype)
        return xb, shape, fmt.DTYPE_BF16
    code = value_type(name, dtype, "device array")
    if code == fmt.DTYPE_BF16:
        xb, shape = _bits_view(x, dtype)
        return xb, shape, code
    torch = torch_of(x)
    if torch is not None:
        check_cuda_tensor(x)
        return x.view(torch.int32 if code == fmt.DTYPE_FP32 else torch.int16), tuple(x.shape), code
    return x, tuple(x.shape), code


def _wide_values(obj, code: int) -> tuple[int, int]:
    """(pointer, n) of n device values of element type ``code`` (FP32 / FP16), 16-byte aligned."""
    ptr, nbytes, item = _raw(obj)
    if item != fmt.ITEMSIZE[code]:
        raise TypeError(f"{fmt.DTYPE_NAMES[code]} values are {fmt.ITEMSIZE[code]}-byte items, got "
                        f"{item}-byte items")
    if ptr % _ALIGN and nbytes:
        raise ValueError(f"device data must be {_ALIGN}-byte aligned (pointer 0x{ptr:x})")
    return ptr, nbytes // item


def _u16(obj):
    """(object holding the data as 16-bit integers, n): ``_values``' checks, keeping the object
    (the simulator's route makes Numba views of it)."""
    torch = torch_of(obj)
    if torch is not None and obj.dtype == torch.bfloat16:
        obj = obj.view(torch.int16)
    return obj, _values(obj)[1]


def _u8(obj):
    """(object, nbytes) of a frame buffer: ``_frame_buffer``'s checks, keeping the object."""
    return obj, _frame_buffer(obj)[1]


def _interface(obj) -> tuple[int, int, int]:
    """``_raw`` of an array that is neither CuPy's nor torch's: the kernels' ``interface``
    (``__cuda_array_interface__``; the memory of a stand-in under the simulator)."""
    ptr, nbytes, dt, _ = _kernels()[3].interface(obj)
    return ptr, nbytes, dt.itemsize


#: (device pointer, byte length, itemsize) of a C-contiguous device array: CuPy arrays and torch
#: tensors by ``arrays.device_buffer``, anything else by ``_interface`` (a partial: no frame of
#: its own on the per-call path)
_raw = partial(device_buffer, other=_interface)


def _values(obj) -> tuple[int, int]:
    """(pointer, n) of n 16-bit device values, 16-byte aligned."""
    ptr, nbytes, item = _raw(obj)
    if item != 2:
        raise TypeError(f"expected 16-bit values, got {item}-byte items")
    if ptr % _ALIGN and nbytes:
        raise ValueError(f"device data must be {_ALIGN}-byte aligned (pointer 0x{ptr:x})")
    return ptr, nbytes // 2


def _frame_buffer(obj) -> tuple[int, int]:
    """(pointer, nbytes) of a uint8 device frame buffer, 16-byte aligned."""
    ptr, nbytes, item = _raw(obj)
    if item != 1:
        raise TypeError(f"a zipccl frame buffer is uint8, got {item}-byte items")
    if ptr % _ALIGN:
        raise ValueError(f"frame buffers must be {_ALIGN}-byte aligned (pointer 0x{ptr:x})")
    return ptr, nbytes


def _check_frame_bytes(nbytes: int) -> None:
    if nbytes < fmt.HEADER_SIZE:
        raise ValueError(f"not a zipccl frame: {nbytes} bytes is shorter than the "
                         f"{fmt.HEADER_SIZE}-byte header")


def _stream_key(stream) -> int:
    """The CUDA stream handle of ``stream`` as an int (None / 0: the legacy default stream)."""
    if stream is None:
        return 0
    if type(stream) is int:
        return stream
    for attr in ("ptr", "cuda_stream"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if hasattr(stream, "handle"):
        h = stream.handle
        return int(getattr(h, "value", h) or 0)
    return int(stream)


_KINDS_NP = {"u8": np.uint8, "bf16": BF16, "f32": np.float32, "f16": np.float16}
_KIND_OF = {fmt.DTYPE_BF16: "bf16", fmt.DTYPE_FP32: "f32", fmt.DTYPE_FP16: "f16"}


def _empty_like_framework(like, nbytes_or_shape, what: str):
    """A new device array in the framework of ``like`` (``arrays.empty_like``; a Numba device
    array, or NumPy memory under the simulator, for other kinds): ``what`` 'u8' (frame) or
    'bf16', 'f32', 'f16' (values; Numba and CuPy hold BF16 as uint16)."""
    dt = _KINDS_NP[what]
    if kind(like) in _FRAMEWORK:
        return empty_like(like, nbytes_or_shape, dt)
    dt = np.uint16 if dt == BF16 else dt
    runtime = _kernels()[3]
    if runtime.SIMULATOR:
        return np.empty(nbytes_or_shape, dtype=dt)
    return runtime.device_empty(nbytes_or_shape, dt)


def _flat(buf):
    return buf if buf.ndim == 1 else buf.reshape(-1)
