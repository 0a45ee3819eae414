"""``Core.replay`` without a GPU: where zipccl records its own graph of a kept call, and what
it leaves behind. The front end records on a capture stream of its own (the call's may be the
legacy default stream, which cannot be captured); the engine works on that stream during the
recording and on the call's own stream again after it, whether the recording succeeds or
fails; a failed recording runs the call as it is, once, on the call's stream. The real capture
and replay run in ``tests/test_graph_gpu.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zipccl import format as fmt
from zipccl.comm import core as core_mod
from zipccl.comm.base import ExchangeStats
from zipccl.comm.call import Route
from zipccl.comm.core import Core
from zipccl.comm.policy import Policy


class _Engine:
    def __init__(self):
        self.streams: list = []

    def set_stream(self, stream) -> None:
        self.streams.append(stream)

    def held(self) -> list:
        return []


class _Channel:
    """What ``RecordingChannel`` and ``Core.replay`` ask of a slot channel."""

    raw = False

    def __init__(self):
        self.launched: list = []

    def launch_graph(self, op, uniform, sites, launch):
        self.launched.append(op)
        launch()
        return None


class _Front:
    def __init__(self):
        self.launches = 0

    def graph(self, call, ctx, record):
        record("capture stream")  # raises where the recorded call raises
        return self._launch

    def _launch(self) -> None:
        self.launches += 1


@pytest.fixture
def kept(monkeypatch):
    """A kept all-gather on the call's stream "call stream", its runs logged as (route stream,
    engine stream, channel type)."""
    eng, ch = _Engine(), _Channel()
    call = SimpleNamespace(op="all_gather", stream="call stream", send=SimpleNamespace(code=fmt.DTYPE_BF16))
    route = Route(eng, SimpleNamespace(capturable=True, name="nccl"), ch, "call stream")
    plan = SimpleNamespace(call=call, route=route, graph=None)
    runs: list = []
    fail = []

    def run(c, r, compress):
        runs.append((r.stream, eng.streams[-1] if eng.streams else None, type(r.channel).__name__))
        if fail and r.stream == "capture stream":
            raise RuntimeError("the capture was invalidated")
        return ExchangeStats(6, 8)

    monkeypatch.setitem(core_mod.COLLECTIVES, "all_gather", SimpleNamespace(run=run))
    return SimpleNamespace(eng=eng, ch=ch, plan=plan, runs=runs, fail=fail, core=Core(Policy("always")))


def test_a_kept_call_is_recorded_on_the_front_ends_stream_and_launched(kept):
    front = _Front()
    kept.core.replay(front, kept.plan, None)
    assert kept.runs == [("capture stream", "capture stream", "RecordingChannel")]
    assert kept.eng.streams == ["capture stream", "call stream"]  # the engine's own stream again
    assert kept.plan.graph and kept.plan.graph[0] == front._launch
    assert front.launches == 1 and kept.ch.launched == ["all_gather"]
    assert kept.core.stats.compressed_calls == 1 and kept.core.stats.wire_bytes == 6


def test_a_failed_recording_runs_the_call_as_it_is_on_its_own_stream(kept):
    kept.fail.append(True)
    front = _Front()
    with pytest.warns(RuntimeWarning, match="recording the call as a CUDA graph failed"):
        kept.core.replay(front, kept.plan, None)
    assert kept.runs == [("capture stream", "capture stream", "RecordingChannel"),
                         ("call stream", "call stream", "_Channel")]
    assert kept.eng.streams == ["capture stream", "call stream"]
    assert kept.plan.graph is False and front.launches == 0  # never tried again
    assert kept.core.stats.compressed_calls == 1
