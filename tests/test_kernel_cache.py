"""The on-disk kernel cache (``zipccl.kernels.cache``) and ``python -m zipccl warmup``, without a GPU.

Compiling needs a device (and NVRTC), so the cache is driven here with stand-in compile and
load functions: where entries go (arch, toolchain, what the kernel is), that a hit returns the
stored bytes and compiles nothing, that stale, damaged and refused entries are compiled again
with a warning, that an unwritable folder is bypassed with one warning, that
``ZIPCCL_CACHE_DIR`` is honoured, and that ``launch.Kernel`` goes through it. The library's
real kernels are described (``ident``) without compiling: every one has an entry of its own,
the same in every process. The warmup command on a machine without a GPU says so and exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from conftest import SIMULATOR

from zipccl import warmup
from zipccl.kernels import cache

ROOT = Path(__file__).resolve().parent.parent
TOOLS = {"zipccl": "9.9.9", "numba": "0.68.1", "numba-cuda": "0.30.4", "numpy": "2.5.0"}
WHAT = {"kernel": {"name": "zipccl.kernels.fake.encode_tiles", "closure": [4, True]},
        "options": {"launch_bounds": [128, 8]}, "argtypes": ["array(uint32, 1d, C)", "int64"],
        "numba": {"OPT": 3}}


class Compiler:
    """Stand-in for Numba's compile + load: counts calls, returns a fresh image each time."""

    def __init__(self, image: bytes = b"\x7fELF cubin for sm_90", entry: str = "_Z6kernelPj"):
        self.image, self.entry = image, entry
        self.builds = 0
        self.loads: list[cache.Entry] = []

    def build(self):
        self.builds += 1
        return f"compiled#{self.builds}", cache.Entry(self.image, self.entry)

    def load(self, entry: cache.Entry):
        self.loads.append(entry)
        return f"loaded:{entry.entry}"


def _fetch(kc: cache.KernelCache, comp: Compiler, what=WHAT, arch="sm_90", source="src-1"):
    return kc.fetch(what, arch, source, comp.load, comp.build)


class _no_warnings(warnings.catch_warnings):
    """A block in which a ``KernelCacheWarning`` fails the test."""

    def __enter__(self):
        out = super().__enter__()
        warnings.simplefilter("error", cache.KernelCacheWarning)
        return out


# -- where ---------------------------------------------------------------------------------------

def test_directory_honours_the_environment(tmp_path):
    assert cache.directory({"ZIPCCL_CACHE_DIR": str(tmp_path / "k")}) == tmp_path / "k"
    assert cache.directory({"ZIPCCL_CACHE_DIR": "~/k"}) == Path("~/k").expanduser()
    assert cache.directory({"XDG_CACHE_HOME": "/x"}) == Path("/x/zipccl/kernels")
    assert cache.directory({}) == Path("~/.cache/zipccl/kernels").expanduser()
    assert cache.directory({"ZIPCCL_CACHE_DIR": "", "XDG_CACHE_HOME": "/x"}) == Path("/x/zipccl/kernels")
    assert cache.enabled({}) and cache.enabled({"ZIPCCL_KERNEL_CACHE": "1"})
    assert not any(cache.enabled({"ZIPCCL_KERNEL_CACHE": v}) for v in ("0", "off", "False", "no"))


def test_default_cache_reads_the_environment_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ZIPCCL_CACHE_DIR", str(tmp_path / "a"))
    cache.reset_default()
    try:
        assert cache.default().root == tmp_path / "a"
        monkeypatch.setenv("ZIPCCL_CACHE_DIR", str(tmp_path / "b"))
        assert cache.default().root == tmp_path / "a"  # one cache per process
        cache.reset_default()
        assert cache.default().root == tmp_path / "b"
        monkeypatch.setenv("ZIPCCL_KERNEL_CACHE", "0")
        cache.reset_default()
        assert cache.default().root is None
    finally:
        cache.reset_default()


# -- keying --------------------------------------------------------------------------------------

