"""The policy: for each collective call, compressed or native, and why.

Compression pays only when moving the saved bytes takes longer than coding them,
which depends on the link, the codec's speed and the message size. This module
makes that choice in one place so it is inspectable (``explain``), loggable
(``logging.getLogger("zipccl.policy")`` at DEBUG) and forceable
(``mode="always" | "never"``).

``mode="auto"`` follows a measured ``Profile`` when it has one
(``Communicator.calibrate``). The profile holds *components*, each measured on
its own, and the cost model (``zipccl.costmodel``: ``fit_alpha_beta``,
``pipelined``) composes them into predicted times:

- native: per operation, ``alpha + bytes / beta`` fitted to the native
  collective's measured times;
- compressed: the pipelined exchange as it is implemented
  (``collectives.chunked_exchange``): a fixed cost per call, then ``rounds``
  rounds whose stages (host work per round, encode, transfer, decode [+ reduce])
  overlap, ``sum(stage) + (rounds - 1) * max(stage)``; encode / decode / reduce
  throughputs and the ratio come from timing the codec alone, the transfer from
  the native all-gather (two ranks, or all-gather: frames move as an all-gather)
  or all-to-all fit on the compressed bytes, the per-round and per-call fixed
  costs from compressed calls on tiny messages.

It compresses only where it is sure: inside the calibrated size range, when the
model predicts the compressed path at least ``margin`` faster, and when the
compressed path was also measured faster at the calibrated sizes on both sides of
the message size. Anywhere else (outside the range, no profile for the op,
measurements disagreeing with the model) it stays native. Without a profile it
falls back to a size threshold: BF16 messages of at least ``min_bytes`` per rank
on a GPU are compressed; host arrays stay native unless ``compress_host=True``.

Every rank must reach the same decision, so ``decide`` is a pure function of
values all ranks agree on (they are checked collectively before it is called,
and a profile is computed from the maximum over ranks of each measurement).

Sizes follow the ``nbytes`` the communicator decides on: the send buffer of
all-gather and reduce-scatter, the buffer of all-reduce, the mean send buffer of
all-to-all.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field

from ..costmodel import pipelined

MODES = ("auto", "always", "never")
OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")
PROFILE_VERSION = 2

log = logging.getLogger("zipccl.policy")


@dataclass(frozen=True)
class Decision:
    """One policy decision: ``compress`` or not, a sentence saying why, the predicted times."""

    op: str
    nbytes: int  # uncompressed bytes per rank the decision was made for
    compress: bool
    reason: str
    native_s: float | None = None  # the profile's predictions, when there is one
    compressed_s: float | None = None

    def __str__(self) -> str:
        path = "compressed" if self.compress else "native"
        return f"{self.op} {self.nbytes:,} B/rank -> {path} ({self.reason})"


@dataclass(frozen=True)
class Prediction:
    """Predicted times of both paths of one call and the compressed path's stages (seconds)."""

    op: str
    nbytes: int
    native_s: float
    compressed_s: float
    rounds: int
    stages: dict  # per-stage totals of the compressed path, plus "fixed"

    def describe(self) -> str:
        st = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in self.stages.items())
        return (f"predicted native {self.native_s * 1e3:.3f} ms, compressed {self.compressed_s * 1e3:.3f} ms"
                f" ({self.rounds} round{'s' if self.rounds > 1 else ''}; stage totals ms: {st})")


