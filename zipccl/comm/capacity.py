"""The capacity rule: how many escape bytes a slot reserves, the same on every rank.

A slot (``format.slot``) holds a frame's static part plus ``capacity`` escape bytes; a frame
with more escapes spills its tail beside the collective (slow but correct). The capacity
must be known before the data exists and must be the same on every rank without a message,
so the rule is a pure function of its configuration and of the escape counts of earlier
calls, which every rank learns alike from the received slot headers. Escape rates differ by
tensor kind and drift during training, so the rule follows each *call site* (a key every rank
names alike): a cold start, then the recent largest escape rate with a margin, on a coarse
grid so that plans keyed by the slot size are reused; it never exceeds the escape room of a
RAW frame. All state is integers. The rule, its defaults and the measurements they were
chosen from: docs/COLLECTIVES.md, "Slot capacity".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from .. import format as fmt
from ..format.slot import slot_bytes, tail_bytes


def escape_room(n: int, code: int = fmt.DTYPE_BF16) -> int:
    """Escape bytes beyond which a frame of ``n`` values is RAW (its largest size): the most
    capacity can usefully reserve.

    >>> escape_room(4096), escape_room(100)
    (2432, 0)
    """
    lay = fmt.Layout.for_count(int(n), fmt.dtype_code(code))
    return max(0, lay.raw_size - lay.static_size)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fraction(name: str, value) -> float:
    if not _is_number(value) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a fraction of n in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CapacityConfig:
    """The capacity rule's settings (docs/COLLECTIVES.md, "Slot capacity"); validated on construction.

    >>> CapacityConfig(margin=0.5)
    Traceback (most recent call last):
    ...
    ValueError: margin must be a number >= 1, got 0.5
    """

    cold: float = 0.125  # fraction of n reserved at a site before its first observation
    fraction: float | None = None  # override: ceil(fraction * n) bytes at every site
    nbytes: int | None = None  # override: this many bytes per frame at every site
    window: int = 4  # observations per site whose largest rate counts
    margin: float = 1.25  # multiplies that rate
    pad: int = 1  # grid steps added on top
    decay: float = 0.25  # share of the gap to a lower target closed per observation
    grid: int = 128  # the adaptive capacity is a multiple of n / grid (rounded up)

    def __post_init__(self):
        _fraction("cold", self.cold)
        if self.fraction is not None:
            _fraction("fraction", self.fraction)
        if self.nbytes is not None and not (_is_count(self.nbytes) and self.nbytes >= 0):
            raise ValueError(f"nbytes must be an integer >= 0, got {self.nbytes!r}")
        if self.fraction is not None and self.nbytes is not None:
            raise ValueError("give one override, fraction or nbytes, not both")
        for name in ("window", "grid"):
            if not (_is_count(getattr(self, name)) and getattr(self, name) >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not (_is_count(self.pad) and self.pad >= 0):
            raise ValueError(f"pad must be an integer >= 0, got {self.pad!r}")
        if not (_is_number(self.margin) and self.margin >= 1):
            raise ValueError(f"margin must be a number >= 1, got {self.margin!r}")
        if not (_is_number(self.decay) and 0 < self.decay <= 1):
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")

    @property
    def fixed(self) -> bool:
        """True when an override replaces the adaptive rule."""
        return self.fraction is not None or self.nbytes is not None


def as_config(capacity) -> CapacityConfig | None:
    """The ``capacity=`` argument of the communicators as a ``CapacityConfig``: None (the
    default rule), a CapacityConfig, or a dict of its settings (e.g. ``{"fraction": 0.1}``).

    >>> as_config({"fraction": 0.1}).fraction
    0.1
    """
    if capacity is None or isinstance(capacity, CapacityConfig):
        return capacity
    if isinstance(capacity, dict):
        return CapacityConfig(**capacity)
    raise TypeError(f"capacity must be a zipccl.comm.capacity.CapacityConfig or a dict of its "
                    f"settings, got {type(capacity).__name__}")


@dataclass
class _Site:
    rates: deque  # the last `window` observed rates, in grid steps (ceil)
    level: int  # the capacity in grid steps


def _count(name: str, v) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__") or int(v) < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    return int(v)


class CapacityRule:
    """Escape capacity per call site: ``capacity`` before a call, ``observe`` after it.

    Every rank must make the same ``observe`` calls (same values, same order); then every
    rank gets the same ``capacity`` for the same call. Not thread-safe (one per communicator).

    >>> rule = CapacityRule()
    >>> rule.capacity("ag0", 1 << 20)  # cold: 1/8 of n
    131072
    >>> rule.observe("ag0", 1 << 20, max_escapes=24_000)  # 2.3 % escaped
    >>> rule.capacity("ag0", 1 << 20)  # 2.3 % * 1.25 + 1 step, on the 1/128 grid
    40960
    """

    def __init__(self, config: CapacityConfig | None = None, **settings):
        if config is not None and settings:
            raise TypeError("give a CapacityConfig or settings, not both")
        self._config = config if config is not None else CapacityConfig(**settings)
        self._sites: dict[Hashable, _Site] = {}
        self.changes = 0  # how often a capacity may have changed (a kept graph's slots: resized?)

    @property
    def config(self) -> CapacityConfig:
        return self._config

    @config.setter
    def config(self, value: CapacityConfig) -> None:
        self._config = value
        self.changes += 1

    def capacity(self, site: Hashable, n: int, code: int = fmt.DTYPE_BF16) -> int:
        """Escape bytes to reserve for a frame of ``n`` values of type ``code`` at ``site``."""
        n, cfg = _count("n", n), self._config
        if cfg.nbytes is not None:
            want = cfg.nbytes
        elif cfg.fraction is not None:
            want = math.ceil(cfg.fraction * n)
        elif (s := self._sites.get(site)) is not None:
            want = -(-s.level * n // cfg.grid)
        else:
            want = math.ceil(cfg.cold * n)
        return min(want, escape_room(n, code))

    def slot_bytes(self, site: Hashable, n: int, code: int = fmt.DTYPE_BF16) -> int:
        """``slots.slot_bytes`` of a frame at ``site`` with this rule's capacity."""
        return slot_bytes(n, code, self.capacity(site, n, code))

    def observe(self, site: Hashable, n: int, code: int = fmt.DTYPE_BF16, max_escapes: int = 0) -> None:
        """Record the largest escape count ``max_escapes`` among the frames of a call at
        ``site`` whose frames hold ``n`` values (frames of unequal sizes: the count of the frame
        that escape count belongs to)."""
        n, e, cfg = _count("n", n), _count("max_escapes", max_escapes), self._config
        fmt.dtype_code(code)  # validates the type code
        if e > n:
            raise ValueError(f"max_escapes {e} exceeds the frame's {n} values")
        if n == 0 or cfg.fixed:
            return
        rate = -(-e * cfg.grid // n)
        s = self._sites.get(site)
        if s is None:
            s = self._sites[site] = _Site(deque(maxlen=cfg.window), 0)
        s.rates.append(rate)
        target = min(cfg.grid, math.ceil(max(s.rates) * cfg.margin) + cfg.pad)
        before = s.level
        if target >= s.level:  # a new site starts at level 0
            s.level = target
        else:
            s.level -= math.ceil((s.level - target) * cfg.decay)
        self.changes += s.level != before

    def level(self, site: Hashable) -> float | None:
        """The site's current capacity as a fraction of n (None: not observed yet)."""
        s = self._sites.get(site)
        return None if s is None else s.level / self.config.grid

    def reset(self) -> None:
        """Forget every observation (every rank together, e.g. when a communicator is rebuilt)."""
        self._sites.clear()
        self.changes += 1


# -- measuring a rule on recorded traffic --------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One recorded call: its site, element type and the (n, escapes) of each of its frames."""

    site: Hashable
    frames: Sequence[tuple[int, int]]
    code: int = fmt.DTYPE_BF16


@dataclass
class Tally:
    """What a rule did on a sequence of calls (``replay``)."""

    frames: int = 0
    spills: int = 0
    raw_bytes: int = 0  # the frames' values, uncompressed
    slot_bytes: int = 0  # slots moved (slot headers and frame headers included)
    frame_bytes: int = 0  # the frames' own lengths
    tail_bytes: int = 0  # moved beside the collective by spills
    spilled_raw_bytes: int = 0  # raw bytes of the frames that spilled
    cold_frames: int = 0  # frames sized before their site's first observation
    cold_spills: int = 0
    cold_raw_bytes: int = 0
    cold_slot_bytes: int = 0

    def add(self, n: int, code: int, slot: int, frame_len: int, cold: bool) -> None:
        tail = tail_bytes(frame_len, slot)
        raw = n * fmt.ITEMSIZE[code]
        self.frames += 1
        self.raw_bytes += raw
        self.slot_bytes += slot
        self.frame_bytes += frame_len
        self.tail_bytes += tail
        self.spills += tail > 0
        self.spilled_raw_bytes += raw if tail else 0
        if cold:
            self.cold_frames += 1
            self.cold_spills += tail > 0
            self.cold_raw_bytes += raw
            self.cold_slot_bytes += slot

    def summary(self) -> dict:
        """Slot ratio (slot / raw bytes), wire ratio (slots + tails), spill rate (per frame),
        spilled bytes (tails / frame bytes; raw bytes of spilled frames / raw bytes), and the
        slot ratio and spill rate of the frames sized after their site's first observation
        (None if there are none)."""
        div = max(1, self.raw_bytes)
        warm = self.frames - self.cold_frames
        return {"frames": self.frames, "spills": self.spills, "cold_frames": self.cold_frames,
                "cold_spills": self.cold_spills, "raw_bytes": self.raw_bytes,
                "slot_bytes": self.slot_bytes, "frame_bytes": self.frame_bytes,
                "tail_bytes": self.tail_bytes, "slot_ratio": self.slot_bytes / div,
                "wire_ratio": (self.slot_bytes + self.tail_bytes) / div,
                "frame_ratio": self.frame_bytes / div,
                "spill_rate": self.spills / max(1, self.frames),
                "spilled_bytes_fraction": self.tail_bytes / max(1, self.frame_bytes),
                "spilled_raw_fraction": self.spilled_raw_bytes / div,
                "steady_slot_ratio": (self.slot_bytes - self.cold_slot_bytes)
                / (self.raw_bytes - self.cold_raw_bytes) if warm else None,
                "steady_spill_rate": (self.spills - self.cold_spills) / warm if warm else None}


def replay(rule: CapacityRule, calls: Iterable[Call], tally: Tally | None = None) -> Tally:
    """Size every frame of ``calls`` with ``rule``, in order, as a collective would: capacity
    before the call, then ``observe`` of the call's largest escape count; returns the tally.

    >>> t = replay(CapacityRule(fraction=0.0625), [Call("g", [(1 << 16, 1 << 13)])])
    >>> t.spills, round(t.summary()["slot_ratio"], 4)
    (1, 0.7217)
    """
    tally = tally if tally is not None else Tally()
    for call in calls:
        cold = rule.level(call.site) is None and not rule.config.fixed
        for n, esc in call.frames:
            if n == 0:
                continue
            lay = fmt.Layout.for_count(n, call.code)
            tally.add(n, call.code, rule.slot_bytes(call.site, n, call.code), lay.frame_len(esc), cold)
        live = [(e, n) for n, e in call.frames if n]
        if live:
            e, n = max(live)
            rule.observe(call.site, n, call.code, e)
    return tally
