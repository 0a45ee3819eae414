"""Slots: what one compressed frame occupies on the wire, sized before the data exists.

A collective moves each frame as a *slot* of ``slot_bytes(n, code, capacity)`` bytes: a
128-byte slot header followed by the first bytes of the frame. Every rank computes the
same size from the element count, the element type and the escape capacity, so one
transfer per pipeline round moves all slots and its byte count is known to the host when
the call is made. A frame longer than its slot *spills*: its tail (frame bytes from
``slot_bytes - SLOT_HEADER`` on) moves beside the collective (``comm.spill``).

Each frame is encoded into a *region* of ``region_bytes(n, code)`` bytes: the slot header,
then room for the largest frame of n values, so a spilled tail lands right after the
received part and the frame is contiguous. This module alone knows the slot header's
offsets (``SLOT_FIELDS``; the kernels take them from there); ``docs/FORMAT.md``, "The slot
header", describes it in prose.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import frame as fmt

SLOT_HEADER = 128
SLOT_MAGIC = b"ZSLT"
SLOT_VERSION = 1
OP_CODES = {"all_gather": 1, "all_to_all": 2, "reduce_scatter": 3, "all_reduce": 4}

# name, struct code, offset (little-endian). The header is exactly SLOT_HEADER bytes.
SLOT_FIELDS = (
    ("magic", "4s", 0),  # SLOT_MAGIC
    ("version", "I", 4),  # SLOT_VERSION
    ("seq", "Q", 8),  # call sequence number: every rank numbers a communicator's calls alike, from 1
    ("op", "I", 16),  # OP_CODES
    ("dtype", "I", 20),  # element type code (format.DTYPE_*)
    ("n", "Q", 24),  # element count
    ("frame_len", "Q", 32),  # the frame header's
    ("slot_bytes", "Q", 40),
    ("error", "I", 48),  # the sender's sticky error word
    ("reserved", "I", 52),  # 0
    ("max_escapes", "Q", 56),  # the sender's largest escape count over the frames of this call
    ("zero", "60s", 64),
    ("crc", "I", 124),  # CRC-32 of bytes [0, 124)
)
_STRUCT = struct.Struct("<" + "".join(code for _, code, _ in SLOT_FIELDS))
assert _STRUCT.size == SLOT_HEADER
SLOT_OFFSET = {name: at for name, _, at in SLOT_FIELDS}
CRC_AT = SLOT_OFFSET["crc"]


@dataclass(frozen=True)
class SlotHeader:
    seq: int
    op: int
    dtype: int
    n: int
    frame_len: int
    slot_bytes: int
    error: int = 0
    max_escapes: int = 0


@lru_cache(maxsize=4096)
def region_bytes(n: int, code: int = fmt.DTYPE_BF16) -> int:
    """Bytes of the region one frame of ``n`` values is encoded into: the slot header and room
    for the largest frame (a multiple of 128, so regions packed one after another stay aligned).

    >>> region_bytes(4096), region_bytes(0)
    (8448, 0)
    """
    if n == 0:
        return 0
    return SLOT_HEADER + fmt.align(fmt.max_compressed_size(n, code))


@lru_cache(maxsize=4096)
def slot_bytes(n: int, code: int = fmt.DTYPE_BF16, capacity: int = 0) -> int:
    """Bytes one frame of ``n`` values occupies on the wire, with ``capacity`` escape bytes
    reserved beyond the frame's static part; never more than its region (a small frame, whose
    largest size is below that, never spills).

    >>> slot_bytes(1 << 20, capacity=0) - SLOT_HEADER == fmt.static_size(1 << 20)
    True
    >>> slot_bytes(100, capacity=1 << 20) == region_bytes(100)
    True
    """
    if n == 0:
        return 0
    if capacity < 0:
        raise ValueError(f"escape capacity must be >= 0, got {capacity}")
    return min(SLOT_HEADER + fmt.align(fmt.static_size(n, code) + int(capacity)), region_bytes(n, code))


def tail_bytes(frame_len: int, slot: int) -> int:
    """Bytes of a frame of ``frame_len`` that do not fit its slot of ``slot`` bytes (0: it fits)."""
    return max(0, int(frame_len) - (int(slot) - SLOT_HEADER))


def pack_slot_header(h: SlotHeader) -> np.ndarray:
    """The 128 bytes of ``h``, CRC included (the device kernels write the same bytes)."""
    raw = _STRUCT.pack(SLOT_MAGIC, SLOT_VERSION, h.seq, h.op, h.dtype, h.n, h.frame_len,
                       h.slot_bytes, h.error, 0, h.max_escapes, bytes(60), 0)
    crc = zlib.crc32(raw[:CRC_AT]) & 0xFFFFFFFF
    return np.frombuffer(raw[:CRC_AT] + struct.pack("<I", crc), dtype=np.uint8).copy()


def parse_slot_header(buf) -> SlotHeader:
    """The slot header at the start of ``buf`` (uint8); ValueError if it is not one."""
    raw = bytes(np.asarray(buf[:SLOT_HEADER], dtype=np.uint8))
    if len(raw) < SLOT_HEADER:
        raise ValueError(f"slot of {len(raw)} bytes is shorter than its {SLOT_HEADER}-byte header")
    f = _STRUCT.unpack(raw)
    if f[0] != SLOT_MAGIC:
        raise ValueError(f"bad slot magic {f[0]!r}")
    if zlib.crc32(raw[:CRC_AT]) & 0xFFFFFFFF != f[-1]:
        raise ValueError("slot header CRC mismatch")
    if f[1] != SLOT_VERSION:
        raise ValueError(f"unsupported slot version {f[1]}")
    return SlotHeader(seq=f[2], op=f[3], dtype=f[4], n=f[5], frame_len=f[6], slot_bytes=f[7],
                      error=f[8], max_escapes=f[10])
