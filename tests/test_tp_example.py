"""Smoke run of examples/tp_gpt.py: 3 steps of the tiny GPT with TP = 2 under mpiexec,
against the PyTorch-only baseline of the same seed, data and steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpi_launch import ROOT, mpiexec

pytest.importorskip("torch")

SCRIPT = ROOT / "examples" / "tp_gpt.py"
COMMON = ["--steps", "3", "--tiny", "--seed", "5", "--threads", "1"]


def run_example(cmd: list[str], tmp_path: Path, name: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [*cmd, *COMMON, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text())
    # the same JSON is the last line of stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == result
    return result


@pytest.mark.mpi
def test_tp2_identity_matches_baseline(tmp_path: Path) -> None:
    tp_cmd = [*mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(SCRIPT)]
    tp = run_example(
        [*tp_cmd, "--tp-compressor", "identity", "--tp-algorithm", "ring"], tmp_path, "tp"
    )
    base = run_example([sys.executable, str(SCRIPT), "--baseline"], tmp_path, "base")

    assert tp["mode"] == "tp" and tp["tp"] == 2
    assert tp["compressor"] == {"id": "identity"}
    assert tp["replicated_identical"] is True
    assert tp["replicated_params"] > 0
    assert tp["model"] == base["model"]
    assert [h["step"] for h in tp["history"]] == [h["step"] for h in base["history"]]
    # same initial weights, data and arithmetic up to float rounding
    assert tp["val_loss"] == pytest.approx(base["val_loss"], rel=1e-4)
    assert tp["train_loss"] == pytest.approx(base["train_loss"], rel=1e-4)


# The README's two commands (examples/README.md), verbatim: no --threads, no --seed.
README_REAL = ["-m", "mpi4py", str(SCRIPT), "--tiny", "--steps", "3", "--tp-compressor", "taco"]
README_VIRTUAL = [str(SCRIPT), "--tiny", "--steps", "3", "--virtual-tp", "2"]
README_VIRTUAL += ["--tp-compressor", "taco"]


def last_json_line(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.mpi
def test_virtual_tp2_equals_real_tp2_as_the_readme_runs_them() -> None:
    """--virtual-tp 2 (one process) trains bitwise like two real ranks under mpiexec, with
    the README's commands as written: by default each rank's matmuls get the same torch
    threads in both (cores / TP ranks), on which torch's CPU sums depend. The real run is
    also the TP = 2 taco (two-shot, the default) run: with a lossy codec the loss moves a
    little, but replicas must not."""
    real = last_json_line([*mpiexec(), "-n", "2", sys.executable, *README_REAL])
    assert real["compressor"]["id"] == "taco" and real["algorithm"] == "two_shot"
    assert real["replicated_identical"] is True
    assert 0.0 < real["val_loss"] < 6.0  # finite and near ln(256) = 5.5 after 3 steps
    virtual = last_json_line([sys.executable, *README_VIRTUAL])
    assert real["mode"] == "tp" and virtual["mode"] == "virtual" and virtual["tp"] == 2
    assert virtual["threads"] == real["threads"] >= 1
    assert virtual["val_loss"] == real["val_loss"]
    assert virtual["history"] == real["history"]
    assert virtual["train_loss"] == real["train_loss"]


# ---------------------------------------------------- examples/tp_convergence_gpu.py
CONVERGENCE = ROOT / "examples" / "tp_convergence_gpu.py"


def load_example(name: str):
    """An examples/ module, imported the way the scripts import their siblings."""
    import importlib  # noqa: PLC0415

    folder = str(ROOT / "examples")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


@pytest.mark.mpi
def test_convergence_experiment_smoke(tmp_path: Path) -> None:
    """Both phases end to end on the CPU: every arm at TP 4 and 8 on virtual ranks, the
    JSON and PNG; then the real TP = 2 run under mpiexec against the simulated one."""
    out = tmp_path / "tp.json"
    run = [sys.executable, str(CONVERGENCE), "run", "--smoke", "--seeds", "0,1"]
    run += ["--work-dir", str(tmp_path / "runs"), "--out", str(out), "--jobs-per-gpu", "2"]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    arms = ["uncompressed", "identity", "taco", "taco_ring", "taco_no_ash"]
    arms += ["taco_no_dual_scale", "int8"]
    assert list(report["summary"]) == arms
    assert len(report["runs"]) == 2 * (1 + 6 * 2) and not report["incomplete"]
    for row in report["runs"]:
        assert {"arm", "seed", "tp", "algorithm", "params", "tokens", "val_loss"} <= set(row)
        assert row["history"] and row["history"][-1]["step"] == report["setup"]["steps"]
    taco = report["summary"]["taco"]["tp8"]
    assert taco["n"] == 2 and len(taco["delta_pct_vs_uncompressed_ci"]) == 2
    assert {"mean", "sd", "delta_pct_vs_uncompressed", "delta_pct_vs_identity"} <= set(taco)
    assert report["summary"]["uncompressed"]["tp1"]["delta_pct_vs_uncompressed"] == 0.0
    # keyed by arm alone: the smallest TP size's fields at the top level
    top = report["summary"]["taco"]
    assert top["tp"] == 4 and top["mean"] == top["tp4"]["mean"] and top["n"] == 2
    assert set(report["target"]) == {"rule", "tp4", "tp8"}
    assert report["corpus"]["train_bytes"] > 10**6 and report["commit"]

    # a rerun finds every run done and only rewrites the report
    again = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "26 already in" in again.stdout

    check = [sys.executable, str(CONVERGENCE), "check", "--smoke", "--out", str(out)]
    check += ["--work-dir", str(tmp_path / "check")]
    proc = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    section = report["real_vs_sim"]
    assert section["backend"] == "mpi" and section["tp"] == 2
    assert section["bitwise_equal"] is True and section["first_differing_step"] is None
    assert report["summary"]  # the experiment's part is kept


@pytest.mark.launch
def test_frontier_smoke(tmp_path: Path) -> None:
    """The frontier command on the CPU with a 4-bit arm and a per-direction arm: the runs,
    the frontier points (bytes from the codecs themselves), its PNG and the curves'."""
    from coccl.compressors import get_compressor  # noqa: PLC0415

    tpc = load_example("tp_convergence_gpu")
    out = tmp_path / "frontier.json"
    run = [sys.executable, str(CONVERGENCE), "frontier", "--smoke", "--seeds", "0,1"]
    run += ["--arms", "uncompressed,nvfp4,fwd_taco_bwd_nvfp4", "--tps", "4"]
    run += ["--work-dir", str(tmp_path / "runs"), "--out", str(out), "--jobs-per-gpu", "1"]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert (tmp_path / "frontier-curves.png").stat().st_size > 0
    assert len(report["runs"]) == 6 and not report["incomplete"]
    mixed = [r for r in report["runs"] if r["arm"] == "fwd_taco_bwd_nvfp4"]
    assert all(r["backward_compressor"] == tpc.NVFP4 for r in mixed)
    assert all("backward_compressor" not in r for r in report["runs"] if r["arm"] == "nvfp4")
    points = {(p["arm"], p["tp"]): p for p in report["frontier"]}
    assert set(points) == {("uncompressed", 1), ("nvfp4", 4), ("fwd_taco_bwd_nvfp4", 4)}
    count = 4 * 32 * 64  # the smoke setup's batch x seq x d_model
    nv = get_compressor(tpc.NVFP4)
    taco = get_compressor("taco")
    bf16 = tpc.tp_frontier.FORWARD_DTYPE
    mixed = points[("fwd_taco_bwd_nvfp4", 4)]["bytes_per_element"]
    assert mixed["forward"] == taco.encoded_nbytes(count, bf16) / count
    assert mixed["backward"] == nv.encoded_nbytes(count, np.float32) / count
    assert mixed["mean"] == (mixed["forward"] + mixed["backward"]) / 2
    assert points[("uncompressed", 1)]["bytes_per_element"] == {
        "forward": 2.0,
        "backward": 4.0,
        "mean": 3.0,
    }
    nvfp4 = points[("nvfp4", 4)]
    assert nvfp4["delta_pct"] == report["summary"]["nvfp4"]["tp4"]["delta_pct_vs_uncompressed"]
    assert nvfp4["meets_target"] == (nvfp4["delta_pct"] <= 0.5 and nvfp4["ci"][1] < 1.0)
    assert [p["bytes_per_element"]["mean"] for p in report["frontier"]] == sorted(
        p["bytes_per_element"]["mean"] for p in report["frontier"]
    )
    assert set(report["frontier_fewest_bytes"]) == {"tp4"}


