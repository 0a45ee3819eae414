"""The raw exchange (``policy="raw"``): zipccl's slot path with the codec off.

A RAW frame written by ``encode_slot(raw=True)`` decodes to the same bits on the host engine;
with ``SlotChannel.raw`` every slot holds a whole RAW frame (nothing spills) and moves the
values plus the slot and frame headers; the policy sends every coded type through it. Two
ranks over gloo run it inside FSDP2 training (``tests/test_torch.py``, the end-to-end toy) and
the MoE layer (``tests/test_moe.py``), bit for bit against native.
"""

from __future__ import annotations

import numpy as np
import pytest

from zipccl import format as fmt
from zipccl.comm.exchange import SlotChannel, raw_header
from zipccl.comm.host import HostEngine
from zipccl.comm.policy import Policy
from zipccl.format.slot import SLOT_HEADER, region_bytes, slot_bytes, tail_bytes


def _values(n: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        return (rng.standard_normal(n) * 0.02).astype(np.float32)
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)  # every pattern: NaNs, infs, subnormals
    return bits.view(np.float16) if dtype == np.float16 else bits


@pytest.mark.parametrize("dtype", [np.uint16, np.float32, np.float16])
@pytest.mark.parametrize("n", [1, 7, 4096, 70_001])
def test_raw_frame_round_trip_and_size(n, dtype):
    eng = HostEngine()
    x = _values(n, dtype, seed=n)
    code = fmt.DTYPE_BF16 if dtype == np.uint16 else fmt.dtype_code(np.dtype(dtype).name)
    region = np.full(region_bytes(n, code), 0xAB, dtype=np.uint8)
    eng.encode_slot(x, region, raw=True)
    h = fmt.parse_header(region[SLOT_HEADER:])
    assert h.raw and h.n == n and h.dtype == code and h.frame_len == fmt.HEADER_SIZE + x.nbytes
    out = np.zeros_like(x)
    assert eng.decode_frame(region[SLOT_HEADER:], out, 0) is None
    assert np.array_equal(out.view(np.uint8), x.view(np.uint8))
    ch = SlotChannel(spills=None)
    ch.site("all_gather", True)
    ch.raw = True
    slot = slot_bytes(n, code, ch.capacity(n, code))
    assert tail_bytes(h.frame_len, slot) == 0  # the slot holds the RAW frame: nothing spills
    assert slot == SLOT_HEADER + fmt.align(fmt.HEADER_SIZE + x.nbytes)  # values + two headers, aligned


def test_raw_header_is_fixed_by_count_and_type():
    assert np.array_equal(raw_header(100), raw_header(100))
    assert not np.array_equal(raw_header(100), raw_header(101))
    with pytest.raises(ValueError, match="truncated"):
        fmt.parse_header(raw_header(100), buffer_len=fmt.HEADER_SIZE + 199)


def test_policy_raw_takes_the_exchange_for_coded_types_only():
    p = Policy("raw")
    d = p.decide("all_gather", 1 << 20, dtype="bfloat16", device=False, world=2)
    assert d.compress and d.raw and "codec off" in d.reason and str(d).endswith(d.reason + ")")
    assert "raw exchange" in str(d)
    assert not p.decide("all_gather", 1 << 20, dtype=None, device=True, world=2).compress
    assert not p.decide("all_gather", 1 << 20, dtype="bfloat16", device=True, world=1).compress
    assert not Policy("always").decide("all_gather", 64, dtype="bfloat16", device=True, world=2).raw


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_device_raw_frame_matches_the_host_and_decodes(dtype):
    """``pytest -m gpu tests/test_raw_exchange.py``: the device engine's RAW frame is the host
    engine's byte for byte (header and values) and the GPU decoder returns the same bits."""
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError
    except Exception:  # noqa: BLE001
        pytest.skip("no CUDA device / CuPy")
    from zipccl.comm.pipeline import DeviceEngine

    n = 300_001
    x = _values(n, dtype, seed=3)
    code = fmt.DTYPE_BF16 if dtype == np.uint16 else fmt.DTYPE_FP32
    want = np.zeros(region_bytes(n, code), dtype=np.uint8)
    HostEngine().encode_slot(x, want, raw=True)
    eng = DeviceEngine()
    eng.set_stream(None)
    region = cp.zeros(want.size, dtype=cp.uint8)
    eng.encode_slot(cp.asarray(x), region, raw=True)
    out = cp.zeros(n, dtype=x.dtype)
    eng.decode(region[SLOT_HEADER:], out)
    eng.sync()
    end = SLOT_HEADER + fmt.HEADER_SIZE + x.nbytes
    assert np.array_equal(cp.asnumpy(region[:end]), want[:end])
    assert np.array_equal(cp.asnumpy(out).view(np.uint8), x.view(np.uint8))


def test_device_raw_headers_are_kept_in_pinned_chunks_never_freed():
    """The device engine keeps each (size, type)'s RAW header in pinned host memory, packed
    into chunks; a copy enqueued earlier may still read any of them, so none is dropped or
    overwritten however many sizes come (here over two chunks)."""
    import types

    from zipccl.comm.pipeline import RAW_CHUNK, DeviceEngine

    chunks = []

    def pinned(n):
        chunks.append(bytearray(n))
        return chunks[-1]

    eng = object.__new__(DeviceEngine)  # no CuPy here: only the header store is used
    eng.cp = types.SimpleNamespace(cuda=types.SimpleNamespace(alloc_pinned_memory=pinned))
    eng._raw_headers, eng._raw_chunk, eng._raw_used = {}, None, 0
    keys = [(1000 + i, fmt.DTYPE_BF16 if i % 2 else fmt.DTYPE_FP32) for i in range(RAW_CHUNK + 10)]
    got = [eng._raw_header(k) for k in keys]
    assert len(chunks) == 2 and all(eng._raw_header(k) is g for k, g in zip(keys, got, strict=True))
    for k, g in zip(keys, got, strict=True):
        assert bytes(g) == bytes(raw_header(*k))
