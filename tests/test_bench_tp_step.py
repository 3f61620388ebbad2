"""``coccl-bench tp-step``: the interpolation of the recorded AllReduce times, the checks
of its flags, and two launched runs on CPU ranks checked against bench/SCHEMA.md: two
ranks (Gloo against coccl identity and taco: identity's output and input gradient equal
Gloo's, taco's differ but stay close) and one rank (the TP=2 prediction from a small
recorded-sweep file written by the test)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from test_bench import run_bench
from test_bench_schema import schema

pytest.importorskip("torch")

from coccl.bench import cli, tp_predict, tp_step  # noqa: E402
from coccl.bench.tp_model import TPBlock, TPStack  # noqa: E402
from coccl.bench.tp_shapes import MODELS, ModelShape  # noqa: E402

TINY = MODELS["tiny"]


def row(size: int, time_us: float, link="nvlink", dtype="float32", algorithm="native",
        compressor="identity") -> dict:  # fmt: skip
    return {"link": link, "type": dtype, "algorithm": algorithm, "compressor": compressor,
            "size": size, "time_us_inplace": time_us, "sweep": f"{link}-{dtype}"}  # fmt: skip


ROWS = [row(1024, 10.0), row(4096, 40.0), row(16384, 100.0)]


# ------------------------------------------------------------ recorded times
@pytest.mark.parametrize(
    "size,expected,used",
    [(1024, 10.0, [1024]), (4096, 40.0, [4096]), (2048, 20.0, [1024, 4096]),
     (10240, 70.0, [4096, 16384]), (16384, 100.0, [16384])],
)  # fmt: skip
def test_recorded_time_is_linear_between_the_bracketing_sizes(size, expected, used):
    time_us, rows, note = tp_predict.recorded_time_us(
        ROWS, "nvlink", "float32", "native", "identity", size
    )
    assert time_us == pytest.approx(expected) and note is None
    assert [r["size"] for r in rows] == used


@pytest.mark.parametrize("size", [1023, 16385])
def test_no_recorded_time_outside_the_recorded_sizes(size):
    time_us, rows, note = tp_predict.recorded_time_us(
        ROWS, "nvlink", "float32", "native", "identity", size
    )
    assert time_us is None and rows == [] and "outside" in note


@pytest.mark.parametrize(
    "link,dtype,compressor", [("shm", "float32", "identity"), ("nvlink", "bfloat16", "identity"),
                              ("nvlink", "float32", "taco")],
)  # fmt: skip
def test_no_recorded_time_without_matching_rows(link, dtype, compressor):
    time_us, _, note = tp_predict.recorded_time_us(ROWS, link, dtype, "native", compressor, 4096)
    assert time_us is None and "no recorded" in note


def test_recorded_variant_of_each_arm():
    from coccl import get_compressor  # noqa: PLC0415

    base = {"compressor": None, "compressor_config": None}
    taco = {"compressor": "taco", "compressor_config": get_compressor("taco").get_config()}
    small = get_compressor("taco", group_size=64).get_config()
    assert tp_predict.recorded_variant(base, "auto") == ("native", "identity")
    assert tp_predict.recorded_variant(taco, "two_shot") == ("two_shot", "taco")
    options = {"compressor": "taco:group_size=64", "compressor_config": small}
    assert tp_predict.recorded_variant(options, "auto") is None


def test_the_repository_links_file_loads():
    links = tp_predict.load_links(tp_predict.LINKS_FILE)
    assert {r["link"] for r in links["rows"]} >= set(tp_predict.LINKS)


def test_a_file_without_link_rows_is_refused(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"size": 1}]}))
    with pytest.raises(ValueError, match="link"):
        tp_predict.load_links(bad)


# ------------------------------------------------------------------ shapes, flags
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_splits_over_two_ranks(name):
    shape = MODELS[name]
    assert shape.problem(2) is None and shape.hidden % shape.heads == 0


@pytest.mark.parametrize(
    "argv,message",
    [(["--model", "tiny", "--tp", "3"], "heads=4"),
     (["--model", "qwen2.5-7b", "--tp", "7"], "kv_heads=4"),
     (["--model", "gpt-1t"], "unknown model"),
     (["--warmup", "-1"], "--warmup")],
)  # fmt: skip
def test_bad_flags_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["tp-step", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def _request(tmp_path: Path, links: str) -> argparse.Namespace:
    (tmp_path / "links.json").write_text(links)
    return argparse.Namespace(
        model=["tiny"], device="cpu", dtype=None, links=tmp_path / "links.json", json=None
    )


def test_the_world_s_tp_is_checked_against_the_model(tmp_path: Path):
    """Without --tp the TP is the world's size, checked as an explicit --tp is."""
    assert "heads=4 does not split over --tp 3" in tp_step._problem(_request(tmp_path, ""), 3, 3)


