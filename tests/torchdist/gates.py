"""The skips torch's generic distributed suite makes by a backend's name, not by what it can do.

``DistributedTest._DistTestBase`` runs some tests for gloo (or mpi / nccl / gloo) alone, checking
``BACKEND`` by name when the class is defined: any other backend, zipccl included, is skipped
with one of these reasons. Such a test says nothing about the backend, so comparisons with gloo
leave it out (docs/TORCH.md names each).
"""

GATED_BY_NAME = (
    "to be one of {'gloo'}",  # require_backend_is_available({"gloo"})
    "only supported on mpi, nccl and gloo",  # get_future
    "Only gloo backend supports timeouts",
    "GLOO Batch Send Recv CPU",
    "Only Gloo backend supports sparse all reduce",
)


def gated(status: str, reason: str) -> bool:
    """Whether a test ended ``status`` with ``reason`` only because of the backend's name."""
    return status == "skip" and any(g in reason for g in GATED_BY_NAME)
