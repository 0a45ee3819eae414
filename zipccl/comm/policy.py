"""The policy: for each collective call, compressed or native, and why.

Compression pays only when moving the saved bytes takes longer than coding them,
which depends on the link, the codec's speed and the message size. This module
makes that choice in one place so it is inspectable (``explain``), loggable
(``logging.getLogger("zipccl.policy")`` at DEBUG) and forceable
(``mode="always" | "never"``).

``mode="auto"`` uses a measured ``Profile`` when it has one: for each operation
the native and the compressed path's times were measured at a few sizes
(``Communicator.calibrate``) and fitted to ``alpha + bytes / beta``
(``zipccl.costmodel.fit_alpha_beta``), and the path predicted faster wins, so
fixed costs (kernel launches, synchronisations) and the real link speed are in
the choice. Without a profile it falls back to a size threshold: BF16 messages
of at least ``min_bytes`` per rank on a GPU are compressed; host arrays stay
native unless ``compress_host=True``.

Every rank must reach the same decision, so ``decide`` is a pure function of
values all ranks agree on (they are checked collectively before it is called).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

MODES = ("auto", "always", "never")
OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")

log = logging.getLogger("zipccl.policy")


@dataclass(frozen=True)
class Decision:
    """One policy decision: ``compress`` or not, and a sentence saying why."""

    op: str
    nbytes: int  # uncompressed bytes per rank the decision was made for
    compress: bool
    reason: str

    def __str__(self) -> str:
        path = "compressed" if self.compress else "native"
        return f"{self.op} {self.nbytes:,} B/rank -> {path} ({self.reason})"


@dataclass(frozen=True)
class Profile:
    """Measured alpha-beta fits of each path per operation: time = alpha + bytes / (beta GB/s).

    ``fits[op][path] = (alpha_s, beta_gbps)`` for path "native" and "compressed";
    ``key`` names what was measured (transport, ranks, device) so a cached profile is
    only reused where it was made.

    >>> prof = Profile("x", {"all_gather": {"native": (1e-5, 25.0), "compressed": (1e-3, 36.0)}})
    >>> [round(t * 1e3, 3) for t in prof.predict("all_gather", 1 << 30)]
    [42.96, 30.826]
    """

    key: str
    fits: dict = field(default_factory=dict)

    def predict(self, op: str, nbytes: int) -> tuple[float, float] | None:
        """(native s, compressed s) predicted for ``op`` on ``nbytes`` per rank, or None."""
        f = self.fits.get(op)
        if not f or "native" not in f or "compressed" not in f:
            return None
        (an, bn), (ac, bc) = f["native"], f["compressed"]
        return an + nbytes / (bn * 1e9), ac + nbytes / (bc * 1e9)

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "fits": self.fits}, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Profile:
        d = json.loads(text)
        fits = {op: {path: tuple(v) for path, v in paths.items()} for op, paths in d["fits"].items()}
        return Profile(d["key"], fits)


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
    profile: Profile | None = None  # measured fits; "auto" follows them where they cover the op

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"policy must be one of {MODES}, got {self.mode!r}")
        if int(self.min_bytes) < 0:
            raise ValueError(f"min_bytes must be >= 0, got {self.min_bytes}")

    def decide(self, op: str, nbytes: int, *, bf16: bool, device: bool, world: int) -> Decision:
        """Compressed or native for one call of ``op`` moving ``nbytes`` per rank."""
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")
        if not bf16:
            d = Decision(op, nbytes, False, "not BF16: passed through the native collective")
        elif world == 1:
            d = Decision(op, nbytes, False, "one rank: nothing crosses a link")
        elif self.mode == "never":
            d = Decision(op, nbytes, False, 'policy="never"')
        elif self.mode == "always":
            d = Decision(op, nbytes, True, 'policy="always"')
        elif self.profile is not None and self.profile.predict(op, nbytes) is not None:
            tn, tc = self.profile.predict(op, nbytes)
            d = Decision(op, nbytes, tc < tn, f"measured profile predicts native {tn * 1e3:.3f} ms, "
                                              f"compressed {tc * 1e3:.3f} ms")
        elif not device and not self.compress_host:
            d = Decision(op, nbytes, False, "host arrays: the CPU codec is slower than a host MPI "
                                            "link (compress_host=False)")
        elif nbytes < self.min_bytes:
            d = Decision(op, nbytes, False, f"below the {self.min_bytes:,}-byte threshold")
        else:
            d = Decision(op, nbytes, True, f"at or above the {self.min_bytes:,}-byte threshold")
        log.debug("%s", d)
        return d

    def explain(self, op: str, nbytes: int, *, device: bool = True, world: int = 2) -> str:
        """One line saying what ``op`` on ``nbytes`` BF16 bytes per rank would do, and why."""
        return str(self.decide(op, nbytes, bf16=True, device=device, world=world))
