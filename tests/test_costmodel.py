"""The alpha-beta cost model: its limits, its consistency with nccl-tests' busbw, its fits."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from zipccl import costfit as cf
from zipccl import costmodel as cm
from zipccl.metrics import busbw, nccl_tests_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the committed records' reader
from experiments import records as rec  # noqa: E402

MIB = 1 << 20
FREE = dict(encode_gbps=1e15, decode_gbps=1e15)  # a codec that costs nothing


@pytest.mark.parametrize("op", cm.OPS)
@pytest.mark.parametrize("p", [2, 4, 8])
def test_native_time_reproduces_bus_bandwidth(op, p):
    """With alpha = 0, nccl-tests' busbw of the predicted time is exactly the link bandwidth."""
    link = cm.Link("l", 25.0)
    m = 64 * MIB
    t = cm.native_time(op, m, p, link)
    assert busbw(op, nccl_tests_size(op, m, p), t, p) == pytest.approx(25.0, rel=1e-12)


@pytest.mark.parametrize("op,steps", [("all_gather", 3), ("reduce_scatter", 3), ("all_to_all", 3),
                                      ("all_reduce", 6)])
def test_latency_counts_once_per_ring_step(op, steps):
    link = cm.Link("l", 1e9, latency=1e-3)  # bandwidth so high only latency remains
    assert cm.native_time(op, 1, 4, link) == pytest.approx(steps * 1e-3, rel=1e-6)


def test_single_rank_costs_nothing():
    link, codec = cm.Link("l", 10.0, 1e-5), cm.Codec("c", 100.0, 100.0, 0.7)
    for op in cm.OPS:
        assert cm.native_time(op, MIB, 1, link) == 0.0
        assert cm.compressed_time(op, MIB, 1, link, codec) == 0.0


@pytest.mark.parametrize("op", ["all_gather", "all_to_all", "reduce_scatter"])
@pytest.mark.parametrize("p", [2, 4])
def test_free_codec_scales_only_the_bandwidth_term(op, p):
    link = cm.Link("l", 25.0, latency=20e-6)
    codec = cm.Codec("free", ratio=0.7, **FREE)
    m = 256 * MIB
    lat = (p - 1) * 20e-6
    bw_term = cm.native_time(op, m, p, link) - lat
    expected = lat + 0.7 * bw_term
    assert cm.compressed_time(op, m, p, link, codec) == pytest.approx(expected, rel=1e-9)


def test_all_reduce_is_reduce_scatter_then_all_gather():
    link, codec = cm.Link("l", 25.0, 1e-5), cm.Codec("c", 500.0, 700.0, 0.7, overhead=5e-6)
    m, p = 128 * MIB, 4
    rs = cm.compressed_time("reduce_scatter", m / p, p, link, codec)
    ag = cm.compressed_time("all_gather", m / p, p, link, codec)
    assert cm.compressed_time("all_reduce", m, p, link, codec) == pytest.approx(rs + ag, rel=1e-12)


def test_reduce_scatter_methods_agree_on_two_ranks_and_differ_beyond():
    link, codec = cm.Link("l", 25.0, 1e-5), cm.Codec("c", 500.0, 700.0, 0.7, reduce_gbps=1000.0)
    m = 64 * MIB
    a2a = cm.compressed_time("reduce_scatter", m, 2, link, codec, method="all_to_all")
    ring = cm.compressed_time("reduce_scatter", m, 2, link, codec, method="ring")
    assert a2a == pytest.approx(ring, rel=1e-12)  # one hop: same work either way
    a2a8 = cm.compressed_time("reduce_scatter", m, 8, link, codec, method="all_to_all")
    ring8 = cm.compressed_time("reduce_scatter", m, 8, link, codec, method="ring")
    assert a2a8 != pytest.approx(ring8, rel=1e-3)
    best = cm.compressed_time("reduce_scatter", m, 8, link, codec)
    assert best == min(a2a8, ring8)
    with pytest.raises(ValueError, match="methods"):
        cm.compressed_time("reduce_scatter", m, 8, link, codec, method="tree")