def test_entries_are_keyed_by_arch_toolchain_and_kernel(tmp_path):
    kc = cache.KernelCache(tmp_path, TOOLS)
    image, meta = kc.paths(WHAT, "sm_90")
    assert image.parent == tmp_path / "zipccl-9.9.9_numba-0.68.1_numba-cuda-0.30.4_numpy-2.5.0_v1" / "sm_90"
    assert image.name.startswith("encode_tiles-") and image.suffix == ".cubin" and meta.suffix == ".json"
    assert kc.paths(dict(WHAT), "sm_90") == (image, meta)  # a function of the values only
    others = [
        kc.paths(WHAT, "sm_100")[0],
        cache.KernelCache(tmp_path, {**TOOLS, "numba": "0.69.0"}).paths(WHAT, "sm_90")[0],
        cache.KernelCache(tmp_path, {**TOOLS, "zipccl": "9.9.10"}).paths(WHAT, "sm_90")[0],
        cache.KernelCache(tmp_path, {**TOOLS, "numba-cuda": "0.31.0"}).paths(WHAT, "sm_90")[0],
        kc.paths({**WHAT, "kernel": {**WHAT["kernel"], "closure": [4, False]}}, "sm_90")[0],  # FP32 build
        kc.paths({**WHAT, "argtypes": ["array(uint16, 1d, C)", "int64"]}, "sm_90")[0],
        kc.paths({**WHAT, "options": {"launch_bounds": [128, 6]}}, "sm_90")[0],
        kc.paths({**WHAT, "numba": {"OPT": 0}}, "sm_90")[0],
    ]
    assert len({image, *others}) == 1 + len(others)


def test_a_hit_loads_the_stored_cubin_and_compiles_nothing(tmp_path):
    comp = Compiler()
    with _no_warnings():
        assert _fetch(cache.KernelCache(tmp_path, TOOLS), comp) == ("compiled#1", "compiled")
        image, meta = cache.KernelCache(tmp_path, TOOLS).paths(WHAT, "sm_90")
        assert image.read_bytes() == comp.image
        stored = json.loads(meta.read_text())
        assert (stored["arch"], stored["source"], stored["entry"], stored["toolchain"]) == \
            ("sm_90", "src-1", comp.entry, TOOLS)
        again = cache.KernelCache(tmp_path, TOOLS)  # the next process
        assert _fetch(again, comp) == (f"loaded:{comp.entry}", "cache")
    assert comp.builds == 1 and comp.loads[0].image == comp.image
    assert not list(image.parent.glob(".*.tmp"))  # no temporary file left behind


def test_other_arch_or_toolchain_compiles_its_own_entry(tmp_path):
    comp = Compiler()
    with _no_warnings():
        _fetch(cache.KernelCache(tmp_path, TOOLS), comp)
        assert _fetch(cache.KernelCache(tmp_path, TOOLS), comp, arch="sm_100")[1] == "compiled"
        assert _fetch(cache.KernelCache(tmp_path, {**TOOLS, "numba": "0.69.0"}), comp)[1] == "compiled"
        assert _fetch(cache.KernelCache(tmp_path, TOOLS), comp)[1] == "cache"  # the first is intact
    assert comp.builds == 3


def test_an_entry_from_other_sources_is_rebuilt_with_a_warning(tmp_path):
    comp = Compiler()
    _fetch(cache.KernelCache(tmp_path, TOOLS), comp, source="src-1")
    comp.image = b"\x7fELF the edited kernel"
    with pytest.warns(cache.KernelCacheWarning, match="stale.*other kernel sources"):
        assert _fetch(cache.KernelCache(tmp_path, TOOLS), comp, source="src-2")[1] == "compiled"
    with _no_warnings():
        assert _fetch(cache.KernelCache(tmp_path, TOOLS), comp, source="src-2")[1] == "cache"
    assert comp.builds == 2 and comp.loads[-1].image == b"\x7fELF the edited kernel"


@pytest.mark.parametrize("damage", ["truncated cubin", "other cubin", "bad json", "meta fields", "no cubin"])
def test_a_damaged_entry_is_rebuilt_with_a_warning(tmp_path, damage):
    comp = Compiler()
    _fetch(cache.KernelCache(tmp_path, TOOLS), comp)
    image, meta = cache.KernelCache(tmp_path, TOOLS).paths(WHAT, "sm_90")
    if damage == "truncated cubin":
        image.write_bytes(comp.image[:5])
    elif damage == "other cubin":
        image.write_bytes(b"\x7fELF something else entirely")
    elif damage == "bad json":
        meta.write_text("{not json")
    elif damage == "meta fields":
        m = json.loads(meta.read_text())
        m["arch"] = "sm_80"
        meta.write_text(json.dumps(m))
    else:
        image.unlink()
    with pytest.warns(cache.KernelCacheWarning, match="stale|damaged|unreadable"):
        assert _fetch(cache.KernelCache(tmp_path, TOOLS), comp)[1] == "compiled"
    assert comp.builds == 2 and not comp.loads
    with _no_warnings():
        assert _fetch(cache.KernelCache(tmp_path, TOOLS), comp)[1] == "cache"  # rewritten whole


