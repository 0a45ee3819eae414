"""The on-disk kernel cache: zipccl's GPU kernels compiled once per machine, not once per process.

Numba compiles a ``@cuda.jit`` kernel the first time a process launches it (seconds per kernel).
``launch.Kernel`` therefore asks this cache first: an entry is the kernel's linked cubin and the
name of its entry point, loaded with one ``cuModuleLoadData``; a miss compiles through Numba and
writes the entry for the next process. An entry is keyed by the toolchain's versions, the GPU
architecture and a hash of what the kernel is (its source and every zipccl module it imports,
its closed-over values, options and argument types); one that does not match, is damaged or is
refused by the driver is compiled again and replaced, with a ``KernelCacheWarning``. Entries are
written to a temporary file and renamed into place, so ranks warming one cache never read half
an entry. ``cupy_module`` builds the CUDA C spill kernels through CuPy's own cache. Under the
CUDA simulator nothing is compiled and the cache is never opened. Where it lives, what voids an
entry and ``python -m zipccl warmup``: docs/KERNEL_CACHE.md.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path

ENV_DIR = "ZIPCCL_CACHE_DIR"
ENV_ENABLE = "ZIPCCL_KERNEL_CACHE"
FORMAT = 1  # the layout of an entry; a change starts new folders
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the zipccl package folder
_TOOLCHAIN_PREFIX = "zipccl-"


class KernelCacheWarning(UserWarning):
    """A cache entry was rebuilt, or the cache directory could not be used."""


class Uncacheable(Exception):
    """What a kernel is cannot be written down stably (it is then compiled every process)."""


# -- where ---------------------------------------------------------------------------------------

def directory(environ: Mapping[str, str] | None = None) -> Path:
    """The cache's root folder: ``$ZIPCCL_CACHE_DIR``, else ``$XDG_CACHE_HOME/zipccl/kernels``,
    else ``~/.cache/zipccl/kernels``.

    >>> str(directory({"ZIPCCL_CACHE_DIR": "/scratch/k"}))
    '/scratch/k'
    >>> str(directory({"XDG_CACHE_HOME": "/xdg"}))
    '/xdg/zipccl/kernels'
    """
    env = os.environ if environ is None else environ
    given = env.get(ENV_DIR)
    if given:
        return Path(given).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "zipccl" / "kernels"


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``ZIPCCL_KERNEL_CACHE`` is ``0`` (or ``off``, ``false``, ``no``).

    >>> enabled({}), enabled({"ZIPCCL_KERNEL_CACHE": "0"})
    (True, False)
    """
    env = os.environ if environ is None else environ
    return env.get(ENV_ENABLE, "1").strip().lower() not in ("0", "off", "false", "no")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def toolchain() -> dict[str, str]:
    """The versions a compiled kernel depends on beyond its own source."""
    import numpy

    return {"zipccl": _version("zipccl"), "numba": _version("numba"), "numba-cuda": _version("numba-cuda"),
            "numpy": numpy.__version__}


def toolchain_folder(tools: Mapping[str, str]) -> str:
    """The folder name of a toolchain (``FORMAT`` included).

    >>> toolchain_folder({"zipccl": "0.1.0", "numba": "0.68.1"})
    'zipccl-0.1.0_numba-0.68.1_v1'
    """
    parts = [f"{k}-{v}" for k, v in tools.items()]
    return "_".join(parts + [f"v{FORMAT}"]).replace(os.sep, "-")


def arch_name(cc: tuple[int, int]) -> str:
    """``(9, 0)`` -> ``'sm_90'``."""
    return f"sm_{cc[0]}{cc[1]}"


# -- what a kernel is ----------------------------------------------------------------------------

