"""The zipccl frame: header, section offsets, alignment and sizes.

This is the only module that knows where anything lives inside a frame. The codecs
(reference, CPU, GPU) and the collectives ask it for offsets and never compute one
themselves. A frame is a 128-byte header (``HEADER_FIELDS``) followed by sections that
each start on a 128-byte boundary (``Layout``); everything before the escape bytes has a
size that depends on the element count and type alone (the *static part*), so a receiver
can size it without being told. A RAW frame holds the values verbatim; an encoder writes
one exactly when the compressed frame would be longer, so no frame is longer than
``max_compressed_size(n, dtype)``. ``docs/FORMAT.md`` describes the same layout in prose;
the two must agree.
"""

from __future__ import annotations

import functools
import operator
import struct
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = [  # the frame's names are the package's (``from zipccl import format as fmt``)
    "MAGIC",
    "VERSION",
    "DTYPE_BF16",
    "DTYPE_FP32",
    "DTYPE_FP16",
    "DTYPE_NAMES",
    "ITEMSIZE",
    "EXPONENT_MAX",
    "N_PLANES",
    "HEADER_SIZE",
    "ALIGN",
    "BLOCK",
    "CODEBOOK_SIZE",
    "MAX_NDIM",
    "FLAG_RAW",
    "FLAG_CHECKSUM",
    "KNOWN_FLAGS",
    "HEADER_FIELDS",
    "OFFSET",
    "FRAME_LEN_AT",
    "N_ESCAPES_AT",
    "CODEBOOK_AT",
    "dtype_code",
    "align",
    "Layout",
    "max_compressed_size",
    "static_size",
    "check_codebook",
    "Header",
    "pack_header",
    "parse_header",
    "check_escape_counts",
    "payload_checksum",
    "check_escape_values",
]

MAGIC = b"ZCCL"
VERSION = 1
DTYPE_BF16 = 1
DTYPE_FP32 = 2
DTYPE_FP16 = 3
DTYPE_NAMES = {DTYPE_BF16: "bfloat16", DTYPE_FP32: "float32", DTYPE_FP16: "float16"}
ITEMSIZE = {DTYPE_BF16: 2, DTYPE_FP32: 4, DTYPE_FP16: 2}  # bytes per value
EXPONENT_MAX = {DTYPE_BF16: 255, DTYPE_FP32: 255, DTYPE_FP16: 31}  # all-ones exponent (inf, NaN)
N_PLANES = {DTYPE_BF16: 3, DTYPE_FP32: 3, DTYPE_FP16: 6}  # bit planes after the byte plane
_DTYPE_ALIASES = {"bfloat16": DTYPE_BF16, "bf16": DTYPE_BF16, "torch.bfloat16": DTYPE_BF16,
                  "float32": DTYPE_FP32, "fp32": DTYPE_FP32, "torch.float32": DTYPE_FP32,
                  "float16": DTYPE_FP16, "fp16": DTYPE_FP16, "half": DTYPE_FP16,
                  "torch.float16": DTYPE_FP16}

HEADER_SIZE = 128
ALIGN = 128
BLOCK = 4096  # elements per escape block (one count per block)
CODEBOOK_SIZE = 7  # codes 1..7 name codebook entries; code 0 is the escape
MAX_NDIM = 8

FLAG_RAW = 1 << 0
FLAG_CHECKSUM = 1 << 1
KNOWN_FLAGS = FLAG_RAW | FLAG_CHECKSUM