def test_an_entry_the_driver_refuses_is_rebuilt_with_a_warning(tmp_path):
    comp = Compiler()
    _fetch(cache.KernelCache(tmp_path, TOOLS), comp)

    def refuse(entry):
        raise RuntimeError("cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE")

    with pytest.warns(cache.KernelCacheWarning, match="did not load.*INVALID_IMAGE"):
        got = cache.KernelCache(tmp_path, TOOLS).fetch(WHAT, "sm_90", "src-1", refuse, comp.build)
    assert got == ("compiled#2", "compiled")


def test_an_unwritable_folder_is_bypassed_with_one_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    kc = cache.KernelCache(blocker / "kernels", TOOLS)  # cannot be made, whoever runs the test
    comp = Compiler()
    with pytest.warns(cache.KernelCacheWarning, match="cannot write to") as rec:
        assert _fetch(kc, comp) == ("compiled#1", "compiled, not cached")
        other = {**WHAT, "argtypes": ["int64"]}
        assert _fetch(kc, comp, what=other) == ("compiled#2", "compiled, not cached")
    assert len([w for w in rec if issubclass(w.category, cache.KernelCacheWarning)]) == 1
    assert comp.builds == 2 and blocker.read_text() == "not a folder"


def test_a_cache_that_is_off_or_a_kernel_that_cannot_be_cached_only_compiles(tmp_path):
    comp = Compiler()
    with _no_warnings():
        assert _fetch(cache.KernelCache(None, TOOLS), comp) == ("compiled#1", "compiled, not cached")
        kc = cache.KernelCache(tmp_path, TOOLS)
        assert kc.fetch(None, "sm_90", None, comp.load, comp.build)[1] == "compiled, not cached"
        assert kc.fetch(WHAT, "sm_90", "src-1", comp.load, lambda: ("h", None))[1] == "compiled, not cached"
    assert not any(tmp_path.rglob("*.cubin")) and not comp.loads


def test_clear_removes_only_zipccls_folders(tmp_path):
    _fetch(cache.KernelCache(tmp_path, TOOLS), Compiler())
    _fetch(cache.KernelCache(tmp_path, {**TOOLS, "numba": "0.69.0"}), Compiler())
    (tmp_path / "notes.txt").write_text("mine")
    assert cache.clear(tmp_path) == 4
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert cache.clear(tmp_path / "absent") == 0


# -- what a kernel is: its source and its description ---------------------------------------------