def test_no_compression_never_pays():
    link, codec = cm.Link("l", 25.0, 1e-5), cm.Codec("c", 2000.0, 2000.0, 1.0)
    for op in cm.OPS:
        pred = cm.predict(op, 64 * MIB, 2, link, codec, chunks=None)
        assert pred.choice == "native" and pred.speedup < 1
        assert cm.break_even_throughput(op, 64 * MIB, 2, link, 1.0) == math.inf


def test_pipelined_limits():
    stages = [(1e-5, 1.0), (2e-5, 3.0), (1e-5, 2.0)]
    assert cm.pipelined(stages, 1) == pytest.approx(sum(f + w for f, w in stages))
    # many chunks: close to the slowest stage, never below it
    t = cm.pipelined(stages, 1000)
    assert 3.0 <= t < 3.1
    with pytest.raises(ValueError):
        cm.pipelined(stages, 0)


def test_best_chunks_is_at_least_as_fast_as_one_chunk():
    link, codec = cm.Link("shm", 25.0, 15e-6), cm.Codec("c", 300.0, 400.0, 0.7, overhead=20e-6)
    for op in cm.OPS:
        p1 = cm.predict(op, 256 * MIB, 2, link, codec, chunks=1)
        pb = cm.predict(op, 256 * MIB, 2, link, codec, chunks=None)
        assert pb.compressed_s <= p1.compressed_s and pb.chunks >= 1
    # a slow codec on a slow link: pipelining must help
    assert cm.predict("all_gather", 256 * MIB, 2, link, codec, chunks=None).chunks > 1


@pytest.mark.parametrize("op", cm.OPS)
def test_break_even_throughput_is_where_the_times_cross(op):
    link = cm.Link("shm", 25.0, 15e-6)
    m, p, r = 64 * MIB, 4, 0.7
    g = cm.break_even_throughput(op, m, p, link, r)
    assert math.isfinite(g) and g > 0
    native = cm.native_time(op, m, p, link)
    at = cm.compressed_time(op, m, p, link, cm.Codec("x", g, g, r))
    assert at == pytest.approx(native, rel=1e-6)
    assert cm.compressed_time(op, m, p, link, cm.Codec("x", g / 2, g / 2, r)) > native
    assert cm.compressed_time(op, m, p, link, cm.Codec("x", g * 2, g * 2, r)) < native


def test_faster_links_need_faster_codecs():
    g = [cm.break_even_throughput("all_gather", 256 * MIB, 2, cm.Link("l", bw), 0.7)
         for bw in (3.5, 25.0, 284.0)]
    assert g[0] < g[1] < g[2]


def test_fit_alpha_beta_recovers_parameters():
    alpha, beta = 25e-6, 40.0
    sizes = [2**k for k in range(16, 31, 2)]
    times = [alpha + s / (beta * 1e9) for s in sizes]
    a, b = cf.fit_alpha_beta(sizes, times)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)
    with pytest.raises(ValueError):
        cf.fit_alpha_beta([1.0], [1.0])


@pytest.mark.parametrize("p", [2, 4])
def test_link_from_busbw_round_trips(p):
    truth = cm.Link("t", 30.0, per_op={"all_gather": 30.0, "reduce_scatter": 28.0, "all_to_all": 26.0},
                    per_op_latency={"all_gather": 1e-5, "reduce_scatter": 3e-5, "all_to_all": 2e-5})
    table = {op: {m: busbw(op, nccl_tests_size(op, m, p), cm.native_time(op, m, p, truth), p)
                  for m in (MIB, 16 * MIB, 256 * MIB)} for op in truth.per_op}
    fitted = cf.link_from_busbw("f", table, nranks=p)
    for op in truth.per_op:
        assert fitted.bw(op) == pytest.approx(truth.bw(op), rel=1e-6)
        assert fitted.lat(op) == pytest.approx(truth.lat(op), rel=1e-6)