# name, struct code, offset. The header is exactly HEADER_SIZE bytes; the last
# four hold a CRC-32 of the 124 bytes before them.
HEADER_FIELDS = (
    ("magic", "4s", 0),
    ("version", "B", 4),
    ("dtype", "B", 5),
    ("flags", "H", 6),
    ("n", "Q", 8),
    ("n_escapes", "Q", 16),
    ("frame_len", "Q", 24),
    ("checksum", "Q", 32),
    ("codebook", "7s", 40),
    ("ndim", "B", 47),
    ("block", "I", 48),
    ("reserved", "I", 52),
    ("shape", "8Q", 56),
    ("reserved2", "I", 120),
    ("header_crc", "I", 124),
)
_HEADER_STRUCT = struct.Struct("<4sBBHQQQQ7sBII8QII")
assert _HEADER_STRUCT.size == HEADER_SIZE
assert [f[2] for f in HEADER_FIELDS] == [0, 4, 5, 6, 8, 16, 24, 32, 40, 47, 48, 52, 56, 120, 124]
# byte offsets of the fields a device reads or writes in place (the frame length is an int64 LE)
OFFSET = {name: at for name, _, at in HEADER_FIELDS}
FRAME_LEN_AT = OFFSET["frame_len"]
N_ESCAPES_AT = OFFSET["n_escapes"]
CODEBOOK_AT = OFFSET["codebook"]


def dtype_code(dtype) -> int:
    """The header's element-type code of ``dtype``: a code, a name or a NumPy / torch dtype.

    >>> dtype_code("bfloat16"), dtype_code("float32"), dtype_code(np.float16)
    (1, 2, 3)
    """
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) in DTYPE_NAMES:
            return int(dtype)
        raise ValueError(f"unknown zipccl element type code {dtype}")
    name = str(dtype)
    if name not in _DTYPE_ALIASES:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[name]
    raise TypeError(f"zipccl compresses bfloat16, float32 and float16; got {dtype!r}")


def align(nbytes: int) -> int:
    """Round ``nbytes`` up to the next multiple of ALIGN (128)."""
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


# Frame layout (integers little-endian, every section on a 128-byte boundary, padding zero):
#
#   offset 0     header (128 bytes, HEADER_FIELDS); byte 5 names the element type
#   sm_offset    byte plane: n bytes. BF16 and FP32: sign(x_i) << 7 | the top 7 mantissa
#                bits of x_i; FP16: the low 8 mantissa bits of x_i
#   planes       code planes 0..2 (and, for FP16, bit planes 3..5 holding mantissa bits 8,
#                9 and the sign), plane k at planes_offset + k * plane_stride; each is
#                ceil(n/32) uint32 words, bit j of word w = bit k of code(x_{32w+j})
#   counts       ceil(n/BLOCK) uint32: number of escapes in each block of BLOCK elements
#   low halves   FP32 only: 2n bytes, the low 16 mantissa bits of each value (uint16 LE)
#   escapes      n_escapes bytes: the exponent of every escaped element, in order
#   ---------    the frame ends right after the last escape byte (no tail padding)
#
# A RAW frame (FLAG_RAW) is the header, then the n values verbatim (2n or 4n bytes).
@dataclass(frozen=True)
class Layout:
    """Byte offsets and sizes of every section of a frame of ``n`` elements of ``dtype``.

    >>> lay = Layout.for_count(4096)
    >>> lay.sm_offset, lay.planes_offset, lay.plane_stride, lay.counts_offset, lay.escapes_offset
    (128, 4224, 512, 5760, 5888)
    >>> lay = Layout.for_count(4096, DTYPE_FP32)
    >>> lay.counts_offset, lay.lo_offset, lay.escapes_offset, lay.raw_size
    (5760, 5888, 14080, 16512)
    >>> Layout.for_count(4096, DTYPE_FP16).counts_offset
    7296
    """

    n: int
    sm_offset: int
    planes_offset: int
    plane_words: int  # uint32 words in one code plane
    plane_stride: int  # bytes from one plane to the next (128-aligned)
    counts_offset: int
    n_blocks: int
    escapes_offset: int  # == static_size: everything before it depends on n only
    raw_size: int  # length of a RAW frame of n elements
    dtype: int = DTYPE_BF16
    n_planes: int = 3  # bit planes: 3 code planes (+ 3 raw bit planes for FP16)
    lo_offset: int = 0  # FP32: the low halves (2n bytes); others: == escapes_offset, empty

    @staticmethod
    def for_count(n: int, dtype: int = DTYPE_BF16) -> Layout:
        """The layout of ``n`` elements of ``dtype`` (a pure function of both: made once per
        pair and kept, as every call of a collective asks again)."""
        return _layout_for(operator.index(n), dtype)

    @staticmethod
    def _make(n: int, dtype) -> Layout:
        if n < 0:
            raise ValueError(f"element count must be >= 0, got {n}")
        dtype = dtype_code(dtype)
        n_planes = N_PLANES[dtype]
        sm_offset = HEADER_SIZE
        planes_offset = align(sm_offset + n)
        plane_words = (n + 31) // 32
        plane_stride = align(4 * plane_words)
        counts_offset = planes_offset + n_planes * plane_stride
        n_blocks = (n + BLOCK - 1) // BLOCK
        lo_offset = align(counts_offset + 4 * n_blocks)
        escapes_offset = align(lo_offset + 2 * n) if dtype == DTYPE_FP32 else lo_offset
        return Layout(n, sm_offset, planes_offset, plane_words, plane_stride, counts_offset,
                      n_blocks, escapes_offset, HEADER_SIZE + ITEMSIZE[dtype] * n, dtype,
                      n_planes, lo_offset)

    def plane_offset(self, k: int) -> int:
        """Byte offset of bit plane ``k`` (code planes 0..2; FP16's raw bit planes 3..5)."""
        return self.planes_offset + k * self.plane_stride

    @property
    def lo_size(self) -> int:
        """Bytes of the low-halves section (2n for FP32, else 0)."""
        return 2 * self.n if self.dtype == DTYPE_FP32 else 0

    @property
    def static_size(self) -> int:
        """Bytes of a compressed frame whose size depends on n alone."""
        return self.escapes_offset

    def compressed_len(self, n_escapes: int) -> int:
        """Length of the compressed (non-RAW) frame with ``n_escapes`` escapes."""
        return self.escapes_offset + n_escapes

    def is_raw(self, n_escapes: int) -> bool:
        """The rule every encoder follows: RAW exactly when compressing would grow the frame."""
        return self.compressed_len(n_escapes) > self.raw_size

    def frame_len(self, n_escapes: int) -> int:
        return self.raw_size if self.is_raw(n_escapes) else self.compressed_len(n_escapes)