def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "zipccl"
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "comm").mkdir()
    files = {
        "__init__.py": "from . import api\n",
        "api.py": "X = 1\n",
        "format.py": "MAGIC = 7\n",
        "unrelated.py": "Y = 2\n",
        "host_only.py": "Z = 3\n",
        "comm/__init__.py": "from .big import Thing\n",
        "comm/big.py": "class Thing: pass\n",
        "comm/slots.py": "SLOT = 64\n",
        "kernels/__init__.py": "",
        "kernels/helpers.py": "from .. import format as fmt\nW = fmt.MAGIC\n",
        "kernels/k.py": textwrap.dedent("""\
            from .. import format as fmt
            from ..comm import slots
            from . import helpers
            if True:
                from .helpers import W
            def host():
                from .. import host_only
            """),
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    return pkg


def test_source_hash_follows_module_level_imports(tmp_path):
    pkg = _package(tmp_path)

    def h():
        cache.source_hash.cache_clear()
        return cache.source_hash(str(pkg / "kernels" / "k.py"), str(pkg))

    first = h()
    for name in ("unrelated.py", "host_only.py", "api.py", "__init__.py", "comm/big.py", "comm/__init__.py"):
        (pkg / name).write_text((pkg / name).read_text() + "# edited\n")
        assert h() == first, name  # not imported by the kernel module at module level
    for name in ("kernels/k.py", "kernels/helpers.py", "format.py", "comm/slots.py"):
        before = h()
        (pkg / name).write_text((pkg / name).read_text() + "# edited\n")
        assert h() != before, name


def test_source_hash_of_the_real_kernels_covers_the_frame_format():
    from zipccl.kernels import encode

    cache.source_hash.cache_clear()
    files = cache.source_hash(encode.__file__)
    assert files == cache.source_hash(encode.__file__) and len(files) == 64


def test_describe_refuses_what_it_cannot_write_down_stably():
    assert cache.describe({"b": (1, 2.5), "a": None}) == {"a": None, "b": [1, 2.5]}

    class Opaque:
        pass

    with pytest.raises(cache.Uncacheable):
        cache.describe(Opaque())


_IDENTS = """
import json, sys
from zipccl import warmup
from zipccl.kernels import cache
json.dump([[k.name, cache.ident(k.dispatcher, k.argtypes), cache.source_of(k.dispatcher)]
           for k in warmup.library_kernels()], sys.stdout, sort_keys=True)
"""


@pytest.mark.skipif(SIMULATOR, reason="describes the compiled kernels' dispatchers (not the simulator's)")
def test_every_library_kernel_has_an_entry_of_its_own_the_same_in_every_process(tmp_path):
    rows = [[k.name, cache.ident(k.dispatcher, k.argtypes), cache.source_of(k.dispatcher)]
            for k in warmup.library_kernels()]
    here = json.loads(json.dumps(rows, sort_keys=True))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    there = json.loads(subprocess.run([sys.executable, "-c", _IDENTS], capture_output=True, text=True,
                                      env=env, check=True, timeout=300).stdout)
    # another process describes every kernel the same way (the order in which the kernel modules
    # were first imported, here by earlier tests, does not matter)
    assert sorted(map(json.dumps, here)) == sorted(map(json.dumps, there))
    names = {n for n, _, _ in here}
    assert {"encode_tiles", "encode_finish", "decode_tiles", "decode_finish", "decode_tiles16",
            "wide_finish", "scan_counts", "decode_warps", "choose_codebook"} <= names
    texts = [json.dumps(w, sort_keys=True) for _, w, _ in here]
    assert len(set(texts)) == len(here)  # FP32 / FP16 / warp builds kept apart
    assert not any("0x" in t for t in texts)  # no addresses
    kc = cache.KernelCache(tmp_path, TOOLS)
    assert len({kc.paths(w, "sm_90")[0] for _, w, _ in here}) == len(here)


@pytest.mark.skipif(SIMULATOR, reason="the lean launcher is not used under the simulator")
def test_launch_kernel_compiles_once_then_loads_from_the_cache(tmp_path, monkeypatch):
    from zipccl.kernels import launch, stats

    monkeypatch.setenv("ZIPCCL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ZIPCCL_KERNEL_CACHE", raising=False)
    cache.reset_default()
    comp = Compiler()

    def load_image(entry):  # stands in for cuModuleLoadData + cuModuleGetFunction
        comp.loads.append(entry)
        return 4242

    def compile_kernel(self):  # stands in for Numba's compile + load
        comp.build()
        return 1112, cache.Entry(comp.image, comp.entry)

    monkeypatch.setattr(launch, "compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(launch, "_load_image", load_image)
    monkeypatch.setattr(launch.Kernel, "_compile", compile_kernel)
    monkeypatch.setattr(launch.Kernel, "_check_params", lambda self, handle: None)
    try:
        first = launch.Kernel(stats.choose_codebook, stats.CODEBOOK.argtypes)
        assert first.function(0) == 1112 and first.origin[0] == "compiled"
        assert first.function(0) == 1112 and comp.builds == 1  # once per process and device
        cache.reset_default()  # a fresh process: the same kernel, loaded
        second = launch.Kernel(stats.choose_codebook, stats.CODEBOOK.argtypes)
        assert second.function(0) == 4242 and second.origin[0] == "cache"
        assert comp.builds == 1 and comp.loads[0].image == comp.image
        assert len(list((tmp_path).rglob("choose_codebook-*.cubin"))) == 1
    finally:
        launch._KERNELS.remove(first)
        launch._KERNELS.remove(second)
        cache.reset_default()


# -- CuPy's cache for the CUDA C spill kernels ----------------------------------------------------

class _FakeCupy:
    """CuPy's RawModule and cache-folder lookup, recording the environment at compile time."""

    def __init__(self, folder: Path):
        seen = self.seen = []

        class RawModule:
            def __init__(self, code, options):
                self.code, self.options = code, options

            def compile(self):
                seen.append(os.environ.get("CUPY_CACHE_IN_MEMORY"))

        self.RawModule = RawModule
        self.cuda = type("cuda", (), {"compiler": type("compiler", (), {
            "get_cache_dir": staticmethod(lambda: str(folder))})})


def test_spill_kernels_use_cupys_disk_cache_or_memory_when_unwritable(tmp_path, monkeypatch):
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    ok = _FakeCupy(tmp_path / "cupy")
    with _no_warnings():
        mod = cache.cupy_module(ok, "__global__ void k() {}", ("--std=c++14",))
    assert ok.seen == [None] and mod.options == ("--std=c++14",)
    (tmp_path / "f").write_text("")
    bad = _FakeCupy(tmp_path / "f" / "cupy")
    with pytest.warns(cache.KernelCacheWarning, match="CuPy's kernel cache .* cannot be written"):
        cache.cupy_module(bad, "__global__ void k() {}", ())
    assert bad.seen == ["1"] and "CUPY_CACHE_IN_MEMORY" not in os.environ


# -- the simulator ---------------------------------------------------------------------------------

_SIM_ROUND_TRIP = """
import numpy as np
from zipccl.codec import gpu
x = (np.arange(100, dtype=np.uint32) * 2654435761 % 65536).astype(np.uint16) & 0xBFFF
y = gpu.decompress(gpu.compress(x, dtype="bfloat16"))
assert np.array_equal(np.asarray(y).view(np.uint16).reshape(-1), x)
print("exact")
"""


def test_the_simulator_compiles_nothing_and_leaves_the_cache_alone(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_ENABLE_CUDASIM": "1",
           "ZIPCCL_CACHE_DIR": str(tmp_path / "k")}
    r = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning", "-c", _SIM_ROUND_TRIP],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "exact", r.stderr
    assert not (tmp_path / "k").exists()


# -- the command ----------------------------------------------------------------------------------

def test_warmup_without_a_gpu_says_so_and_exits_2(tmp_path):
    if cache.gpu_count()[0]:
        pytest.skip("this machine has a GPU (the H200 check runs warmup itself)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZIPCCL_CACHE_DIR": str(tmp_path / "k")}
    r = subprocess.run([sys.executable, "-m", "zipccl", "warmup"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "no CUDA GPU to compile for" in r.stderr
    assert not (tmp_path / "k").exists()


def test_warmup_under_the_simulator_says_so_and_exits_2(monkeypatch, capsys):
    from numba import config

    from zipccl.cli import main

    monkeypatch.setattr(config, "ENABLE_CUDASIM", 1)
    assert main(["warmup"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "simulator" in err


def test_warmup_where_names_the_folders(tmp_path, monkeypatch, capsys):
    from zipccl.cli import main

    monkeypatch.setenv("ZIPCCL_CACHE_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "c"))
    assert main(["warmup", "--where"]) == 0
    out = capsys.readouterr().out
    assert f"zipccl kernel cache: {tmp_path / 'k'} (on;" in out and str(tmp_path / "c") in out
    with pytest.raises(SystemExit) as e:
        main(["warmup", "--bogus"])
    assert e.value.code == 2


# -- on a GPU (pytest -m gpu) ---------------------------------------------------------------------

_GPU_ROUND_TRIP = """
import hashlib, json
import cupy as cp
import zipccl
from zipccl.kernels import launch
x = (cp.arange(1 << 20, dtype=cp.uint32) * 2654435761 % 65536).astype(cp.uint16) & 0xBFFF
frame = zipccl.compress(x, dtype="bfloat16")
y = zipccl.decompress(frame)
origins = sorted({how for k in launch.kernels() for how in k.origin.values()})
print(json.dumps({"exact": bool(cp.array_equal(y.reshape(-1), x)), "origins": origins,
                  "frame": hashlib.sha256(cp.asnumpy(frame).tobytes()).hexdigest()}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="compiles real kernels")
def test_a_second_process_loads_every_kernel_from_the_cache(tmp_path):
    pytest.importorskip("cupy")
    if not cache.gpu_count()[0]:
        pytest.skip("no CUDA GPU")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZIPCCL_CACHE_DIR": str(tmp_path / "k")}
    env.pop("ZIPCCL_KERNEL_CACHE", None)
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", _GPU_ROUND_TRIP], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["exact"] and warm["exact"] and cold["frame"] == warm["frame"]
    assert cold["origins"] == ["compiled"] and warm["origins"] == ["cache"]
    assert list((tmp_path / "k").rglob("*.cubin"))
