"""The public codec API: ``compress``, ``decompress``, ``max_compressed_size``.

It picks an implementation by where the data lives: device arrays go to the GPU
codec and stay on the device; host arrays go to the CPU fast path (or the NumPy
reference when ``backend="reference"``). BF16, FP32 and FP16 tensors are accepted;
the frame's header records which, and ``decompress`` gives the same type back.
Both may be called from several threads at once (docs/COLLECTIVES.md, "Threads").
"""

from __future__ import annotations

import numpy as np

from . import format as fmt
from .arrays import (
    host_frame,
    host_out_values,
    host_values,
    is_device_array,
    like_input,
    torch_of,
)
from .codebook import Codebook

_HOST_BACKENDS = ("auto", "cpu", "reference")


def _host_codec(backend: str):
    if backend not in _HOST_BACKENDS:
        raise ValueError(f"backend must be one of {_HOST_BACKENDS} for host arrays, got {backend!r}")
    if backend == "reference":
        from .codec import reference
        return reference
    from .codec import cpu
    return cpu


def _frame_out(out) -> np.ndarray:
    """``out=`` of ``compress`` on host data as the flat uint8 array of its own memory.

    ``out`` must be a host buffer whose memory the frame can be written into in place: a
    NumPy array, a CPU torch tensor, or a writable buffer-protocol object (``bytearray``,
    a writable ``memoryview``...), C-contiguous. A list or any other object that would be
    converted to a new array raises TypeError, a read-only buffer (``bytes``) or a strided
    one ValueError: the frame never goes to a copy.
    """
    torch = torch_of(out)
    if torch is not None:
        if out.is_cuda:
            raise TypeError("out= is a CUDA tensor; the frame of host data goes to a host buffer")
        if not out.is_contiguous():
            raise ValueError("out= must be a C-contiguous buffer (a frame is one contiguous run "
                             "of bytes); this torch tensor is strided")
        arr = out.detach().reshape(-1).view(torch.uint8).numpy()  # the tensor's own memory, as bytes
    elif is_device_array(out):
        raise TypeError("out= is a device array; the frame of host data goes to a host buffer")
    elif isinstance(out, np.ndarray):
        arr = out
    else:
        try:
            view = memoryview(out)
        except TypeError:
            raise TypeError(f"out= must be a writable host buffer (a NumPy array, a CPU torch "
                            f"tensor, a bytearray...), got {type(out).__name__}: the frame would "
                            f"go to a copy of it") from None
        if view.readonly:
            raise ValueError(f"out= is read-only ({type(out).__name__}); pass a writable buffer "
                             f"such as a bytearray")
        arr = np.asarray(view)
    if not arr.flags.c_contiguous:
        raise ValueError("out= must be a C-contiguous buffer (a frame is one contiguous run of "
                         "bytes); this one is strided")
    if not arr.flags.writeable:
        raise ValueError("out= is read-only")
    return arr.reshape(-1).view(np.uint8)


def _host_frame(frame):
    """A host frame as the decoders read it: its bytes in order, in one contiguous run.

    A strided uint8 array (NumPy or torch) or a strided ``memoryview`` is copied into one (the
    decoders view their argument's memory as a flat byte string, which a strided
    buffer is not); bytes, bytearray and contiguous buffers pass unchanged.
    """
    frame = host_frame(frame)  # a CPU torch frame: its bytes, as NumPy
    if isinstance(frame, np.ndarray):
        if frame.dtype != np.uint8:
            raise TypeError(f"a zipccl frame is a uint8 buffer, got dtype {frame.dtype}")
        return frame if frame.flags.c_contiguous else np.ascontiguousarray(frame).reshape(-1)
    if isinstance(frame, memoryview) and not frame.c_contiguous:
        return np.ascontiguousarray(np.asarray(frame)).reshape(-1).view(np.uint8)
    return frame


def _pick_codebook(bits: np.ndarray, codebook: Codebook | None, sigma: float | None,
                   code: int = fmt.DTYPE_BF16) -> Codebook:
    if codebook is not None and sigma is not None:
        raise ValueError("give either codebook= or sigma=, not both")
    if codebook is not None:
        if not isinstance(codebook, Codebook):
            raise TypeError(f"codebook must be a zipccl.Codebook, got {type(codebook).__name__}")
        return codebook
    if sigma is not None:
        return Codebook.from_sigma(sigma, code)
    return Codebook.from_sample(bits, dtype=code)


