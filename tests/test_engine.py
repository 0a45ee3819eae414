"""Both engines implement ``zipccl.comm.engine.Engine``: every method, with a compatible signature.

Runs without a GPU: the device engine is checked as a class (its constructor needs CuPy).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import zipccl
from zipccl.comm.engine import Engine
from zipccl.comm.host import HostEngine
from zipccl.comm.pipeline import DeviceEngine

ENGINES = [HostEngine, DeviceEngine]
METHODS = sorted(n for n, v in vars(Engine).items() if inspect.isfunction(v) and not n.startswith("_"))
ATTRIBUTES = sorted(Engine.__annotations__)
_MISSING = object()


def _incompatible(proto, impl) -> str | None:
    """Why ``impl`` cannot stand where the protocol method ``proto`` is called, or None.

    Every protocol parameter must be there, in the same place, of the same kind, with the
    same default where the protocol has one; parameters the protocol does not name must
    be optional.
    """
    want = list(inspect.signature(proto).parameters.values())
    have = list(inspect.signature(impl).parameters.values())
    if len(have) < len(want):
        return f"takes {len(have)} parameters, the protocol passes {len(want)}"
    for w, h in zip(want, have[:len(want)], strict=True):
        if (w.name, w.kind) != (h.name, h.kind):
            return f"parameter {h.name!r} ({h.kind.description}) where the protocol has {w.name!r}"
        if w.default is not inspect.Parameter.empty and w.default != h.default:
            return f"default of {w.name!r} is {h.default!r}, the protocol's is {w.default!r}"
    for h in have[len(want):]:
        if h.default is inspect.Parameter.empty and h.kind not in (h.VAR_POSITIONAL, h.VAR_KEYWORD):
            return f"extra parameter {h.name!r} has no default"
    return None


def _problems(cls: type) -> list[str]:
    """Every way ``cls`` falls short of the protocol (empty: it implements it)."""
    out = []
    for name in METHODS:
        impl = inspect.getattr_static(cls, name, _MISSING)
        if impl is _MISSING:
            out.append(f"{cls.__name__}.{name} is missing")
        elif not inspect.isfunction(impl):
            out.append(f"{cls.__name__}.{name} is a {type(impl).__name__}, not a method")
        else:
            why = _incompatible(getattr(Engine, name), impl)
            if why:
                out.append(f"{cls.__name__}.{name}: {why}")
    init = inspect.getsource(cls.__init__)
    for name in ATTRIBUTES:  # a class attribute or one the constructor sets
        if not hasattr(cls, name) and not re.search(rf"self\.{name}\s*=", init):
            out.append(f"{cls.__name__}.{name} (attribute) is missing")
    return out


def test_the_protocol_declares_what_the_algorithms_call():
    assert "encode_slot" in METHODS and "pipeline_finish" in METHODS and ATTRIBUTES == ["checksum", "device"]
    root = Path(zipccl.__file__).parent
    called = set()
    for path in [*(root / "comm").glob("*.py"), *(root / "torch").glob("*.py")]:
        called |= set(re.findall(r"\beng(?:ine)?\.([a-z_]+)\b", path.read_text()))
    assert called, "no engine calls found: the scan is wrong"
    known = set(METHODS) | set(ATTRIBUTES)
    assert called <= known, f"called but not declared: {sorted(called - known)}"


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_engine_implements_the_protocol(cls):
    assert _problems(cls) == []


def test_host_engine_instance_is_an_engine():
    eng = HostEngine(checksum=True)
    assert isinstance(eng, Engine) and eng.checksum and not eng.device


def test_the_check_catches_a_missing_or_renamed_method():
    class Renamed(HostEngine):
        decode_frame = None  # no longer a method

        def decode_stream(self, round_):  # parameter renamed
            return None

        def decode(self, frame, out, slot=1):  # default changed
            return super().decode(frame, out)

        def copy(self, dst, src, how):  # a new required parameter
            pass

    problems = "\n".join(_problems(Renamed))
    for what in ("decode_frame is a NoneType", "decode_stream: parameter 'round_'",
                 "decode: default of 'slot'", "copy: extra parameter 'how'"):
        assert what in problems

    class Missing:
        device = True

        def __init__(self):
            self.checksum = False

    assert f"Missing.{METHODS[0]} is missing" in _problems(Missing)
    assert len(_problems(Missing)) == len(METHODS)