def test_links_fitted_to_the_committed_nccl_runs_match_them_within_10_percent():
    """The NCCL baselines of the notebooks: each link's newest run in results/collectives.jsonl."""
    recs = rec.select_latest(rec.load_records([rec.RESULTS / "collectives.jsonl"]))
    links = sorted({r["link"] for r in recs})
    assert {"nvlink", "shm"} <= set(links)
    for name in links:
        p, table = rec.nccl_busbw(recs, name, 16 * MIB)
        link = cf.link_from_busbw(name, table, p)
        assert set(table) == set(cm.OPS)
        for op, points in table.items():
            for m, measured in points.items():
                t = cm.native_time(op, m, p, link)
                assert busbw(op, nccl_tests_size(op, m, p), t, p) == pytest.approx(measured, rel=0.10)


def test_prediction_explain_and_validation():
    pred = cm.predict("all_gather", 64 * MIB, 2, cm.Link("shm", 25.0, 1e-5),
                      cm.Codec("zipccl", 2000.0, 2000.0, 0.7))
    text = pred.explain()
    assert "native" in text and "compressed" in text and pred.choice in text
    assert pred.speedup == pytest.approx(pred.native_s / pred.compressed_s)
    with pytest.raises(ValueError):
        cm.Link("bad", 0.0)
    with pytest.raises(ValueError):
        cm.Link("bad", 1.0, per_op={"broadcast": 1.0})
    with pytest.raises(ValueError):
        cm.Codec("bad", 0.0, 1.0, 0.7)
    with pytest.raises(ValueError):
        cm.native_time("gather", 1, 2, cm.Link("l", 1.0))


def test_peer_codec_reads_the_newest_peers_run_at_the_nearest_size():
    peers = rec.load_records([rec.RESULTS / "codec_peers.jsonl"])
    newest = max(r["run_id"] for r in peers if r["codec"] == "dietgpu")
    row = {(r["op"], r["size_mib"]): r for r in peers if r["run_id"] == newest
           and r["codec"] == "dietgpu" and r["data"] == "gaussian" and r["mode"] == "eager"}
    c = rec.peer_codec(peers, "dietgpu", 300 * MIB)  # nearest measured: 256 MiB
    assert c.encode_gbps == row[("compress", 256)]["gbps"]
    assert c.decode_gbps == row[("decompress", 256)]["gbps"]
    assert c.ratio == row[("compress", 256)]["ratio"]
    assert rec.peer_codec(peers, "nvcomp-ans", name="ans").name == "ans"
    with pytest.raises(ValueError, match="no codec_peers record"):
        rec.peer_codec(peers, "DietGPU")


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("op", cm.OPS)
def test_link_from_fits_predicts_the_fitted_times(op, p):
    alpha, beta = 3e-5, 40.0
    link = cf.link_from_fits("l", {op: (alpha, beta)}, nranks=p)
    for m in (MIB, 256 * MIB):
        assert cm.native_time(op, m, p, link) == pytest.approx(alpha + m / (beta * 1e9), rel=1e-12)
        terms = cm.native_terms(op, m, p, link)
        assert terms["latency"] == pytest.approx(alpha, rel=1e-12)
        assert sum(terms.values()) == pytest.approx(cm.native_time(op, m, p, link), rel=1e-12)


def test_exchange_wire_is_all_gather_on_two_ranks_and_send_recv_beyond():
    link = cm.Link("l", 25.0, 1e-5, per_op={"all_gather": 25.0, "all_to_all": 20.0})
    two, four = cm.exchange_wire(link, 2), cm.exchange_wire(link, 4)
    assert two.bw("all_to_all") == two.bw("reduce_scatter") == 25.0 and two.latency == 0.0
    assert four.bw("all_to_all") == 20.0 and four.bw("all_gather") == 25.0


EX_LINK, EX_CODEC = cm.Link("shm", 25.0, 2e-5), cm.Codec("c", 2000.0, 1500.0, 0.7, reduce_gbps=800.0)
EX_WIRE = cm.exchange_wire(EX_LINK, 2)  # no latency: the rounds' fixed costs are the exchange's


