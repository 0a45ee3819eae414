"""The one array-kind adapter: NumPy, CuPy, torch and any ``__cuda_array_interface__`` object.

``kind`` tells what an array is (read once per type), ``identity`` what makes a view of its
memory valid (address, shape, strides, dtype, device: the key of plans and of ``unowned``'s
cached views), ``device_buffer`` its pointer and size; ``cupy_view``, ``as_torch`` and
``unowned`` view memory as another kind without copying. Inside the codec a BF16 or FP16
tensor is its uint16 bit patterns, an FP32 tensor its uint32 bit patterns: ``host_values``
turns a host array into them and ``like_input`` hands results back in the caller's kind
(torch in, torch out). Nothing here imports torch or CuPy unless the caller's object already
comes from them (``as_torch`` and ``unowned`` run only where they are loaded).
"""

from __future__ import annotations

import ctypes
import sys

import ml_dtypes
import numpy as np

from . import format as fmt

BF16 = np.dtype(ml_dtypes.bfloat16)
_BF16_NAMES = ("bfloat16", "bf16")

# -- kinds: what an array is -------------------------------------------------------------------

NUMPY, CUPY, TORCH, CAI = "numpy", "cupy", "torch", "cai"
_KINDS: dict[type, str | None] = {}


def torch_of(x):
    """The torch module when ``x`` is a torch tensor, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def cupy_of(x):
    """The CuPy module when ``x`` is a CuPy array, else None (never imports CuPy)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy
    return None


def kind(x) -> str | None:
    """What ``x`` is: ``TORCH`` (a tensor, CPU or CUDA), ``CUPY``, ``CAI`` (another object
    with ``__cuda_array_interface__``: a Numba device array), ``NUMPY``, or None; worked out
    once per type.

    >>> kind(np.zeros(2)), kind([0.0])
    ('numpy', None)
    """
    t = type(x)
    k = _KINDS.get(t, 0)
    if k == 0:
        k = _kind_of_type(t)
        if len(_KINDS) < 256:
            _KINDS[t] = k
    if k is None and hasattr(x, "__cuda_array_interface__"):  # set on the object, not its type
        return CAI
    return k


def _kind_of_type(t: type) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(t, torch.Tensor):
        return TORCH
    cupy = sys.modules.get("cupy")
    if cupy is not None and issubclass(t, cupy.ndarray):  # before NumPy: a stand-in subclasses it
        return CUPY
    if hasattr(t, "__cuda_array_interface__"):
        return CAI
    if issubclass(t, np.ndarray):
        return NUMPY
    return None


def is_device_array(x) -> bool:
    """True for CUDA memory: CuPy, Numba device arrays, CUDA torch tensors."""
    torch = torch_of(x)
    if torch is not None:
        return bool(x.is_cuda)
    return hasattr(x, "__cuda_array_interface__")


# -- identity and pointers: what a view of an array's memory depends on ----------------------------
# A device pointer names its device (CUDA's unified addresses), so CuPy and interface arrays
# need no device beside it; a torch tensor's pointer may be a host one, hence its device.

def _id_numpy(a):
    return (type(a), a.__array_interface__["data"][0], a.shape, a.strides, a.dtype,
            a.flags.writeable)


def _id_cupy(a):
    return (type(a), a.data.ptr, a.shape, a.strides, a.dtype)


def _id_torch(t):
    return (type(t), t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)


def _id_cai(a):
    cai = a.__cuda_array_interface__
    return (type(a), cai["data"][0], cai["shape"], cai["strides"], cai["typestr"])


_IDENTITY = {NUMPY: _id_numpy, CUPY: _id_cupy, TORCH: _id_torch, CAI: _id_cai, None: None}


def identity(x) -> tuple | None:
    """(type, address, shape, strides, dtype[, device or writability]) of an array: equal for
    two arrays over the same memory seen the same way, so a view made for one serves the
    other; None for an object that is no array.

    >>> x = np.zeros(4, np.uint16)
    >>> identity(x) == identity(x[:]), identity(x) == identity(x[:2]), identity(b"")
    (True, False, None)
    """
    f = _IDENTITY[_KINDS.get(type(x)) or kind(x)]  # kind(), without a call when known
    return None if f is None else f(x)