def max_compressed_size(n: int, dtype=DTYPE_BF16) -> int:
    """Largest frame that compressing ``n`` values of ``dtype`` (BF16 by default) can
    produce, in bytes: the RAW frame, header + the values.

    ``n`` is an integer (a Python or NumPy int): a float such as 1.9 or a string such
    as "12" raises TypeError instead of being rounded or parsed, a negative count ValueError.

    >>> max_compressed_size(1000), max_compressed_size(1000, "float32")
    (2128, 4128)
    """
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise TypeError(f"element count must be an integer, got {type(n).__name__} {n!r}")
    return Layout.for_count(operator.index(n), dtype_code(dtype)).raw_size


@functools.lru_cache(maxsize=4096)
def _layout_for(n: int, dtype) -> Layout:
    return Layout._make(n, dtype)


def static_size(n: int, dtype=DTYPE_BF16) -> int:
    """Size of the static part of a compressed frame of ``n`` elements (header .. counts,
    and FP32's low halves)."""
    return Layout.for_count(int(n), dtype_code(dtype)).static_size


def check_codebook(exponents, dtype: int) -> None:
    """ValueError unless ``exponents`` can be the codebook of a frame of ``dtype``: FP16
    exponents are 5 bits, so its codebook entries lie in 0..31."""
    top = EXPONENT_MAX[dtype]
    if any(int(e) > top for e in exponents):
        raise ValueError(f"a {DTYPE_NAMES[dtype]} codebook holds exponents 0..{top}, "
                         f"got {tuple(int(e) for e in exponents)}")


