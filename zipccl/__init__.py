"""zipccl: lossless compressed collectives for BF16 LLM training traffic.

The public API is this module's names; everything else is an implementation
detail. Importing zipccl never touches a GPU.
"""

from .api import compress, decompress, max_compressed_size
from .codebook import Codebook

__version__ = "0.1.0"

__all__ = ["compress", "decompress", "max_compressed_size", "Codebook", "__version__"]


def __getattr__(name):
    # The communicator pulls in mpi4py; load it only when asked for.
    if name == "Communicator":
        from .comm.communicator import Communicator
        return Communicator
    raise AttributeError(f"module 'zipccl' has no attribute {name!r}")
