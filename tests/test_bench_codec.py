"""Tests of ``coccl-bench codec`` and ``coccl-bench fidelity``: the ``--compressor`` list,
the synthetic tensors and the error model, both commands end to end on the CPU (the
throughput is measured, never asserted), and their usage errors."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coccl.bench import cli
from coccl.bench.codec import Columns, codec_specs, rotation_sets
from coccl.bench.fidelity import SYNTHETIC, allreduce_quantizations, synthetic_tensors
from coccl.compressors import Compressor

from gpu import GPU

CODEC_ROW = {"codec", "op", "dtype", "count", "nbytes", "time_ms", "GBps", "fraction"}
FIDELITY_ROW = {"tensor", "shape", "codec", "rel_l2", "max_abs", "snr_db"}
RECORD = {"command", "date", "commit", "rows"}


def read(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------ parts
def test_codec_specs() -> None:
    specs = codec_specs("identity, taco:group_size=32,ash=False,int8,taco,taco")
    assert [s.label for s in specs] == ["identity", "taco:group_size=32,ash=False", "int8", "taco"]
    assert specs[1].codec.get_config() == {
        "id": "taco",
        "fp8_format": "e4m3",
        "group_size": 32,
        "ash": False,
        "dual_scale": True,
        "coccl_clamps": False,
    }
    assert codec_specs("taco:fp8_format=e5m2")[0].codec.fp8_format == "e5m2"
    tah = codec_specs("tah:row=4096,window=5")[0].codec  # an int option after another
    assert (tah.row, tah.window, tah.alignment) == (4096, 5, 5 * 4096)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("identity,nope", "compressor 'nope' is not available"),
        ("taco:group_size=33", "compressor 'taco:group_size=33' is not available"),
        ("ash=False", "does not follow a compressor"),
        ("taco:group_size", "expected key=value"),
        (" , ", "give comma-separated compressors"),
    ],
)
def test_codec_specs_rejects(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        codec_specs(text)


def test_columns_and_rotation() -> None:
    columns = Columns.fit(["name", "value"], [["taco", "1.5"], ["identity", "10.25"]])
    lines = [columns.header(), columns.line(["taco", "1.5"])]
    assert lines == ["#name      value", " taco        1.5"]
    assert rotation_sets(1) == 8 and rotation_sets(1 << 30) == 2


def test_synthetic_tensors() -> None:
    first = dict(synthetic_tensors((64, 512), seed=1))
    again = dict(synthetic_tensors((64, 512), seed=1))
    assert list(first) == list(SYNTHETIC)
    for name, x in first.items():
        assert x.shape == (64, 512) and x.dtype == np.float32
        np.testing.assert_array_equal(x, again[name])
    rms = np.sqrt(np.mean(first["outlier_channels"].astype(np.float64) ** 2, axis=0))
    big = rms > 10
    assert 1 <= big.sum() <= 4 and rms[big].min() > 15 * np.median(rms)
    assert np.mean(first["sparse"] == 0) > 0.9
    grad = np.abs(first["lognormal_grad"])
    assert grad.max() > 1000 * np.median(grad)


def test_allreduce_quantizations() -> None:
    assert allreduce_quantizations("two_shot", 4) == pytest.approx(1.75)
    assert allreduce_quantizations("ring", 4) == pytest.approx(2.5)
    assert allreduce_quantizations("two_shot", 1000) < 2


# ------------------------------------------------------------------- fidelity
def test_fidelity_synthetic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fidelity.json"
    argv = ["fidelity", "--shape", "256x512", "--compressor", "identity,taco,int8"]
    argv += ["--model-quantizations", "--ranks", "4", "--json", str(path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "rel_l2" in out and "two_shot@4" in out
    record = read(path)
    assert RECORD <= set(record) and record["source"] == "synthetic"
    rows = {(r["tensor"], r["codec"]): r for r in record["rows"]}
    assert len(rows) == len(SYNTHETIC) * 3
    assert all(FIDELITY_ROW <= set(r) for r in record["rows"])
    taco = rows["gaussian", "taco"]
    assert 0.025 <= taco["rel_l2"] <= 0.03
    assert taco["snr_db"] == pytest.approx(-20 * math.log10(taco["rel_l2"]))
    assert taco["rel_l2_two_shot"] == pytest.approx(taco["rel_l2"] * math.sqrt(1.75))
    assert taco["rel_l2_ring"] == pytest.approx(taco["rel_l2"] * math.sqrt(2.5))
    for name in SYNTHETIC:
        identity = rows[name, "identity"]
        assert identity["rel_l2"] == 0 and identity["max_abs"] == 0
        assert identity["snr_db"] == "inf"  # strict JSON: non-finite as a string
        assert 0 < rows[name, "int8"]["rel_l2"] < 0.05


def test_fidelity_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(7)
    np.save(tmp_path / "acts.npy", rng.standard_normal((32, 256), dtype=np.float32))
    np.savez(
        tmp_path / "grads.npz",
        w=rng.standard_normal(1000).astype(np.float16),
        b=rng.standard_normal((10, 10)),
        step=np.arange(3),
    )
    path = tmp_path / "out.json"
    files = [str(tmp_path / "acts.npy"), str(tmp_path / "grads.npz")]
    argv = ["fidelity", "--input", *files, "--compressor", "identity,taco", "--json", str(path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "grads.npz:step: dtype int64 is not a float type, skipped" in out
    record = read(path)
    assert record["source"] == "input"
    got = {(Path(r["tensor"]).name, r["codec"]): r for r in record["rows"]}
    assert set(got) == {
        (name, codec)
        for name in ("acts.npy", "grads.npz:w", "grads.npz:b")
        for codec in ("identity", "taco")
    }
    assert got["grads.npz:w", "taco"]["dtype"] == "float16"
    assert got["grads.npz:b", "identity"]["shape"] == [10, 10]
    assert got["acts.npy", "identity"]["rel_l2"] == 0
    assert 0.02 < got["acts.npy", "taco"]["rel_l2"] < 0.035


def test_fidelity_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["fidelity", "--input", str(tmp_path / "missing.npy")]) == 2
    assert "missing.npy: no such file" in capsys.readouterr().err
    np.save(tmp_path / "ints.npy", np.arange(10))
    assert cli.main(["fidelity", "--input", str(tmp_path / "ints.npy")]) == 2
    assert "no float array in --input" in capsys.readouterr().err


# ---------------------------------------------------------------------- codec
def moved_bytes(codec: Compressor, op: str, dtype: np.dtype, count: int) -> int:
    """What one call reads and writes, by the module docstring of ``bench/codec.py``."""
    payload = codec.encoded_nbytes(count, dtype)
    data = 8 * count if op == "decode_accumulate" else dtype.itemsize * count
    return payload * (2 if op == "hop" else 1) + data


def test_codec_cpu_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "codec.json"
    argv = ["codec", "--device", "cpu", "--counts", "4K,1000", "-d", "float32,bfloat16"]
    argv += ["--compressor", "identity,int8,taco:group_size=32", "-n", "2", "-w", "0"]
    assert cli.main([*argv, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "copy bandwidth" in out and "decode_accumulate" in out
    assert "# Out of bounds values : 0 OK" in out.splitlines()
    record = read(path)
    assert RECORD | {"cpu", "copy_GBps", "check", "checks", "errors"} <= set(record)
    assert record["device"] == "cpu" and record["copy_GBps"] > 0 and record["errors"] == []
    assert "codec --device cpu" in record["command"]
    rows = record["rows"]
    assert all(CODEC_ROW <= set(r) for r in rows)
    specs = {s.label: s.codec for s in codec_specs("identity,int8,taco:group_size=32")}
    keys = {(r["codec"], r["op"], r["dtype"], r["count"]) for r in rows}
    assert keys == {
        (codec, op, dtype, count)
        for codec in specs
        for op in ("encode", "decode", "decode_accumulate")
        for dtype in ("float32", "bfloat16")
        for count in (4096, 1000)
    }
    for r in rows:  # full precision: the figures are exactly what the time says
        dtype = cli.datatype(r["dtype"])
        assert r["nbytes"] == moved_bytes(specs[r["codec"]], r["op"], dtype, r["count"])
        assert r["time_ms"] > 0
        assert r["GBps"] == pytest.approx(r["nbytes"] / (r["time_ms"] * 1e-3) / 1e9, rel=1e-12)
        assert r["fraction"] == pytest.approx(r["GBps"] / record["copy_GBps"], rel=1e-12)
        assert r["kernel"] is None and r["config"] is None  # CPU, default timings
        assert r["copy_ms"] > 0  # a copy of the same bytes, in the same run
        assert r["size_fraction"] == pytest.approx(r["copy_ms"] / r["time_ms"], rel=1e-12)
    assert {r["group_size"] for r in rows if r["codec"] == "taco:group_size=32"} == {32}
    checks = {(c["codec"], c["dtype"], c["count"]): c for c in record["checks"]}
    assert set(checks) == {(k[0], k[2], k[3]) for k in keys}
    for (codec, _, _), c in checks.items():
        assert c["ok"] and c["payload_mismatches"] is None  # no GPU to compare with
        assert c["rel_err"] <= c["bound"]
        assert (c["bound"] == 0) == (codec == "identity") and (c["rel_err"] == 0) == (
            codec == "identity"
        )


BROKEN_CODEC = Path(__file__).parent / "scripts" / "broken_codec_bench.py"


@pytest.mark.launch
def test_codec_check_fails_a_broken_codec(tmp_path: Path) -> None:
    script = BROKEN_CODEC
    args = ["codec", "--counts", "1000", "-d", "float32", "-n", "1", "-w", "0"]
    args += ["--compressor", "int8,skewed_int8", "--json", str(tmp_path / "c.json")]
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "# Out of bounds values : 1 FAILED" in proc.stdout.splitlines()
    checks = {c["codec"]: c for c in read(tmp_path / "c.json")["checks"]}
    assert checks["int8"]["ok"] and not checks["skewed_int8"]["ok"]
    assert checks["skewed_int8"]["rel_err"] > 0.2 > checks["skewed_int8"]["bound"]


def test_codec_gpu_flags_need_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--tuning", "--launch-cost", "--fp8-check"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["codec", flag])
        assert exc.value.code == 2
        assert f"{flag} measures the GPU kernels: add --device gpu" in capsys.readouterr().err


def test_codec_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["codec", "--compressor", "taco", "-d", "int32"])
    assert exc.value.code == 2
    assert "does not support dtype int32" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["codec", "--counts", "0"])
    assert exc.value.code == 2


def test_codec_gpu_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import cupy  # noqa: PLC0415

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is present")
    except Exception:
        pass
    assert cli.main(["codec", "--device", "gpu", "--counts", "1K"]) == 2
    assert "--device gpu needs" in capsys.readouterr().err


@pytest.mark.launch
@pytest.mark.parametrize("subcommand", ["codec", "fidelity"])
def test_unknown_compressor_exit_code(subcommand: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "coccl.bench.cli", subcommand, "--compressor", "identity,nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "compressor 'nope' is not available: unknown compressor 'nope'" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.gpu
def test_codec_gpu_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not GPU:
        pytest.skip("needs CuPy and a CUDA GPU")
    path = tmp_path / "codec.json"
    argv = ["codec", "--device", "gpu", "--counts", "1M,4M", "-d", "float32,bfloat16"]
    argv += ["--compressor", "identity,int8,taco", "-n", "3", "-w", "1", "--json", str(path)]
    argv += ["--tuning", "--launch-cost", "--fp8-check", "512M"]
    assert cli.main(argv) == 0, capsys.readouterr().out
    record = read(path)
    assert record["errors"] == [] and record["copy_kernel_GBps"] > 0
    hops = [r for r in record["rows"] if r["op"] == "hop"]  # taco's and int8's fused hop
    assert {(r["codec"], r["dtype"], r["count"]) for r in hops} == {
        (codec, dtype, count)
        for codec in ("int8", "taco")
        for dtype in ("float32", "bfloat16")
        for count in (1 << 20, 1 << 22)
    }
    assert len(record["rows"]) == 2 * 3 * 2 * 3 + len(hops)
    specs = {s.label: s.codec for s in codec_specs("identity,int8,taco")}
    for r in record["rows"]:
        dtype = cli.datatype(r["dtype"])
        assert r["nbytes"] == moved_bytes(specs[r["codec"]], r["op"], dtype, r["count"])
        assert r["copy_ms"] > 0 and r["size_fraction"] > 0
        lossy = r["codec"] != "identity"
        assert (r["kernel"] is not None) == lossy
        if lossy:
            assert r["kernel"]["regs"] > 0 and r["kernel"]["local_bytes"] >= 0
    assert all(c["ok"] and c["payload_mismatches"] == 0 for c in record["checks"])
    assert {r["config"] for r in record["launch_cost_rows"]} == {"launch cost timed"}
    assert {r["op"] for r in record["tuning_rows"]} == {"encode"}
    assert len({r["config"] for r in record["tuning_rows"]}) > 1
    assert [c["fp8_format"] for c in record["fp8_checks"]] == ["e4m3", "e5m2"]
    assert all(c["ok"] and c["patterns"] == 512 << 20 for c in record["fp8_checks"])
