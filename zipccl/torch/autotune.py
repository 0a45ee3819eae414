"""``policy="auto"`` in the torch layer: measure once per group, cache on disk, decide alike everywhere.

``calibrate(group, device)`` measures on the group itself, every rank taking part, through the
one harness ``zipccl.comm.calibrate.measure`` (the four collectives natively and compressed at a
few sizes; here also the codec alone via ``zipccl.compress`` / ``decompress``, a local BF16 sum
and the compressed calls' wire ratio) into a ``zipccl.comm.policy.Profile``. Rank 0's profile is
broadcast, so all ranks choose alike for every (op, size). It is cached at
``$ZIPCCL_CACHE_DIR`` (default ``~/.cache/zipccl``) as ``profile-<hash>.json``, keyed by world
size and ranks per host, device model(s), link (inner backend, ``NCCL_*`` / ``GLOO_*``) and
versions; a matching job loads it, a damaged or other-version file is measured again.

``ZIPCCL_POLICY=always|never|auto`` replaces the default ``"auto"`` (an explicit "always" /
"never" in code stays); ``ZIPCCL_CALIBRATION_SIZES`` (bytes per rank) overrides the sizes.
Host tensors under the functions and hooks keep the threshold rule (native unless
``compress_host``); the backend calibrates on every device type it serves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..comm.calibrate import FrontEnd, measure
from ..comm.policy import Policy, Profile, env_policy
from ..costmodel import OPS
from .functional import Collectives
from .translate import ReduceOp
from .transport import FORGET, resolve_group

CACHE_ENV = "ZIPCCL_CACHE_DIR"
SIZES_ENV = "ZIPCCL_CALIBRATION_SIZES"
DEVICE_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)  # bytes per rank
HOST_SIZES = (16 << 10, 256 << 10, 1 << 20)


@dataclass(frozen=True)
class Calibration:
    """Where a group's profile came from: "measured" or "cache", the file, seconds spent."""

    source: str
    path: str | None
    seconds: float
    profile: Profile


_DONE: dict[tuple, tuple] = {}  # (id(group), device type) -> (group, Policy, Calibration)
_FORCED: dict[tuple, Policy] = {}


def cache_dir() -> Path:
    """``$ZIPCCL_CACHE_DIR``, else ``~/.cache/zipccl`` (``$XDG_CACHE_HOME/zipccl`` where set)."""
    d = os.environ.get(CACHE_ENV)
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zipccl"


def calibration_sizes(device: torch.device) -> tuple[int, ...]:
    """Bytes per rank calibrated on ``device``'s type (``$ZIPCCL_CALIBRATION_SIZES`` overrides)."""
    v = os.environ.get(SIZES_ENV)
    if v:
        sizes = tuple(sorted({int(s) for s in v.split(",") if s.strip()}))
        if len(sizes) < 2 or sizes[0] < 4:
            raise ValueError(f"{SIZES_ENV}={v!r}: need at least two sizes of >= 4 bytes")
        return sizes
    return DEVICE_SIZES if device.type == "cuda" else HOST_SIZES


def _inner_backend(group, device: torch.device) -> str:
    if _zipccl_group(group):
        return group.inner._get_backend(device).name()
    return str(dist.get_backend(group))


