"""Arguments in: what every ``Communicator`` collective does to its arguments first.

The Communicator's entry points take NumPy arrays (``ml_dtypes.bfloat16``, float32,
float16, or integer bit patterns with ``dtype=``), torch tensors, CuPy and Numba device
arrays. This module turns each argument into one ``Arr``: a flat view of the caller's
memory as the collectives take it (BF16 as uint16 bits, FP32 as float32, FP16 as
float16), whether it lives on a device, and its element type. It checks what every call
needs (dtype, contiguity, alignment, writability, sizes, counts) and raises TypeError /
ValueError naming the argument, before anything moves; the Communicator reports those in
the control row (``agreement``).

The plan key of a call (``call_key``) is its arguments' ``arrays.identity`` (address, shape,
strides, dtype, device), so that a call whose arguments were seen before is looked up instead
of normalised again (``plans``). What kind an argument is and its views as another kind come
from ``zipccl.arrays``, the one array-kind adapter.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .. import format as fmt
from ..arrays import _INT_NAMES, BF16, CAI, CUPY, NUMPY, TORCH, address, cupy_view, identity, kind
from ..arrays import unowned as unowned_view
from .transport import REDUCE_OPS, stream_ptr

# dtype= values: the element type integer bit patterns hold
DTYPE_ARGS = ("bfloat16", "bf16", "float32", "fp32", "float16", "fp16")
_NATIVE_CODES = {name: code for code, name in fmt.DTYPE_NAMES.items()}
_VIEW = {fmt.DTYPE_BF16: np.uint16, fmt.DTYPE_FP32: np.float32, fmt.DTYPE_FP16: np.float16}


@dataclass
class Arr:
    """One argument, normalised: a 1-D view of the caller's memory (BF16 as uint16 bits,
    FP32 as float32, FP16 as float16).

    >>> a = wrap(np.zeros(4, np.float32), None, "send")
    >>> a.code == fmt.DTYPE_FP32, a.device, a.nbytes
    (True, False, 16)
    """

    data: object  # numpy.ndarray or cupy.ndarray, 1-D, C-contiguous, shares the caller's memory
    device: bool
    code: int | None  # format.DTYPE_* of a type zipccl codes; None: any other (native only)
    dtype: str  # "bfloat16", "float32", "float16" or the NumPy dtype name
    torch: bool = False

    @property
    def bf16(self) -> bool:
        return self.code == fmt.DTYPE_BF16

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def _want(dtype) -> int | None:
    """The element type ``dtype=`` asks 16- or 32-bit integers to be read as (None: none)."""
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype in DTYPE_ARGS:
        return fmt.dtype_code(dtype)
    raise TypeError(f"dtype= names the element type of integer bit patterns: one of "
                    f"{', '.join(map(repr, DTYPE_ARGS))}; got {dtype!r}")


def _typed(arr, name: str, want: int | None, role: str):
    """(1-D view as the collectives take it, element code or None, dtype name) of a flat array
    whose dtype is called ``name``: BF16 as uint16 bits, FP32 as float32, FP16 as float16."""
    if want is None:
        code = _NATIVE_CODES.get(name)
        if code is None:
            return arr, None, name
    else:
        code = want
        if name != fmt.DTYPE_NAMES[want] and name not in _INT_NAMES[fmt.ITEMSIZE[want]]:
            raise TypeError(f"{role}: dtype={fmt.DTYPE_NAMES[want]!r} needs a "
                            f"{8 * fmt.ITEMSIZE[want]}-bit array, got {name}")
    return arr.view(_VIEW[code]), code, fmt.DTYPE_NAMES[code]


def wrap(x, dtype: str | None, role: str, *, writable: bool = False) -> Arr:
    """Normalise one argument; raises TypeError / ValueError naming ``role`` and the problem.

    >>> wrap(np.zeros(2, np.uint16), "bfloat16", "send").dtype
    'bfloat16'
    >>> wrap(np.zeros(2, np.float64), "bfloat16", "recv")
    Traceback (most recent call last):
    TypeError: recv: dtype='bfloat16' needs a 16-bit array, got float64
    """
    want = _want(dtype)
    k = kind(x)
    if k == TORCH:
        torch = sys.modules["torch"]
        if not x.is_contiguous():
            raise ValueError(f"{role} is a non-contiguous torch tensor; pass .contiguous()")
        t = x.detach()
        name = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        elif want is not None and t.dtype == torch.uint16:
            t = t.view(torch.int16)  # NumPy has uint16; torch.uint16 may not convert
        if t.is_cuda:
            arr = cupy_view(t)
        else:
            arr = t.numpy().reshape(-1)
        if name == "bfloat16":
            arr = arr.view(np.uint16)
        flat, code, name = _typed(arr, name, want, role)
        return Arr(flat, bool(t.is_cuda), code, name, torch=True)
    if k in (CUPY, CAI):
        try:
            import cupy
        except ImportError as e:
            raise TypeError(f"{role} is a CUDA array; zipccl needs CuPy to move device arrays") from e
        arr = x if type(x) is cupy.ndarray else cupy.asarray(x)
        if not arr.flags.c_contiguous:
            raise ValueError(f"{role} is a non-contiguous device array")
        if arr.data.ptr % max(arr.itemsize, 1):
            raise ValueError(f"{role} is misaligned for its {arr.dtype} elements")
        device = True
    elif k == NUMPY:
        arr = x
        if not arr.flags.c_contiguous:
            raise ValueError(f"{role} is a non-contiguous array (strides {arr.strides}); "
                             f"pass np.ascontiguousarray(...)")
        if not arr.flags.aligned:
            raise ValueError(f"{role} is misaligned for its {arr.dtype} elements")
        if writable and not arr.flags.writeable:
            raise ValueError(f"{role} is read-only")
        device = False
    else:
        raise TypeError(f"{role} must be a NumPy, CuPy, Numba device or torch array, "
                        f"got {type(x).__name__}")
    name = np.dtype(arr.dtype).name if arr.dtype != BF16 else "bfloat16"
    flat = arr.reshape(-1)
    if name == "bfloat16":
        flat = flat.view(np.uint16)
    flat, code, name = _typed(flat, name, want, role)
    return Arr(flat, device, code, name)


def unowned(a: Arr) -> Arr:
    """``a`` over the same memory without holding its owner (a torch tensor, a caller's array):
    what a plan keeps, so that a cached call never keeps a freed buffer alive. Valid only while
    a live array of the same address, size and type is passed again (the plan key's promise)."""
    return Arr(unowned_view(a.data), a.device, a.code, a.dtype, a.torch)


def check_pair(send: Arr, recv: Arr) -> None:
    """``send`` and ``recv`` of one call: both host or both device arrays, of one dtype."""
    if send.device != recv.device:
        raise TypeError("send and recv must both be host arrays or both device arrays")
    if send.dtype != recv.dtype:
        raise TypeError(f"send is {send.dtype} but recv is {recv.dtype}")


def check_sizes(mismatch: str | None) -> None:
    """Raise ValueError with a collective's ``mismatch`` of sizes (None: the sizes fit)."""
    if mismatch is not None:
        raise ValueError(mismatch)


def as_count(value, what: str) -> int:
    """One element count as a Python int: a Python int or a NumPy integer, nothing else.

    A bool, a float (even ``2.0``), a string or any other object raises TypeError instead
    of being truncated or parsed; a negative count raises ValueError.

    >>> as_count(np.int64(3), "count")
    3
    >>> as_count(2.5, "send_counts[0]")
    Traceback (most recent call last):
    TypeError: send_counts[0] must be an integer (a Python int or a NumPy integer), got float 2.5
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer (a Python int or a NumPy integer), "
                        f"got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    return int(value)


def check_counts(counts, p: int, what: str) -> list[int]:
    """Per-peer counts as ``p`` non-negative Python ints: the one check of count lists for
    every front end (the Communicator's all-to-all counts, torch's split sizes).

    ``counts`` is a sequence (list, tuple, 1-D NumPy array) of Python ints or NumPy
    integers; floats, strings and bools are refused (TypeError), never rounded or parsed.

    >>> check_counts(np.array([3, 0]), 2, "send_counts")
    [3, 0]
    >>> check_counts(["1000", "1000"], 2, "send_counts")
    Traceback (most recent call last):
    TypeError: send_counts[0] must be an integer (a Python int or a NumPy integer), got str '1000'
    """
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__"):
        raise TypeError(f"{what} must be a sequence of {p} integers, got "
                        f"{type(counts).__name__} {counts!r}")
    if isinstance(counts, np.ndarray) and counts.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got an array of shape {counts.shape}")
    vals = [as_count(c, f"{what}[{i}]") for i, c in enumerate(counts)]
    if len(vals) != p:
        raise ValueError(f"{what} has {len(vals)} entries; {p} ranks need one each")
    return vals


def reduction_of(a: Arr, op: str) -> str:
    """``op`` checked for the Communicator: one of ``REDUCE_OPS`` or "avg" (the stated sum, then
    one division: BF16, FP32 and FP16 only). BF16's other reductions are NCCL's own (MPI has
    none: the Communicator refuses them there, ``no_bf16_reduction``)."""
    if op not in REDUCE_OPS and op != "avg":
        raise ValueError(f"op must be one of {REDUCE_OPS + ('avg',)}, got {op!r}")
    if op == "avg" and a.code is None:
        raise ValueError(f"op='avg' takes BF16, FP32 or FP16 arrays, got {a.dtype}")
    return op


def no_bf16_reduction(op: str, transport: str) -> str:
    """The error of a BF16 reduction zipccl does not compute on a transport without its own."""
    return (f"BF16 op={op!r} over {transport}: MPI has no BF16 {op}; zipccl computes 'sum' and "
            f"'avg' itself, and BF16 {op} needs a transport with its own (NCCL)")


# -- memory -----------------------------------------------------------------------------------

def ptr_range(a) -> tuple[int, int]:
    """[first, last + 1) byte address of a 1-D NumPy or CuPy array."""
    p = int(a.__array_interface__["data"][0]) if isinstance(a, np.ndarray) else address(a)
    return p, p + a.nbytes


def overlap(a, b) -> bool:
    """Whether two non-empty 1-D arrays share memory.

    >>> x = np.zeros(8, np.uint16)
    >>> overlap(x[:4], x[3:]), overlap(x[:4], x[4:]), overlap(x[:0], x)
    (True, False, False)
    """
    (a0, a1), (b0, b1) = ptr_range(a), ptr_range(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def byte_view(a):
    """A uint8 view of a 1-D array of either kind (NumPy or CuPy)."""
    return a.view(np.uint8) if isinstance(a, np.ndarray) else a.view("uint8")


# -- streams ------------------------------------------------------------------------------------

def call_stream(arr: Arr, stream):
    """The stream a call on ``arr`` runs on, as the transports take it: None for host arrays,
    the current torch stream's handle for a torch tensor passed without one."""
    if not arr.device:
        return None
    if stream is None and arr.torch:
        import torch

        return torch.cuda.current_stream().cuda_stream
    return stream


def stream_handle(stream, torch: bool) -> int:
    """The raw handle of the stream a device call runs on (None: the current one)."""
    if stream is None:
        if torch:
            return sys.modules["torch"].cuda.current_stream().cuda_stream
        return sys.modules["cupy"].cuda.get_current_stream().ptr
    return stream_ptr(stream)


# -- plan keys: the arrays' identity ---------------------------------------------------------------


def call_key(op: str, a, b, dtype, stream, extra=None):
    """(plan key, stream handle) of a call: the arrays' identity and the resolved stream.

    The key is None for arguments zipccl cannot read cheaply (the call then takes the
    checked path, which names the problem). ``b`` is None for in-place calls.

    >>> x = np.zeros(4, np.float32)
    >>> call_key("all_reduce", x, None, None, None)[0] == call_key("all_reduce", x, None, None, None)[0]
    True
    >>> call_key("all_reduce", [0.0], None, None, None)
    (None, None)
    """
    ka = identity(a)
    kb = None if b is None else identity(b)
    if ka is None or (kb is None and b is not None):
        return None, stream
    k = kind(a)
    st = None
    if k in (CUPY, CAI) or (k == TORCH and ka[-1].type == "cuda"):
        try:
            st = stream_handle(stream, k == TORCH)
        except (TypeError, AttributeError):
            return None, stream
    return (op, ka, kb, dtype, st, extra), st