@pytest.mark.parametrize("links", ["{}", "not json", '{"rows": [{"link": "nvlink"}]}'])
def test_links_without_sweeps_are_refused_before_any_measurement(tmp_path: Path, links):
    assert "--links" in tp_step._problem(_request(tmp_path, links), 1, 1)


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tp-step", "--help"])
    text = "".join(capsys.readouterr().out.split())
    for default in ("(default:gpt-6.7b)", "(default:2048)", "(default:identity,taco)"):
        assert default in text


# ------------------------------------------------------------------ launched runs
def load_checked(path: Path) -> dict:
    """The record, every table checked against SCHEMA.md."""
    record = json.loads(path.read_text())
    tables = schema()
    tables["tp-step record"].check(record)
    for run in record["runs"]:
        tables["tp-step runs[]"].check(run)
        for arm in run["arms"]:
            tables["tp-step arms[]"].check(arm)
        for cost in run["codec_costs"]:
            tables["tp-step codec_costs[]"].check(cost)
        for p in run["predictions"]:
            tables["tp-step predictions[]"].check(p)
        if run["prediction_model"] is not None:
            tables["tp-step prediction_model"].check(run["prediction_model"])
    return record


@pytest.mark.mpi
def test_two_cpu_ranks_gloo_against_coccl(tmp_path: Path):
    args = "tp-step --np 2 --model tiny --seq 16 --steps 3 --warmup 1"
    proc = run_bench([*args.split(), "--compressor", "identity,taco", "--json", "t.json"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = load_checked(tmp_path / "t.json")
    assert record["nranks"] == 2 and record["tp"] == 2 and record["dtype"] == "float32"
    (run,) = record["runs"]
    assert run["message_bytes"] == 16 * TINY.hidden * 4
    assert run["allreduces_per_step"] == {"forward": 4, "backward": 4}
    gloo, identity, taco = run["arms"]
    assert [gloo["arm"], identity["arm"], taco["arm"]] == ["gloo", "coccl:identity", "coccl:taco"]
    for arm in run["arms"]:
        assert arm["finite"] and arm["allreduce_calls"] == 8
        assert arm["allreduce_bytes"] == 8 * run["message_bytes"]
        assert arm["step_ms"] > 0 and arm["tokens_per_s"] > 0
        assert arm["compute_ms"] + arm["comm_ms"] == pytest.approx(arm["step_ms"])
    # a two-rank sum does not depend on the order: identity is Gloo's result
    scale = gloo["output_max_abs"]
    assert identity["output_max_abs_diff"] <= 1e-6 * scale
    assert identity["input_grad_max_abs_diff"] <= 1e-6 * gloo["input_grad_norm"]
    assert identity["calls"] == {"allreduce:exact": 8 * 4}
    # taco quantized every AllReduce (min_compress_bytes 0): close, not equal
    assert taco["calls"] == {"allreduce:compressed": 8 * 4}
    assert 0 < taco["output_max_abs_diff"] < 0.1 * scale
    assert taco["input_grad_max_abs_diff"] > 0


@pytest.mark.mpi
def test_one_cpu_rank_predicts_from_the_recorded_sweeps(tmp_path: Path):
    """One process, no launcher (an MPI world of one): TP = 1 and the prediction."""
    message = 32 * TINY.hidden * 4  # seq 32, float32
    rows = [row(message // 2, 100.0), row(message * 2, 400.0)]  # 200 us at the message
    rows += [row(message // 2, 50.0, algorithm="auto", compressor="taco")]
    (tmp_path / "links.json").write_text(json.dumps({"what": "test", "rows": rows}))
    args = "tp-step --model tiny --layers 1 --seq 32 --steps 2 --warmup 0 --links links.json"
    proc = run_bench([*args.split(), "--compressor", "identity,taco", "--json", "p.json"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = load_checked(tmp_path / "p.json")
    (run,) = record["runs"]
    assert [a["arm"] for a in run["arms"]] == ["tp1"] and run["arms"][0]["comm_ms"] == 0
    assert [c["codec"] for c in run["codec_costs"]] == ["identity", "taco"]
    assert all(c["count"] == 32 * TINY.hidden for c in run["codec_costs"])
    model = run["prediction_model"]
    assert model["kind"] == "prediction" and model["tp"] == 2 and model["links_what"] == "test"
    by = {(p["link"], p["arm"]): p for p in run["predictions"]}
    assert len(by) == 3 * 3 and all(p["kind"] == "prediction" for p in by.values())
    nccl = by[("nvlink", "nccl")]
    assert nccl["allreduce_us"] == pytest.approx(200.0)
    assert nccl["comm_ms"] == pytest.approx(4 * 0.2)
    assert nccl["step_ms"] == pytest.approx(model["compute_ms"] + 0.8)
    assert nccl["speedup"] == pytest.approx(1.0)
    assert [r["size"] for r in nccl["rows"]] == [message // 2, message * 2]
    taco = by[("nvlink", "coccl:taco")]  # the message lies beyond taco's one recorded size
    assert taco["step_ms"] is None and "outside" in taco["note"]
    assert by[("socket", "nccl")]["step_ms"] is None


# ---------------------------------------------------------------------- on GPUs
def cuda_devices() -> int:
    """GPUs that both torch and CuPy see (0 without either)."""
    import torch  # noqa: PLC0415

    from gpu import GPU  # noqa: PLC0415

    return torch.cuda.device_count() if GPU and torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.skipif(cuda_devices() < 1, reason="needs torch with CUDA, CuPy and a GPU")
def test_one_gpu_measures_the_compute_and_predicts(tmp_path: Path):
    args = "tp-step --np 1 --device gpu --model tiny --seq 512 --steps 3 --warmup 1"
    argv = [*args.split(), "--compressor", "identity,taco,int8", "--json", "g.json"]
    proc = run_bench(argv, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = load_checked(tmp_path / "g.json")
    assert record["device"] == "gpu" and record["gpu"] and record["dtype"] == "bfloat16"
    (run,) = record["runs"]
    assert run["message_bytes"] == 512 * TINY.hidden * 2
    assert all(c["encode_us"] > 0 and c["decode_accumulate_us"] > 0 for c in run["codec_costs"])
    by = {(p["link"], p["arm"]): p for p in run["predictions"]}
    for link in ("nvlink", "shm"):  # bfloat16 sweeps recorded from 16 B on these links
        for arm in ("nccl", "coccl:identity", "coccl:taco"):
            assert by[(link, arm)]["step_ms"] > run["prediction_model"]["compute_ms"]
        assert by[(link, "coccl:int8")]["step_ms"] is None  # no int8 sweep recorded


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.skipif(cuda_devices() < 2, reason="needs two GPUs with torch's CUDA and CuPy")
def test_two_gpus_nccl_against_coccl(tmp_path: Path):
    args = "tp-step --np 2 --device gpu --model tiny --seq 256 --steps 3 --warmup 2"
    argv = [*args.split(), "--compressor", "identity,taco", "--json", "g2.json"]
    proc = run_bench(argv, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = load_checked(tmp_path / "g2.json")
    (run,) = record["runs"]
    nccl, identity, taco = run["arms"]
    assert nccl["arm"] == "nccl" and all(arm["finite"] for arm in run["arms"])
    assert all(arm["allreduce_calls"] == 8 and arm["comm_ms"] > 0 for arm in run["arms"])
    # a two-rank bfloat16 sum rounds once in both: identity stays at NCCL's result, up to
    # differences of rounding carried through two layers
    assert identity["output_max_abs_diff"] <= 1e-2 * nccl["output_max_abs"]
    assert identity["calls"] == {"allreduce:exact": 8 * 5}
    assert taco["calls"] == {"allreduce:compressed": 8 * 5}
    assert 0 < taco["output_max_abs_diff"] < 0.1 * nccl["output_max_abs"]


# -------------------------------------------------------------------- the block
GQA = ModelShape("gqa", 64, 4, 2, 96, True, "a grouped-query SwiGLU test width")


@pytest.mark.parametrize("shape", [TINY, GQA], ids=["mha-gelu", "gqa-swiglu"])
def test_two_shards_hold_the_whole_block(shape):
    """Each TP=2 shard holds half of every split weight; the replicated norms stay whole."""
    import torch  # noqa: PLC0415

    def block(tp: int) -> dict:
        blk = TPBlock(shape, tp, 0, 0, torch.float32, torch.device("cpu"), 1)
        return {name: p.shape for name, p in blk.named_parameters()}

    whole, half = block(1), block(2)
    for name in ("qkv", "up"):
        assert half[name][0] * 2 == whole[name][0] and half[name][1] == shape.hidden
    for name in ("proj", "down"):
        assert half[name][1] * 2 == whole[name][1] and half[name][0] == shape.hidden
    assert half["ln1"] == whole["ln1"] == (shape.hidden,)


@pytest.mark.parametrize("shape", [TINY, GQA], ids=["mha-gelu", "gqa-swiglu"])
def test_a_stack_without_group_runs_forward_and_backward(shape):
    import torch  # noqa: PLC0415

    stack = TPStack(2, shape=shape, tp=2, rank=1, dtype=torch.float32,
                    device=torch.device("cpu"), seed=3)  # fmt: skip
    x = torch.randn(2, 8, shape.hidden, requires_grad=True)
    out = stack(x)
    out.backward(torch.ones_like(out))
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all() and all(p.grad is not None for p in stack.parameters())
