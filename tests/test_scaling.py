"""The scaling projection: calibration recovers known parameters, projections have the right limits."""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from zipccl import costmodel as cm
from zipccl import scaling as sc
from zipccl.metrics import busbw, nccl_tests_size

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # experiments/records.py, as the scripts and figures import it
from experiments import records as rec  # noqa: E402

MIB = 1 << 20
SIZES = (1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB)


def known() -> sc.Calibration:
    """Ground truth with a different alpha / B for every op and link, so a mix-up shows."""
    links = {"nvlink": cm.Link("nvlink", 260.0, 30e-6,
                               per_op={"all_gather": 260.0, "reduce_scatter": 250.0, "all_to_all": 280.0,
                                       "all_reduce": 300.0},
                               per_op_latency={"all_gather": 30e-6, "reduce_scatter": 32e-6,
                                               "all_to_all": 45e-6, "all_reduce": 16e-6}),
             "shm": cm.Link("shm", 25.0, 40e-6,
                            per_op={"all_gather": 25.0, "reduce_scatter": 25.2, "all_to_all": 23.0,
                                    "all_reduce": 28.7},
                            per_op_latency={"all_gather": 38e-6, "reduce_scatter": 35e-6,
                                            "all_to_all": 42e-6, "all_reduce": 27e-6})}
    codec = cm.Codec("zipccl", 1500.0, 1500.0, 0.7, 0.6e-3, 850.0)
    return sc.Calibration(links, {k: cm.sendrecv_wire(v) for k, v in links.items()}, codec,
                          {"nvlink": 0.6986, "shm": 0.6990})


def records(cal: sc.Calibration, run: str = "r1") -> list[dict]:
    """2-rank collectives records whose times are exactly the model's."""
    out = []
    for link in cal.links:
        for op in cm.OPS:
            for m in SIZES:
                t = sc.ring_times(op, m, 2, cal, link)
                for v, s in (("nccl", t.native_s), ("always", t.compressed_s)):
                    nb = nccl_tests_size(op, m, 2)
                    out.append({"bench": "collectives", "run": run, "link": link, "op": op, "variant": v,
                                "per_rank_bytes": m, "nranks": 2, "time_s": s,
                                "busbw_gbps": busbw(op, nb, s, 2),
                                **({"compressed": True, "wire_ratio": cal.ratio[link]} if v != "nccl"
                                   else {})})
    return out


def test_calibration_recovers_links_codec_and_ratio():
    truth = known()
    cal = rec.calibrate(records(truth))
    for name, link in truth.links.items():
        got = cal.links[name]
        for op in cm.OPS:
            assert got.bw(op) == pytest.approx(link.bw(op), rel=1e-9)
            assert got.lat(op) == pytest.approx(link.lat(op), rel=1e-6)
        assert cal.wires[name].bandwidth == pytest.approx(link.bw("all_to_all"), rel=1e-9)
        assert cal.ratio[name] == truth.ratio[name]
    assert cal.codec.overhead == pytest.approx(truth.codec.overhead, rel=1e-6)
    assert cal.codec.encode_gbps == pytest.approx(1500.0, rel=1e-6)
    assert cal.codec.decode_gbps == pytest.approx(1500.0, rel=1e-6)
    assert cal.codec.reduce_gbps == pytest.approx(850.0, rel=1e-6)
    assert (cal.overlap, cal.chunks) == (0.0, 1)
    assert cal.source["fit_max_abs_rel_err"] < 1e-9


def test_calibration_fits_overlap_when_codec_throughput_is_measured():
    truth = replace(known(), codec=cm.Codec("zipccl", 1800.0, 2200.0, 0.7, 0.5e-3, 900.0), overlap=0.4)
    codec_recs = [{"bench": "codec_gpu", "variant": "v2", "mode": "graph", "op": op,
                   "input_bytes": m, "seconds": 5e-6 + m / (g * 1e9)}
                  for op, g in (("encode", 1800.0), ("decode", 2200.0)) for m in SIZES]
    cal = rec.calibrate(records(truth), codec_recs)
    assert cal.codec.encode_gbps == pytest.approx(1800.0, rel=1e-9)
    assert cal.codec.decode_gbps == pytest.approx(2200.0, rel=1e-9)
    assert cal.overlap == pytest.approx(0.4, rel=1e-6)
    assert cal.codec.overhead == pytest.approx(0.5e-3, rel=1e-6)
    assert cal.codec.reduce_gbps == pytest.approx(900.0, rel=1e-6)


