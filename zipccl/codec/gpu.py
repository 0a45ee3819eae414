"""GPU codec: host-side orchestration of the CUDA kernels in ``zipccl.kernels``.

Same frames as ``codec.reference`` (byte for byte), for data that lives on a
GPU: CuPy arrays, Numba device arrays and CUDA torch tensors (through
``__cuda_array_interface__``; torch bfloat16 is viewed as int16). Work is
enqueued on the caller's stream; nothing is copied to the host except where
marked below.

Two levels:

``encode_into(bits, out, codebook, stream=None, checksum=False, shape=None, workspace=None)``
    The no-synchronisation entry for collectives. ``bits``: n BF16 values
    (uint16 / int16 / torch bfloat16, C-contiguous, 16-byte aligned); ``out``: a
    uint8 device buffer of at least ``format.max_compressed_size(n)`` bytes,
    16-byte aligned. Two kernel launches write the complete frame at the start
    of ``out``; its length is header bytes 24..31 (int64 LE, ``Header.frame_len``)
    and the escape count bytes 16..23, readable on the device; the first
    ``format.static_size(n)`` bytes have a size known from n alone (if the frame
    is not RAW). Nothing is allocated when ``workspace`` is given.
``decode_into(frame, out, stream=None, workspace=None)``
    The no-synchronisation decoder: ``frame`` a uint8 device buffer holding a
    frame at its start (it may be longer than the frame), ``out`` n values
    (uint16 / int16 / torch bfloat16), where n must match the frame. Never
    writes outside ``out``. A bad frame sets error bits in the workspace
    instead of raising: ``workspace.last_error()`` (a synchronisation) returns
    them, ``Workspace.describe(bits)`` explains them; ``out`` is then undefined.
``Workspace(max_elements)``
    Device scratch (8 bytes per 4096 values + 256 bytes) for the scan and the
    counters. One workspace serves any number of calls *in stream order*; two
    streams running at once need two workspaces. Calls that pass none use one
    cached per (device, stream), grown on demand (growing allocates).

``compress`` / ``decompress`` (what ``zipccl.compress`` / ``zipccl.decompress``
call for device arrays) add conveniences that synchronise: ``compress`` chooses
the default codebook on the device (``kernels/stats.choose_codebook``: the host's
``Codebook.from_sample`` of the same sample, bit for bit) and reads the 8-byte
frame length back to return an exact-length view of the frame: one
synchronisation; ``decompress`` decodes at once (into ``out=``, or into an array sized
from the header last seen on the frame buffer or stream), then reads the 128-byte
header and the error bits together, validates the header on the host and raises
ValueError for a corrupted frame: one synchronisation, two when the header differs
from that guess (the output is then sized from it and the frame decoded again).
Collectives use the ``*_into`` functions.

FP32 and FP16: ``encode_into`` / ``decode_into`` take float32 (or 32-bit integer)
and float16 arrays (or 16-bit integers with ``dtype="float16"``) through the same
plans and workspaces (``kernels/encode_launch.py``'s ``WidePlan`` / ``kernels/decode_fp16.py``): FP32
runs the BF16 tile kernels' FP32 builds, FP16 the encoder's FP16 build and a decoder on the BF16
decoder's tile structure.
``compress`` chooses the FP32 codebook on the device, as for BF16 (the choice kernel on the upper
halves); the FP16 codebook comes from the strided sample, gathered on the device and read back
(one synchronisation more).

Launching: on a GPU every kernel is launched from a *plan* (``kernels/launch.py``:
compiled once per signature and device, parameters packed once, one
``cuLaunchKernel`` each), cached by sizes, workspace, codebook and flags and
pointed at each call's buffers; a steady-state ``encode_into`` costs about 12 µs
of host time on an H200 machine. Under Numba's CUDA simulator the same kernels
are called through Numba's dispatcher (``_*_numba``) by default; inside
``plans_under_simulator()`` the simulator takes the GPU's route instead (plans, packed
parameters, ``retarget``), with ``kernels/simlaunch.py`` standing in for the driver's
launch, so that route is tested without a GPU too.
"""

from __future__ import annotations

import sys
import zlib
from contextlib import contextmanager
from functools import lru_cache

import numpy as np

from .. import format as fmt
from ..codebook import SAMPLE_SIZE, Codebook
from ..format import errors

_ALIGN = 16


_MODULES: list = []


def _kernels():
    """(_common, encode_launch, decode, runtime, stats): zipccl.kernels imports numba.cuda, so only
    when a GPU codec call happens (imported once; later calls are a list lookup)."""
    if not _MODULES:
        from ..kernels import _common, decode, encode_launch, launch, runtime, stats
        _MODULES.extend(((_common, encode_launch, decode, runtime, stats), launch))
    return _MODULES[0]


_WIDE: list = []


def _wide():
    """(encode_launch, decode_fp16): the modules of FP32 / FP16 frames, imported on the first call."""
    if not _WIDE:
        _kernels()
        from ..kernels import decode_fp16, encode_launch
        _WIDE.extend((encode_launch, decode_fp16))
    return _WIDE


def _launch():
    if not _MODULES:
        _kernels()
    return _MODULES[1]


#: Under the simulator: whether encode_into / decode_into / encode_chosen_into take the plan
#: route (``plans_under_simulator``) rather than Numba's dispatcher. One element, so that
#: tests can switch it without rebinding a module global.
_SIM_PLANS = [False]


@contextmanager
def plans_under_simulator():
    """Under Numba's CUDA simulator, run the codec's ``*_into`` calls through the GPU's plan
    route (``kernels/simlaunch.py`` stands in for the launch) while the block runs; on a GPU
    that route is the only one and this changes nothing.

    >>> with plans_under_simulator():  # doctest: +SKIP
    ...     encode_into(x, out, codebook)
    """
    before = _SIM_PLANS[0]
    _SIM_PLANS[0] = True
    try:
        yield
    finally:
        _SIM_PLANS[0] = before