def test_parallelize_sends_each_direction_through_its_group() -> None:
    """With a backward group, the forward AllReduces (row-parallel) go through the
    forward group and the backward ones (column-parallel) through the backward group: the
    forward is bitwise the one-group model's of the forward codec, the gradients are not."""
    from dataclasses import dataclass, field  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from coccl.tensor_parallel import VirtualTPGroup  # noqa: PLC0415

    tp_gpt = load_example("tp_gpt")
    tpc = load_example("tp_convergence_gpu")

    @dataclass(frozen=True)
    class Counting(VirtualTPGroup):
        calls: list = field(default_factory=list, compare=False)

        def allreduce(self, partials):  # type: ignore[override]
            self.calls.append(partials[0].dtype)
            return super().allreduce(partials)

    cfg = tp_gpt.GPTConfig(layers=2, d_model=32, heads=4, seq=16)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))

    def model(group, backward_group=None):
        torch.manual_seed(0)
        return tp_gpt.parallelize(tp_gpt.GPT(cfg), group, backward_group)

    def loss_and_grads(m):
        logits = m(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())
        loss.backward()
        return logits.detach(), [p.grad.clone() for p in m.parameters()]

    fwd, bwd = Counting(2, "two_shot", tpc.NVFP4), Counting(2, "two_shot", "taco")
    both = model(fwd, bwd)
    logits = both(x)
    assert (len(fwd.calls), len(bwd.calls)) == (2 * cfg.layers, 0)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    assert (len(fwd.calls), len(bwd.calls)) == (2 * cfg.layers, 2 * cfg.layers)

    split_logits, split_grads = loss_and_grads(
        model(VirtualTPGroup(2, "two_shot", tpc.NVFP4), VirtualTPGroup(2, "two_shot", "taco"))
    )
    one_logits, one_grads = loss_and_grads(model(VirtualTPGroup(2, "two_shot", tpc.NVFP4)))
    assert torch.equal(split_logits, one_logits)  # the forward: the forward codec's alone
    assert not all(torch.equal(a, b) for a, b in zip(split_grads, one_grads, strict=True))
    # the same codec both ways is the one-group model, bitwise
    same_logits, same_grads = loss_and_grads(
        model(VirtualTPGroup(2, "two_shot", tpc.NVFP4), VirtualTPGroup(2, "two_shot", tpc.NVFP4))
    )
    assert torch.equal(same_logits, one_logits)
    assert all(torch.equal(a, b) for a, b in zip(same_grads, one_grads, strict=True))
    with pytest.raises(ValueError, match="same kind and size"):
        model(VirtualTPGroup(2), VirtualTPGroup(4))