@dataclass(frozen=True)
class Profile:
    """What ``Communicator.calibrate`` measured, and the cost model that composes it.

    - ``native[op] = (alpha_s, beta_gbps)``: the native collective, t = alpha + bytes / beta;
    - ``codec``: ``encode_gbps``, ``decode_gbps``, ``reduce_gbps`` (GB/s of BF16 input)
      and ``ratio`` (frame bytes / raw bytes) of the codec alone;
    - ``round_s[op]``, ``fixed_s[op]``: the compressed path's fixed cost per pipeline round
      and per call (from compressed calls on tiny messages);
    - ``measured[op][path] = [[bytes, s], ...]``: every calibration point, native and
      compressed, used to check the model and to bound where it may compress;
    - ``chunk``: elements per pipeline round; ``overlap``: whether rounds overlap (device
      streams) or run one after another (host); ``world``: ranks; ``key``: what was measured
      (device or host, transport, ranks, machine), so a cached profile is reused only there.

    >>> prof = Profile("k", 2, 16 << 20, True, native={"all_gather": (2e-5, 25.0)},
    ...                codec={"encode_gbps": 1000.0, "decode_gbps": 1000.0, "reduce_gbps": 1000.0,
    ...                       "ratio": 0.7},
    ...                round_s={"all_gather": 1e-4}, fixed_s={"all_gather": 5e-4},
    ...                measured={"all_gather": {"native": [[1 << 20, 6e-5], [1 << 30, 0.043]],
    ...                                         "compressed": [[1 << 20, 9e-4], [1 << 30, 0.031]]}})
    >>> pr = prof.predict("all_gather", 1 << 30)
    >>> round(pr.native_s * 1e3, 2), round(pr.compressed_s * 1e3, 2), pr.rounds
    (42.97, 30.73, 32)
    """

    key: str
    world: int
    chunk: int  # elements per round (0: the two-phase exchange, one round)
    overlap: bool = True  # stages of different rounds overlap (device streams); host: one after another
    native: dict = field(default_factory=dict)
    codec: dict = field(default_factory=dict)
    round_s: dict = field(default_factory=dict)
    fixed_s: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)

    def sizes(self, op: str) -> list[int]:
        """The calibrated sizes of ``op`` (bytes, ascending)."""
        return sorted({int(b) for b, _ in self.measured.get(op, {}).get("native", [])})

    def predict(self, op: str, nbytes: int) -> Prediction | None:
        """Both paths' predicted times for ``op`` on ``nbytes``, or None if ``op`` is not profiled."""
        if op not in self.native or op not in self.fixed_s or not self.codec:
            return None
        a, b = self.native[op]
        tn = a + nbytes / (b * 1e9)
        p = self.world
        if op == "all_reduce":  # reduce-scatter of the buffer, then all-gather of one shard
            parts = [("reduce_scatter", nbytes), ("all_gather", nbytes / p)]
        else:
            parts = [(op, nbytes)]
        total, stages, rounds = self.fixed_s[op], {"fixed": self.fixed_s[op]}, 0
        for sub, size in parts:
            k, st = self._stages(sub, size, self.round_s[op])
            if self.overlap:
                total += pipelined([(fixed, work) for fixed, work in st.values()], k)
            else:
                total += sum(k * fixed + work for fixed, work in st.values())
            rounds = max(rounds, k)
            for name, (fixed, work) in st.items():
                stages[name] = stages.get(name, 0.0) + k * fixed + work
        return Prediction(op, int(nbytes), tn, total, rounds, stages)

    def _stages(self, op: str, nbytes: float, round_s: float) -> tuple[int, dict]:
        """(rounds, {stage: (fixed per round, total work)}) of one exchange of the pipelined path."""
        p, c = self.world, self.codec
        enc, dec, red, r = (c["encode_gbps"] * 1e9, c["decode_gbps"] * 1e9, c["reduce_gbps"] * 1e9,
                            c["ratio"])
        gather_bw = self.native["all_gather"][1] * 1e9 if "all_gather" in self.native else None
        pairs_bw = self.native["all_to_all"][1] * 1e9 if "all_to_all" in self.native else None
        if op == "all_gather":  # nbytes = own piece; one frame to every peer, all-gather
            msg, e, d, wire, bw = nbytes, nbytes, (p - 1) * nbytes, r * nbytes, gather_bw
            extra = 0.0
        elif op == "all_to_all":  # nbytes = whole send buffer; messages of nbytes / p
            msg = nbytes / p
            e = d = (p - 1) * msg
            wire, bw = (r * msg, gather_bw) if p == 2 else (r * nbytes, pairs_bw)
            extra = 0.0
        elif op == "reduce_scatter":  # nbytes = send buffer = p pieces of the output size
            msg = nbytes / p
            e = d = (p - 1) * msg
            wire, bw = (r * msg, gather_bw) if p == 2 else (r * nbytes, pairs_bw)
            extra = nbytes / red
        else:
            raise ValueError(f"no stage model for {op!r}")
        if bw is None:  # the transfer's link was not measured: no prediction
            bw = math.nan
        rounds = max(1, math.ceil(msg / 2 / self.chunk)) if self.chunk else 1
        return rounds, {"host": (round_s, 0.0), "encode": (0.0, e / enc), "transfer": (0.0, wire / bw),
                        "decode": (0.0, d / dec + extra)}

    def to_json(self) -> str:
        d = {"version": PROFILE_VERSION, "key": self.key, "world": self.world, "chunk": self.chunk,
             "overlap": self.overlap,
             "native": self.native, "codec": self.codec, "round_s": self.round_s,
             "fixed_s": self.fixed_s, "measured": self.measured}
        return json.dumps(d, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Profile:
        """A profile saved by ``to_json``; ValueError for another version (measure again)."""
        d = json.loads(text)
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version {d.get('version')}, this build reads {PROFILE_VERSION}")
        return Profile(d["key"], int(d["world"]), int(d["chunk"]), bool(d["overlap"]),
                       {op: tuple(v) for op, v in d["native"].items()}, d["codec"], d["round_s"],
                       d["fixed_s"], d["measured"])


@dataclass(frozen=True)
class Policy:
    """Native or compressed per operation and message size.

    >>> p = Policy("auto", min_bytes=1 << 20)
    >>> p.decide("all_gather", 4 << 20, bf16=True, device=True, world=2).compress
    True
    >>> p.decide("all_gather", 4 << 20, bf16=True, device=False, world=2).reason
    'host arrays: the CPU codec is slower than a host MPI link (compress_host=False)'
    """

    mode: str = "auto"
    min_bytes: int = 1 << 20  # "auto" without a profile: smallest per-rank BF16 message compressed
    compress_host: bool = False  # "auto" without a profile: also compress host (NumPy) arrays
    profile: Profile | None = None  # measured components; "auto" follows them where they cover the op
    margin: float = 0.05  # "auto" with a profile: compress only when predicted this much faster
    _memo: dict = field(init=False, repr=False, compare=False)  # decisions already made

    def __post_init__(self):
        object.__setattr__(self, "_memo", {})  # a pure function of its arguments: remember it
        if self.mode not in MODES:
            raise ValueError(f"policy must be one of {MODES}, got {self.mode!r}")
        if int(self.min_bytes) < 0:
            raise ValueError(f"min_bytes must be >= 0, got {self.min_bytes}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")

    def decide(self, op: str, nbytes: int, *, bf16: bool, device: bool, world: int) -> Decision:
        """Compressed or native for one call of ``op`` moving ``nbytes`` per rank."""
        key = (op, int(nbytes), bool(bf16), bool(device), int(world))
        d = self._memo.get(key)
        if d is None:
            d = self._decide(op, nbytes, bf16=bf16, device=device, world=world)
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = d
        log.debug("%s", d)
        return d

    def _decide(self, op: str, nbytes: int, *, bf16: bool, device: bool, world: int) -> Decision:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")
        pred = None
        if self.profile is not None and bf16 and world == self.profile.world:
            pred = self.profile.predict(op, nbytes)
        times = {"native_s": pred.native_s, "compressed_s": pred.compressed_s} if pred else {}
        if not bf16:
            d = Decision(op, nbytes, False, "not BF16: passed through the native collective")
        elif world == 1:
            d = Decision(op, nbytes, False, "one rank: nothing crosses a link")
        elif self.mode == "never":
            d = Decision(op, nbytes, False, 'policy="never"', **times)
        elif self.mode == "always":
            d = Decision(op, nbytes, True, 'policy="always"', **times)
        elif pred is not None:
            d = self._from_profile(op, nbytes, pred)
        elif not device and not self.compress_host:
            d = Decision(op, nbytes, False, "host arrays: the CPU codec is slower than a host MPI "
                                            "link (compress_host=False)")
        elif nbytes < self.min_bytes:
            d = Decision(op, nbytes, False, f"below the {self.min_bytes:,}-byte threshold")
        else:
            d = Decision(op, nbytes, True, f"at or above the {self.min_bytes:,}-byte threshold")
        return d

    def _from_profile(self, op: str, nbytes: int, pred: Prediction) -> Decision:
        prof = self.profile
        sizes = prof.sizes(op)
        tn, tc = pred.native_s, pred.compressed_s
        times = {"native_s": tn, "compressed_s": tc}
        text = pred.describe()
        if not sizes or nbytes < sizes[0] or nbytes > sizes[-1]:
            lo, hi = (sizes[0], sizes[-1]) if sizes else (0, 0)
            return Decision(op, nbytes, False, f"{text}; outside the calibrated range "
                                               f"{lo:,}-{hi:,} B: native", **times)
        if not tc < (1.0 - self.margin) * tn:
            return Decision(op, nbytes, False, f"{text}: native", **times)
        # the measurements at the calibrated sizes around nbytes must agree with the model
        meas = prof.measured[op]
        nat, comp = dict((int(b), t) for b, t in meas["native"]), dict((int(b), t) for b, t in
                                                                           meas["compressed"])
        below = max(s for s in sizes if s <= nbytes)
        above = min(s for s in sizes if s >= nbytes)
        for s in {below, above}:
            if s in comp and not comp[s] < nat[s]:
                return Decision(op, nbytes, False, f"{text}; but at the calibrated {s:,} B the "
                                                   f"compressed path measured slower: native", **times)
        return Decision(op, nbytes, True, f"{text}: compressed", **times)

    def explain(self, op: str, nbytes: int, *, device: bool = True, world: int = 2) -> str:
        """One line saying what ``op`` on ``nbytes`` BF16 bytes per rank would do, and why."""
        return str(self.decide(op, nbytes, bf16=True, device=device, world=world))
