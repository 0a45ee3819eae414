"""What the collectives and the slot exchange share: the error every rank raises, the element
types a collective moves, shard counts and the pipeline rounds a message is cut into.

It sits below both (``collectives`` and ``exchange`` import it), so neither needs the other's
module to say what a round or a byte count is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import format as fmt


class CollectiveError(ValueError):
    """A collective call failed (where and on which ranks it is raised: ``agreement``'s
    module docstring and docs/COLLECTIVES.md)."""


def value_code(a) -> int:
    """The frame element type (``format.DTYPE_*``) of a collective's 1-D array (NumPy or
    CuPy): uint16 BF16 bit patterns, float16 FP16, float32 FP32.

    >>> value_code(np.zeros(1, np.uint16)), value_code(np.zeros(1, np.float32))
    (1, 2)
    """
    dt = np.dtype(a.dtype)
    if dt == np.uint16:
        return fmt.DTYPE_BF16
    if dt == np.float32:
        return fmt.DTYPE_FP32
    if dt == np.float16:
        return fmt.DTYPE_FP16
    raise TypeError(f"zipccl collectives move uint16 (BF16 bits), float32 or float16 arrays; "
                    f"got {dt}")


def value_patterns(values):
    """The bit patterns of a collective's array, as the codecs read them: float32 as uint32,
    float16 as uint16 (BF16 arrives as uint16 already). A view, NumPy or CuPy."""
    if values.dtype == np.float32:
        return values.view(np.uint32)
    if values.dtype == np.float16:
        return values.view(np.uint16)
    return values


def chunk_elements(chunk: int, itemsize: int) -> int:
    """Elements per pipeline round for values of ``itemsize`` bytes, given ``chunk`` BF16
    elements per round (the same bytes, whole escape blocks, at least one); 0 stays 0 (one
    round).

    >>> chunk_elements(8192, 2), chunk_elements(8192, 4), chunk_elements(4096, 4), chunk_elements(0, 4)
    (8192, 4096, 4096, 0)
    """
    if not chunk or itemsize == 2:
        return chunk
    return max(fmt.BLOCK, 2 * chunk // itemsize // fmt.BLOCK * fmt.BLOCK)


def split_counts(n: int, p: int) -> list[int]:
    """Element counts of ``p`` near-equal shards of ``n`` (the first n % p get one more).

    >>> split_counts(10, 4)
    [3, 3, 2, 2]
    """
    return [n // p + (1 if r < n % p else 0) for r in range(p)]


def offsets(counts: Sequence[int]) -> list[int]:
    """Exclusive prefix sum: where each of ``counts`` starts when packed."""
    out, pos = [], 0
    for c in counts:
        out.append(pos)
        pos += int(c)
    return out


@dataclass
class ExchangeStats:
    """Bytes one rank sent in an exchange: on the wire vs what the raw messages hold."""

    wire_bytes: int = 0
    raw_bytes: int = 0

    def add(self, other: ExchangeStats) -> None:
        self.wire_bytes += other.wire_bytes
        self.raw_bytes += other.raw_bytes


def chunk_count(max_count: int, chunk: int) -> int:
    """Number of pipeline rounds for messages of at most ``max_count`` elements (>= 1).

    >>> chunk_count(0, 4096), chunk_count(4096, 4096), chunk_count(4097, 4096)
    (1, 1, 2)
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0 elements, got {chunk}")
    return max(1, -(-int(max_count) // int(chunk)))


def piece(count: int, chunk: int, k: int) -> tuple[int, int]:
    """(first element, element count) of round ``k``'s piece of a message of ``count`` elements."""
    lo = k * chunk
    return lo, max(0, min(chunk, count - lo))
