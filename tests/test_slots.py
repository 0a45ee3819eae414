"""The capacity rule (zipccl/comm/capacity.py): the same on every rank, cold start, override,
adaptation, decay, the RAW-size cap, argument checks; and the measuring script on a subset."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from zipccl import format as fmt
from zipccl.comm.capacity import Call, CapacityConfig, CapacityRule, escape_room, replay
from zipccl.format.slot import SLOT_HEADER, region_bytes, slot_bytes, tail_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 1 << 20


def _observations(seed: int, count: int = 300):
    """A seeded sequence of (site, n, code, max_escapes) over a few sites and sizes."""
    rng = np.random.default_rng(seed)
    sites = [("all_gather", 0), ("reduce_scatter", 1), "tag"]
    out = []
    for _ in range(count):
        n = int(rng.choice([0, 100, 4096, 5000, N]))
        code = int(rng.choice([fmt.DTYPE_BF16, fmt.DTYPE_FP32, fmt.DTYPE_FP16]))
        out.append((sites[rng.integers(3)], n, code, int(rng.integers(0, n + 1) * rng.random() ** 4)))
    return out


def _drive(rule: CapacityRule, obs) -> list[int]:
    caps = []
    for site, n, code, e in obs:
        caps.append(rule.capacity(site, n, code))
        rule.observe(site, n, code, e)
    return caps


@pytest.mark.parametrize("cfg", [CapacityConfig(), CapacityConfig(window=1, decay=1.0),
                                 CapacityConfig(grid=512, margin=1.1, pad=3)])
def test_same_observations_same_capacities(cfg):
    obs = _observations(1)
    a, b = _drive(CapacityRule(cfg), obs), _drive(CapacityRule(cfg), obs)
    assert a == b
    assert len(set(a)) > 5  # the sequence exercises the rule, not one constant
    other = CapacityRule(cfg)
    _drive(other, obs)
    other.reset()
    assert _drive(other, obs) == a  # reset forgets everything


def test_cold_start_and_sites_are_independent():
    rule = CapacityRule(cold=0.125)
    assert rule.capacity("a", N) == N // 8
    assert rule.level("a") is None
    rule.observe("a", N, max_escapes=N // 100)
    assert rule.capacity("a", N) < N // 8
    assert rule.capacity("b", N) == N // 8  # another site is still cold
    assert CapacityRule(cold=0.0).capacity("a", N) == 0


def test_overrides_ignore_observations():
    for rule, want in ((CapacityRule(fraction=0.0625), N // 16), (CapacityRule(nbytes=777), 777)):
        assert rule.capacity("s", N) == want
        rule.observe("s", N, max_escapes=N // 2)
        assert rule.capacity("s", N) == want
        assert rule.level("s") is None
    assert CapacityRule(nbytes=1 << 30).capacity("s", 4096) == escape_room(4096)


def test_adaptive_level_is_on_the_grid_and_covers_the_observation():
    rule = CapacityRule(grid=128, margin=1.25, pad=1, window=4)
    rule.observe("s", N, max_escapes=24_000)  # ceil(2.93 steps) = 3 -> ceil(3.75) + 1 = 5 steps
    assert rule.level("s") == 5 / 128
    assert rule.capacity("s", N) == 5 * N // 128
    for e in range(0, N // 4, 9973):  # a frame of the observed rate always fits next time
        r = CapacityRule()
        r.observe("s", N, max_escapes=e)
        assert r.capacity("s", N) >= e
        assert r.capacity("s", N) % (N // 128) == 0
        assert r.capacity("s", 1000) == -(-round(r.level("s") * 128) * 1000 // 128)  # any n


def test_burst_is_held_for_the_window_then_decays_slowly():
    rule = CapacityRule(window=4, decay=0.25, margin=1.0, pad=0, grid=128)
    steady, burst = N * 4 // 128, N * 40 // 128
    rule.observe("s", N, max_escapes=steady)
    assert rule.capacity("s", N) == steady
    rule.observe("s", N, max_escapes=burst)
    assert rule.capacity("s", N) == burst  # rises at once
    caps = []
    for _ in range(20):
        rule.observe("s", N, max_escapes=steady)
        caps.append(rule.capacity("s", N))
    assert caps[:3] == [burst] * 3  # the burst is still in the window
    falling = caps[3:]
    assert all(a > b for a, b in zip(falling[:-1], falling[1:], strict=True) if a > steady)
    assert falling[0] > steady and caps[-1] == steady  # slowly, but all the way
    fast = CapacityRule(window=4, decay=1.0, margin=1.0, pad=0)
    fast.observe("s", N, max_escapes=burst)
    for _ in range(4):
        fast.observe("s", N, max_escapes=steady)
    assert fast.capacity("s", N) == steady  # decay 1: gone once it leaves the window


@pytest.mark.parametrize("code", [fmt.DTYPE_BF16, fmt.DTYPE_FP32, fmt.DTYPE_FP16])
def test_slot_never_exceeds_its_region_and_a_full_capacity_never_spills(code):
    rule = CapacityRule(cold=1.0)
    for n in [1, 31, 100, 1000, 4095, 4096, 4097, 65536, 100_003]:
        cap = rule.capacity(("s", n), n, code)
        assert cap == escape_room(n, code)
        slot = slot_bytes(n, code, cap)
        assert slot <= region_bytes(n, code)
        lay = fmt.Layout.for_count(n, code)
        for esc in (0, cap, n):  # up to every value escaping (a RAW frame)
            assert tail_bytes(lay.frame_len(esc), slot) == 0
        rule.observe(("s", n), n, code, n)  # an all-escape observation saturates at the cap
        assert rule.capacity(("s", n), n, code) == escape_room(n, code)
        assert rule.slot_bytes(("s", n), n, code) <= region_bytes(n, code)


def test_replay_counts_spills_and_bytes():
    n = 1 << 16
    lay = fmt.Layout.for_count(n)
    t = replay(CapacityRule(fraction=0.0625), [Call("g", [(n, n // 8), (n, n // 32)])])
    s = t.summary()
    slot = slot_bytes(n, fmt.DTYPE_BF16, n // 16)
    assert (t.frames, t.spills, t.slot_bytes) == (2, 1, 2 * slot)
    assert t.tail_bytes == lay.frame_len(n // 8) - (slot - SLOT_HEADER)
    assert s["spill_rate"] == 0.5 and s["spilled_raw_fraction"] == 0.5
    assert s["wire_ratio"] == (t.slot_bytes + t.tail_bytes) / (4 * n)
    adaptive = replay(CapacityRule(), [Call("g", [(n, n // 8)])] * 3)
    assert (adaptive.spills, adaptive.cold_frames, adaptive.cold_spills) == (0, 1, 0)
    assert adaptive.summary()["steady_slot_ratio"] < 0.78


@pytest.mark.parametrize("settings, match", [
    (dict(cold=1.5), "cold"), (dict(fraction=-0.1), "fraction"), (dict(nbytes=-1), "nbytes"),
    (dict(nbytes=1.5), "nbytes"), (dict(fraction=0.1, nbytes=10), "one override"),
    (dict(window=0), "window"), (dict(grid=0), "grid"), (dict(pad=-1), "pad"),
    (dict(margin=0.9), "margin"), (dict(margin=float("nan")), "margin"), (dict(decay=0), "decay"),
    (dict(decay=1.5), "decay"), (dict(cold=True), "cold"), (dict(window=2.0), "window"),
])
def test_bad_settings_are_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        CapacityConfig(**settings)


def test_bad_calls_are_refused():
    rule = CapacityRule()
    with pytest.raises(ValueError, match="n must be"):
        rule.capacity("s", -1)
    with pytest.raises(ValueError, match="n must be"):
        rule.capacity("s", 2.5)
    with pytest.raises(ValueError, match="exceeds"):
        rule.observe("s", 10, max_escapes=11)
    with pytest.raises(ValueError, match="max_escapes"):
        rule.observe("s", 10, max_escapes=-1)
    with pytest.raises(ValueError):
        rule.observe("s", 10, code=99, max_escapes=1)
    with pytest.raises(TypeError, match="not both"):
        CapacityRule(CapacityConfig(), cold=0.5)


def test_script_on_a_subset(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import slot_capacity

    out = tmp_path / "sc.jsonl"
    recs = slot_capacity.main(["--traffic", "captured,fsdp", "--steps", "0,10",
                               "--rules", "fixed 6.25%,adaptive", "--out", str(out)])
    saved = [json.loads(line) for line in out.read_text().splitlines()]
    assert saved == recs and len(recs) == 2 * (3 + 2 + 3)  # captured x3, fsdp x2, fsdp_tensor x3
    for r in recs:
        assert r["rule_config"] == slot_capacity.RULES[r["rule"]].__dict__
        assert r["frames"] > 0 and r["machine"].endswith("CPU dev box")
        assert r["wire_ratio"] == (r["slot_bytes"] + r["tail_bytes"]) / r["raw_bytes"]
    never = replay(CapacityRule(fraction=1.0),
                   slot_capacity.captured_calls(slot_capacity.load(slot_capacity.RESULTS
                                                                  / "training_capture.jsonl"), "default"))
    assert never.spills == 0 and never.frames > 500