def test_codec_fit_is_the_same_bits_when_the_arithmetic_differs_in_its_last_bits():
    """The least-squares fit is rounded to ``FIT_DIGITS`` digits, so the committed projection is
    rebuilt to the same bytes on machines whose BLAS / SIMD paths round differently: times that
    differ by one ulp (a stand-in for that) give the same codec, overlap and diagnostics."""
    truth = known()
    timed = [sc.Timed(t, op, m, 2, truth.zipccl_time(op, m, 2, t) * (1 + 0.01 * math.sin(i)))
             for i, (t, op, m) in enumerate((t, op, m) for t in truth.links for op in cm.OPS
                                            for m in SIZES)]
    nudged = [replace(t, seconds=math.nextafter(t.seconds, 1.0)) for t in timed]
    fits = [sc.fit_codec(ts, truth.wires, truth.ratio, codec_known=truth.codec) for ts in (timed, nudged)]
    assert fits[0] == fits[1]
    codec, overlap, _ = fits[0]
    assert all(float(f"{v:.{sc.FIT_DIGITS}g}") == v for v in (codec.overhead, overlap))


def test_calibration_uses_each_links_newest_run():
    old = records(replace(known(), codec=replace(known().codec, overhead=5e-3)), run="")
    new = records(known(), run="2026-12-01T00:00:00")
    cal = rec.calibrate(old + new)
    assert cal.codec.overhead == pytest.approx(0.6e-3, rel=1e-6)
    checks = rec.check(cal, old + new, rec.select_latest(old + new))
    assert all(c["in_fit"] == (c["run"] is not None) for c in checks)
    assert all(abs(c["rel_err"]) < 1e-9 for c in checks if c["in_fit"])
    assert any(c["rel_err"] < -0.1 for c in checks if not c["in_fit"])  # the old, slower library


@pytest.mark.parametrize("link", ["nvlink", "shm"])
def test_two_rank_prediction_is_the_alpha_beta_formula(link):
    cal = known()
    lk, w, c, r = cal.links[link], cal.wires[link], cal.codec, cal.ratio[link]
    a, b, e = w.latency, w.bandwidth * 1e9, c.encode_gbps * 1e9
    o, red = c.overhead, c.reduce_gbps * 1e9
    m = 256 * MIB

    def nat(op, x, steps=1):  # steps ring steps of x bytes on op's alpha / B
        return steps * (lk.lat(op) + x / (lk.bw(op) * 1e9))

    expect = {  # one peer: encode what goes out, send r times it, decode what comes in
        "all_gather": (nat("all_gather", m), 2 * o + 2 * m / e + a + r * m / b),
        "all_to_all": (nat("all_to_all", m / 2), 2 * o + m / e + a + r * m / 2 / b),
        "reduce_scatter": (nat("reduce_scatter", m), 2 * o + 2 * m / e + a + r * m / b + 2 * m / red),
        "all_reduce": (nat("all_reduce", m / 2, 2),  # reduce-scatter of m/2, then all-gather of m/2
                       4 * o + 2 * m / e + 2 * a + r * m / b + m / red),
    }
    for op, (tn, tc) in expect.items():
        t = sc.ring_times(op, m, 2, cal, link)
        assert t.native_s == pytest.approx(tn, rel=1e-12), op
        assert t.compressed_s == pytest.approx(tc, rel=1e-12), op