def address(a) -> int:
    """The first byte's address of a NumPy, CuPy or interface array (host or device).

    >>> x = np.zeros(8, np.uint16)
    >>> address(x[2:]) - address(x)
    4
    """
    if isinstance(a, np.ndarray):
        return int(a.__array_interface__["data"][0])
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    return int(a.__cuda_array_interface__["data"][0])


def cai_buffer(obj) -> tuple[int, int, np.dtype, tuple[int, ...]]:
    """(device pointer, byte length, dtype, shape) of a C-contiguous array read through its
    ``__cuda_array_interface__``; ValueError for a strided one."""
    desc = obj.__cuda_array_interface__
    dtype = np.dtype(desc["typestr"])
    shape = tuple(int(d) for d in desc["shape"])
    strides = desc.get("strides")
    if strides is not None:
        expect, step = [], dtype.itemsize
        for d in reversed(shape):
            expect.append(step)
            step *= d
        if tuple(strides) != tuple(reversed(expect)) and int(np.prod(shape)) > 1:
            raise ValueError("zipccl needs C-contiguous device arrays")
    return int(desc["data"][0]), int(np.prod(shape)) * dtype.itemsize, dtype, shape


def check_cuda_tensor(x) -> None:
    """A torch tensor device code can take: on a CUDA device and C-contiguous."""
    if not x.is_cuda:
        raise TypeError("a CPU torch tensor goes to the host codec, not the GPU one")
    if not x.is_contiguous():
        raise ValueError("zipccl needs C-contiguous device arrays")


def device_buffer(obj, other=None) -> tuple[int, int, int]:
    """(device pointer, byte length, itemsize) of a C-contiguous device array, cheaply: CuPy
    arrays and torch tensors through their own attributes (cheaper than the interface),
    anything else through ``__cuda_array_interface__``, or ``other(obj)`` where given."""
    k = _KINDS.get(type(obj)) or kind(obj)  # kind(), without a call when known
    if k == CUPY:
        if not obj.flags.c_contiguous:
            raise ValueError("zipccl needs C-contiguous device arrays")
        return obj.data.ptr, obj.nbytes, obj.itemsize
    if k == TORCH:
        check_cuda_tensor(obj)
        item = obj.element_size()
        return obj.data_ptr(), obj.numel() * item, item
    if other is not None:
        return other(obj)
    ptr, nbytes, dt, _ = cai_buffer(obj)
    return ptr, nbytes, dt.itemsize


# -- views: the same memory as another kind, no copy ----------------------------------------------

_CUPY_OF_TORCH = {"int16": np.int16, "float32": np.float32, "float16": np.float16, "uint8": np.uint8}


def cupy_view(t):
    """A 1-D CuPy array over the contiguous CUDA tensor ``t``'s memory (kept alive by it), made
    from its pointer for the types the collectives move (``cupy.asarray`` reads
    ``__cuda_array_interface__``, which costs tens of microseconds a call), else by CuPy."""
    import cupy

    dt = _CUPY_OF_TORCH.get(str(t.dtype)[6:])
    if dt is None:
        return cupy.asarray(t).reshape(-1)
    nbytes = t.numel() * t.element_size()
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), nbytes, t, t.device.index)
    return cupy.ndarray((t.numel(),), dt, cupy.cuda.MemoryPointer(mem, 0))


# (identity, what) -> a view that holds no owner: valid whenever an array of that identity
# is alive, which is what a caller passing one promises for as long as it uses the view.
_VIEWS: dict[tuple, object] = {}


def _cached(key, make):
    view = _VIEWS.get(key)
    if view is None:
        view = make()
        if len(_VIEWS) >= 256:
            try:  # the oldest; another thread may be changing the dict (compress is thread-safe)
                _VIEWS.pop(next(iter(_VIEWS)), None)
            except (RuntimeError, StopIteration):
                _VIEWS.clear()
        _VIEWS[key] = view
    return view


def unowned(a):
    """A 1-D NumPy or CuPy array ``a`` over the same memory without holding its owner (what a
    plan keeps, so that a cached call never keeps a freed buffer alive), cached by
    ``identity``. Valid only while a live array of that identity is passed again.

    >>> x = np.arange(4, dtype=np.uint16)
    >>> v = unowned(x); v[0] = 7; int(x[0]), v is unowned(x), v is unowned(x[:2])
    (7, True, False)
    """
    return _cached((identity(a), "unowned"), lambda: _unowned(a))


