"""Arrays in and out: NumPy (ml_dtypes.bfloat16, float32, float16 or their integer bit
patterns), torch, CuPy, Numba device arrays.

Inside the codec a BF16 or FP16 tensor is its uint16 bit patterns, an FP32 tensor its
uint32 bit patterns; ``host_values`` says which element type they are. This module turns
whatever the caller has into that view without copying where the memory allows
it, tells host arrays from device arrays, and hands host results back in the kind
the caller passed (``like_input``: torch in, torch out). It imports neither torch nor CuPy
unless the caller's object already comes from them.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
_BF16_NAMES = ("bfloat16", "bf16")


def _torch_of(x):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def is_device_array(x) -> bool:
    """True for CUDA memory: CuPy, Numba device arrays, CUDA torch tensors."""
    torch = _torch_of(x)
    if torch is not None:
        return bool(x.is_cuda)
    return hasattr(x, "__cuda_array_interface__")


def _check_bf16(dtype_obj, dtype: str | None, what: str) -> None:
    name = str(dtype_obj)
    if name in ("bfloat16", "torch.bfloat16"):
        return
    if dtype in _BF16_NAMES and name in ("uint16", "int16", "torch.int16", "torch.uint16"):
        return
    hint = (" (pass dtype=\"bfloat16\" to read uint16 bit patterns as BF16)"
            if name in ("uint16", "int16", "torch.int16", "torch.uint16") else "")
    raise TypeError(f"zipccl compresses BF16 tensors; got a {what} of dtype {name}{hint}")


def _host_torch(x, dtype: str | None, needs: str):
    """torch if ``x`` is a BF16 CPU torch tensor, None if it is no torch tensor; raises
    TypeError for a bad ``dtype=``, a CUDA tensor (``needs`` says why) or a non-BF16 one."""
    if dtype is not None and dtype not in _BF16_NAMES:
        raise TypeError(f"zipccl compresses BF16 tensors; dtype={dtype!r} is not bfloat16")
    torch = _torch_of(x)
    if torch is not None:
        if x.is_cuda:
            raise TypeError(f"{needs}; this torch tensor is on a CUDA device")
        _check_bf16(x.dtype, dtype, "torch tensor")
    return torch


def _torch_bits(t, torch) -> np.ndarray:
    """The uint16 view of a contiguous CPU tensor's memory."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().view(np.uint16)


def host_bits(x, *, dtype: str | None = None) -> np.ndarray:
    """The BF16 bit patterns of a host array as a C-contiguous uint16 array of the same shape.

    Accepts a NumPy array of ``ml_dtypes.bfloat16``, a uint16/int16 array with
    ``dtype="bfloat16"``, or a CPU torch tensor of ``torch.bfloat16``. A
    non-contiguous input is copied; anything else is a view. Raises TypeError for
    other dtypes, naming the dtype.

    >>> import ml_dtypes, numpy as np
    >>> host_bits(np.array([1.0, -2.0], dtype=ml_dtypes.bfloat16))
    array([16256, 49152], dtype=uint16)
    """
    torch = _host_torch(x, dtype, "host_bits needs a host tensor")
    if torch is not None:
        return _torch_bits(x.detach().contiguous(), torch)
    if is_device_array(x):
        raise TypeError("host_bits needs a host array; this one lives on a CUDA device")
    if isinstance(x, (bytes, bytearray, str)):
        # NumPy reads these as one string scalar (dtype |S4): say what the caller has.
        raise TypeError(f"zipccl compresses BF16 tensors; got {type(x).__name__} of length "
                        f"{len(x)}. To compress raw BF16 bit patterns pass "
                        f"np.frombuffer(data, np.uint16) with dtype=\"bfloat16\"; to read a "
                        f"frame use zipccl.decompress")
    arr = np.asarray(x)
    _check_bf16(arr.dtype, dtype, "NumPy array" if isinstance(x, np.ndarray) else type(x).__name__)
    # ascontiguousarray promotes 0-d arrays to 1-d; keep the caller's shape.
    return np.ascontiguousarray(arr).view(np.uint16).reshape(arr.shape)