def compress(x, codebook: Codebook | None = None, *, sigma: float | None = None,
             dtype: str | None = None, checksum: bool = True, out=None, stream=None,
             backend: str = "auto"):
    """Compress a BF16, FP32 or FP16 tensor into one frame: a contiguous uint8 buffer.

    ``x`` is a NumPy array of ``ml_dtypes.bfloat16``, float32 or float16, a torch
    tensor of those types, integer bit patterns with ``dtype=`` ("bfloat16" or
    "float16" for 16-bit, "float32" for 32-bit integers), or a device array (CuPy,
    Numba, CUDA torch), in which case the frame is a device array on the same device,
    written on ``stream``. Other dtypes raise TypeError naming them.
    The frame is the kind of array ``x`` is: a 1-D uint8 NumPy array for NumPy input, a
    uint8 torch tensor for a torch tensor (on its device; a CPU one shares the NumPy
    frame's memory), a CuPy or Numba uint8 array for those.
    The codebook defaults to ``Codebook.from_sigma`` of a strided-sample estimate;
    ``sigma=`` gives sigma directly. ``out=`` is a preallocated, C-contiguous, writable buffer of at
    least ``max_compressed_size(x.size, x.dtype)`` bytes where ``x`` lives (host data: a NumPy
    array, a CPU torch tensor, a ``bytearray`` or other writable buffer; device data: a uint8
    device array); the frame is written at its start, in place, and the returned frame is a
    view of it, of ``out``'s kind. An ``out=`` that cannot be written in place is refused,
    never written to a copy: a list or other non-buffer, or a buffer on the wrong side,
    raises TypeError, a strided or read-only one (``bytes``) ValueError. More than 8
    dimensions (``format.MAX_NDIM``) raise ValueError.

    >>> import ml_dtypes, numpy as np, zipccl
    >>> x = np.random.default_rng(0).normal(0, 0.02, 10000).astype(ml_dtypes.bfloat16)
    >>> frame = zipccl.compress(x)
    >>> y = zipccl.decompress(frame)
    >>> bool(np.array_equal(x.view(np.uint16), y.view(np.uint16))), len(frame) < x.nbytes
    (True, True)
    >>> g = np.random.default_rng(0).normal(0, 1e-3, 10000).astype(np.float32)
    >>> y = zipccl.decompress(zipccl.compress(g))
    >>> y.dtype, bool(np.array_equal(g.view(np.uint32), y.view(np.uint32)))
    (dtype('float32'), True)
    >>> # t: a torch.bfloat16 CPU tensor of shape (100, 100)
    >>> # zipccl.compress(t): a torch.uint8 tensor; zipccl.decompress of it: t's dtype, shape, bits
    """
    if is_device_array(x):
        if out is not None and not is_device_array(out):
            raise TypeError(f"out= must be a device array for device data (the frame is written "
                            f"on the device, in place), got {type(out).__name__}")
        from .codec import gpu
        return gpu.compress(x, codebook=codebook, sigma=sigma, dtype=dtype, checksum=checksum,
                            out=out, stream=stream)
    bits, code = host_values(x, dtype=dtype)
    if bits.ndim > fmt.MAX_NDIM:
        raise ValueError(f"zipccl frames hold at most {fmt.MAX_NDIM} dimensions, got {bits.ndim} "
                         f"(shape {bits.shape}); reshape the tensor first")
    dst = None if out is None else _frame_out(out)  # refused before any work
    cb = _pick_codebook(bits, codebook, sigma, code)
    frame = _host_codec(backend).encode(bits, cb, bits.shape, checksum, dtype=code)
    if dst is None:
        return like_input(frame, x)
    if dst.size < frame.size:
        name = fmt.DTYPE_NAMES[code]
        raise ValueError(f"out= holds {dst.size} bytes; this frame needs {frame.size} "
                         f"(max_compressed_size({bits.size}, {name!r}) = "
                         f"{fmt.max_compressed_size(bits.size, code)})")
    dst[:frame.size] = frame
    return like_input(dst[:frame.size], out)


def decompress(frame, *, out=None, stream=None, backend: str = "auto"):
    """Decompress one frame into a tensor bit-identical to the compressed one.

    The result is the kind of array the frame is, so what was compressed comes back:
    a host frame (bytes, bytearray, uint8 NumPy array) gives a NumPy array of the
    original shape and type (``ml_dtypes.bfloat16``, float32 or float16); a CPU torch
    frame (uint8 tensor) a CPU torch tensor of that shape and type (torch.bfloat16,
    float32, float16); a device frame a device array of its framework (CUDA torch: the
    torch type; CuPy: float32, float16, or uint16 patterns for BF16, which CuPy lacks).
    ``out=`` (a host frame: a NumPy array of the frame's type, any layout, or a contiguous
    CPU torch tensor, with as many elements as the frame) receives the values in C order
    and is returned.
    Raises ValueError if ``frame`` is not a complete, valid zipccl frame, or if ``out=``
    cannot receive them.
    """
    if is_device_array(frame):
        from .codec import gpu
        return gpu.decompress(frame, out=out, stream=stream)
    bits, header = _host_codec(backend).decode(_host_frame(frame))
    if out is None:
        return like_input(bits, frame, header.dtype)
    dst = host_out_values(out, header.dtype)
    if dst.size != bits.size:
        raise ValueError(f"out= has {dst.size} elements; the frame holds {bits.size}")
    # Element i of the frame goes to element i of out in C order, whatever out's strides.
    dst[...] = bits.reshape(dst.shape)
    return out


def max_compressed_size(n: int, dtype="bfloat16") -> int:
    """Worst-case frame size in bytes for ``n`` values of ``dtype`` (header + raw data).

    Raises TypeError for a count that is not an integer (``1.9``, ``"12"``) and
    ValueError for a negative one.

    >>> max_compressed_size(1 << 20), max_compressed_size(1 << 20, "float32")
    (2097280, 4194432)
    """
    return fmt.max_compressed_size(n, dtype)