def _device_model(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def _versions(device: torch.device) -> dict:
    import zipccl

    v = {"zipccl": zipccl.__version__, "torch": torch.__version__}
    try:
        import numba

        v["numba"] = numba.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        try:
            v["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            pass
        try:
            import cupy

            v["cupy"] = cupy.__version__
        except ImportError:
            pass
    return v


def profile_key(group=None, device: torch.device | str = "cpu") -> str:
    """What a profile of ``group`` on ``device`` depends on, the same string on every rank (collective)."""
    import socket

    group = resolve_group(group)
    device = torch.device(device)
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_"))}
    env.pop("NCCL_DEBUG", None)
    env.pop("NCCL_DEBUG_SUBSYS", None)
    mine = {"host": socket.gethostname(), "model": _device_model(device), "env": env,
            "versions": _versions(device)}
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    hosts = Counter(d["host"] for d in every)
    desc = {"world": len(every), "hosts": len(hosts), "ranks_per_host": max(hosts.values()),
            "device": device.type, "backend": _inner_backend(group, device),
            "models": sorted({d["model"] for d in every}),
            "env": sorted({json.dumps(d["env"], sort_keys=True) for d in every}),
            "versions": sorted({json.dumps(d["versions"], sort_keys=True) for d in every})}
    return "torch|" + json.dumps(desc, sort_keys=True)


def profile_path(key: str) -> Path:
    """The cache file of the profile with ``key``."""
    return cache_dir() / f"profile-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _bcast(text: str | None, group) -> str | None:
    """Rank 0's ``text`` on every rank of ``group``."""
    box = [text]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]


def calibrate(group=None, device: torch.device | str | None = None, *, sizes=None, repeat: int = 3,
              cache: bool = True) -> Calibration:
    """``group``'s profile on ``device``: loaded from the cache, else measured (and cached).

    Collective: every rank of ``group`` calls it. ``sizes``: bytes per rank (default
    ``calibration_sizes``). Returns a ``Calibration`` holding the same ``Profile`` on every rank.

    >>> # in a torch.distributed job:
    >>> # cal = zipccl.torch.autotune.calibrate(device="cuda"); cal.source, cal.path
    """
    group = resolve_group(group)
    device = torch.device(device if device is not None else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    t0 = time.perf_counter()
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    key = profile_key(group, device)
    path = profile_path(key)
    if cache:
        text = None
        if rank == 0:
            try:
                text = path.read_text()
            except OSError:
                text = None
        text = _bcast(text, group)
        prof = _parse(text, key, p)
        if prof is not None:
            return Calibration("cache", str(path), time.perf_counter() - t0, prof)
    sizes = tuple(sorted(sizes)) if sizes is not None else calibration_sizes(device)
    measured = _measure(group, device, key, sizes, repeat)
    text = _bcast(measured.to_json() if rank == 0 else None, group)
    prof = Profile.from_json(text)  # rank 0's bytes on every rank: the same decisions everywhere
    if cache and rank == 0:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as e:
            warnings.warn(f"zipccl: could not cache the calibration profile at {path}: {e}", stacklevel=2)
    return Calibration("measured", str(path) if cache else None, time.perf_counter() - t0, prof)


def _parse(text: str | None, key: str, world: int) -> Profile | None:
    if not text:
        return None
    try:
        prof = Profile.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None  # another version or a damaged file: measure again
    return prof if prof.key == key and prof.world == world else None


def _measure(group, device: torch.device, key: str, sizes, repeat: int) -> Profile:
    """The one harness (``comm.calibrate.measure``) on ``group``: its calls through
    ``Collectives`` forced to one path by their policy, and the codec alone
    (``zipccl.compress`` / ``decompress``), a torch p-way BF16 sum (FP32 accumulation) and the
    wire ratio of the compressed calls."""
    from .. import compress, decompress

    p, rank = dist.get_world_size(group), dist.get_rank(group)
    cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(12345 + rank)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def data(n: int) -> torch.Tensor:
        return (torch.randn(n, generator=gen) * 0.02).to(torch.bfloat16).to(device)

    def empty(n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.bfloat16, device=device)

    def slowest(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=ReduceOp.MAX, group=group)
        return [float(v) for v in t.tolist()]

    def call_of(c: Collectives, op: str, n: int):
        """``op`` through ``c`` on messages of ``n`` BF16 elements per rank (the metrics convention)."""
        if op == "all_gather":
            x, out = data(n), empty(p * n)
            return lambda: c.all_gather_into_tensor(out, x, group=group)
        if op == "reduce_scatter":
            x, out = data(p * n), empty(n)
            return lambda: c.reduce_scatter_tensor(out, x, ReduceOp.SUM, group=group)
        n = max(p, n // p * p)
        x = data(n)
        out = empty(n)
        if op == "all_to_all":
            return lambda: c.all_to_all_single(out, x, group=group)

        def call():  # in place: every call starts from the same input; both paths pay the copy
            out.copy_(x)
            c.all_reduce(out, ReduceOp.SUM, group=group)
        return call

    paths = {False: Collectives(Policy("never")), True: Collectives(Policy("always"))}

    @contextmanager
    def make_call(compressed: bool, op: str, n: int):
        c = paths[compressed]
        yield call_of(c, op, n), lambda: int(c.last_decision.nbytes)

    def codec(n: int):
        x = data(n)
        frame = compress(x, checksum=False)
        out = empty(n)
        stage = data(p * n)
        st = paths[True].stats
        return {"encode": (2 * n, lambda: compress(x, checksum=False)),
                "decode": (2 * n, lambda: decompress(frame, out=out) if not cuda else decompress(frame)),
                "reduce": (2 * p * n, lambda: stage.view(p, n).float().sum(0).to(torch.bfloat16)),
                }, st.wire_bytes / max(1, st.raw_bytes)

    fe = FrontEnd(key, p, paths[True].chunk, cuda, lambda: dist.barrier(group=group), slowest, sync,
                  make_call, codec)
    return measure(fe, sizes, OPS, repeat)


def policy_for(group, device: torch.device, base: Policy | None = None) -> Policy:
    """``base`` ("auto") with ``group``'s profile on ``device``'s type; calibrates on first use
    (collective then: every rank calls it at the same point)."""
    group = resolve_group(group)
    device = torch.device(device)
    if dist.get_world_size(group) == 1:  # nothing crosses a link: the policy keeps it native
        return base if base is not None else Policy("auto")
    k = (id(group), device.type)
    done = _DONE.get(k)
    if done is None or done[0] is not group:
        cal = calibrate(group, device)
        pol = dataclasses.replace(base if base is not None else Policy("auto"), profile=cal.profile)
        done = _DONE[k] = (group, pol, cal)  # the group is held: its id stays its own
    return done[1]


def _held(group, device) -> tuple[Policy | None, Calibration | None, str]:
    """(policy, calibration, device type) ``group`` holds for ``device`` (None: CUDA, else CPU)."""
    types = [torch.device(device).type] if device is not None else ["cuda", "cpu"]
    for t in types:
        done = _DONE.get((id(group), t))
        if done is not None and done[0] is group:
            return done[1], done[2], t
    if _zipccl_group(group) and group.policy_mode != "auto":
        pol = group._policy
        return (pol if isinstance(pol, Policy) else Policy(pol)), None, types[-1]
    return None, None, types[-1]


def calibration(group=None, device: torch.device | str | None = None) -> Calibration | None:
    """The calibration ``group`` (default: world) holds for ``device``'s type, or None (local)."""
    return _held(resolve_group(group), device)[1]


def explain(op: str, nbytes: int, group=None, device: torch.device | str | None = None) -> str:
    """What ``group`` (default: world) does with ``op`` on ``nbytes`` BF16 bytes per rank, and why:
    with a calibration, both paths' predicted times and the choice. Local (no communication).

    ``nbytes`` follows the policy's convention: the send buffer (all-to-all: its mean).

    >>> # zipccl.torch.explain("all_gather", 64 << 20)
    >>> # 'all_gather 67,108,864 B/rank -> native (predicted native 0.301 ms (...), compressed ...'
    """
    group = resolve_group(group)
    pol, cal, dev = _held(group, device)
    if pol is None:
        return (f"{op} {int(nbytes):,} B/rank: not calibrated yet on this group; its first eligible "
                f"call under \"auto\" calibrates (or zipccl.torch.autotune.calibrate)")
    d = pol.decide(op, int(nbytes), dtype="bfloat16", device=dev == "cuda",
                   world=dist.get_world_size(group))
    return str(d) + (f" [profile {cal.source}: {cal.path}]" if cal is not None else "")


def policy_for_mode(policy: Policy) -> Policy:
    """``policy``, or -- for a profile-free "auto" while ``$ZIPCCL_POLICY`` forces another mode --
    that mode with ``policy``'s other settings."""
    if policy.mode != "auto" or policy.profile is not None:
        return policy
    forced = env_policy()
    if forced is None or forced == "auto":
        return policy
    k = (id(policy), forced)
    got = _FORCED.get(k)
    if got is None:
        got = _FORCED[k] = dataclasses.replace(policy, mode=forced)
        _FORCED[(id(got), "held")] = policy  # keep ``policy`` alive: its id stays its own
    return got


def resolve(policy: Policy, group, t: torch.Tensor) -> Policy:
    """The policy a call of ``zipccl.torch``'s functions and hooks follows.

    A profile-free "auto" on CUDA tensors takes the group's calibrated profile (calibrating on
    first use); ``$ZIPCCL_POLICY`` may force another mode; anything else is ``policy`` itself.
    """
    pol = policy_for_mode(policy)
    if pol.mode != "auto" or pol.profile is not None or group is None:
        return pol
    if _zipccl_group(group):
        return pol  # the group's own calls below decide (its policy, its calibration)
    if not t.is_cuda:
        return pol
    return policy_for(group, t.device, base=pol)


def _zipccl_group(group) -> bool:
    """Whether ``group`` is a zipccl backend group (``backend.ZipProcessGroup``: its own policy)."""
    return hasattr(group, "policy_mode") and hasattr(group, "inner")


# the torch functions and hooks follow the group's calibrated "auto"; forget_groups drops them
Collectives.resolve = staticmethod(resolve)
FORGET.append(_DONE.clear)