@dataclass(frozen=True)
class Header:
    """The decoded fixed-size header of a frame."""

    n: int
    n_escapes: int
    frame_len: int
    flags: int
    codebook: tuple[int, ...]
    shape: tuple[int, ...]
    checksum: int = 0
    dtype: int = DTYPE_BF16
    block: int = BLOCK
    version: int = VERSION

    @property
    def raw(self) -> bool:
        return bool(self.flags & FLAG_RAW)

    @property
    def has_checksum(self) -> bool:
        return bool(self.flags & FLAG_CHECKSUM)

    def pack(self) -> bytes:
        """The 128 header bytes, CRC included."""
        if len(self.shape) > MAX_NDIM:
            raise ValueError(f"zipccl frames hold at most {MAX_NDIM} dimensions, got {len(self.shape)}")
        shape8 = tuple(self.shape) + (0,) * (MAX_NDIM - len(self.shape))
        body = _HEADER_STRUCT.pack(MAGIC, self.version, self.dtype, self.flags, self.n,
                                   self.n_escapes, self.frame_len, self.checksum,
                                   bytes(self.codebook), len(self.shape), self.block, 0,
                                   *shape8, 0, 0)
        crc = zlib.crc32(body[:HEADER_SIZE - 4])
        return body[:HEADER_SIZE - 4] + struct.pack("<I", crc)


def pack_header(header: Header) -> np.ndarray:
    """The header as a uint8 array of HEADER_SIZE bytes."""
    return np.frombuffer(header.pack(), dtype=np.uint8).copy()


def parse_header(buf, buffer_len: int | None = None) -> Header:
    """Read and validate the header of ``buf`` (any bytes-like / uint8 array).

    Checks magic, version, dtype, flags, header CRC, shape, codebook (FP16: entries
    0..31) and every length against the buffer size. Raises ValueError with a message
    naming what is wrong. It does not look at the payload; the decoders check the
    escape counts and checksum.
    ``buffer_len``: the length of the whole buffer when ``buf`` holds only its first
    bytes (at least the 128 header bytes; a device frame's header read to the host).

    >>> h = parse_header(pack_header(Header(n=3, n_escapes=0, frame_len=HEADER_SIZE + 6,
    ...                                     flags=FLAG_RAW, codebook=tuple(range(7)), shape=(3,))),
    ...                  buffer_len=HEADER_SIZE + 6)
    >>> h.n, h.raw
    (3, True)
    """
    mv = memoryview(np.ascontiguousarray(np.frombuffer(buf, dtype=np.uint8)))
    total = len(mv) if buffer_len is None else int(buffer_len)
    if min(total, len(mv)) < HEADER_SIZE:
        raise ValueError(f"not a zipccl frame: {total} bytes is shorter than the "
                         f"{HEADER_SIZE}-byte header")
    raw = bytes(mv[:HEADER_SIZE])
    (magic, version, dtype, flags, n, n_esc, frame_len, checksum, codebook, ndim, block,
     reserved, *rest) = _HEADER_STRUCT.unpack(raw)
    shape8, reserved2, crc = rest[:8], rest[8], rest[9]
    if magic != MAGIC:
        raise ValueError(f"not a zipccl frame: magic is {magic!r}, expected {MAGIC!r}")
    if crc != zlib.crc32(raw[:HEADER_SIZE - 4]):
        raise ValueError("corrupted zipccl frame: header checksum mismatch")
    if version != VERSION:
        raise ValueError(f"unsupported zipccl frame version {version} (this build reads {VERSION})")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unsupported zipccl frame dtype code {dtype}")
    if flags & ~KNOWN_FLAGS:
        raise ValueError(f"corrupted zipccl frame: unknown flag bits 0x{flags & ~KNOWN_FLAGS:x}")
    if block != BLOCK:
        raise ValueError(f"corrupted zipccl frame: block size {block}, expected {BLOCK}")
    if ndim > MAX_NDIM or reserved or reserved2 or any(shape8[ndim:]):
        raise ValueError("corrupted zipccl frame: bad shape fields")
    shape = tuple(int(d) for d in shape8[:ndim])
    if ndim and int(np.prod(np.array(shape, dtype=object))) != n:
        raise ValueError(f"corrupted zipccl frame: shape {shape} does not hold {n} elements")
    if ndim == 0 and n != 1:
        raise ValueError(f"corrupted zipccl frame: a 0-d frame must hold 1 element, not {n}")
    cb = tuple(codebook)
    if len(set(cb)) != CODEBOOK_SIZE:
        raise ValueError(f"corrupted zipccl frame: codebook {cb} has repeated entries")
    if max(cb) > EXPONENT_MAX[dtype]:
        raise ValueError(f"corrupted zipccl frame: codebook {cb} holds exponents above "
                         f"{EXPONENT_MAX[dtype]}, the largest of {DTYPE_NAMES[dtype]}")
    lay = Layout.for_count(n, dtype)
    raw_frame = bool(flags & FLAG_RAW)
    if raw_frame:
        expected = lay.raw_size
        if n_esc != 0:
            raise ValueError("corrupted zipccl frame: a RAW frame lists escapes")
    else:
        if n_esc > n:
            raise ValueError(f"corrupted zipccl frame: {n_esc} escapes for {n} elements")
        if lay.is_raw(n_esc):
            raise ValueError("corrupted zipccl frame: compressed frame longer than RAW")
        expected = lay.compressed_len(n_esc)
    if frame_len != expected:
        raise ValueError(f"corrupted zipccl frame: header says {frame_len} bytes, "
                         f"layout needs {expected}")
    if total < frame_len:
        raise ValueError(f"truncated zipccl frame: {total} bytes, header says {frame_len}")
    if not flags & FLAG_CHECKSUM and checksum:
        raise ValueError("corrupted zipccl frame: checksum present without its flag")
    return Header(n=n, n_escapes=n_esc, frame_len=frame_len, flags=flags, codebook=cb,
                  shape=shape, checksum=checksum, dtype=dtype, block=block, version=version)


