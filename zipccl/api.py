"""The public codec API: ``compress``, ``decompress``, ``max_compressed_size``.

It picks an implementation by where the data lives: device arrays go to the GPU
codec and stay on the device; host arrays go to the CPU fast path (or the NumPy
reference when ``backend="reference"``).
"""

from __future__ import annotations

import numpy as np

from . import format as fmt
from .arrays import as_bf16, host_bits, host_out_bits, is_device_array
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
    """``out=`` of ``compress`` as the flat uint8 array of its own memory.

    A frame is one contiguous run of bytes, so ``out`` must be C-contiguous and
    writable; anything else raises ValueError instead of writing to a copy.
    """
    arr = np.asarray(out)
    if not arr.flags.c_contiguous:
        raise ValueError("out= must be a C-contiguous buffer (a frame is one contiguous run of "
                         "bytes); this one is strided")
    if not arr.flags.writeable:
        raise ValueError("out= is read-only")
    return arr.reshape(-1).view(np.uint8)


def _host_frame(frame):
    """A host frame as the decoders read it: its bytes in order, in one contiguous run.

    A strided uint8 array or a strided ``memoryview`` is copied into one (the
    decoders view their argument's memory as a flat byte string, which a strided
    buffer is not); bytes, bytearray and contiguous buffers pass unchanged.
    """
    if isinstance(frame, np.ndarray):
        if frame.dtype != np.uint8:
            raise TypeError(f"a zipccl frame is a uint8 buffer, got dtype {frame.dtype}")
        return frame if frame.flags.c_contiguous else np.ascontiguousarray(frame).reshape(-1)
    if isinstance(frame, memoryview) and not frame.c_contiguous:
        return np.ascontiguousarray(np.asarray(frame)).reshape(-1).view(np.uint8)
    return frame


def _pick_codebook(bits: np.ndarray, codebook: Codebook | None, sigma: float | None) -> Codebook:
    if codebook is not None and sigma is not None:
        raise ValueError("give either codebook= or sigma=, not both")
    if codebook is not None:
        if not isinstance(codebook, Codebook):
            raise TypeError(f"codebook must be a zipccl.Codebook, got {type(codebook).__name__}")
        return codebook
    if sigma is not None:
        return Codebook.from_sigma(sigma)
    return Codebook.from_sample(bits)


def compress(x, codebook: Codebook | None = None, *, sigma: float | None = None,
             dtype: str | None = None, checksum: bool = True, out=None, stream=None,
             backend: str = "auto"):
    """Compress a BF16 tensor into one frame: a contiguous uint8 buffer, ready to send.

    ``x`` is an ``ml_dtypes.bfloat16`` NumPy array, a torch bfloat16 tensor, a uint16
    array with ``dtype="bfloat16"``, or a device array (CuPy, Numba, CUDA torch), in
    which case the frame is a device array on the same device, written on ``stream``.
    The codebook defaults to ``Codebook.from_sigma`` of a strided-sample estimate;
    ``sigma=`` gives sigma directly. ``out=`` is a preallocated, C-contiguous buffer of at
    least ``max_compressed_size(x.size)`` bytes; the frame is written at its start and the
    returned array is a view of it (a strided or read-only ``out=`` raises ValueError).

    >>> import ml_dtypes, numpy as np, zipccl
    >>> x = np.random.default_rng(0).normal(0, 0.02, 10000).astype(ml_dtypes.bfloat16)
    >>> frame = zipccl.compress(x)
    >>> y = zipccl.decompress(frame)
    >>> bool(np.array_equal(x.view(np.uint16), y.view(np.uint16))), len(frame) < x.nbytes
    (True, True)
    """
    if is_device_array(x):
        from .codec import gpu
        return gpu.compress(x, codebook=codebook, sigma=sigma, dtype=dtype, checksum=checksum,
                            out=out, stream=stream)
    bits = host_bits(x, dtype=dtype)
    cb = _pick_codebook(bits, codebook, sigma)
    frame = _host_codec(backend).encode(bits, cb, bits.shape, checksum)
    if out is None:
        return frame
    dst = _frame_out(out)
    if dst.size < frame.size:
        raise ValueError(f"out= holds {dst.size} bytes; this frame needs {frame.size} "
                         f"(max_compressed_size({bits.size}) = {fmt.max_compressed_size(bits.size)})")
    dst[:frame.size] = frame
    return dst[:frame.size]


def decompress(frame, *, out=None, stream=None, backend: str = "auto"):
    """Decompress one frame into a tensor bit-identical to the compressed one.

    A host frame (bytes, bytearray, uint8 NumPy array) gives an ``ml_dtypes.bfloat16``
    NumPy array of the original shape; a device frame gives a device array. ``out=``
    (a host frame: a BF16 NumPy array of any layout, or a contiguous CPU torch tensor,
    with as many elements as the frame) receives the values in C order and is returned.
    Raises ValueError if ``frame`` is not a complete, valid zipccl frame, or if ``out=``
    cannot receive them.
    """
    if is_device_array(frame):
        from .codec import gpu
        return gpu.decompress(frame, out=out, stream=stream)
    bits, header = _host_codec(backend).decode(_host_frame(frame))
    if out is None:
        return as_bf16(bits)
    dst = host_out_bits(out, dtype="bfloat16" if getattr(out, "dtype", None) == np.uint16 else None)
    if dst.size != bits.size:
        raise ValueError(f"out= has {dst.size} elements; the frame holds {bits.size}")
    # Element i of the frame goes to element i of out in C order, whatever out's strides.
    dst[...] = bits.reshape(dst.shape)
    return out


def max_compressed_size(n: int) -> int:
    """Worst-case frame size in bytes for ``n`` BF16 values (header + raw data).

    Raises TypeError for a count that is not an integer (``1.9``, ``"12"``) and
    ValueError for a negative one.

    >>> max_compressed_size(1 << 20)
    2097280
    """
    return fmt.max_compressed_size(n)
