"""Captured spill sites (``zipccl.comm.spill_sites.Sites``): the spill path of calls in a CUDA graph.

A replayed graph launches the same kernels with the same arguments every time. Here two ranks
(threads, an in-memory channel, host memory: the kernels' NumPy twins) "capture" their calls
once (``Sites.begin``) and then "replay" them many times by running the same launches again,
new frames in the same regions each time, some spilling: every slot header must carry the
replay's number and every frame must land byte for byte, with a ring of two blocks per site
that the take step reuses only once the progress thread is done with it.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from test_spill import LocalChannel, _Net, _transfer, _two_ranks

from zipccl import format as fmt
from zipccl.comm import spill, spill_sites
from zipccl.format import errors
from zipccl.format import slot as slots
from zipccl.kernels import spill as kern

SITES = (("all_gather", fmt.DTYPE_BF16, 3000), ("all_to_all", fmt.DTYPE_BF16, 5000))
CAPACITY = 64  # escape bytes per slot: most frames can spill


def _frame(rng, n: int, code: int, spill_it: bool) -> np.ndarray:
    slot = slots.slot_bytes(n, code, CAPACITY)
    fit, most = slot - slots.SLOT_HEADER, fmt.max_compressed_size(n, code)
    assert most > fit  # the sizes of SITES can spill
    length = int(rng.integers(fit + 1, most + 1) if spill_it else rng.integers(128, fit + 1))
    b = rng.integers(0, 256, length, dtype=np.uint8)
    b[fmt.FRAME_LEN_AT:fmt.FRAME_LEN_AT + 8] = np.array([length], "<u8").view(np.uint8)
    b[fmt.N_ESCAPES_AT:fmt.N_ESCAPES_AT + 8] = np.array([int(rng.integers(0, 1 << 20))], "<u8").view(np.uint8)
    return b


def _aligned(nbytes: int):
    raw = np.full(nbytes + 128, 0x5A, np.uint8)
    off = -int(raw.ctypes.data) % 128
    return raw[off:off + nbytes]


class _Rank:
    """One rank's captured calls: per site one frame toward the peer, one from it."""

    def __init__(self, rank: int, peer: int, sp: spill.Spills, sites: spill_sites.Sites):
        self.rank, self.peer, self.sp, self.sites = rank, peer, sp, sites
        self.calls = []
        for op, code, n in SITES:
            region = slots.region_bytes(n, code)
            slot = slots.slot_bytes(n, code, CAPACITY)
            send, recv = _aligned(region), _aligned(region)
            site = sites.begin(op, code, [(self.peer, int(send.ctypes.data), slot, region, n)],
                               [(self.peer, int(recv.ctypes.data), slot, region, n)])
            self.calls.append((op, code, n, slot, send, recv, site))

    def replay(self, gen: int, move, spill_rate: float, which=None) -> list[str]:
        """Every captured call once (``which``: those calls, by index), as a replay runs them;
        returns what landed wrong."""
        problems = []
        for k, (op, code, n, slot, send, recv, site) in enumerate(self.calls):
            if which is not None and k not in which:
                continue
            mine = _frame(np.random.default_rng([gen, k, self.rank]), n, code,
                          np.random.default_rng([gen, k, self.rank, 1]).random() < spill_rate)
            theirs = _frame(np.random.default_rng([gen, k, self.peer]), n, code,
                            np.random.default_rng([gen, k, self.peer, 1]).random() < spill_rate)
            send[128:128 + mine.size] = mine
            self.sites.launch_out(site)
            move([(self.peer, send[:slot])], [(self.peer, recv[:slot])])
            self.sites.launch_in(site)
            h = slots.parse_slot_header(recv[:128])
            if h.seq != gen or h.op != slots.OP_CODES[op] or h.frame_len != theirs.size:
                problems.append(f"replay {gen} site {k}: slot header {h}")
            if not np.array_equal(recv[128:128 + theirs.size], theirs):
                problems.append(f"replay {gen} site {k}: frame differs")
        return problems


