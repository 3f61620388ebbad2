"""Tests of ``coccl-bench fidelity --tensors`` (named cases from ``.npz`` files, the rows'
bytes per element, cosine and bound columns) on tiny generated files, and of
``examples/capture_tensors.py``: its hooks against an independent computation, and two
tiny runs bitwise equal."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from coccl.bench import cli
from coccl.bench.codec import codec_specs
from coccl.bench.fidelity import META_KEY, group_bound_ratios
from coccl.compressors import get_compressor

ROOT = Path(__file__).resolve().parents[1]
CODECS = "identity,int8,tah:row=256,int:bits=4,group_size=128,hadamard=32,mx"


def write_npz(path: Path, meta: object | None = None, **arrays: np.ndarray) -> str:
    extra = {} if meta is None else {META_KEY: np.array(json.dumps(meta))}
    np.savez(path, **arrays, **extra)
    return str(path)


def tiny_tensors(tmp_path: Path) -> tuple[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    arrays = {
        "act": rng.standard_normal((16, 256), dtype=np.float32) * 3,
        "grad": (rng.standard_t(3, 1000) * 1e-4).astype(np.float32),  # no whole group
        "half": rng.standard_normal(300).astype(np.float16),
        "one": np.array([2.5], dtype=np.float32),
    }
    meta = {"what": "a test", "tensors": {"act": "activations", "grad": "gradients"}}
    path = write_npz(tmp_path / "t.npz", meta, **arrays, step=np.arange(3))
    return path, arrays


def test_fidelity_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, arrays = tiny_tensors(tmp_path)
    out = tmp_path / "out.json"
    argv = ["fidelity", "--tensors", path, "--compressor", CODECS, "--json", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "step: dtype int64 is not a float type, skipped" in printed
    assert "act: activations" in printed
    record = json.loads(out.read_text())
    assert record["source"] == "tensors"
    assert record["captures"] == {path: {"what": "a test", "tensors": record["tensors"]}}
    assert record["tensors"] == {"act": "activations", "grad": "gradients"}
    rows = {(r["tensor"], r["codec"]): r for r in record["rows"]}
    codecs = {spec.label: spec.codec for spec in codec_specs(CODECS)}
    labels = ["identity", "int8", "tah:row=256", "int:bits=4,group_size=128,hadamard=32", "mx"]
    assert set(rows) == {(name, label) for name in arrays for label in labels}
    for (name, label), row in rows.items():
        x = arrays[name].reshape(-1)
        codec = codecs[label]
        assert row["shape"] == list(arrays[name].shape) and row["dtype"] == x.dtype.name
        assert row["bytes_per_element"] == codec.encoded_nbytes(x.size, x.dtype) / x.size
        # the float64 reference of the same (deterministic) roundtrip
        y = codec.decode(codec.encode(x), count=x.size, dtype=x.dtype).astype(np.float64)
        x64 = x.astype(np.float64)
        rel = np.linalg.norm(y - x64) / np.linalg.norm(x64)
        cosine = x64 @ y / (np.linalg.norm(x64) * np.linalg.norm(y))
        assert row["rel_l2"] == pytest.approx(rel, rel=1e-12, abs=0)
        assert row["cosine"] == pytest.approx(cosine, rel=1e-12)
        assert row["max_abs"] == np.max(np.abs(y - x64))
        assert row["rel_l2"] <= row["bound"] or row["bound"] == 0 == row["rel_l2"]
        assert 0 <= row["bound_ratio"] <= 1 and row["groups_over"] == 0
        if label == "identity":
            assert row["rel_l2"] == row["bound_ratio"] == 0
            assert row["cosine"] == pytest.approx(1.0, abs=1e-15)
            assert row["bytes_per_element"] == x.dtype.itemsize
        else:
            assert row["bound_ratio"] > 0 or name == "one"


def test_group_bound_ratios_short_last_group() -> None:
    codec = get_compressor("int8")  # groups of 128: 300 elements are 128 + 128 + 44
    x = np.ones(300, dtype=np.float32)
    b = codec.rel_error_bound * (1 + 2.0**-24) + 2.0**-24  # bounds.roundtrip_bound
    limits = [b * math.sqrt(n) + math.sqrt(n) * codec.abs_error_floor for n in (128, 128, 44)]
    diff = np.zeros(300)
    diff[130] = 0.5 * limits[1]
    diff[299] = 2.0 * limits[2]
    ratios = group_bound_ratios(codec, x, diff)
    assert ratios == pytest.approx([0.0, 0.5, 2.0], rel=1e-12)


def test_blocks_far_below_an_nvfp4_payloads_top_are_held_to_its_payload_floor() -> None:
    """NVFP4's block scales are relative to the payload's largest value, so blocks ~2^20
    below it flush: within the codec's payload_floor, which the ratio uses; against
    abs_error_floor alone they would be far over."""
    codec = get_compressor("mx", element="e2m1", block=16, scale="e4m3")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(16) * 1e3, rng.standard_normal(4096) * 1e-3])
    x = x.astype(np.float32)
    y = codec.decode(codec.encode(x), count=x.size, dtype=np.float32)
    diff = y.astype(np.float64) - x
    assert not y[16:].any()  # flushed
    assert group_bound_ratios(codec, x, diff).max() <= 1.0
    top = float(np.abs(x).max())
    assert codec.payload_floor(top) > 1e3 * codec.abs_error_floor


def test_fidelity_tensors_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ones = np.ones(4, dtype=np.float32)
    a = write_npz(tmp_path / "a.npz", x=ones)
    b = write_npz(tmp_path / "b.npz", x=ones)
    np.save(tmp_path / "c.npy", ones)
    bad = write_npz(tmp_path / "bad.npz", x=ones, **{META_KEY: np.array("[1, 2]")})
    ints = write_npz(tmp_path / "ints.npz", {"what": "ints"}, n=np.arange(3))
    cases = [
        ([a, b], "'x' is in both"),
        ([str(tmp_path / "c.npy")], "an .npy holds no names"),
        ([bad], f"{META_KEY} is not a JSON object"),
        ([ints], "no float array in --tensors"),
        ([str(tmp_path / "missing.npz")], "missing.npz: no such file"),
    ]
    for files, message in cases:
        assert cli.main(["fidelity", "--tensors", *files]) == 2, message
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["fidelity", "--tensors", a, "--input", a])
    assert exc.value.code == 2
    assert "--input and --tensors exclude each other" in capsys.readouterr().err


# ------------------------------------------------------------- the capture script
@pytest.fixture(scope="module")
def capture_module():
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        yield importlib.import_module("capture_tensors")
    finally:
        sys.path.remove(str(ROOT / "examples"))


def test_capture_hooks_match_an_independent_computation(capture_module) -> None:
    import torch  # noqa: PLC0415
    import tp_gpt  # noqa: PLC0415
    from torch.nn import functional as F  # noqa: PLC0415

    from coccl.tensor_parallel import (  # noqa: PLC0415
        ColumnParallelLinear,
        RowParallelLinear,
        VirtualTPGroup,
    )

    torch.manual_seed(3)
    model = tp_gpt.GPT(tp_gpt.GPTConfig(layers=2, d_model=64, heads=4, seq=16))
    xy = torch.randint(0, 256, (2, 17))
    block, proj, fc1 = model.blocks[0], model.blocks[0].attn.proj, model.blocks[0].mlp.fc1
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        block.register_forward_hook(lambda m, i, o: seen.update(act=o)),
        proj.register_forward_hook(lambda m, i, o: seen.update(proj_in=i[0], proj_out=o)),
        fc1.register_full_backward_hook(lambda m, gi, go: seen.update(gi=gi[0], go=go[0])),
    ]
    capture = capture_module.Capture(model, tp=2)
    loss = F.cross_entropy(model(xy[:, :-1]).flatten(0, 1), xy[:, 1:].flatten())
    (act_grad,) = torch.autograd.grad(loss, seen["act"], retain_graph=True)
    loss.backward()
    capture.remove()
    for hook in hooks:
        hook.remove()
    got = capture.arrays()
    assert sorted(got) == sorted(
        ["pp_act.after_block0", "pp_grad.after_block0"]
        + [f"tp_fwd.block{i}.{n}" for i in (0, 1) for n in ("attn_proj", "mlp_fc2")]
        + [f"tp_bwd.block{i}.mlp_fc1" for i in (0, 1)]
    )
    flat = lambda t: t.detach().reshape(-1, t.shape[-1]).numpy()  # noqa: E731
    np.testing.assert_array_equal(got["pp_act.after_block0"], flat(seen["act"]))
    np.testing.assert_array_equal(got["pp_grad.after_block0"], flat(act_grad))
    group = VirtualTPGroup(2)
    # rank 0's partial with rank 0's shard as coccl's layers cut it; both ranks' sum
    rows = RowParallelLinear.from_linear(proj, group).rank_weights
    x = seen["proj_in"].detach()
    partials = [x[..., r * 32 : (r + 1) * 32] @ w.detach().T for r, w in enumerate(rows)]
    np.testing.assert_allclose(got["tp_fwd.block0.attn_proj"], flat(partials[0]), rtol=1e-6)
    total = partials[0] + partials[1] + proj.bias.detach()
    np.testing.assert_allclose(flat(total), flat(seen["proj_out"]), rtol=1e-5, atol=1e-6)
    cols = ColumnParallelLinear.from_linear(fc1, group).rank_weights
    go = seen["go"].detach()
    grads = [go[..., r * 128 : (r + 1) * 128] @ w.detach() for r, w in enumerate(cols)]
    np.testing.assert_allclose(got["tp_bwd.block0.mlp_fc1"], flat(grads[0]), rtol=1e-6)
    np.testing.assert_allclose(flat(grads[0] + grads[1]), flat(seen["gi"]), rtol=1e-5, atol=1e-8)


def test_capture_is_deterministic(capture_module, tmp_path: Path) -> None:
    tiny = ["--steps", "2", "--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32"]
    tiny += ["--batch", "2", "--val-batches", "1"]
    runs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.npz"
        assert capture_module.main(["--out", str(out), *tiny]) == 0
        with np.load(out) as z:
            runs.append({k: z[k] for k in z.files})
    first, second = runs
    assert sorted(first) == sorted(second)
    meta = json.loads(str(first.pop(META_KEY)))
    second.pop(META_KEY)
    params = meta["model"]["params"]
    for name, array in first.items():
        np.testing.assert_array_equal(array, second[name], err_msg=name)
        assert meta["arrays"][name]["shape"] == list(array.shape)
    for name in ("dp_grad.bucket", "weights.all", "weights.delta"):
        assert first[name].shape == (params,)
    assert np.any(first["weights.delta"] != 0) and np.all(np.isfinite(first["dp_grad.bucket"]))
    assert first["pp_act.after_block0"].shape == (2 * 32, 64)
    assert meta["steps"] == meta["captured_step"] == 2 and math.isfinite(meta["val_loss"])