def check_escape_counts(seen: np.ndarray, counts: np.ndarray, n_escapes: int) -> None:
    """The decoders' escape rule: each block's stored count equals the zero codes seen in it,
    and the counts add up to the header's ``n_escapes``. Raises ValueError otherwise."""
    seen = np.asarray(seen, dtype=np.int64)
    counts = np.asarray(counts).astype(np.int64)
    if not np.array_equal(seen, counts):
        bad = int(np.flatnonzero(seen != counts)[0])
        raise ValueError(f"corrupted zipccl frame: block {bad} has {int(seen[bad])} escape "
                         f"codes but its count says {int(counts[bad])}")
    if int(seen.sum()) != n_escapes:
        raise ValueError("corrupted zipccl frame: escape counts do not add up to the header's")


def payload_checksum(frame: np.ndarray, frame_len: int) -> int:
    """Checksum of frame bytes [HEADER_SIZE, frame_len), the reference definition.

    The payload is zero-padded to a multiple of 4 bytes and read as little-endian
    uint32 words w_i (i = 0 is the word at HEADER_SIZE); the checksum is
    sum_i w_i * (2i + 1) mod 2**64. Any single-bit flip changes it (the weight is odd),
    and it splits into independent per-range partial sums, so a GPU can compute it
    in parallel and still be deterministic.
    """
    payload = np.asarray(frame[HEADER_SIZE:frame_len], dtype=np.uint8)
    pad = (-len(payload)) % 4
    if pad:
        payload = np.concatenate([payload, np.zeros(pad, np.uint8)])
    words = payload.view("<u4").astype(np.uint64)
    weights = 2 * np.arange(len(words), dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.sum(words * weights, dtype=np.uint64))


def check_escape_values(escapes: np.ndarray, dtype: int) -> None:
    """The decoders' rule for escape bytes: each holds an exponent of ``dtype`` (FP16: 0..31).
    Raises ValueError naming the first byte that does not."""
    top = EXPONENT_MAX[dtype]
    esc = np.asarray(escapes)
    if top < 255 and esc.size and int(esc.max()) > top:
        bad = int(esc[np.flatnonzero(esc > top)[0]])
        raise ValueError(f"corrupted zipccl frame: escape byte {bad} is not a "
                         f"{DTYPE_NAMES[dtype]} exponent (0..{top})")