def test_replays_move_every_tail_exactly():
    slot_net, site_net = _Net(), _Net()
    out = {}

    def body(rank, sp):
        sites = spill_sites.Sites(sp, LocalChannel(site_net, rank, 2), ring=2)
        r = _Rank(rank, 1 - rank, sp, sites)
        problems, move = [], _transfer(slot_net, rank)
        for gen in range(1, 41):
            problems += r.replay(gen, move, 0.5 if gen <= 20 else 0.05)
        out[rank] = {"problems": problems, "stats": sites.stats(), "error": sp.error()}
        sites.close()  # the thread hands back the block it handled last, then stops
        out[rank]["free"] = sorted(int(b.words[kern.W_HOST_FREE]) for s in sites._sites for b in s.blocks)
        sp.close()

    _two_ranks(body, [LocalChannel(slot_net, r, 2) for r in range(2)])
    for r in range(2):
        assert out[r]["problems"] == []
        assert out[r]["error"] == 0
        assert out[r]["stats"]["sites"] == 2 and out[r]["stats"]["blocks"] == 4  # nothing grew
        # every ring block handed back after the last call it served (a block is handed back
        # once the thread handled the next call, asynchronously: read after close, not before)
        assert out[r]["free"] == [39, 39, 40, 40]


def test_a_fed_graph_meets_eager_calls_of_its_peer():
    """zipccl's own graph of a call (``FedSite``): the host numbers every launch and gives it a
    call block as for an eager call, so rank 0 launching "graphs" (the same kernels, launched
    with the site) and rank 1 running the calls eagerly meet call for call, tails exact."""
    slot_net, out = _Net(), {}
    op, code, n = SITES[0]
    region, slot = slots.region_bytes(n, code), slots.slot_bytes(n, code, CAPACITY)

    def body(rank, sp):
        peer, move = 1 - rank, _transfer(slot_net, rank)
        send, recv = _aligned(region), _aligned(region)
        sends = [(peer, int(send.ctypes.data), slot, region, n)]
        recvs = [(peer, int(recv.ctypes.data), slot, region, n)]
        site = spill_sites.FedSite(sp, op, code, sends, recvs) if rank == 0 else None
        problems = []
        for seq in range(1, 31):
            mine = _frame(np.random.default_rng([seq, rank]), n, code, seq % 2 == 0)
            theirs = _frame(np.random.default_rng([seq, peer]), n, code, seq % 2 == 0)
            send[128:128 + mine.size] = mine
            sp.begin(seq, op, code, sends, recvs)
            if site is not None:  # what a launch of the graph runs, its site fed first
                assert site.room()
                site.feed(seq)
                spill_sites.launch_out(sp, site)
                move([(peer, send[:slot])], [(peer, recv[:slot])])
                spill_sites.launch_in(sp, site)
            else:
                sp.launch_out(seq)
                move([(peer, send[:slot])], [(peer, recv[:slot])])
                sp.launch_in(seq)
            h = slots.parse_slot_header(recv[:128])
            if h.seq != seq or not np.array_equal(recv[128:128 + theirs.size], theirs):
                problems.append(f"call {seq}: header seq {h.seq}, frame equal "
                                f"{np.array_equal(recv[128:128 + theirs.size], theirs)}")
        out[rank] = (problems, sp.error(), None if site is None else int(site.words[kern.S_GEN]))
        sp.close()

    _two_ranks(body, [LocalChannel(slot_net, r, 2) for r in range(2)])
    assert out[0][0] == [] and out[1][0] == [] and out[0][1] == out[1][1] == 0
    assert out[0][2] == 30  # the take step ran once per launch, from the fed entries


class _BrokenChannel(LocalChannel):
    def isend(self, data, peer, tag):
        raise ConnectionError("the host channel broke")


def _to_self(moves, lands):
    for (_, src), (_, dst) in zip(moves, lands, strict=True):
        dst[:] = src


