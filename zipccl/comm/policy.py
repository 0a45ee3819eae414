"""The policy: for each collective call, compressed or native, and why.

Compression pays only when moving the saved bytes takes longer than coding them, which
depends on the link, the codec's speed and the message size. This module makes that choice in
one place: inspectable (``explain``), logged (``zipccl.policy`` at DEBUG) and forceable
(``mode="always" | "never"``; ``"raw"`` takes the compressed path with every frame RAW).
``mode="auto"`` follows a measured ``Profile`` (``Communicator.calibrate``): components, each
measured on its own, that the cost model (``zipccl.costmodel``, fitted with
``zipccl.costfit``) composes into predicted times at any size; without one, a size threshold.
Every rank must decide alike, so ``decide`` is a pure function of values all ranks agree on;
decisions are cached per (op, size). How the profile's parts are measured and combined, and
the sizes it counts: docs/COST_MODEL.md, "The policy".
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from .. import costmodel as cm
from ..costfit import anchored, fit_exchange, link_from_fits
from ..costmodel import OPS, Prediction

MODES = ("auto", "always", "never", "raw")
NOT_CODED = "not a type zipccl codes (BF16, FP32, FP16): passed through the native collective"
_CODED = ("bfloat16", "float32", "float16", None)  # decide's dtype: a type zipccl codes, or None
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
    raw: bool = False  # zipccl's exchange with the codec off (policy "raw"): frames sent RAW
    loopback: bool = False  # one rank, compressed through a slot to itself (``Policy.loopback``)

    def __str__(self) -> str:
        path = "raw exchange" if self.raw else "compressed" if self.compress else "native"
        return f"{self.op} {self.nbytes:,} B/rank -> {path} ({self.reason})"


# Anchoring (costfit.anchored): where the calibration's times are steady (each the least of
# this many measurements), the model's prediction for a path is scaled by measured / modelled
# time at the nearest calibrated size. The model alone assumes the pipeline's stages overlap
# perfectly; on a fast link at large sizes they do not (the codec's kernels and NCCL's share
# the GPU; the run that showed it: experiments/README.md, "The host path and the
# model-following policy").
ANCHOR_BEST_OF = 3


@dataclass(frozen=True)
class Profile:
    """What ``Communicator.calibrate`` measured, and the cost model that composes it.

    - ``native[op] = (alpha_s, beta_gbps)``: the native collective, t = alpha + bytes / beta;
    - ``codec``: ``encode_gbps``, ``decode_gbps``, ``reduce_gbps`` (GB/s of BF16 input)
      and ``ratio`` (frame bytes / raw bytes) of the codec alone;
    - ``round_s[op]``, ``fixed_s[op]``: the compressed path's fixed cost per pipeline round
      and per call (from compressed calls on tiny messages; the model refits the per-call
      cost to the compressed calls in ``measured`` where there are any);
    - ``measured[op][path] = [[bytes, s], ...]``: every calibration point, native and
      compressed; the compressed ones fix the per-call cost the model uses;
    - ``best_of``: each measured time is the least of this many measurements; from
      ``ANCHOR_BEST_OF`` on, predictions are scaled to the nearest measured size (module
      comment at ``ANCHOR_BEST_OF``);
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
    (42.97, 31.0, 32)
    """

    key: str
    world: int
    chunk: int  # elements per round (0: one round)
    overlap: bool = True  # stages of different rounds overlap (device streams); host: one after another
    native: dict = field(default_factory=dict)
    codec: dict = field(default_factory=dict)
    round_s: dict = field(default_factory=dict)
    fixed_s: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)
    # each measured time is the least of this many back-to-back measurements; from
    # ANCHOR_BEST_OF on they are steady enough to anchor the model to (1: a single measurement)
    best_of: int = 1
    _models: dict = field(init=False, repr=False, compare=False)  # per op: (link, codec, exchange)

    def __post_init__(self):
        object.__setattr__(self, "_models", {})

    def sizes(self, op: str) -> list[int]:
        """The calibrated sizes of ``op`` (bytes, ascending)."""
        return sorted({int(b) for b, _ in self.measured.get(op, {}).get("native", [])})

    def _per_rank(self, op: str, nbytes: float) -> float:
        """The policy's size of ``op`` in the cost model's convention (reduce-scatter: its output)."""
        return nbytes / self.world if op == "reduce_scatter" else nbytes

    def model(self, op: str) -> tuple[cm.Link, cm.Codec, cm.Exchange] | None:
        """The cost model's (native link, codec, compressed exchange) for ``op``; None if not profiled."""
        if op in self._models:
            return self._models[op]
        found = None
        if op in self.native and op in self.fixed_s and op in self.round_s and self.codec:
            p = self.world
            # native fits are per policy size: reduce-scatter's is its send buffer of p outputs
            fits = {o: (a, b / (p if o == "reduce_scatter" else 1)) for o, (a, b) in self.native.items()}
            link = link_from_fits(self.key, fits, p)
            c = self.codec
            codec = cm.Codec("zipccl", c["encode_gbps"], c["decode_gbps"], c["ratio"],
                             reduce_gbps=c["reduce_gbps"])
            ex = cm.Exchange(self.fixed_s[op], self.round_s[op], 2 * self.chunk, self.overlap)
            # the per-call cost that the calls of real sizes show, where there are any
            calls = [(self._per_rank(op, b), t) for b, t in self.measured.get(op, {}).get("compressed", [])]
            found = (link, codec, fit_exchange(op, p, link, codec, ex, calls))
        self._models[op] = found
        return found

    def predict(self, op: str, nbytes: int) -> Prediction | None:
        """Both paths' predicted times for ``op`` on ``nbytes`` (policy sizes), or None if not profiled.

        The prediction's own ``nbytes`` is the cost model's per-rank size (reduce-scatter:
        ``nbytes / world``).
        """
        m = self.model(op)
        if m is None:
            return None
        pred = self._model_predict(op, nbytes, m)
        if self.best_of < ANCHOR_BEST_OF:
            return pred
        return anchored(pred, nbytes, self.measured.get(op, {}),
                           lambda b: self._model_predict(op, int(b), m))

    def _model_predict(self, op: str, nbytes: int, m) -> Prediction:
        link, codec, ex = m
        return cm.predict(op, self._per_rank(op, nbytes), self.world, link, codec, exchange=ex)

    def to_json(self) -> str:
        d = {"version": PROFILE_VERSION, "key": self.key, "world": self.world, "chunk": self.chunk,
             "overlap": self.overlap,
             "native": self.native, "codec": self.codec, "round_s": self.round_s,
             "fixed_s": self.fixed_s, "measured": self.measured, "best_of": self.best_of}
        return json.dumps(d, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Profile:
        """A profile saved by ``to_json``; ValueError for another version (measure again)."""
        d = json.loads(text)
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version {d.get('version')}, this build reads {PROFILE_VERSION}")
        return Profile(d["key"], int(d["world"]), int(d["chunk"]), bool(d["overlap"]),
                       {op: tuple(v) for op, v in d["native"].items()}, d["codec"], d["round_s"],
                       d["fixed_s"], d["measured"], int(d.get("best_of", 1)))


POLICY_ENV = "ZIPCCL_POLICY"


def env_policy() -> str | None:
    """``$ZIPCCL_POLICY`` ("always", "never", "auto", "raw"), or None when unset; ValueError
    otherwise. It replaces the default "auto" of every front end (an explicit mode in code
    stays): ``Communicator``, ``zipccl.torch``'s functions and hooks, the torch backend."""
    v = os.environ.get(POLICY_ENV, "").strip().lower()
    if not v:
        return None
    if v not in MODES:
        raise ValueError(f"{POLICY_ENV}={v!r}: expected one of {MODES}")
    return v


@dataclass(frozen=True)
class Policy:
    """Native or compressed per operation and message size.

    >>> p = Policy("auto", min_bytes=1 << 20)
    >>> p.decide("all_gather", 4 << 20, dtype="bfloat16", device=True, world=2).compress
    True
    >>> p.decide("all_gather", 4 << 20, dtype="float32", device=False, world=2).reason
    'host arrays: the CPU codec is slower than a host MPI link (compress_host=False)'
    >>> p.decide("all_gather", 4 << 20, dtype=None, device=True, world=2).reason
    'not a type zipccl codes (BF16, FP32, FP16): passed through the native collective'

    ``dtype``: "bfloat16", "float32", "float16", or None for any type zipccl does not code
    (and for reductions zipccl does not compute: only sums are coded). A measured profile
    holds BF16 components only: with one, FP32 and FP16 calls stay native (the model has no
    measurement of their codec), and "always" or a profile-free "auto" compresses them.
    """

    mode: str = "auto"
    min_bytes: int = 1 << 20  # "auto" without a profile: smallest per-rank BF16 message compressed
    compress_host: bool = False  # "auto" without a profile: also compress host (NumPy) arrays
    profile: Profile | None = None  # measured components; "auto" follows them where they cover the op
    margin: float = 0.02  # "auto" with a profile: compress only when predicted this much faster
    loopback: bool = False  # one rank: run the whole compressed path through a slot to itself
    # (for benchmarks and tests of host cost and capture on one GPU; it moves nothing useful)
    # (near-ties stay native: the codec would take memory bandwidth for nothing)
    _memo: dict = field(init=False, repr=False, compare=False)  # decisions already made

    def __post_init__(self):
        object.__setattr__(self, "_memo", {})  # a pure function of its arguments: remember it
        if self.mode not in MODES:
            raise ValueError(f"policy must be one of {MODES}, got {self.mode!r}")
        if int(self.min_bytes) < 0:
            raise ValueError(f"min_bytes must be >= 0, got {self.min_bytes}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if not isinstance(self.loopback, bool):
            raise TypeError(f"loopback must be True or False, got {self.loopback!r}")
        if self.loopback and self.mode not in ("always", "raw"):
            raise ValueError(f'loopback=True runs the compressed path on one rank for benchmarks '
                             f'and tests: it needs policy "always" or "raw", got {self.mode!r}')

    def decide(self, op: str, nbytes: int, *, dtype: str | None, device: bool, world: int) -> Decision:
        """Compressed or native for one call of ``op`` moving ``nbytes`` per rank of ``dtype``.

        Made once per (op, size, dtype, place, ranks) and logged then; later calls with the
        same arguments are one dict lookup.
        """
        key = (op, nbytes, dtype, device, world)
        d = self._memo.get(key)
        if d is None:
            if dtype not in _CODED:
                raise ValueError(f"dtype must be one of {_CODED}, got {dtype!r}")
            d = self._decide(op, int(nbytes), dtype=dtype, device=bool(device), world=int(world))
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = d
            log.debug("%s", d)
        return d

    def _decide(self, op: str, nbytes: int, *, dtype: str | None, device: bool, world: int) -> Decision:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")
        pred = None
        if self.profile is not None and dtype == "bfloat16" and world == self.profile.world:
            pred = self.profile.predict(op, nbytes)
        times = {"native_s": pred.native_s, "compressed_s": pred.compressed_s} if pred else {}
        if dtype is None:
            d = Decision(op, nbytes, False, NOT_CODED)
        elif world == 1 and self.loopback and self.mode in ("always", "raw"):
            d = Decision(op, nbytes, True, f'one rank, loopback=True (policy="{self.mode}"): the '
                                           f'compressed path through a slot to itself',
                         raw=self.mode == "raw", loopback=True)
        elif world == 1:
            d = Decision(op, nbytes, False, "one rank: nothing crosses a link")
        elif self.mode == "never":
            d = Decision(op, nbytes, False, 'policy="never"', **times)
        elif self.mode == "always":
            d = Decision(op, nbytes, True, 'policy="always"', **times)
        elif self.mode == "raw":
            d = Decision(op, nbytes, True, 'policy="raw": zipccl\'s exchange, codec off (RAW frames)',
                         raw=True)
        elif pred is not None:
            d = self._from_profile(op, nbytes, pred)
        elif self.profile is not None and dtype != "bfloat16" and world == self.profile.world:
            d = Decision(op, nbytes, False, f"the calibrated profile measured BF16 only: {dtype} "
                                            f"stays native")
        elif not device and not self.compress_host:
            d = Decision(op, nbytes, False, "host arrays: the CPU codec is slower than a host MPI "
                                            "link (compress_host=False)")
        elif nbytes < self.min_bytes:
            d = Decision(op, nbytes, False, f"below the {self.min_bytes:,}-byte threshold")
        else:
            d = Decision(op, nbytes, True, f"at or above the {self.min_bytes:,}-byte threshold")
        return d

    def _from_profile(self, op: str, nbytes: int, pred: Prediction) -> Decision:
        """The cost model's choice, at any size: compressed when predicted ``margin`` faster."""
        tn, tc = pred.native_s, pred.compressed_s
        sizes = self.profile.sizes(op)
        where = ""
        if sizes and not sizes[0] <= nbytes <= sizes[-1]:
            where = f"; extrapolated beyond the calibrated {sizes[0]:,}-{sizes[-1]:,} B"
        if tc < (1.0 - self.margin) * tn:
            verdict = "compressed"
        elif tc < tn:
            verdict = f"native (compressed faster by less than the {self.margin:.0%} margin)"
        else:
            verdict = "native"
        return Decision(op, nbytes, verdict == "compressed", f"predicted {pred.terms()}{where}: {verdict}",
                        native_s=tn, compressed_s=tc)

    def explain(self, op: str, nbytes: int, *, device: bool = True, world: int = 2) -> str:
        """One line saying what ``op`` on ``nbytes`` BF16 bytes per rank would do, and why.

        >>> Policy("auto", min_bytes=1 << 20).explain("all_gather", 4096)
        'all_gather 4,096 B/rank -> native (below the 1,048,576-byte threshold)'
        """
        return str(self.decide(op, nbytes, dtype="bfloat16", device=device, world=world))
