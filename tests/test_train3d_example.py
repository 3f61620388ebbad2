"""examples/train3d_convergence_gpu.py on the CPU: a 3-step smoke run of two arms end to
end (workers, JSON, PNG), and the 3D step's bookkeeping in process (every parameter in
one DP buffer, replicas and masters in step, an exact arm's loss the plain model's)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "train3d_convergence_gpu.py"
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))


def test_smoke_run_writes_the_table(tmp_path: Path) -> None:
    out = tmp_path / "t3d.json"
    cmd = [sys.executable, str(SCRIPT), "run", "--tiny", "--steps", "3", "--seeds", "0"]
    cmd += ["--arms", "uncompressed,taco3d", "--stand-ins", "--jobs-per-gpu", "2"]
    cmd += ["--work-dir", str(tmp_path / "runs"), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert list(report["summary"]) == ["uncompressed", "taco3d"] and not report["incomplete"]
    assert report["layout"] == {"tp": 4, "pp": 2, "dp": 2, "tp_algorithm": "two_shot"}
    assert report["summary"]["uncompressed"]["delta_pct_vs_uncompressed"] == 0.0
    assert {"rule", "delta_pct", "ci", "met"} <= set(report["target"])
    taco3d = report["arms"]["taco3d"]
    assert all(taco3d[k] is not None for k in ("tp", "pp_fwd", "pp_bwd", "dp_reduce"))
    for row in report["runs"]:
        assert row["history"][-1]["step"] == 3 and row["stand_ins"] is True
    # a finished run counts only for its own configuration: without the stand-ins (or
    # with another DP recipe) the same job name in the same folder is run again
    import argparse  # noqa: PLC0415

    import tp_convergence_gpu as tpc  # noqa: PLC0415
    import train3d_convergence_gpu as t3d  # noqa: PLC0415

    setup, job = tpc.Setup(**report["setup"]), tpc.Job("taco3d", 4, 0)
    work = tmp_path / "runs"
    assert t3d.done(work, job, setup, argparse.Namespace(dp_reduce="intra", stand_ins=True))
    assert not t3d.done(work, job, setup, argparse.Namespace(dp_reduce="intra", stand_ins=False))
    assert not t3d.done(work, job, setup, argparse.Namespace(dp_reduce="inter", stand_ins=True))


def test_the_6bit_pp_arm_is_taco3d_with_int6_activations() -> None:
    import dataclasses  # noqa: PLC0415

    import train3d_convergence_gpu as t3d  # noqa: PLC0415

    taco3d, pp6 = t3d.make_arm("taco3d", 768), t3d.make_arm("taco3d_pp6", 768)
    assert pp6.pp_fwd == {"id": "int", "bits": 6, "group_size": 32} == pp6.pp_bwd
    assert dataclasses.replace(pp6, name="taco3d", pp_fwd=taco3d.pp_fwd) == taco3d


@pytest.mark.parametrize("name", ["taco3d", "taco3d_pp6", "taco3d_pp4h"])
def test_the_shipped_policies_are_the_tables_arms(name: str) -> None:
    """What the accuracy table measured is what ``named_policy`` ships."""
    import train3d_convergence_gpu as t3d  # noqa: PLC0415

    from coccl.compressors import get_compressor  # noqa: PLC0415
    from coccl.torch.policy import named_policy  # noqa: PLC0415

    arm, traffic = t3d.make_arm(name, 768), named_policy(name).fill(d_model=768).traffic
    shipped = {
        "tp": traffic["tp"]["allreduce"], "pp_fwd": traffic["pp"]["forward"],
        "pp_bwd": traffic["pp"]["backward"], "dp_reduce": traffic["dp"]["reduce"],
        "dp_gather": traffic["dp"]["gather"],
    }  # fmt: skip
    for field, entry in shipped.items():
        assert get_compressor(getattr(arm, field)).get_config() == entry.codec, field
    assert traffic["tp"]["allreduce"].schedule == "two_shot"  # the table's TP schedule
    assert traffic["dp"]["gather"].state == "delta"  # the table's delta AllGather


def tiny_step(arm_name: str):
    import tp_convergence_gpu as tpc  # noqa: PLC0415
    import tp_gpt  # noqa: PLC0415
    import train3d_convergence_gpu as t3d  # noqa: PLC0415

    s = tpc.SMOKE
    torch.manual_seed(0)
    full = tp_gpt.GPT(tp_gpt.GPTConfig(s.layers, s.d_model, s.heads, s.seq))
    plain = tp_gpt.GPT(full.cfg)
    plain.load_state_dict(full.state_dict())
    x = torch.randint(0, 256, (s.batch, s.seq))
    y = torch.randint(0, 256, (s.batch, s.seq))
    arm = t3d.make_arm(arm_name, s.d_model, stand_ins=True)
    lr = torch.tensor(1e-3)
    model, opt, step = t3d.build_3d(
        full, arm, torch.device("cpu"), lr, x, y, contextlib.nullcontext
    )
    return plain, model, opt, step, x, y


def test_exact_arm_step_is_the_plain_models() -> None:
    plain, model, opt, step, x, y = tiny_step("uncompressed")
    loss = step()
    expected = torch.nn.functional.cross_entropy(plain(x).flatten(0, 1), y.flatten())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for b in opt.buffers:  # an exact AllGather: the replicas are the masters, bitwise
        assert torch.equal(b.replica, b.master)
        assert not b.replica[:, b.used :].any()  # the padding stays zero
    names = {n for n, _ in model.named_parameters()}
    held = sum(len(row) for b in opt.buffers for row in b.rows)
    assert held == len(names)


def test_compressed_arm_replicas_follow_masters_within_one_step() -> None:
    _, _, opt, step, _, _ = tiny_step("taco3d")
    for _ in range(3):
        step()
    for b in opt.buffers:
        gap = (b.replica - b.master).abs().max().item()
        assert 0 < gap < 1e-2  # lossy, and one weight difference's error, not the weights'


@pytest.mark.parametrize("arm", ["uncompressed", "taco3d"])
def test_graph_and_eager_3d_steps_agree_on_gpu(arm: str) -> None:
    """The captured 3D step (TP, PP and DP codecs, the delta AllGather) computes what its
    eager step computes, and on the GPU the step does get captured."""
    from gpu import GPU  # noqa: PLC0415

    if not (GPU and torch.cuda.is_available()):
        pytest.skip("needs CuPy and a CUDA GPU")
    import dataclasses  # noqa: PLC0415

    import tp_convergence_gpu as tpc  # noqa: PLC0415
    import train3d_convergence_gpu as t3d  # noqa: PLC0415

    setup = dataclasses.replace(tpc.SMOKE, device="cuda", steps=10, eval_every=5, batch=8)
    job = tpc.Job(arm, t3d.TP, 0)
    results = {}
    for mode in ("off", "on"):
        a = t3d.make_arm(arm, setup.d_model)
        results[mode] = tpc.train(
            job, dataclasses.replace(setup, cuda_graph=mode), a, torch.device("cuda"), None,
            lambda: False, print, build=t3d.build_3d, arm_fields=t3d.arm_fields(a, "intra", False),
        )  # fmt: skip
    assert results["on"]["cuda_graph"] is True and results["off"]["cuda_graph"] is False
    assert results["on"]["train_losses"] == results["off"]["train_losses"]
    assert results["on"]["val_loss"] == results["off"]["val_loss"]