def test_one_rank_loopback_replays():
    """One rank, its own peer (the loopback mode): tails go to itself through the thread."""
    sp = spill.Spills(LocalChannel(_Net(), 0, 1), device=False)
    sites = spill_sites.Sites(sp, LocalChannel(_Net(), 0, 1))
    r = _Rank(0, 0, sp, sites)
    problems = []
    for gen in range(1, 21):
        problems += r.replay(gen, _to_self, 0.7)
    assert problems == [] and sp.error() == 0
    sites.close()
    sp.close()


def test_a_failed_thread_never_leaves_a_replay_waiting():
    """The site channel breaks at the first tail: the thread raises ERR_PROGRESS, so the
    spill-in and take steps of this and later replays return at once (no hang), the error
    word says so, and close() raises what the thread failed with."""
    sp = spill.Spills(LocalChannel(_Net(), 0, 1), device=False)
    sites = spill_sites.Sites(sp, _BrokenChannel(_Net(), 0, 1))
    r = _Rank(0, 0, sp, sites)
    done = threading.Event()

    def replays():
        for gen in range(1, 5):  # ring 2: replays 3 and 4 take blocks never handed back
            r.replay(gen, _to_self, 1.0)
        done.set()

    t = threading.Thread(target=replays, daemon=True)
    t.start()
    assert done.wait(30), "a replay waited for a failed progress thread"
    assert sp.error() & errors.ERR_PROGRESS
    with pytest.raises(RuntimeError, match="progress thread failed") as e:
        sites.close()
    assert isinstance(e.value.__cause__, ConnectionError)
    sp.close()


def test_close_stops_a_thread_that_waits_for_a_replay():
    sp = spill.Spills(LocalChannel(_Net(), 0, 2), device=False)
    sites = spill_sites.Sites(sp, LocalChannel(_Net(), 0, 2))
    buf = _aligned(8192)
    ptr = int(buf.ctypes.data)
    sites.begin("all_gather", "bfloat16", [(1, ptr, 1024, 2048, 100)], [(1, ptr + 4096, 1024, 2048, 100)])
    sites.close(timeout=5)
    assert not sites._thread.is_alive() and sites.channel.closed
    with pytest.raises(RuntimeError, match="after close"):
        sites.begin("all_gather", "bfloat16", [], [])
    sp.close()


def test_ring_size_is_checked():
    sp = spill.Spills(LocalChannel(_Net(), 0, 2), device=False)
    for ring in (1, kern.RING_MAX + 1):
        with pytest.raises(ValueError, match="ring"):
            spill_sites.Sites(sp, LocalChannel(_Net(), 0, 2), ring=ring)
    sp.close()


def test_a_graph_launch_is_numbered_as_an_eager_call_and_refused_when_resized_or_full():
    """``SlotChannel.launch_graph`` (one rank looping back): a launch numbers its round as the
    eager call would and feeds its site; a capacity rule that now sizes the slot otherwise
    refuses it ("resized"), and so does a feed whose launches the device has not started
    ("full"), in both cases with nothing numbered."""
    from zipccl.comm.capacity import CapacityRule
    from zipccl.comm.exchange import SlotChannel

    op, code, n = SITES[0]
    sp = spill.Spills(LocalChannel(_Net(), 0, 1), device=False)
    rule = CapacityRule(nbytes=CAPACITY)
    ch = SlotChannel(sp, rule)
    region, slot = slots.region_bytes(n, code), slots.slot_bytes(n, code, CAPACITY)
    send, recv = _aligned(region), _aligned(region)
    site = spill_sites.FedSite(sp, op, code, [(0, int(send.ctypes.data), slot, region, n)],
                               [(0, int(recv.ctypes.data), slot, region, n)])
    ran = []

    def launch():  # what the graph runs: the site's kernels (their twins, at once here)
        mine = _frame(np.random.default_rng(len(ran)), n, code, True)
        send[128:128 + mine.size] = mine
        spill_sites.launch_out(sp, site)
        _to_self([(0, send[:slot])], [(0, recv[:slot])])
        spill_sites.launch_in(sp, site)
        ran.append(np.array_equal(recv[128:128 + mine.size], mine))

    assert [ch.launch_graph(op, True, [site], launch) for _ in range(3)] == [None] * 3
    assert ran == [True] * 3 and ch.seq == 3 and int(site.words[kern.S_SEQ]) == 3
    rule.config = type(rule.config)(nbytes=CAPACITY + 1024)  # the rule sizes the slot otherwise
    assert ch.launch_graph(op, True, [site], launch) == "resized" and ch.seq == 3
    rule.config = type(rule.config)(nbytes=CAPACITY)
    started = SimpleNamespace(words=np.zeros(kern.HEADER_WORDS, np.uint64))
    site._fed.extend(SimpleNamespace(done=False, seq=-1, block=started) for _ in range(kern.FEED_MAX))
    assert ch.launch_graph(op, True, [site], launch) == "full" and ch.seq == 3 and len(ran) == 3
    site._fed.clear()
    assert ch.launch_graph(op, True, [site], launch) is None and ran == [True] * 4
    sp.close()