def host_out_bits(out, *, dtype: str | None = None) -> np.ndarray:
    """A writable uint16 view of the memory of the host array ``out``, strides included.

    What is written into the view lands in ``out`` itself: for a NumPy array of any
    layout (the view keeps its strides), or a contiguous CPU torch tensor. Raises
    TypeError for a non-BF16 dtype and ValueError when no such view exists (a
    read-only array, a non-contiguous torch tensor).

    >>> import ml_dtypes, numpy as np
    >>> out = np.zeros(6, dtype=ml_dtypes.bfloat16)
    >>> host_out_bits(out[::2])[:] = 16256  # 1.0
    >>> out.astype(np.float32).tolist()
    [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    """
    torch = _host_torch(out, dtype, "a host frame decodes into a host tensor")
    if torch is not None:
        if not out.is_contiguous():
            raise ValueError("out= must be a contiguous torch tensor (or a NumPy array of any "
                             "layout); this one is not contiguous")
        return _torch_bits(out.detach(), torch)
    if is_device_array(out):
        raise TypeError("a host frame decodes into a host array; out= lives on a CUDA device")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out= must be a NumPy array or a torch tensor, got {type(out).__name__}")
    _check_bf16(out.dtype, dtype, "NumPy array")
    if not out.flags.writeable:
        raise ValueError("out= is read-only")
    return out.view(np.uint16)  # same item size: a view for every layout


_FLOAT_NAMES = {"bfloat16": "bfloat16", "torch.bfloat16": "bfloat16", "float32": "float32",
                "torch.float32": "float32", "float16": "float16", "torch.float16": "float16"}
_INT_NAMES = {2: ("uint16", "int16", "torch.int16", "torch.uint16"),
              4: ("uint32", "int32", "torch.int32", "torch.uint32")}
_TYPES = "bfloat16, float32 or float16"


def value_type(dtype_obj, dtype: str | None, what: str) -> int:
    """The element-type code (``format.DTYPE_*``) of an array of dtype ``dtype_obj``.

    A float dtype names itself (``dtype=``, when given, must agree); integer bit
    patterns need ``dtype=`` (uint16 / int16: "bfloat16" or "float16", uint32 / int32:
    "float32"). Raises TypeError naming the dtype otherwise.

    >>> value_type(np.dtype(np.float16), None, "NumPy array"), value_type(np.dtype(np.uint32), "float32", "x")
    (3, 2)
    """
    from . import format as fmt

    name = str(dtype_obj)
    want = None
    if dtype is not None:
        try:
            want = fmt.dtype_code(dtype)
        except (TypeError, ValueError):
            raise TypeError(f"zipccl compresses {_TYPES} tensors; dtype={dtype!r} is none of "
                            "them") from None
    if name in _FLOAT_NAMES:
        code = fmt.dtype_code(_FLOAT_NAMES[name])
        if want is not None and want != code:
            raise TypeError(f"a {what} of dtype {name} cannot be read as {fmt.DTYPE_NAMES[want]}")
        return code
    for size, names in _INT_NAMES.items():
        if name in names:
            if want is not None and fmt.ITEMSIZE[want] == size:
                return want
            fits = " or ".join(fmt.DTYPE_NAMES[c] for c in fmt.DTYPE_NAMES if fmt.ITEMSIZE[c] == size)
            hint = (f" (pass dtype=\"{fits.split(' or ')[0]}\" to read {name} bit patterns as "
                    f"{fits})")
            if want is not None:
                hint = f"; dtype={dtype!r} has {8 * fmt.ITEMSIZE[want]}-bit values"
            raise TypeError(f"zipccl compresses {_TYPES} tensors; got a {what} of dtype "
                            f"{name}{hint}")
    raise TypeError(f"zipccl compresses {_TYPES} tensors; got a {what} of dtype {name}")


def host_values(x, *, dtype: str | None = None) -> tuple[np.ndarray, int]:
    """(bit patterns, element-type code) of a host array of BF16, FP32 or FP16 values.

    The patterns are a C-contiguous uint16 (BF16, FP16) or uint32 (FP32) array of the
    same shape, a view where the memory allows. Accepts NumPy arrays (ml_dtypes.bfloat16,
    float32, float16, or integer bit patterns with ``dtype=``) and CPU torch tensors.

    >>> host_values(np.array([1.0], np.float32))
    (array([1065353216], dtype=uint32), 2)
    """
    torch = _torch_of(x)
    if torch is not None:
        if x.is_cuda:
            raise TypeError("host_values needs a host tensor; this torch tensor is on a CUDA device")
        code = value_type(x.dtype, dtype, "torch tensor")
        t = x.detach().contiguous()
        return _torch_int_view(t, torch).numpy().view(_BITS[code]), code
    if is_device_array(x):
        raise TypeError("host_values needs a host array; this one lives on a CUDA device")
    if isinstance(x, (bytes, bytearray, str)):
        host_bits(x)  # raises the message that says what to pass instead
    arr = np.asarray(x)
    code = value_type(arr.dtype, dtype, "NumPy array" if isinstance(x, np.ndarray)
                      else type(x).__name__)
    return np.ascontiguousarray(arr).view(_BITS[code]).reshape(arr.shape), code