@pytest.mark.parametrize("op", cm.OPS)
def test_speedup_tends_to_the_ratio_bound_on_a_slow_link(op):
    cal = known()
    slow = cm.Link("slow", 0.01, 0.0)  # 10 MB/s: coding and fixed costs vanish next to the wire
    cal = replace(cal, links={**cal.links, "slow": slow}, wires={**cal.wires, "slow": slow},
                  ratio={**cal.ratio, "slow": 0.7})
    for p in (2, 8, 64):
        assert sc.ring_times(op, 1024 * MIB, p, cal, "slow").speedup == pytest.approx(1 / 0.7, rel=1e-3)
    h = sc.hierarchical_times(op, 1024 * MIB, 64, cal, intra="nvlink", inter="slow")
    assert h.speedup == pytest.approx(1 / 0.7, rel=2e-3)  # the NVLink stages are negligible there
    assert h.speedup < 1 / 0.7


@pytest.mark.parametrize("op", cm.OPS)
def test_hierarchical_is_native_within_a_node_and_adds_up_its_stages(op):
    cal = known()
    for p in (2, 4, 8):
        t = sc.hierarchical_times(op, 64 * MIB, p, cal)
        assert t.compressed_s == t.native_s == cm.native_time(op, 64 * MIB, p, cal.links["nvlink"])
    t = sc.hierarchical_times(op, 64 * MIB, 32, cal)
    assert t.native_s == pytest.approx(sum(a for a, _ in t.stages.values()), rel=1e-12)
    assert t.compressed_s == pytest.approx(sum(b for _, b in t.stages.values()), rel=1e-12)
    inter = [k for k in t.stages if ".inter." in k]
    assert len(inter) == 1 and t.stages[inter[0]][1] != t.stages[inter[0]][0]
    with pytest.raises(ValueError):
        sc.hierarchical_times(op, 64 * MIB, 12, cal)


def test_ring_native_time_grows_with_ranks_and_compression_saves_the_wire():
    cal = known()
    t = [sc.ring_times("all_gather", 256 * MIB, p, cal, "shm") for p in (2, 4, 8, 16)]
    assert all(x.native_s < y.native_s for x, y in zip(t[:-1], t[1:], strict=True))
    assert all(x.speedup < y.speedup < 1 / 0.6990 for x, y in zip(t[:-1], t[1:], strict=True))


def test_project_scaling_script_on_committed_results(tmp_path):
    out = tmp_path / "scaling.jsonl"
    subprocess.run([sys.executable, str(ROOT / "experiments" / "project_scaling.py"), "--out", str(out)],
                   check=True, capture_output=True, cwd=ROOT)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = {r["record"] for r in recs}
    assert {"link", "codec", "projection", "check"} <= kinds
    proj = [r for r in recs if r["record"] == "projection"]
    assert {r["nranks"] for r in proj} >= {2, 8, 16, 32, 64}
    assert {r["arrangement"] for r in proj} == {"ring", "hierarchical"}
    assert all(math.isfinite(r["speedup"]) and r["speedup"] > 0 for r in proj)


@pytest.mark.parametrize("op", cm.OPS)
def test_per_peer_fixed_costs_vanish_at_two_ranks_and_grow_with_peers(op):
    cal = known()
    t2 = sc.ring_times(op, 64 * MIB, 2, cal, "shm")
    assert t2.per_peer_extra_s == 0.0 and t2.speedup_per_peer == t2.speedup
    t8, t16 = (sc.ring_times(op, 64 * MIB, p, cal, "shm") for p in (8, 16))
    assert 0 < t8.per_peer_extra_s < t16.per_peer_extra_s
    calls = sc.codec_calls(op, 8, True) - sc.codec_calls(op, 8, False)
    assert t8.per_peer_extra_s == pytest.approx(calls * cal.codec.overhead, rel=1e-12)
    h = sc.hierarchical_times(op, 64 * MIB, 32, cal)  # 4 nodes: only the inter stage pays it
    assert h.per_peer_extra_s == pytest.approx(sc.per_peer_extra(op, 4, cal), rel=1e-12)


def test_record_reading_examples_run():
    """experiments/records.py is outside zipccl/, where --doctest-modules runs: its examples run here."""
    result = doctest.testmod(rec)
    assert result.attempted >= 5 and result.failed == 0
