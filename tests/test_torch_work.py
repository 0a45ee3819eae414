"""The ``Work`` of a compressed CUDA call raises the slot channel's sticky error at ``wait()``.

Runs on the CPU: a stand-in channel whose error word is set, around a completed torch Work.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("torch_installed")  # missing torch: each test fails saying so


class _Channel:
    def __init__(self, error: str | None):
        self.error = error
        self.checked = 0

    def check(self, op: str) -> None:
        from zipccl.comm import CollectiveError

        self.checked += 1
        if self.error:
            raise CollectiveError(f"zipccl {op}: {self.error}")


def test_wait_raises_the_sticky_error_and_keeps_the_future():
    import torch

    from zipccl.comm import CollectiveError
    from zipccl.torch.functional import _CheckedWork, _done_work

    t = torch.arange(4.0)
    ok = _CheckedWork(_done_work(t), _Channel(None))
    assert ok.wait() and ok.is_completed() and ok.get_future().wait()[0] is t
    bad = _CheckedWork(_done_work(t), _Channel("corrupted zipccl frame"))
    with pytest.raises(CollectiveError, match="wait: corrupted"):
        bad.wait()