def host_out_values(out, code: int) -> np.ndarray:
    """``host_out_bits`` for any element type: a writable view of ``out``'s bit patterns,
    which must be of the element type ``code`` (a float dtype, or integers of its size)."""
    if code == 1:
        return host_out_bits(out, dtype="bfloat16" if getattr(out, "dtype", None) == np.uint16
                             else None)
    from . import format as fmt

    name = fmt.DTYPE_NAMES[code]
    torch = _torch_of(out)
    if torch is not None:
        if out.is_cuda:
            raise TypeError("a host frame decodes into a host tensor; this torch tensor is on a "
                            "CUDA device")
        if value_type(out.dtype, name, "torch tensor") != code:
            raise TypeError(f"out= is {out.dtype}; the frame holds {name}")
        if not out.is_contiguous():
            raise ValueError("out= must be a contiguous torch tensor (or a NumPy array of any "
                             "layout); this one is not contiguous")
        return _torch_int_view(out.detach(), torch).numpy().view(_BITS[code])
    if is_device_array(out):
        raise TypeError("a host frame decodes into a host array; out= lives on a CUDA device")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out= must be a NumPy array or a torch tensor, got {type(out).__name__}")
    if str(out.dtype) in _FLOAT_NAMES and _FLOAT_NAMES[str(out.dtype)] != name:
        raise TypeError(f"out= is {out.dtype}; the frame holds {name}")
    value_type(out.dtype, name, "NumPy array")
    if not out.flags.writeable:
        raise ValueError("out= is read-only")
    return out.view(_BITS[code])


_BITS = {1: np.uint16, 2: np.uint32, 3: np.uint16}
_VALUES = {1: BF16, 2: np.dtype(np.float32), 3: np.dtype(np.float16)}


def _torch_int_view(t, torch):
    """A contiguous CPU tensor's memory as integers of its item size (NumPy can take them)."""
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


_TORCH_VALUES = {1: "bfloat16", 2: "float32", 3: "float16"}
_INTS = {1: np.int16, 2: np.int32, 3: np.int16}


def host_frame(frame):
    """A CPU torch frame (a uint8 tensor) as the NumPy view of its bytes; any other frame
    as it is. Raises TypeError for a torch tensor of another dtype."""
    torch = _torch_of(frame)
    if torch is None:
        return frame
    if frame.dtype != torch.uint8:
        raise TypeError(f"a zipccl frame is a uint8 buffer, got a torch tensor of dtype {frame.dtype}")
    return frame.detach().contiguous().numpy()


def like_input(arr: np.ndarray, like, code: int | None = None):
    """A host result, without a copy, in the kind of array the caller passed (``like``): a
    frame (``code`` None) as it is, or bit patterns as values of the element type ``code``;
    for a torch ``like`` as a CPU torch tensor sharing ``arr``'s memory (uint8, or
    torch.bfloat16 / float32 / float16), else as NumPy (``as_values``).

    >>> like_input(np.array([16256], np.uint16), b"frame", 1).astype(np.float32)
    array([1.], dtype=float32)
    """
    torch = _torch_of(like)
    if torch is None:
        return arr if code is None else as_values(arr, code)
    if not arr.flags.writeable:  # torch tensors are writable: never share read-only memory
        arr = arr.copy()
    if code is None:
        return torch.from_numpy(arr)
    return torch.from_numpy(arr.view(_INTS[code])).view(getattr(torch, _TORCH_VALUES[code]))


def as_values(bits: np.ndarray, code: int) -> np.ndarray:
    """View bit patterns as values of the element type ``code`` (no copy): bfloat16
    (ml_dtypes), float32 or float16."""
    return np.asarray(bits).view(_VALUES[code])


def as_bf16(bits: np.ndarray) -> np.ndarray:
    """View uint16 bit patterns as an ``ml_dtypes.bfloat16`` array (no copy)."""
    return np.asarray(bits).view(BF16)


def to_bf16(x) -> np.ndarray:
    """Round any floating host array to BF16 (round-to-nearest-even), for tools and demos."""
    torch = _torch_of(x)
    if torch is not None:
        x = x.detach().float().cpu().numpy()
    return np.asarray(x).astype(BF16)