def _dispatcher_route() -> bool:
    """True where the kernels go through Numba's dispatcher: the simulator, unless
    ``plans_under_simulator`` is on."""
    return _kernels()[3].SIMULATOR and not _SIM_PLANS[0]


def _device_pointer(array) -> int:
    """Device pointer of a Numba device array (under the simulator: its host address)."""
    if _kernels()[3].SIMULATOR:
        from ..kernels import simlaunch
        return simlaunch.device_pointer(array)
    return _launch().device_pointer(array)


_SIM_TABLES: dict[str, object] = {}


def _kept(name: str, make):
    """``make()``: a table on the device; under the simulator made once and kept for good (a
    plan holds its address, and the simulator's tables are fresh copies on every call)."""
    if not _kernels()[3].SIMULATOR:
        return make()
    if name not in _SIM_TABLES:
        _SIM_TABLES[name] = make()
    return _SIM_TABLES[name]


def _crc_table():
    """The header CRC table on the device (``runtime.crc_table``)."""
    return _kept("crc", _kernels()[3].crc_table)


def _codebook_tables():
    """``runtime.codebook_tables()``: the tables of ``stats.choose_codebook``."""
    return _kept("codebook", _kernels()[3].codebook_tables)


def _common_slots() -> int:
    """The workspace words before its status words (counters and chunk slots)."""
    return _kernels()[0].WS_STATUS


def _torch_of(x):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def _cupy_of(x):
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy
    return None


def _bits_view(x, dtype: str | None):
    """(object exposing the interface as 16-bit integers, shape). Raises TypeError for non-BF16."""
    torch = _torch_of(x)
    if torch is not None:
        _check_cuda_tensor(x)
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16), tuple(x.shape)
        if x.dtype in (torch.int16, torch.uint16) and dtype in ("bfloat16", "bf16"):
            return x, tuple(x.shape)
        raise TypeError(f"zipccl compresses BF16 tensors; got a torch tensor of dtype {x.dtype}"
                        + (" (pass dtype=\"bfloat16\" to read 16-bit integers as BF16)"
                           if x.dtype in (torch.int16, torch.uint16) else ""))
    cupy = _cupy_of(x)
    if cupy is not None:
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
    torch = _torch_of(x)
    if torch is not None:
        return str(x.dtype)
    cupy = _cupy_of(x)
    if cupy is not None:
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
            _check_cuda_tensor(x)
            return (x.view(as_torch) if as_torch is not x.dtype else x), tuple(x.shape), code
        return x, tuple(x.shape), code
    xb, shape, code = _typed_view_checked(x, dtype)
    if key[1] is not None and len(_TYPED) < 256:
        torch = _torch_of(x)
        _TYPED[key] = (code, xb.dtype if torch is not None else None)
    return xb, shape, code


def _typed_view_checked(x, dtype: str | None):
    """``_typed_view`` the long way: every name check, every message."""
    name = _dtype_name(x)
    short = name.replace("torch.", "")
    if short not in ("float32", "float16") and dtype in (None, "bfloat16", "bf16"):
        xb, shape = _bits_view(x, dtype)
        return xb, shape, fmt.DTYPE_BF16
    from ..arrays import value_type

    code = value_type(name, dtype, "device array")
    if code == fmt.DTYPE_BF16:
        xb, shape = _bits_view(x, dtype)
        return xb, shape, code
    torch = _torch_of(x)
    if torch is not None:
        _check_cuda_tensor(x)
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
    torch = _torch_of(obj)
    if torch is not None and obj.dtype == torch.bfloat16:
        obj = obj.view(torch.int16)
    return obj, _values(obj)[1]


def _u8(obj):
    """(object, nbytes) of a frame buffer: ``_frame_buffer``'s checks, keeping the object."""
    return obj, _frame_buffer(obj)[1]


def _check_cuda_tensor(x) -> None:
    """A torch tensor the GPU codec can take: on a CUDA device and C-contiguous."""
    if not x.is_cuda:
        raise TypeError("a CPU torch tensor goes to the host codec, not the GPU one")
    if not x.is_contiguous():
        raise ValueError("zipccl needs C-contiguous device arrays")


def _raw(obj) -> tuple[int, int, int]:
    """(device pointer, byte length, itemsize) of a C-contiguous device array, cheaply.

    CuPy arrays and torch tensors are read through their own attributes (a few
    hundred nanoseconds); anything else through ``__cuda_array_interface__``.
    """
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(obj) is cupy.ndarray:
        if not obj.flags.c_contiguous:
            raise ValueError("zipccl needs C-contiguous device arrays")
        return obj.data.ptr, obj.nbytes, obj.itemsize
    torch = _torch_of(obj)
    if torch is not None:
        _check_cuda_tensor(obj)
        item = obj.element_size()
        return obj.data_ptr(), obj.numel() * item, item
    ptr, nbytes, dt, _ = _kernels()[3].interface(obj)
    return ptr, nbytes, dt.itemsize


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


