"""Codecs whose GPU kernels a CUDA graph may not capture (``graph_safe`` False): the
Communicator's planner replays no plan of them from a graph (and says why), and under an
active stream capture the simulator and the runner raise ``GraphCaptureError`` naming the
codec instead of running. On the CPU, with a fake capturing state and a codec that says it
is not graph_safe (every built-in codec is)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import coccl
from coccl.algorithms import virtual_ranks
from coccl.communicator.planner import Planner
from coccl.communicator.plans import CallPlan
from coccl.communicator.runner import Runner
from coccl.compressors import (
    Int8Compressor,
    available_compressors,
    get_compressor,
    require_graph_safe,
)
from coccl.config import settings
from coccl.errors import CocclError, GraphCaptureError


class _Unsafe(Int8Compressor):
    """int8 saying that its GPU kernels allocate per call (not registered)."""

    graph_safe = False


CODECS = {"int8": Int8Compressor(), "tah": get_compressor("tah", row=256), "unsafe": _Unsafe()}


def _plan(codec: str) -> CallPlan:
    return CallPlan(
        collective="allreduce", op="sum", dtype=np.dtype(np.float32), count=4096,
        out_count=4096, device=0, route="nccl", algorithm="ring",
        codec=CODECS[codec], reason="", requested=("ring", {}),
        chunk_bytes=1, chunk_elems=4096, depth=1, link="nvlink",
    )  # fmt: skip


class _CapturingStream:
    def is_capturing(self) -> bool:
        return True


def test_every_codec_declares_graph_safe():
    for name in available_compressors():
        assert isinstance(get_compressor(name).graph_safe, bool), name


def test_tah_is_graph_safe():
    assert get_compressor("tah").graph_safe  # its GPU kernels: the payload's memory alone


@pytest.mark.parametrize("codec", list(CODECS))
def test_planner_gives_no_graph_to_a_codec_that_is_not_graph_safe(codec):
    planner = Planner(2, None, None, "nvlink", settings(), False)
    reason = planner._no_graph_reason(_plan(codec))
    if CODECS[codec].graph_safe:
        assert reason == ""
    else:
        assert "'int8' is not graph_safe" in reason


def test_require_graph_safe_names_the_codec():
    require_graph_safe(get_compressor("taco"), "here")  # graph_safe: nothing happens
    with pytest.raises(GraphCaptureError, match="'int8' is not graph_safe.*here"):
        require_graph_safe(_Unsafe(), "here")
    assert issubclass(GraphCaptureError, CocclError)
    assert coccl.compressors.require_graph_safe is require_graph_safe


@pytest.mark.parametrize("codec", list(CODECS))
def test_simulator_under_capture_refuses_a_codec_that_is_not_graph_safe(codec, monkeypatch):
    c = CODECS[codec]
    x = np.random.default_rng(0).standard_normal((2, 1024)).astype(np.float32)
    chunk = 1 << 20 if c.payload_scoped else None  # tah's cut: one payload per shard
    want = virtual_ranks.simulate_allreduce(x, compressor=c, chunk_bytes=chunk)  # it runs
    monkeypatch.setattr(virtual_ranks, "_capturing", lambda like: True)
    if c.graph_safe:
        got = virtual_ranks.simulate_allreduce(x, compressor=c, chunk_bytes=chunk)
        np.testing.assert_array_equal(got, want)
    else:
        with pytest.raises(GraphCaptureError, match="'int8'.*simulate_allreduce"):
            virtual_ranks.simulate_allreduce(x, compressor=c, chunk_bytes=chunk)


def test_runner_under_a_callers_capture_refuses_a_codec_that_is_not_graph_safe():
    runner = Runner.__new__(Runner)  # the checks come before any device work
    with pytest.raises(GraphCaptureError, match="'int8'.*Communicator allreduce"):
        runner._run_in_caller_capture(_plan("unsafe"), None, None, _CapturingStream())


def test_runner_under_a_callers_capture_refuses_the_staged_route():
    plan = dataclasses.replace(_plan("int8"), route="staged", calls=3)
    with pytest.raises(GraphCaptureError, match="over MPI.*backend='nccl'"):
        Runner.__new__(Runner)._run_in_caller_capture(plan, None, None, _CapturingStream())


@pytest.mark.parametrize("level", ["codec", "inter_codec"])
def test_stochastic_codecs_are_not_replayed_from_graphs(level):
    # a graph would repeat one call's random bits at every replay: neither coccl's own
    # graph nor the caller's records a stochastic codec (the caller's refuses at once)
    stochastic = get_compressor({"id": "int", "bits": 4, "rounding": "stochastic"})
    plan = dataclasses.replace(_plan("int8"), calls=3, **{level: stochastic})
    assert plan.stochastic
    planner = Planner(2, None, None, "nvlink", settings(), False)
    assert "stochastic" in planner._no_graph_reason(plan)
    with pytest.raises(GraphCaptureError, match="stochastic codec.*outside the capture"):
        Runner.__new__(Runner)._run_in_caller_capture(plan, None, None, _CapturingStream())


def test_runner_under_a_callers_capture_asks_for_a_first_call():
    with pytest.raises(GraphCaptureError, match="run this call once before capturing"):
        Runner.__new__(Runner)._run_in_caller_capture(_plan("int8"), None, None, _CapturingStream())


def test_rooted_calls_under_a_callers_capture_refuse_the_staged_route(monkeypatch):
    # device data over MPI (no NCCL): broadcast/reduce/gather/scatter refuse before the
    # device context is touched and without breaking the communicator
    from coccl.communicator import exact_calls  # noqa: PLC0415

    monkeypatch.setattr(exact_calls, "caller_stream", lambda obj: _CapturingStream())

    class _Comm(exact_calls.ExactCalls):
        def __init__(self):
            self._runner = dataclasses.make_dataclass("R", ["nccl"])(nccl=None)
            self._settings = dataclasses.make_dataclass("S", ["timeout_s"])(timeout_s=1)

        def _break(self, exc):  # pragma: no cover - must not be reached
            raise AssertionError(f"the communicator broke: {exc}")

    src = dataclasses.make_dataclass("F", ["obj", "device_id"])(obj=None, device_id=0)
    with pytest.raises(GraphCaptureError, match="broadcast.*over MPI"):
        _Comm()._exact_run("broadcast", src, None)


def test_point_to_point_under_a_callers_capture_refuses_the_staged_route(monkeypatch):
    from coccl.communicator import p2p_calls  # noqa: PLC0415

    monkeypatch.setattr(p2p_calls, "caller_stream", lambda obj: _CapturingStream())

    class _Comm(p2p_calls.PointToPointCalls):
        def __init__(self):
            self._runner = None  # touching it would fail: the refusal comes first

    with pytest.raises(GraphCaptureError, match="point-to-point send.*over MPI"):
        _Comm()._staged("send", 1, None, {}, dataclasses.make_dataclass("F", ["obj"])(None))


def test_point_to_point_under_a_callers_capture_refuses_nccl(monkeypatch):
    # a streamed message launches at a later wait and its buffers go back to the pool
    from coccl.communicator import p2p_calls  # noqa: PLC0415

    monkeypatch.setattr(p2p_calls, "caller_stream", lambda obj: _CapturingStream())

    class _Comm(p2p_calls.PointToPointCalls):
        def __init__(self):
            self._runner = None  # touching it would fail: the refusal comes first

    flat = dataclasses.make_dataclass("F", ["obj"])(None)
    with pytest.raises(GraphCaptureError, match="point-to-point recv over NCCL.*outside"):
        _Comm()._streamed("recv", 1, None, {}, flat)


def _torch_cuda():
    torch = pytest.importorskip("torch")
    from gpu import GPU  # noqa: PLC0415

    if not (GPU and torch.cuda.is_available()):
        pytest.skip("needs torch, CuPy and a CUDA GPU")
    return torch


@pytest.mark.gpu
def test_simulator_under_torch_capture_refuses_a_codec_that_is_not_graph_safe():
    torch = _torch_cuda()
    x = torch.randn(2, 1024, device="cuda")
    virtual_ranks.simulate_allreduce(x, compressor=_Unsafe())  # eager: it runs
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(GraphCaptureError, match="'int8'"), torch.cuda.graph(graph):
        virtual_ranks.simulate_allreduce(x, compressor=_Unsafe())


@pytest.mark.gpu
@pytest.mark.parametrize("row", [256, 4096])
def test_tah_roundtrip_captured_by_torch_replays_the_eager_result(row):
    torch = _torch_cuda()
    from coccl.torch.virtual_3d import roundtrip  # noqa: PLC0415

    codec = get_compressor("tah", row=row)
    x = torch.randn(301, row, device="cuda")  # 301 tokens: a partial bitmap byte
    roundtrip(x, codec)  # compiles the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = roundtrip(x, codec)
    for seed in (1, 2):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x) * 10.0 ** torch.randn(x.shape[0], 1, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int32), roundtrip(x, codec).view(torch.int32))
