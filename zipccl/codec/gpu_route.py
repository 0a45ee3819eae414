"""How the GPU codec reaches its kernels: the kernel modules, the route a launch takes, the
device tables that plans point at.

``zipccl.kernels`` imports numba.cuda, so its modules are imported on the first device call
(``_kernels``, ``_wide``), never when ``zipccl`` is imported. On a GPU every launch goes through
a plan (``kernels/launch.py``); under Numba's CUDA simulator the kernels go through Numba's
dispatcher, unless ``plans_under_simulator`` asks for the GPU's route (with
``kernels/simlaunch.py`` standing in for the driver), so that route is tested without a GPU too.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

import numpy as np

_MODULES: list = []


def _kernels():
    """(_common, encode_launch, decode, runtime, stats): zipccl.kernels imports numba.cuda, so only
    when a GPU codec call happens (imported once; later calls are a list lookup)."""
    if not _MODULES:
        from ..kernels import _common, decode, encode_launch, launch, runtime, stats
        if runtime.SIMULATOR:
            reads, device = _SimReads.pinned, runtime.current_device_id
        else:
            reads, device = launch.pinned, launch.current_device
        _MODULES.extend(((_common, encode_launch, decode, runtime, stats), launch, reads, device))
    return _MODULES[0]


def _pinned():
    """This thread's reader of a few device bytes (``launch.pinned()``: ``read``, ``read_two``,
    each a synchronisation); under the simulator a stand-in that copies the memory itself."""
    if not _MODULES:
        _kernels()
    return _MODULES[2]()


def _current_device() -> int:
    """The current device's ordinal (one driver call; 0 under the simulator)."""
    if not _MODULES:
        _kernels()
    return _MODULES[3]()


class _SimReads:
    """``launch.PinnedSlots``' reads under the simulator, where a device pointer is a host
    address and every launch has finished when it returns."""

    @staticmethod
    def pinned() -> type:
        return _SimReads

    @staticmethod
    def read(device_ptr: int, nbytes: int, stream: int) -> np.ndarray:
        return np.frombuffer(ctypes.string_at(device_ptr, nbytes), np.uint8)

    @staticmethod
    def read_two(first: tuple[int, int], second: tuple[int, int], stream: int):
        return _SimReads.read(*first, stream), _SimReads.read(*second, stream)


_WIDE: list = []


def _wide():
    """(encode_launch, decode_fp16): the modules of FP32 / FP16 frames, imported on the first call."""
    if not _WIDE:
        _kernels()
        from ..kernels import decode_fp16, encode_launch
        _WIDE.extend((encode_launch, decode_fp16))
    return _WIDE


def _launch():
    if not _MODULES:
        _kernels()
    return _MODULES[1]


#: Under the simulator: whether encode_into / decode_into / encode_chosen_into take the plan
#: route (``plans_under_simulator``) rather than Numba's dispatcher. One element, so that
#: tests can switch it without rebinding a module global.
_SIM_PLANS = [False]


@contextmanager
def plans_under_simulator():
    """Under Numba's CUDA simulator, run the codec's ``*_into`` calls through the GPU's plan
    route (``kernels/simlaunch.py`` stands in for the launch) while the block runs; on a GPU
    that route is the only one and this changes nothing.

    >>> with plans_under_simulator():  # doctest: +SKIP
    ...     encode_into(x, out, codebook)
    """
    before = _SIM_PLANS[0]
    _SIM_PLANS[0] = True
    try:
        yield
    finally:
        _SIM_PLANS[0] = before


def _dispatcher_route() -> bool:
    """True where the kernels go through Numba's dispatcher: the simulator, unless
    ``plans_under_simulator`` is on."""
    return _kernels()[3].SIMULATOR and not _SIM_PLANS[0]


def _device_pointer(array) -> int:
    """Device pointer of a Numba device array (under the simulator: its host address)."""
    if _kernels()[3].SIMULATOR:
        from ..kernels import simlaunch
        return simlaunch.device_pointer(array)
    return _launch().device_pointer(array)


_SIM_TABLES: dict[str, object] = {}


def _kept(name: str, make):
    """``make()``: a table on the device; under the simulator made once and kept for good (a
    plan holds its address, and the simulator's tables are fresh copies on every call)."""
    if not _kernels()[3].SIMULATOR:
        return make()
    if name not in _SIM_TABLES:
        _SIM_TABLES[name] = make()
    return _SIM_TABLES[name]


def _crc_table():
    """The header CRC table on the device (``runtime.crc_table``)."""
    return _kept("crc", _kernels()[3].crc_table)


def _codebook_tables():
    """``runtime.codebook_tables()``: the tables of ``stats.choose_codebook``."""
    return _kept("codebook", _kernels()[3].codebook_tables)


def _common_slots() -> int:
    """The workspace words before its status words (counters and chunk slots)."""
    return _kernels()[0].WS_STATUS