def _module_file(module: str, root: Path, package: str) -> Path | None:
    """The source file of the dotted ``module`` inside ``package`` (a package: its
    ``__init__.py``), or None when there is none."""
    parts = module.split(".")
    if parts[0] != package:
        return None
    base = root.joinpath(*parts[1:])
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _module_name(path: Path, root: Path, package: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [package, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_files(tree: ast.Module, here: str, is_package: bool, root: Path, package: str) -> set[Path]:
    """The files of the ``package`` modules a module imports outside functions and classes.
    ``from X import n`` names module ``X.n`` when that is a file, else a name defined in ``X``."""
    found: set[Path] = set()

    def add(mod: str) -> bool:
        f = _module_file(mod, root, package)
        if f is not None:
            found.add(f.resolve())
        return f is not None

    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".") if is_package else here.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                if not add(f"{mod}.{a.name}"):
                    add(mod)
        todo.extend(ast.iter_child_nodes(node))
    return found


@lru_cache(maxsize=64)
def source_hash(module_file: str, root: str | None = None, package: str = "zipccl") -> str:
    """SHA-256 of a module's source and of every ``package`` module it imports at module level,
    recursively (what a kernel defined there is compiled from). ``root``: the package folder.

    Imports inside functions are host code and are not followed; a kernel's device code can
    reach only module-level names.
    """
    base = (Path(root) if root is not None else PACKAGE_ROOT).resolve()
    start = Path(module_file).resolve()
    seen: dict[Path, bytes] = {}
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        data = path.read_bytes()
        seen[path] = data
        name = _module_name(path, base, package)
        tree = ast.parse(data, filename=str(path))
        todo.extend(_imported_files(tree, name, path.name == "__init__.py", base, package) - seen.keys())
    h = hashlib.sha256()
    for path in sorted(seen):
        h.update(str(path.relative_to(base)).encode() + b"\0")
        h.update(hashlib.sha256(seen[path]).digest())
    return h.hexdigest()


def describe(value, depth: int = 0):
    """A stable, JSON-able description of a value a kernel closes over (no addresses).

    Numbers, strings and tuples as themselves; a Numba dispatcher or Python function by module,
    qualified name, options and its own closure; NumPy arrays by type and content hash; Numba
    types by name. Anything else raises ``Uncacheable``.

    >>> describe((1, True, "x", None))
    [1, True, 'x', None]
    """
    if depth > 8:
        raise Uncacheable("closure nested too deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [describe(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v, depth + 1) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        np = None
    if np is not None and isinstance(value, np.generic):
        return {"numpy": str(value.dtype), "value": value.item()}
    if np is not None and isinstance(value, np.ndarray):
        return {"ndarray": str(value.dtype), "shape": list(value.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}
    if isinstance(value, type(sys)):  # a module
        return {"module": value.__name__}
    func = getattr(value, "py_func", None)
    if func is not None:  # a Numba dispatcher (kernel or device function)
        return {"dispatcher": _function(func, depth),
                "options": describe(getattr(value, "targetoptions", {}), depth + 1)}
    if callable(value) and hasattr(value, "__code__"):
        return {"function": _function(value, depth)}
    if type(value).__module__.startswith("numba") and hasattr(value, "key"):  # a Numba type
        return {"numba_type": str(value)}
    raise Uncacheable(f"cannot describe a {type(value).__name__} stably")


def _function(func, depth: int) -> dict:
    cells = [describe(c.cell_contents, depth + 1) for c in (func.__closure__ or ())]
    return {"name": f"{func.__module__}.{func.__qualname__}", "closure": cells}


def _numba_settings() -> dict:
    from numba import config

    names = ("OPT", "CUDA_DEBUGINFO_DEFAULT", "CUDA_ENABLE_NRT", "CUDA_FASTMATH")
    return {n: describe(getattr(config, n, None)) for n in names}


def ident(dispatcher, argtypes) -> dict:
    """What a kernel is (``describe``d): name, closure, decorator options, argument types and
    the Numba settings that change code. Raises ``Uncacheable`` (then it is not cached)."""
    func = dispatcher.py_func
    options = dict(getattr(dispatcher, "targetoptions", {}))
    if options.get("link") or options.get("shared_memory_carveout") is not None:
        raise Uncacheable("kernels linked with other code or given a carveout are not cached")
    return {"kernel": _function(func, 0), "options": describe(options),
            "argtypes": [str(t) for t in argtypes], "numba": _numba_settings()}


def source_of(dispatcher) -> str:
    """``source_hash`` of the module that defines ``dispatcher``'s kernel."""
    module = sys.modules.get(dispatcher.py_func.__module__)
    path = getattr(module, "__file__", None)
    if path is None:
        raise Uncacheable(f"no source file for {dispatcher.py_func.__module__}")
    try:
        Path(path).resolve().relative_to(PACKAGE_ROOT)
    except ValueError as e:
        raise Uncacheable(f"{path} is not in the zipccl package") from e
    return source_hash(str(Path(path).resolve()))


# -- the cache -----------------------------------------------------------------------------------

class Entry:
    """A compiled kernel as stored: the linked cubin and the name of its entry point."""

    __slots__ = ("image", "entry")

    def __init__(self, image: bytes, entry: str):
        self.image = bytes(image)
        self.entry = str(entry)


class KernelCache:
    """Compiled kernels under ``root`` for one toolchain (``None``: a cache that never hits and
    never writes). ``fetch`` is the one call a launcher makes."""

    def __init__(self, root: Path | str | None, tools: Mapping[str, str] | None = None,
                 warn: Callable[[str], None] | None = None):
        self.root = None if root is None else Path(root)
        self.tools = dict(toolchain() if tools is None else tools)
        self._warn = warn or (lambda msg: warnings.warn(msg, KernelCacheWarning, stacklevel=4))
        self._unwritable: str | None = None
        self._lock = threading.Lock()

    def folder(self, arch: str) -> Path:
        assert self.root is not None
        return self.root / toolchain_folder(self.tools) / arch

    def paths(self, what: Mapping, arch: str) -> tuple[Path, Path]:
        """(cubin path, metadata path) of the entry of ``what`` (an ``ident``) on ``arch``."""
        key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]
        short = str(what.get("kernel", {}).get("name", "kernel")).rsplit(".", 1)[-1]
        short = "".join(c if c.isalnum() or c == "_" else "_" for c in short)[:60]
        base = self.folder(arch) / f"{short}-{key}"
        return base.with_suffix(".cubin"), base.with_suffix(".json")

    def _meta(self, what: Mapping, arch: str, source: str) -> dict:
        return {"format": FORMAT, "toolchain": self.tools, "arch": arch, "ident": what, "source": source}

    def get(self, what: Mapping, arch: str, source: str) -> Entry | None:
        """The entry of ``what`` built from ``source`` on ``arch``, or None (absent, stale or
        damaged: the last two with a warning)."""
        if self.root is None:
            return None
        image_path, meta_path = self.paths(what, arch)
        try:
            meta_text = meta_path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # absent (or no folder to hold it)
            return None
        except OSError as e:
            self._warn(f"zipccl kernel cache: cannot read {meta_path} ({e}); compiling")
            return None
        name = what.get("kernel", {}).get("name", "?")
        try:
            meta = json.loads(meta_text)
            expect = self._meta(what, arch, source)
            stale = [k for k in expect if meta.get(k) != expect[k]]
            if stale:
                why = ("it was built from other kernel sources" if stale == ["source"]
                       else f"its {', '.join(stale)} differ")
                self._warn(f"zipccl kernel cache: the entry of {name} for {arch} is stale ({why}); "
                           "compiling it again")
                return None
            image = image_path.read_bytes()
            if hashlib.sha256(image).hexdigest() != meta.get("sha256") or not meta.get("entry"):
                self._warn(f"zipccl kernel cache: the entry of {name} for {arch} is damaged "
                           f"({image_path}); compiling it again")
                return None
            return Entry(image, meta["entry"])
        except (OSError, ValueError, AttributeError, TypeError) as e:
            self._warn(f"zipccl kernel cache: unreadable entry of {name} ({meta_path}: {e}); compiling")
            return None

    def put(self, what: Mapping, arch: str, source: str, entry: Entry) -> bool:
        """Write the entry (atomically); False, with one warning per cache, if it cannot be."""
        if self.root is None or self._unwritable is not None:
            return False
        image_path, meta_path = self.paths(what, arch)
        meta = self._meta(what, arch, source)
        meta.update(entry=entry.entry, sha256=hashlib.sha256(entry.image).hexdigest(), bytes=len(entry.image))
        try:
            image_path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(image_path, entry.image)
            _write_atomic(meta_path, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())
            return True
        except OSError as e:
            with self._lock:
                first = self._unwritable is None
                self._unwritable = str(e)
            if first:
                self._warn(f"zipccl kernel cache: cannot write to {self.root} ({e}); kernels are "
                           f"compiled in this process only (set {ENV_DIR} to a writable folder, or "
                           f"{ENV_ENABLE}=0 to silence this)")
            return False

    def fetch(self, what: Mapping | None, arch: str, source: str | None,
              load: Callable[[Entry], object], build: Callable[[], tuple[object, Entry | None]]):
        """``(handle, how)``: ``load(entry)`` of the cached entry when there is a valid one, else
        ``build()`` -> ``(handle, entry or None)`` with the entry written for the next process.
        ``how``: ``"cache"``, ``"compiled"`` or ``"compiled, not cached"``. ``what`` None: the
        kernel cannot be cached (``Uncacheable``) and is built."""
        if what is not None and source is not None:
            entry = self.get(what, arch, source)
            if entry is not None:
                try:
                    return load(entry), "cache"
                except Exception as e:  # the driver refused it: compile instead
                    name = what.get("kernel", {}).get("name", "?")
                    self._warn(f"zipccl kernel cache: the entry of {name} for {arch} did not load "
                               f"({e}); compiling it again")
        handle, entry = build()
        stored = entry is not None and what is not None and source is not None and \
            self.put(what, arch, source, entry)
        return handle, "compiled" if stored else "compiled, not cached"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_DEFAULT: list[KernelCache] = []
_DEFAULT_LOCK = threading.Lock()


def default() -> KernelCache:
    """The process's cache, from the environment when first asked for."""
    if not _DEFAULT:
        with _DEFAULT_LOCK:
            if not _DEFAULT:
                _DEFAULT.append(KernelCache(directory() if enabled() else None))
    return _DEFAULT[0]


def reset_default() -> None:
    """Forget the process's cache (the next ``default()`` reads the environment again)."""
    with _DEFAULT_LOCK:
        _DEFAULT.clear()


def clear(root: Path | str | None = None) -> int:
    """Delete every toolchain folder zipccl wrote under ``root`` (default: ``directory()``);
    returns how many files went. Other files there are left alone."""
    base = Path(root) if root is not None else directory()
    removed = 0
    if not base.is_dir():
        return 0
    for sub in base.iterdir():
        if sub.is_dir() and sub.name.startswith(_TOOLCHAIN_PREFIX):
            removed += sum(1 for p in sub.rglob("*") if p.is_file())
            shutil.rmtree(sub)
    return removed


# -- CuPy's cache for the CUDA C kernels ----------------------------------------------------------

_CUPY_ENV_LOCK = threading.Lock()


def cupy_cache_dir(cupy=None) -> Path:
    """The folder CuPy keeps compiled kernels in (``$CUPY_CACHE_DIR``, default
    ``~/.cupy/kernel_cache``)."""
    getter = getattr(getattr(getattr(cupy, "cuda", None), "compiler", None), "get_cache_dir", None)
    if getter is not None:
        return Path(getter())
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path("~/.cupy/kernel_cache").expanduser())


def writable(folder: Path) -> str | None:
    """None if files can be created in ``folder`` (made if missing), else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".zipccl-probe-")
        os.close(fd)
        os.unlink(tmp)
        return None
    except OSError as e:
        return str(e)


def cupy_module(cupy, code: str, options: tuple[str, ...]):
    """``cupy.RawModule(code=code, options=options)``, compiled now on the current device.

    CuPy keeps the binary in its disk cache, keyed on the whole source, the options, the
    architecture and the CuPy / CUDA / NVRTC versions. When that folder cannot be written (CuPy
    would fail the compilation) the module is compiled in memory, with a ``KernelCacheWarning``.
    """
    mod = cupy.RawModule(code=code, options=options)
    if not hasattr(mod, "compile"):  # a stand-in for CuPy (tests): nothing to compile
        return mod
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "") == "1":
        mod.compile()
        return mod
    why = writable(cupy_cache_dir(cupy))
    if why is None:
        mod.compile()
        return mod
    warnings.warn(f"zipccl: CuPy's kernel cache {cupy_cache_dir(cupy)} cannot be written ({why}); the "
                  "spill kernels are compiled in memory (set CUPY_CACHE_DIR to a writable folder)",
                  KernelCacheWarning, stacklevel=2)
    with _CUPY_ENV_LOCK:  # CuPy reads this variable when it compiles
        before = os.environ.get("CUPY_CACHE_IN_MEMORY")
        os.environ["CUPY_CACHE_IN_MEMORY"] = "1"
        try:
            mod.compile()
        finally:
            if before is None:
                del os.environ["CUPY_CACHE_IN_MEMORY"]
            else:
                os.environ["CUPY_CACHE_IN_MEMORY"] = before
    return mod


def gpu_count() -> tuple[int, str]:
    """(number of CUDA devices, why none) without creating a context; (0, reason) where there is
    no driver, no device or only the CUDA simulator."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return 0, "the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it compiles nothing"
    try:
        from cuda.bindings import driver

        err = driver.cuInit(0)[0]
        if err:
            return 0, f"cuInit failed ({driver.cuGetErrorName(err)[1].decode()})"
        err, n = driver.cuDeviceGetCount()
        return (int(n), "") if not err and n else (0, "no CUDA device")
    except Exception as e:  # no libcuda, no cuda.bindings
        return 0, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


def select_device(device: int) -> None:
    """Make ``device`` current for the compilations and loads that follow (Numba's context)."""
    from numba import cuda

    cuda.select_device(device)