class Workspace:
    """Device scratch for the look-back scan and the counters of a sequence of calls.

    >>> ws = Workspace(1 << 20)  # needs a GPU  # doctest: +SKIP
    """

    def __init__(self, max_elements: int):
        runtime = _kernels()[3]
        self.max_blocks = max(1, -(-int(max_elements) // fmt.BLOCK))
        self.array = runtime.new_workspace_array(self.max_blocks)
        self.device = runtime.current_device_id()
        self.count = _common_slots() + self.max_blocks
        self.ptr = _device_pointer(self.array)

    def fits(self, n: int) -> bool:
        return -(-int(n) // fmt.BLOCK) <= self.max_blocks

    def _slots(self, stream=None) -> np.ndarray:
        """The counter slots, on the host (waits for ``stream``: a synchronisation)."""
        _common, _, _, runtime, _ = _kernels()
        if runtime.SIMULATOR:
            return runtime.to_host(self.array, _common.WS_SLOTS, runtime.stream(stream))
        raw = _launch().pinned().read(self.ptr, 8 * _common.WS_SLOTS, _stream_key(stream))
        return raw.view(np.int64).copy()

    def sticky_error(self, stream=None) -> int:
        """OR of the error bits of every decode on this workspace since it was made. Synchronises."""
        return int(self._slots(stream)[_kernels()[0].WS_ERR_STICKY])

    def last_error(self, stream=None) -> int:
        """Error bits of the last decode on this workspace (0 = valid). Synchronises."""
        return int(self._slots(stream)[_kernels()[0].WS_ERR_LAST])

    def last_frame_len(self, stream=None) -> int:
        """Length of the last frame encoded with this workspace. Synchronises."""
        return int(self._slots(stream)[_kernels()[0].WS_FLEN])

    @staticmethod
    def describe(bits: int) -> str:
        """The error bits of ``last_error`` in words."""
        return errors.describe(bits, errors.FRAME_ERRORS)


_WORKSPACES: dict[tuple[int, int], Workspace] = {}


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


def default_workspace(stream, n: int) -> Workspace:
    """The cached workspace of (current device, stream), grown to hold n values."""
    runtime = _kernels()[3]
    device = runtime.current_device_id() if runtime.SIMULATOR else _launch().current_device()
    key = (device, _stream_key(stream))
    ws = _WORKSPACES.get(key)
    if ws is None or not ws.fits(n):
        ws = _WORKSPACES[key] = Workspace(max(n, fmt.BLOCK * 256))
    return ws


@lru_cache(maxsize=512)
def _template(n: int, shape: tuple[int, ...], exponents: tuple[int, ...] | None,
              dtype: int = fmt.DTYPE_BF16):
    """(16 header words with n_escapes, frame_len, checksum, flags and CRC left 0, CRC-32 of
    its first 124 bytes, codebook as int). ``exponents=None``: the codebook is chosen on
    the device; its bytes are left 0 here (the encoder fills them in and in the CRC) and
    the codebook int is -1, which tells the encoder to read it from the workspace."""
    h = fmt.Header(n=n, n_escapes=0, frame_len=0, flags=0,
                   codebook=tuple(range(fmt.CODEBOOK_SIZE)) if exponents is None else exponents,
                   shape=shape, dtype=dtype)
    raw = bytearray(h.pack())
    raw[fmt.HEADER_SIZE - 4:] = bytes(4)
    cb64 = -1
    if exponents is None:
        at = _CODEBOOK_AT
        raw[at:at + fmt.CODEBOOK_SIZE] = bytes(fmt.CODEBOOK_SIZE)
    else:
        cb64 = int.from_bytes(bytes(exponents), "little")
    words = tuple(int(w) for w in np.frombuffer(bytes(raw), dtype="<i8"))
    return words, zlib.crc32(bytes(raw[:fmt.HEADER_SIZE - 4])), cb64


_CODEBOOK_AT = fmt.CODEBOOK_AT
_FRAME_LEN_AT = fmt.FRAME_LEN_AT


# Plans of the lean launch route, keyed by what a launch's grid and parameters depend on
# besides the buffers' addresses (sizes, workspace and so device, codebook, flags, shape): a call
# retargets the plan at its buffers (a few slot writes) and launches it. A plan holds its
# workspace, so a workspace's memory is never reused while a plan points at it. Plans are
# shared by every caller of the same key: a call retargets and launches without yielding,
# so calls from one thread at a time (or on different workspaces) never see each other's
# pointers.
_PLANS: dict[tuple, object] = {}
_MAX_PLANS = 4096


def _remember(key: tuple, plan):
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _check_workspace(ws: Workspace, n: int, lay: fmt.Layout) -> None:
    if not ws.fits(n):
        raise ValueError(f"workspace holds {ws.max_blocks} blocks; {n} values need {lay.n_blocks}")


def encode_into(bits, out, codebook: Codebook, stream=None, checksum: bool = False,
                shape: tuple[int, ...] | None = None, workspace: Workspace | None = None,
                dtype: str | None = None) -> None:
    """Write the frame of ``bits`` (n BF16, FP32 or FP16 values on the device) at the start
    of ``out``.

    No synchronisation, no allocation when ``workspace`` is given. See the module
    docstring for the buffer rules and where the frame length is; ``out`` holds at least
    ``format.max_compressed_size(n, dtype)`` bytes. The element type follows the array's
    dtype (``element_code``; ``dtype="float16"`` reads 16-bit integers as FP16). The first
    call with a new (size, workspace, codebook, flags) builds its plan (checks, packed
    kernel parameters); later calls only point it at their buffers and launch.
    """
    if type(codebook) is not Codebook and not isinstance(codebook, Codebook):
        raise TypeError(f"codebook must be a zipccl.Codebook, got {type(codebook).__name__}")
    if dtype is not None or _torch_of(bits) is None or bits.dtype != _torch_of(bits).bfloat16:
        code = element_code(bits, dtype)
        if code != fmt.DTYPE_BF16:
            return _encode_wide_into(bits, out, codebook, stream, checksum, shape, workspace, code)
    if _dispatcher_route():
        return _encode_into_numba(bits, out, codebook.exponents, stream, checksum, shape, workspace)
    x_ptr, n = _values(bits)
    o_ptr, nbytes = _frame_buffer(out)
    s = _stream_key(stream)
    ws = workspace if workspace is not None else default_workspace(s, n)
    _encode(x_ptr, n, o_ptr, nbytes, codebook.exponents, s, checksum, shape, ws)


def encode_chosen_into(bits, out, stream=None, checksum: bool = False,
                       shape: tuple[int, ...] | None = None, workspace: Workspace | None = None,
                       dtype: str | None = None) -> None:
    """``encode_into`` with the default codebook chosen on the device from ``bits`` itself
    (``kernels/stats.choose_codebook``, the same codebook ``compress`` picks): the choice
    kernel, then the encoder, on ``stream``. No synchronisation, no host sample: the
    collectives' entry, one fresh codebook per frame. BF16 and FP32 (FP16's choice runs on
    the host: ValueError)."""
    code = element_code(bits, dtype)
    xb = bits
    if code == fmt.DTYPE_FP16:
        raise ValueError("the device codebook choice covers BF16 and FP32; FP16 needs a codebook")
    if _dispatcher_route():
        if code == fmt.DTYPE_BF16:
            xb, n = _u16(xb)
        else:
            n = _wide_values(xb, code)[1]
        ws = workspace if workspace is not None else default_workspace(stream, n)
        _choose_on_device(xb, n, ws, stream, code)
        if code == fmt.DTYPE_BF16:
            return _encode_into_numba(xb, out, None, stream, checksum, shape, ws)
        return _encode_wide_numba(xb, out, None, stream, checksum, shape, ws, code)
    bf16 = code == fmt.DTYPE_BF16
    x_ptr, n = _values(xb) if bf16 else _wide_values(xb, code)
    o_ptr, nbytes = _frame_buffer(out)
    s = _stream_key(stream)
    ws = workspace if workspace is not None else default_workspace(s, n)
    if bf16:
        _choose(x_ptr, n, ws, s)
        _encode(x_ptr, n, o_ptr, nbytes, None, s, checksum, shape, ws)
    else:  # FP32: the upper half of value i is uint16 2i + 1
        _choose(x_ptr + 2, n, ws, s, step=2)
        _encode_wide(x_ptr, n, o_ptr, nbytes, None, s, checksum, shape, ws, code)


def _encode(x_ptr: int, n: int, o_ptr: int, nbytes: int, exponents: tuple[int, ...] | None,
            s: int, checksum: bool, shape, ws: Workspace) -> None:
    """Launch the encoder's plan on stream handle ``s``; ``exponents=None``: the codebook
    that ``stats.choose_codebook`` left in the workspace."""
    device = ws.device  # the workspace's device is the call's (a workspace serves one device)
    key = (0, n, nbytes, ws.ptr, exponents, bool(checksum), shape)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember(key, _encode_plan(device, x_ptr, n, o_ptr, nbytes, ws, exponents, checksum,
                                           shape))
    plan.retarget(x_ptr, o_ptr)
    plan.launch(s)


def _encode_plan(device, x_ptr, n, o_ptr, nbytes, ws, exponents, checksum, shape):
    _common, encode, _, runtime, _ = _kernels()
    lay = fmt.Layout.for_count(n)
    if nbytes < lay.raw_size:
        raise ValueError(f"out holds {nbytes} bytes; a frame of {n} values may need "
                         f"{lay.raw_size} (max_compressed_size)")
    _check_workspace(ws, n, lay)
    shape = (n,) if shape is None else tuple(int(d) for d in shape)
    hdr, crc_base, cb64 = _template(n, shape, exponents)
    crc = _crc_table()
    plan = encode.Plan(device, x_ptr, o_ptr, nbytes, ws.ptr, ws.count, lay, hdr, crc_base,
                       _device_pointer(crc), crc.size, cb64, checksum)
    plan.workspace = ws
    return plan


def _encode_into_numba(bits, out, exponents, stream, checksum, shape, workspace) -> None:
    """``encode_into`` through Numba's dispatcher (the CUDA simulator's route)."""
    _common, encode, _, runtime, _ = _kernels()
    xb, n = _u16(bits)
    ob, nbytes = _u8(out)
    lay = fmt.Layout.for_count(n)
    if nbytes < lay.raw_size:
        raise ValueError(f"out holds {nbytes} bytes; a frame of {n} values may need "
                         f"{lay.raw_size} (max_compressed_size)")
    shape = (n,) if shape is None else tuple(int(d) for d in shape)
    hdr, crc_base, cb64 = _template(n, shape, exponents)
    ws = workspace if workspace is not None else default_workspace(stream, n)
    _check_workspace(ws, n, lay)
    s = runtime.stream(stream)
    encode.launch(runtime.view(xb, (n & ~7) // 2, np.uint32),
                  runtime.view(xb, n, np.uint16), runtime.view(ob, nbytes, np.uint8),
                  runtime.view(ob, nbytes // 4, np.uint32), runtime.view(ob, nbytes // 8, np.int64),
                  ws.array, lay, hdr, crc_base, runtime.crc_table(), cb64, checksum, s)


def decode_into(frame, out, stream=None, workspace: Workspace | None = None,
                dtype: str | None = None) -> None:
    """Decode the frame at the start of ``frame`` into ``out`` (n BF16, FP32 or FP16 values
    on the device, the frame's type: ``element_code`` of ``out``).

    No synchronisation; errors go to the workspace (``Workspace.last_error``), a frame
    of another element type included. Plans are cached as in ``encode_into``.
    """
    if dtype is not None or _torch_of(out) is None or out.dtype != _torch_of(out).bfloat16:
        code = element_code(out, dtype)
        if code != fmt.DTYPE_BF16:
            return _decode_wide_into(frame, out, stream, workspace, code)
    if _dispatcher_route():
        return _decode_into_numba(frame, out, stream, workspace)
    f_ptr, nbytes = _frame_buffer(frame)
    o_ptr, n = _values(out)
    s = _stream_key(stream)
    ws = workspace if workspace is not None else default_workspace(s, n)
    _decode(f_ptr, nbytes, o_ptr, n, s, ws)


def _decode(f_ptr: int, nbytes: int, o_ptr: int, n: int, s: int, ws: Workspace) -> None:
    device = ws.device
    key = (1, nbytes, n, ws.ptr)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember(key, _decode_plan(device, f_ptr, nbytes, o_ptr, n, ws))
    plan.retarget(f_ptr, o_ptr)
    plan.launch(s)


def _check_frame_bytes(nbytes: int) -> None:
    if nbytes < fmt.HEADER_SIZE:
        raise ValueError(f"not a zipccl frame: {nbytes} bytes is shorter than the "
                         f"{fmt.HEADER_SIZE}-byte header")


def _decode_plan(device, f_ptr, nbytes, o_ptr, n, ws):
    _common, _, decode, runtime, _ = _kernels()
    _check_frame_bytes(nbytes)
    lay = fmt.Layout.for_count(n)
    _check_workspace(ws, n, lay)
    crc = _crc_table()
    plan = decode.Plan(device, f_ptr, nbytes, o_ptr, lay, ws.ptr, ws.count, _common.CRC_ZERO,
                       _device_pointer(crc), crc.size)
    plan.workspace = ws
    return plan


def _decode_into_numba(frame, out, stream, workspace) -> None:
    """``decode_into`` through Numba's dispatcher (the CUDA simulator's route)."""
    _common, _, decode, runtime, _ = _kernels()
    fb, nbytes = _u8(frame)
    ob, n = _u16(out)
    _check_frame_bytes(nbytes)
    lay = fmt.Layout.for_count(n)
    ws = workspace if workspace is not None else default_workspace(stream, n)
    _check_workspace(ws, n, lay)
    s = runtime.stream(stream)
    decode.launch(runtime.view(fb, nbytes, np.uint8), runtime.view(fb, nbytes // 4, np.uint32),
                  runtime.view(fb, nbytes // 8, np.int64),
                  runtime.view(ob, (n & ~7) // 2, np.uint32),
                  runtime.view(ob, n, np.uint16), ws.array, lay, _common.CRC_ZERO,
                  runtime.crc_table(), s)


# ---------------------------------------------------------------- FP32 and FP16


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
    plan.retarget(x_ptr, o_ptr)
    plan.launch(s)


def _encode_wide_numba(bits, out, exponents, stream, checksum, shape, workspace, code) -> None:
    """``encode_into`` of FP32 / FP16 through Numba's dispatcher (the simulator's route)."""
    runtime = _kernels()[3]
    _wide_values(bits, code)  # the checks
    xb = bits.view(_torch_of(bits).int32 if code == fmt.DTYPE_FP32 else _torch_of(bits).int16) \
        if _torch_of(bits) is not None else bits
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
    key = (4, code, nbytes, n, ws.ptr)
    plan = _PLANS.get(key)
    if plan is None:
        _check_frame_bytes(nbytes)
        lay = fmt.Layout.for_count(n, code)
        _check_workspace(ws, n, lay)
        _common = _kernels()[0]
        crc = _crc_table()
        plan = _wide()[1].Plan(ws.device, f_ptr, nbytes, o_ptr, lay, ws.ptr, ws.count, _common.CRC_ZERO,
                               _device_pointer(crc), crc.size)
        plan.workspace = ws
        plan = _remember(key, plan)
    plan.retarget(f_ptr, o_ptr)
    plan.launch(s)


def _decode_wide_numba(frame, out, stream, workspace, code) -> None:
    """``decode_into`` of FP32 / FP16 through Numba's dispatcher (the simulator's route)."""
    _common, _, _, runtime, _ = _kernels()
    fb, nbytes = _u8(frame)
    _, n = _wide_values(out, code)
    torch = _torch_of(out)
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


def _wide_sample(xb, n: int, code: int, samples: int, stream) -> np.ndarray:
    """The strided sample ``codebook.choose_codebook`` reads, gathered on the device and read
    back (a synchronisation): FP16 values, or the upper halves of FP32 values."""
    from ..codebook import sample_stride

    _, _, _, runtime, stats = _kernels()
    if n == 0:
        return np.zeros(0, np.uint16)
    stride = sample_stride(n, samples)
    count = min(samples, (n + stride - 1) // stride)
    if code == fmt.DTYPE_FP32:  # the upper half of value i is uint16 2i + 1
        src = runtime.view(_raw(xb)[0] + 2, 2 * n - 1, np.uint16) if not runtime.SIMULATOR \
            else runtime.view(xb, 2 * n, np.uint16)[1:]
        stride *= 2
    else:
        src = runtime.view(xb if runtime.SIMULATOR else _raw(xb)[0], n, np.uint16)
    buf = runtime.device_empty(count, np.uint16) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(count, np.uint16), count, np.uint16)
    s = runtime.stream(stream)
    stats.gather_sample[1, stats.SUM_TPB, s](src, stride, count, buf)
    return runtime.to_host(buf, count, s)


def estimate_sigma(x, samples: int = SAMPLE_SIZE, stream=None, dtype: str | None = "bfloat16") -> float:
    """``codebook.estimate_sigma`` on the device (reads one 16-byte result: a synchronisation)."""
    _, _, _, runtime, stats = _kernels()
    xb, _ = _bits_view(x, dtype)
    xb, n = _u16(xb)
    if n == 0:
        return 0.0
    s = runtime.stream(stream)
    res = runtime.device_empty(2, np.float64) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(2), 2, np.float64)
    scale = runtime.codebook_tables()[0]
    stats.launch_sumsq(runtime.view(xb, n, np.uint16), n, samples, scale, res, s)
    ssum, cnt = runtime.to_host(res, None, s)
    return float(np.sqrt(ssum / cnt)) if cnt else 0.0


def sample_codebook(x, samples: int = SAMPLE_SIZE, stream=None, dtype: str | None = "bfloat16") -> Codebook:
    """``Codebook.from_sample`` of a device tensor: the strided sample (at most ``samples``
    values, 8 KiB) is gathered on the device and read back (a synchronisation), so the
    codebook is exactly the one the host codec picks for the same values. FP32 and FP16
    arrays (``dtype`` is ignored for float arrays) get theirs from the same positions."""
    _, _, _, runtime, stats = _kernels()
    xw, _, code = _typed_view(x, None if dtype == "bfloat16" and not _is_int16(x) else dtype)
    if code != fmt.DTYPE_BF16:
        n = _raw(xw)[1] // fmt.ITEMSIZE[code]
        sample = _wide_sample(xw, n, code, samples, stream)
        return Codebook.from_sample(sample, samples, dtype=fmt.DTYPE_FP16 if code == fmt.DTYPE_FP16
                                    else fmt.DTYPE_BF16)
    xb, _ = _bits_view(x, dtype)
    xb, n = _u16(xb)
    s = runtime.stream(stream)
    buf = runtime.device_empty(max(1, samples), np.uint16) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(max(1, samples), np.uint16), max(1, samples), np.uint16)
    count = stats.launch_gather(runtime.view(xb, n, np.uint16), n, samples, buf, s)
    return Codebook.from_sample(runtime.to_host(buf, count, s) if count else np.zeros(0, np.uint16),
                                samples)


def _is_int16(x) -> bool:
    return _dtype_name(x).replace("torch.", "") in ("uint16", "int16")


def histogram_codebook(x, stream=None, dtype: str | None = "bfloat16") -> Codebook:
    """``Codebook.from_histogram`` on the device (reads the 256 counts back: a synchronisation)."""
    _, _, _, runtime, stats = _kernels()
    xb, _ = _bits_view(x, dtype)
    xb, n = _u16(xb)
    s = runtime.stream(stream)
    hist = runtime.device_zeros(256, np.int64) if not runtime.SIMULATOR \
        else runtime.view(np.zeros(256, np.int64), 256, np.int64)
    stats.launch_histogram(runtime.view(xb, (n & ~7) // 2, np.uint32),
                           runtime.view(xb, n, np.uint16), n, hist, s)
    h = runtime.to_host(hist, None, s)
    order = np.lexsort((np.arange(256), -h))
    return Codebook(tuple(int(e) for e in order[:fmt.CODEBOOK_SIZE]))


_KINDS_NP = {"u8": np.uint8, "bf16": np.uint16, "f32": np.float32, "f16": np.float16}
_KIND_OF = {fmt.DTYPE_BF16: "bf16", fmt.DTYPE_FP32: "f32", fmt.DTYPE_FP16: "f16"}


def _empty_like_framework(like, nbytes_or_shape, kind: str):
    """A new device array in the framework of ``like``: kind 'u8' (frame) or 'bf16', 'f32',
    'f16' (values)."""
    torch = _torch_of(like)
    if torch is not None:
        dt = {"u8": torch.uint8, "bf16": torch.bfloat16, "f32": torch.float32,
              "f16": torch.float16}[kind]
        return torch.empty(nbytes_or_shape, dtype=dt, device=like.device)
    cupy = _cupy_of(like)
    if cupy is not None:
        dt = _KINDS_NP[kind]
        if like.device.id == cupy.cuda.runtime.getDevice():
            return cupy.empty(nbytes_or_shape, dtype=dt)
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(nbytes_or_shape, dtype=dt)
    runtime = _kernels()[3]
    if runtime.SIMULATOR:
        return np.empty(nbytes_or_shape, dtype=_KINDS_NP[kind])
    return runtime.device_empty(nbytes_or_shape, _KINDS_NP[kind])


def _default_stream_for(x, stream):
    if stream is not None:
        return stream
    cupy = _cupy_of(x)
    if cupy is not None:
        return cupy.cuda.get_current_stream().ptr
    torch = _torch_of(x)
    if torch is not None:
        return torch.cuda.current_stream(x.device).cuda_stream
    return None


def _choose_on_device(xb, n: int, ws: Workspace, stream, code: int = fmt.DTYPE_BF16) -> None:
    """Enqueue ``stats.choose_codebook`` through Numba's dispatcher (the simulator's route,
    and the tests'; on a GPU ``compress`` launches ``_choose``'s plan): the default codebook
    of ``xb`` (BF16 values, or FP32 values: their upper halves), into ``ws``."""
    _, _, _, runtime, stats = _kernels()
    fp32 = code == fmt.DTYPE_FP32
    x16 = runtime.view(xb, 2 * n, np.uint16)[1:] if fp32 else runtime.view(xb, n, np.uint16)
    stats.launch_codebook(x16, n, SAMPLE_SIZE, *runtime.codebook_tables(), ws.array, runtime.stream(stream),
                          step=2 if fp32 else 1)


def _choose(x_ptr: int, n: int, ws: Workspace, s: int, step: int = 1) -> None:
    """``stats.choose_codebook`` of the n values at uint16 steps of ``step`` from ``x_ptr``."""
    device = ws.device
    key = (2, n, ws.ptr, step)
    plan = _PLANS.get(key)
    if plan is None:
        stats = _kernels()[4]
        ptrs = tuple((_device_pointer(t), t.size) for t in _codebook_tables())
        plan = stats.CodebookPlan(device, x_ptr, n, SAMPLE_SIZE, ptrs, ws.ptr, ws.count, step)
        plan.keep = ws
        plan = _remember(key, plan)
    plan.retarget(x_ptr)
    plan.launch(s)


@lru_cache(maxsize=256)
def _raw_size(n: int, code: int = fmt.DTYPE_BF16) -> int:
    return fmt.Layout.for_count(n, code).raw_size


def _flat(buf):
    return buf if buf.ndim == 1 else buf.reshape(-1)


def compress(x, codebook: Codebook | None = None, sigma: float | None = None,
             dtype: str | None = None, checksum: bool = True, out=None, stream=None):
    """Compress a device BF16, FP32 or FP16 tensor into a device frame (exact length; see
    module docstring).

    The default codebook of BF16 and FP32 data is ``codebook.choose_codebook`` of the same
    strided sample the host codec reads (FP32: of the values' upper halves), computed on the
    device (``stats.choose_codebook``: same sigma bit for bit, same window, same fallback),
    so device and host frames of equal data are equal and nothing is read back before
    encoding. FP16's comes from the strided sample gathered on the device and read back
    (one synchronisation more).

    ``out`` (uint8, >= max_compressed_size(n, dtype) bytes) is used when given and the
    returned frame is a view of its start. Synchronises once, to read the frame length.
    """
    if codebook is not None and sigma is not None:
        raise ValueError("give either codebook= or sigma=, not both")
    if codebook is not None and not isinstance(codebook, Codebook):
        raise TypeError(f"codebook must be a zipccl.Codebook, got {type(codebook).__name__}")
    xb, shape, code = _typed_view(x, dtype)
    stream = _default_stream_for(x, stream)
    bf16 = code == fmt.DTYPE_BF16
    if codebook is None and sigma is not None:
        codebook = Codebook.from_sigma(sigma, code)
    if codebook is not None and not bf16:
        _check_wide_codebook(codebook, code)
    if _kernels()[3].SIMULATOR:
        if bf16:
            return _compress_numba(x, xb, shape, None if codebook is None else codebook.exponents,
                                   checksum, out, stream)
        return _compress_wide_numba(x, xb, shape, code, codebook, checksum, out, stream)
    x_ptr, n = _values(xb) if bf16 else _wide_values(xb, code)
    raw_size = _raw_size(n, code)
    s = _stream_key(stream)
    if out is not None:  # checked before anything is launched
        o_ptr, nbytes = _frame_buffer(out)
        if nbytes < raw_size:
            what = f"{n}" if bf16 else f"{n}, {fmt.DTYPE_NAMES[code]!r}"
            raise ValueError(f"out= holds {nbytes} bytes; this frame may need {raw_size} "
                             f"(max_compressed_size({what}))")
    if codebook is None and code == fmt.DTYPE_FP16:
        codebook = Codebook.from_sample(_wide_sample(xb, n, code, SAMPLE_SIZE, stream),
                                        dtype=fmt.DTYPE_FP16)
    exponents = None if codebook is None else codebook.exponents
    ws = default_workspace(s, n)
    if exponents is None:  # the GPU chooses the codebook while the output is allocated
        if bf16:
            _choose(x_ptr, n, ws, s)
        else:  # FP32: the upper half of value i is uint16 2i + 1
            _choose(x_ptr + 2, n, ws, s, step=2)
    buf = out
    if out is None:
        buf = _empty_like_framework(x, raw_size, "u8")
        o_ptr, nbytes = _frame_buffer(buf)
    if bf16:
        _encode(x_ptr, n, o_ptr, nbytes, exponents, s, checksum, shape, ws)
    else:
        _encode_wide(x_ptr, n, o_ptr, nbytes, exponents, s, checksum, shape, ws, code)
    flen = int(_launch().pinned().read(o_ptr + _FRAME_LEN_AT, 8, s).view("<i8")[0])
    return _flat(buf)[:flen]


def _compress_wide_numba(x, xw, shape, code, codebook, checksum, out, stream):
    """``compress`` of FP32 / FP16 through Numba's dispatcher (the simulator's route)."""
    runtime = _kernels()[3]
    n = _wide_values(xw, code)[1]
    if codebook is None and code == fmt.DTYPE_FP16:
        codebook = Codebook.from_sample(_wide_sample(xw, n, code, SAMPLE_SIZE, stream),
                                        dtype=fmt.DTYPE_FP16)
    raw_size = fmt.Layout.for_count(n, code).raw_size
    buf = out if out is not None else _empty_like_framework(x, raw_size, "u8")
    nbytes = _u8(buf)[1]
    if nbytes < raw_size:
        raise ValueError(f"out= holds {nbytes} bytes; this frame may need {raw_size} "
                         f"(max_compressed_size({n}, {fmt.DTYPE_NAMES[code]!r}))")
    ws = default_workspace(stream, n)
    if codebook is None:
        _choose_on_device(xw, n, ws, stream, code)
    _encode_wide_into(xw, buf, codebook, stream, checksum, shape, ws, code)
    head = runtime.host_bytes(buf, _FRAME_LEN_AT + 8, runtime.stream(stream))
    flen = int(head[_FRAME_LEN_AT:_FRAME_LEN_AT + 8].view("<i8")[0])
    return _flat(buf)[:flen]


def _compress_numba(x, xb, shape, exponents, checksum, out, stream):
    """``compress`` through Numba's dispatcher (the CUDA simulator's route)."""
    runtime = _kernels()[3]
    _, n = _u16(xb)
    lay = fmt.Layout.for_count(n)
    buf = out if out is not None else _empty_like_framework(x, lay.raw_size, "u8")
    _, buf_nbytes = _u8(buf)
    if buf_nbytes < lay.raw_size:
        raise ValueError(f"out= holds {buf_nbytes} bytes; this frame may need {lay.raw_size} "
                         f"(max_compressed_size({n}))")
    ws = default_workspace(stream, n)
    if exponents is None:
        _choose_on_device(xb, n, ws, stream)
    _encode_into_numba(xb, buf, exponents, stream, checksum, shape, ws)
    head = runtime.host_bytes(buf, _FRAME_LEN_AT + 8, runtime.stream(stream))
    flen = int(head[_FRAME_LEN_AT:_FRAME_LEN_AT + 8].view("<i8")[0])
    return _flat(buf)[:flen]


def decompress(frame, out=None, stream=None):
    """Decompress a device frame into a device tensor bit-identical to the compressed one.

    Returns ``out`` when given (n values), else a new array of the header's shape and
    type in the frame's framework (torch: bfloat16, float32, float16; CuPy and Numba:
    float32, float16, and uint16 bit patterns for BF16, which they lack).
    Raises ValueError for an invalid frame. Synchronises once in the steady state: the
    decoder checks the header itself, so it is launched at once, into ``out`` or into a
    new array sized from the header this frame buffer (else this stream) had last time,
    and the header and the error bits are read back together after it. Only when the
    header differs from that guess (a first call, a new size) is the output sized from
    the header just read and the frame decoded again: a second synchronisation.
    """
    runtime = _kernels()[3]
    stream = _default_stream_for(frame, stream)
    if runtime.SIMULATOR:
        fb, nbytes = _u8(frame)
        f_ptr = _raw(fb)[0]
        s = stream
        skey = 0 if stream is None else id(stream)
        device = runtime.current_device_id()
    else:
        fb = frame
        f_ptr, nbytes = _frame_buffer(frame)
        s = skey = _stream_key(stream)
        device = _launch().current_device()
    _check_frame_bytes(nbytes)
    if out is not None:
        code = element_code(out)
        ws, n_out = _decode_to(fb, f_ptr, nbytes, out, code, s)
        err = _read_error(ws, s)
        return _checked_err(err, None, n_out, lambda: _read_header(fb, f_ptr, s), nbytes, out)
    where = (device, skey, f_ptr, nbytes)
    guess = _GUESSES.get(where) or _GUESSES.get((device, skey))
    if guess is not None and _plausible(guess, nbytes):
        dst, result = _new_values(frame, guess)
        ws, _ = _decode_to(fb, f_ptr, nbytes, dst, guess.dtype, s)
        head, err = _read_header_and_error(fb, f_ptr, ws, s)
        h = _parse_header(head, nbytes)
        _remember_guess(where, (device, skey), h)
        if h.n == guess.n and h.dtype == guess.dtype:  # the decode was the frame's own
            if err:
                raise ValueError(f"corrupted zipccl frame: {Workspace.describe(err)}")
            return result if h.shape == guess.shape else _reshaped(dst, h.shape)
    else:
        h = _parse_header(_read_header(fb, f_ptr, s), nbytes)
        _remember_guess(where, (device, skey), h)
    dst, result = _new_values(frame, h)
    ws, n_out = _decode_to(fb, f_ptr, nbytes, dst, h.dtype, s)
    return _checked_err(_read_error(ws, s), h.n, n_out, None, nbytes, result)


# The header decompress saw last per (device, stream, frame pointer, frame bytes) and per
# (device, stream): what the next call on the same buffer or stream is decoded with before
# its header is read back (a guess only: the decoder checks it against the frame).
_GUESSES: dict[tuple, fmt.Header] = {}
_HEADERS: dict[tuple[bytes, int], fmt.Header] = {}


def _remember_guess(where: tuple, per_stream: tuple, h: fmt.Header) -> None:
    if len(_GUESSES) >= 1024:
        _GUESSES.clear()
    _GUESSES[where] = _GUESSES[per_stream] = h


def _plausible(h: fmt.Header, nbytes: int) -> bool:
    """Could a buffer of ``nbytes`` hold a frame of ``h``'s count and type? (Keeps a wrong
    guess from allocating far more than the frame could need.)"""
    return _static_size(h.n, h.dtype) <= nbytes


@lru_cache(maxsize=256)
def _static_size(n: int, code: int) -> int:
    return fmt.static_size(n, code)


def _parse_header(head, nbytes: int) -> fmt.Header:
    """``format.parse_header`` of 128 header bytes read from a buffer of ``nbytes``; a
    pure function of them, so what was accepted once is remembered (errors are not)."""
    key = (bytes(head), nbytes)
    h = _HEADERS.get(key)
    if h is None:
        h = fmt.parse_header(key[0], buffer_len=nbytes)
        if len(_HEADERS) >= 1024:
            _HEADERS.clear()
        _HEADERS[key] = h
    return h


def _new_values(like, h: fmt.Header):
    """(new array of h's values in the framework of ``like``, the array to return)."""
    dst = _empty_like_framework(like, h.shape if h.shape else (1,), _KIND_OF[h.dtype])
    return dst, (dst if h.shape else dst.reshape(()))


def _reshaped(dst, shape: tuple[int, ...]):
    torch = _torch_of(dst)
    if torch is not None:
        return dst.view(shape)
    return dst.reshape(shape)


def _decode_to(fb, f_ptr: int, nbytes: int, dst, code: int, s) -> tuple[Workspace, int]:
    """Enqueue the decode of the frame into ``dst`` (values of element type ``code``) on
    ``s`` (stream handle; the stream itself under the simulator); (workspace, n)."""
    if code != fmt.DTYPE_BF16:
        n_out = _wide_values(dst, code)[1]
        ws = default_workspace(s, n_out)
        _decode_wide_into(fb, dst, s, ws, code)
        return ws, n_out
    if _kernels()[3].SIMULATOR:
        ob, n_out = _u16(dst)
        ws = default_workspace(s, n_out)
        _decode_into_numba(fb, ob, s, ws)
    else:
        o_ptr, n_out = _values(dst)
        ws = default_workspace(s, n_out)
        _decode(f_ptr, nbytes, o_ptr, n_out, s, ws)
    return ws, n_out


def _read_header(fb, f_ptr: int, s) -> np.ndarray:
    """The frame's 128 header bytes on the host (a synchronisation)."""
    runtime = _kernels()[3]
    if runtime.SIMULATOR:
        return runtime.host_bytes(fb, fmt.HEADER_SIZE, runtime.stream(s))
    return _launch().pinned().read(f_ptr, fmt.HEADER_SIZE, s)


def _read_error(ws: Workspace, s) -> int:
    """The error bits of the last decode on ``ws`` (a synchronisation)."""
    runtime = _kernels()[3]
    if runtime.SIMULATOR:
        return ws.last_error(s)
    at = 8 * _kernels()[0].WS_ERR_LAST
    return int(_launch().pinned().read(ws.ptr + at, 8, s).view("<i8")[0])


def _read_header_and_error(fb, f_ptr: int, ws: Workspace, s) -> tuple[np.ndarray, int]:
    """(header bytes, error bits of the last decode on ``ws``): one synchronisation."""
    runtime = _kernels()[3]
    if runtime.SIMULATOR:
        return runtime.host_bytes(fb, fmt.HEADER_SIZE, runtime.stream(s)), ws.last_error(s)
    at = 8 * _kernels()[0].WS_ERR_LAST
    head, err = _launch().pinned().read_two((f_ptr, fmt.HEADER_SIZE), (ws.ptr + at, 8), s)
    return head, int(err.view("<i8")[0])


def _checked_err(err: int, n, n_out: int, read_header, nbytes: int, result):
    """``result`` when the decode's error bits say the frame was valid; ValueError otherwise,
    in the header's own words when the header is what is wrong (``read_header``: how to
    read it, when the header was not read before the decode)."""
    if err:
        if n is None:
            h = fmt.parse_header(read_header(), buffer_len=nbytes)
            if h.n != n_out:
                raise ValueError(f"out= has {n_out} elements; the frame holds {h.n}")
        elif n != n_out:
            raise ValueError(f"out= has {n_out} elements; the frame holds {n}")
        raise ValueError(f"corrupted zipccl frame: {Workspace.describe(err)}")
    return result