def test_exchange_time_counts_rounds_fixed_costs_and_overlap():
    m = 1 << 30
    serial = cm.Exchange(fixed_s=5e-4, round_s=1e-3, chunk_bytes=64 * MIB, overlap=False)
    t, k, st = cm.exchange_time("all_gather", m, 2, EX_WIRE, EX_CODEC, serial)
    assert k == 16 and st["host"] == pytest.approx(16e-3) and st["fixed"] == 5e-4
    assert t == pytest.approx(sum(st.values()), rel=1e-12)  # one round after another
    assert st["transfer"] == pytest.approx(0.7 * m / 25e9, rel=1e-12)
    over = dataclasses.replace(serial, overlap=True)
    t2, k2, st2 = cm.exchange_time("all_gather", m, 2, EX_WIRE, EX_CODEC, over)
    assert st2 == st and k2 == k
    assert max(st.values()) < t2 < t  # rounds overlap: more than the slowest stage, less than all
    one = cm.Exchange(fixed_s=5e-4, round_s=1e-3)  # no chunking: one round
    assert cm.exchange_time("all_gather", m, 2, EX_WIRE, EX_CODEC, one)[1] == 1


def test_exchange_time_reduces_on_the_decode_stream_and_all_reduce_pays_fixed_once():
    ex = cm.Exchange(fixed_s=5e-4, round_s=1e-4, chunk_bytes=16 * MIB)
    m, p = 256 * MIB, 2
    _, _, rs = cm.exchange_time("reduce_scatter", m, p, EX_WIRE, EX_CODEC, ex)
    assert "reduce" not in rs and rs["decode+reduce"] == pytest.approx(
        (p - 1) * m / 1500e9 + p * m / 800e9, rel=1e-12)
    t, _, st = cm.exchange_time("all_reduce", m, p, EX_WIRE, EX_CODEC, ex)
    t_rs = cm.exchange_time("reduce_scatter", m / p, p, EX_WIRE, EX_CODEC, ex)[0]
    t_ag = cm.exchange_time("all_gather", m / p, p, EX_WIRE, EX_CODEC, ex)[0]
    assert t == pytest.approx(t_rs + t_ag - ex.fixed_s, rel=1e-12)
    assert st["fixed"] == ex.fixed_s and "rs.host" in st and "ag.decode" in st
    assert cm.exchange_time("all_gather", m, 1, EX_WIRE, EX_CODEC, ex)[0] == 0.0


def test_predict_with_an_exchange_uses_its_rounds_and_the_frames_link():
    ex = cm.Exchange(fixed_s=1e-3, round_s=2e-4, chunk_bytes=64 * MIB)
    pred = cm.predict("all_to_all", 1 << 30, 2, EX_LINK, EX_CODEC, chunks=3, exchange=ex)
    t, k, st = cm.exchange_time("all_to_all", 1 << 30, 2, EX_WIRE, EX_CODEC, ex)
    assert (pred.compressed_s, pred.rounds, dict(pred.stages)) == (t, k, st) and k == 8
    assert pred.native_s == cm.native_time("all_to_all", 1 << 30, 2, EX_LINK)
    assert sum(pred.native_stages.values()) == pytest.approx(pred.native_s, rel=1e-12)
    assert "latency" in pred.terms() and "transfer" in pred.terms()


def test_fit_offset_recovers_a_constant_and_never_goes_negative():
    model = [1e-3, 4e-3, 16e-3]
    assert cf.fit_offset([x + 7e-4 for x in model], model) == pytest.approx(7e-4, rel=1e-9)
    assert cf.fit_offset([x * 0.5 for x in model], model) == 0.0
    with pytest.raises(ValueError):
        cf.fit_offset([], [])


def test_fp32_prediction_script_writes_one_record_per_codec_op_and_size(tmp_path):
    from experiments import predict_fp32_collectives as pf

    out = tmp_path / "p.jsonl"
    assert pf.main(["--link", "shm", "--sizes-mib", "64,1024", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2 * 2 * 2
    for r in recs:
        assert r["predicted_speedup"] == r["predicted_native_s"] / r["predicted_compressed_s"] > 0
    fast = {(r["op"], r["per_rank_bytes"]): r["predicted_compressed_s"] for r in recs
            if r["codec"].endswith("2,000 GB/s")}
    slow = {(r["op"], r["per_rank_bytes"]): r["predicted_compressed_s"] for r in recs
            if r["codec"].endswith("as measured")}
    assert all(fast[k] <= slow[k] for k in slow)  # a faster codec never predicts a slower call
