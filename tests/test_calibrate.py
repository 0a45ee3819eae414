"""The one calibration harness (``comm.calibrate.measure``) on a front end with a known clock.

Every call advances a fake clock by a known cost; the other rank is twice as slow. The profile
must hold the slowest rank's least time of each measurement (the first timed run of every call
is made 5x slow), the native fits, the fixed costs from one-block rounds, and the codec rates.
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import pytest

from zipccl import format as fmt
from zipccl.comm import calibrate

ALPHA, BETA = 20e-6, 10.0  # native: s, GB/s
FIXED, ROUND = 300e-6, 50e-6  # compressed: per call, per round of one block
ENC, DEC, RED, LAUNCH = 40.0, 80.0, 160.0, 5e-6  # codec GB/s, seconds per launch
REPEAT = 3
SLOWER = 2.0  # the other rank's times (and ratio) against this one's


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def front_end(clock: Clock, *, rounds: bool, codec_points: int, log: list) -> calibrate.FrontEnd:
    in_rounds = [False]

    def costly(seconds: float, warm: int):
        """A call costing ``seconds``, 5x on its first timed run (after ``warm`` untimed calls)."""
        k = [0]

        def call():
            clock.now += seconds * (5 if warm <= k[0] < warm + REPEAT else 1)
            k[0] += 1
        return call

    @contextmanager
    def make_call(compressed: bool, op: str, n: int):
        log.append((compressed, op, n, in_rounds[0]))
        if not compressed:
            s = ALPHA + 2 * n / (BETA * 1e9)
        elif in_rounds[0]:
            s = FIXED + (n // fmt.BLOCK) * ROUND
        else:
            s = FIXED + ROUND + 2 * n / (ENC * 1e9)
        yield costly(s, warm=2), lambda: 2 * n

    @contextmanager
    def one_block_rounds():
        in_rounds[0] = True
        try:
            yield
        finally:
            in_rounds[0] = False

    def codec(n: int):
        def c(gbps: float, nbytes: int):
            return nbytes, costly(LAUNCH + nbytes / (gbps * 1e9), warm=1)
        return {"encode": c(ENC, 2 * n), "decode": c(DEC, 2 * n), "reduce": c(RED, 4 * n)}, 0.35

    return calibrate.FrontEnd(
        "fake", 2, fmt.BLOCK * 64, False, barrier=lambda: None,
        slowest=lambda values: [SLOWER * v for v in values], sync=lambda: None,
        make_call=make_call, codec=codec, codec_points=codec_points,
        one_block_rounds=one_block_rounds if rounds else None)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(calibrate, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


SIZES = (1 << 20, 4 << 20, 16 << 20)


def test_measure_keeps_the_slowest_ranks_least_time_and_fits(clock):
    log: list = []
    prof = calibrate.measure(front_end(clock, rounds=True, codec_points=2, log=log), SIZES,
                             ops=("all_gather",), repeat=REPEAT)
    pts = prof.measured["all_gather"]
    assert [b for b, _ in pts["native"]] == list(SIZES)  # the policy's bytes, as reported
    for b, t in pts["native"]:
        assert t == pytest.approx(SLOWER * (ALPHA + b / (BETA * 1e9)))
    alpha, beta = prof.native["all_gather"]
    assert alpha == pytest.approx(SLOWER * ALPHA) and beta == pytest.approx(BETA / SLOWER)
    assert prof.round_s["all_gather"] == pytest.approx(SLOWER * ROUND)
    assert prof.fixed_s["all_gather"] == pytest.approx(SLOWER * FIXED)
    # one round and 16 rounds of one block, compressed, inside one_block_rounds
    assert log[-2:] == [(True, "all_gather", fmt.BLOCK, True), (True, "all_gather", 16 * fmt.BLOCK, True)]
    for name, gbps in (("encode", ENC), ("decode", DEC), ("reduce", RED)):
        assert prof.codec[f"{name}_gbps"] == pytest.approx(gbps / SLOWER)  # two sizes: the slope
    assert prof.codec["ratio"] == pytest.approx(SLOWER * 0.35)
    assert prof.best_of == calibrate.CALIBRATION_BEST_OF and prof.world == 2 and not prof.overlap
    assert prof.model("all_gather") is not None


def test_measure_without_fixed_cost_step_and_one_codec_size(clock):
    log: list = []
    prof = calibrate.measure(front_end(clock, rounds=False, codec_points=1, log=log), SIZES,
                             ops=("all_gather", "all_reduce"), repeat=REPEAT)
    assert not any(r for *_, r in log) and len(log) == 2 * 2 * len(SIZES)  # no one-block rounds
    assert prof.round_s == prof.fixed_s == {"all_gather": 0.0, "all_reduce": 0.0}
    n = max(SIZES) // 2  # the largest message only: bytes / time, launch included
    assert prof.codec["encode_gbps"] == pytest.approx(2 * n / (SLOWER * (LAUNCH + 2 * n / (ENC * 1e9))) / 1e9)


def test_an_op_without_signal_keeps_the_threshold_rule(clock):
    """One size: no native fit for the op, and no fixed costs measured for it."""
    log: list = []
    prof = calibrate.measure(front_end(clock, rounds=True, codec_points=1, log=log), (1 << 20,),
                             ops=("all_gather",), repeat=REPEAT)
    assert prof.native == {} and prof.round_s == {} and prof.fixed_s == {}
    assert prof.model("all_gather") is None and len(log) == 2
    assert prof.measured["all_gather"]["native"][0][0] == 1 << 20