def _unowned(a):
    if kind(a) == NUMPY:
        if not a.nbytes:
            return np.empty(0, dtype=a.dtype)
        buf = (ctypes.c_char * int(a.nbytes)).from_address(address(a))
        return np.frombuffer(buf, dtype=a.dtype)
    cp = sys.modules["cupy"]
    mem = cp.cuda.UnownedMemory(int(a.data.ptr), int(a.nbytes), None, int(a.device.id))
    return cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(mem, 0))


def as_torch(arr, dtype: str | None = None):
    """A torch view (no copy) of a 1-D buffer: a tensor as it is, NumPy -> CPU tensor, CuPy
    (or any interface array) -> CUDA tensor, the latter cached by ``identity`` (reading the
    interface costs tens of microseconds) and holding no owner, so valid while ``arr`` is.
    uint16 becomes torch.int16; ``dtype="bfloat16"`` reads 16-bit values as torch.bfloat16.
    """
    torch = sys.modules["torch"]  # callers work on torch tensors: it is loaded
    k = NUMPY if isinstance(arr, np.ndarray) else (_KINDS.get(type(arr)) or kind(arr))
    if k == TORCH:
        t = arr
    elif k == NUMPY:
        a = arr.view(np.int16) if arr.dtype == np.uint16 else arr  # torch's widest 16-bit int
        t = torch.from_numpy(a)
    else:
        return _cached((identity(arr), "torch", dtype), lambda: _torch_device_view(arr, dtype))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


class _Interface:
    """A bare ``__cuda_array_interface__``: what a view made from it holds instead of an owner."""

    def __init__(self, desc: dict):
        self.__cuda_array_interface__ = desc


def _torch_device_view(arr, dtype: str | None):
    torch = sys.modules["torch"]
    ptr, nbytes, dt, shape = cai_buffer(arr)
    if dt == np.uint16:
        dt = np.dtype(np.int16)
    desc = {"shape": shape, "typestr": dt.str, "data": (ptr, False), "strides": None,
            "version": 3}
    dev = getattr(arr, "device", None)
    t = torch.as_tensor(_Interface(desc), device=torch.device("cuda", getattr(dev, "id", None)))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def empty_like(like, shape, dtype):
    """A new array of ``shape`` and NumPy ``dtype`` (``BF16`` included) on ``like``'s device, in
    its framework (torch or CuPy; CuPy has no bfloat16: its uint16 patterns)."""
    torch = torch_of(like)
    if torch is not None:
        dt = torch.bfloat16 if dtype == BF16 else getattr(torch, np.dtype(dtype).name)
        return torch.empty(shape, dtype=dt, device=like.device)
    cupy = cupy_of(like)
    if cupy is None:
        raise TypeError(f"a new array like a {type(like).__name__}: torch or CuPy only")
    dt = np.uint16 if dtype == BF16 else dtype
    if like.device.id == cupy.cuda.runtime.getDevice():
        return cupy.empty(shape, dtype=dt)
    with cupy.cuda.Device(like.device.id):
        return cupy.empty(shape, dtype=dt)


def current_stream(x):
    """The handle of the current stream of ``x``'s framework on its device (CuPy's, torch's),
    or None for other kinds."""
    k = kind(x)
    if k == CUPY:
        return sys.modules["cupy"].cuda.get_current_stream().ptr
    if k == TORCH:
        return sys.modules["torch"].cuda.current_stream(x.device).cuda_stream
    return None


def reshaped(x, shape: tuple[int, ...]):
    """``x`` seen with ``shape`` (a view: torch's ``view``, else ``reshape``)."""
    return x.view(shape) if kind(x) == TORCH else x.reshape(shape)


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
    torch = torch_of(x)
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
    torch = torch_of(x)
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
    name = fmt.DTYPE_NAMES[code]
    torch = torch_of(out)
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
    torch = torch_of(frame)
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
    torch = torch_of(like)
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
    torch = torch_of(x)
    if torch is not None:
        x = x.detach().float().cpu().numpy()
    return np.asarray(x).astype(BF16)