def test_a_graph_launch_compares_its_slots_again_only_when_the_rule_changed():
    """``launch_graph`` compares a site's slot sizes with the adaptive rule's only after the rule
    changed (``CapacityRule.changes``): an observation at another site changes nothing for this
    one and the launch goes on; one that raises this site's capacity refuses it ("resized")."""
    from zipccl.comm.capacity import CapacityRule
    from zipccl.comm.exchange import SlotChannel

    op, code, n = SITES[0]
    sp = spill.Spills(LocalChannel(_Net(), 0, 1), device=False)
    rule = CapacityRule()
    ch = SlotChannel(sp, rule)
    key = (op, True, n, code)
    region, slot = slots.region_bytes(n, code), slots.slot_bytes(n, code, rule.capacity(key, n, code))
    send, recv = _aligned(region), _aligned(region)
    site = spill_sites.FedSite(sp, op, code, [(0, int(send.ctypes.data), slot, region, n)],
                               [(0, int(recv.ctypes.data), slot, region, n)])

    def launch():
        send[128:128 + 64] = 0
        spill_sites.launch_out(sp, site)
        _to_self([(0, send[:slot])], [(0, recv[:slot])])
        spill_sites.launch_in(sp, site)

    assert ch.launch_graph(op, True, [site], launch) is None and site.sized == (id(rule), 0, False)
    rule.observe(("elsewhere", True, n, code), n, code, max_escapes=n // 2)
    assert rule.changes == 1
    assert ch.launch_graph(op, True, [site], launch) is None and site.sized == (id(rule), 1, False)
    rule.observe(key, n, code, max_escapes=n // 2)
    assert ch.launch_graph(op, True, [site], launch) == "resized" and ch.seq == 2
    sp.close()


def test_a_replay_after_close_waits_for_nothing():
    """A graph replayed after its communicator closed (a misuse): its take and spill-in steps
    return at once (no hang; the memory they touch is kept), and the error word says why."""
    sp = spill.Spills(LocalChannel(_Net(), 0, 1), device=False)
    sites = spill_sites.Sites(sp, LocalChannel(_Net(), 0, 1))
    r = _Rank(0, 0, sp, sites)
    assert r.replay(1, _to_self, 1.0) == []
    sites.close(timeout=5)
    assert any(entry[0] is sites._sites for entry in spill_sites.AFTER_CLOSE)
    done = threading.Event()

    def replays():
        for gen in range(2, 6):  # ring 2: from replay 3 on its blocks are never handed back
            r.replay(gen, _to_self, 1.0)
        done.set()

    threading.Thread(target=replays, daemon=True).start()
    assert done.wait(30), "a replay after close waited"
    assert sp.error() & errors.ERR_PROGRESS
    sp.close()