@pytest.mark.launch
def test_convergence_help_shows_defaults() -> None:
    for command in ("run", "frontier", "check"):
        proc = subprocess.run(
            [sys.executable, str(CONVERGENCE), command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0 and "(default: " in proc.stdout


def test_paired_statistics() -> None:
    stats = load_example("convergence_stats")
    assert stats.t975(1) == 12.706 and stats.t975(2) == 4.303
    assert abs(stats.t975(40) - 2.021) < 1e-3 and abs(stats.t975(1000) - 1.962) < 1e-3
    ref = {0: 2.0, 1: 2.2, 2: 1.8}
    arm = {0: 2.02, 1: 2.222, 2: 1.818}  # +1% on every seed
    paired = stats.paired_delta_pct(arm, ref)
    assert paired["n"] == 3 and abs(paired["delta_pct"] - 1.0) < 1e-9
    assert abs(paired["ci"][0] - 1.0) < 1e-9 and abs(paired["ci"][1] - 1.0) < 1e-9
    # the same arm unpaired: the seeds' spread makes the interval wide
    unpaired = stats.welch_delta_pct(list(arm.values()), list(ref.values()))
    assert abs(unpaired["delta_pct"] - 1.0) < 1e-9
    assert unpaired["ci"][0] < -5 and unpaired["ci"][1] > 5
    noisy = stats.paired_delta_pct({0: 2.02, 1: 2.2, 2: 1.8}, ref)
    d = [1.0, 0.0, 0.0]
    half = 4.303 * stats.mean_sd(d)[1] / 3**0.5
    assert abs(noisy["ci"][1] - (1 / 3 + half)) < 1e-9


def test_stdlib_corpus_split_and_windows(tmp_path: Path) -> None:
    corpus_mod = load_example("stdlib_corpus")
    for i in range(60):
        sub = tmp_path / f"pkg{i % 3}"
        sub.mkdir(exist_ok=True)
        (sub / f"m{i}.py").write_bytes(bytes([i]) * 100)
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "x.py").write_bytes(b"third party")
    corpus = corpus_mod.load_stdlib_corpus(tmp_path)
    held_out = [i for i in range(60) if corpus_mod.is_validation(f"pkg{i % 3}/m{i}.py")]
    assert corpus.info["val_files"] == len(held_out) and corpus.info["train_files"] == 60 - len(
        held_out
    )
    assert corpus.train.size + corpus.val.size == 60 * 101  # each file and its newline
    assert b"third party" not in corpus.train.tobytes()
    assert corpus_mod.load_stdlib_corpus(tmp_path).info == corpus.info  # deterministic
    w = corpus_mod.train_windows(corpus.train, 16, 4, 10, seed=1)
    assert w.shape == (10, 4, 17)
    starts = {bytes(win[:16]) + bytes([k]) for k, win in enumerate(w.reshape(-1, 17))}
    assert len(starts) == 40
    flat = corpus.train.tobytes()
    assert all(bytes(win) in flat for win in w.reshape(-1, 17))
    assert not np.array_equal(w, corpus_mod.train_windows(corpus.train, 16, 4, 10, seed=2))
    with pytest.raises(ValueError, match="repeat"):
        corpus_mod.train_windows(corpus.train, 16, 4, 10**6, seed=1)
    v = corpus_mod.val_windows(corpus.val, 16, 2, 1) if corpus.val.size > 40 else None
    assert v is None or v.shape == (1, 2, 17)


def test_the_shipped_tp_policy_is_the_frontiers_arm() -> None:
    """``named_policy("tp_mx6_nv4")`` is what the TP convergence table measured as
    ``fwd_mxfp6_bwd_nvfp4``: its codecs per direction and its schedule."""
    from coccl.compressors import get_compressor  # noqa: PLC0415
    from coccl.torch.policy import named_policy  # noqa: PLC0415

    arm = load_example("tp_convergence_gpu").ARMS["fwd_mxfp6_bwd_nvfp4"]
    shipped = named_policy("tp_mx6_nv4").traffic["tp"]["allreduce"]
    assert get_compressor(arm.compressor).get_config() == shipped.codec
    assert get_compressor(arm.backward).get_config() == shipped.backward_codec
    assert arm.algorithm == shipped.schedule == "two_shot"


def test_graph_and_eager_steps_agree_on_gpu(tmp_path: Path) -> None:
    """The experiment's captured training step computes what its eager step computes
    (a few steps of a small model at TP = 4, taco on virtual ranks)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    exp = load_example("tp_convergence_gpu")
    from coccl.tensor_parallel import VirtualTPGroup  # noqa: PLC0415

    setup = exp.replace(exp.SMOKE, device="cuda", steps=10, eval_every=5, cuda_graph="off", batch=8)
    job = exp.Job("taco", 4, 0)
    results = {}
    for mode in ("off", "on"):
        group = VirtualTPGroup(4, "two_shot", "taco")
        results[mode] = exp.train(
            job,
            exp.replace(setup, cuda_graph=mode),
            group,
            torch.device("cuda"),
            None,
            lambda: False,
            print,
        )
    assert results["on"]["cuda_graph"] is True and results["off"]["cuda_graph"] is False
    assert results["on"]["train_losses"] == results["off"]["train_losses"]
    assert results["on"]["val_loss"] == results["off"]["val_loss"]
