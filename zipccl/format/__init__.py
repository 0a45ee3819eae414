"""Wire formats, the bottom layer: what goes over a link, byte for byte.

- ``frame``: the zipccl frame (header, sections, 128-byte alignment, sizes); its names are
  this package's own (``from zipccl import format as fmt; fmt.Layout``);
- ``slot``: the slot header a collective sends before each frame, region and slot sizes,
  op codes;
- ``errors``: every error bit a kernel or a peer can raise, with its text.

Nothing here imports another zipccl module: codecs, kernels and collectives all read their
offsets and bits from here. ``docs/FORMAT.md`` describes the same layouts in prose.
"""

from .frame import *  # noqa: F403
from .frame import __all__  # noqa: F401
