"""coccl calls inside a CUDA graph the caller captures (CuPy stream capture,
``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``), on one GPU.

A call made while the caller's stream captures is recorded into the caller's graph
(``coccl.communicator.runner``, ``coccl.engine.graphs.CallerCapture``): each replay must
give what the same call gives eagerly on the replay's data, bitwise. Where a recording
cannot replay correctly (device data over MPI, a plan's first call) the call raises
``GraphCaptureError`` before it enqueues anything. One rank: one-rank NCCL runs the
schedules' codec kernels and stream forks; what NCCL operations between GPUs do under
capture needs a GPU per rank (not tested here). Skipped without a GPU.
"""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

from coccl.engine.watchdog import POLL_S

from gpu import GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")]
COLLECTIVES = ["allreduce", "reduce_scatter", "allgather"]


def _capture(fn, mode: str):
    """Run ``fn`` once under a CuPy stream capture in ``mode``; the graph."""
    import cupy as cp

    modes = {
        "relaxed": cp.cuda.runtime.streamCaptureModeRelaxed,
        "global": cp.cuda.runtime.streamCaptureModeGlobal,
    }
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture(modes[mode])
        try:
            fn()
        except BaseException:
            try:  # end the capture; a failed call may have invalidated it
                stream.end_capture()
            except cp.cuda.runtime.CUDARuntimeError:
                pass
            raise
        graph = stream.end_capture()
    return graph, stream


@pytest.mark.parametrize("count", [1, 1000, 1 << 20])
@pytest.mark.parametrize("codec", ["identity", "taco", "int8"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "native"])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_cupy_capture_replays_the_eager_call(ncomm, collective, algorithm, codec, count):
    import cupy as cp

    if algorithm == "native" and codec != "identity":
        pytest.skip("native takes identity only")
    kwargs = {"algorithm": algorithm, "compressor": codec, "chunk_bytes": 1 << 18}
    call = getattr(ncomm, collective)
    x = cp.asarray(np.random.default_rng(count).standard_normal(count).astype(np.float32))
    out = call(x, **kwargs)  # the plan's first call: eager
    call(x, out=out, **kwargs)  # its second: coccl's own graph, where the plan has one
    graph, stream = _capture(lambda: call(x, out=out, **kwargs), "relaxed")
    cp.cuda.Device().synchronize()  # the eager calls ran on the null stream
    for seed in (1, 2, 3):
        # ``stream`` is non-blocking: what the replay reads is written on it
        with stream:
            x[...] = cp.asarray(np.random.default_rng(seed).standard_normal(count), cp.float32)
        graph.launch(stream)
        stream.synchronize()
        want = call(x.copy(), **kwargs)
        cp.testing.assert_array_equal(out.view(cp.int32), want.view(cp.int32))


def test_cupy_global_capture_replays_or_says_relaxed(ncomm):
    """Global mode forbids allocations while capturing: the recording either needs none
    (the memory pool had room) and replays correctly, or it raises GraphCaptureError
    naming the relaxed mode."""
    import cupy as cp

    from coccl.errors import GraphCaptureError

    x = cp.arange(1 << 16, dtype=cp.float32)
    out = ncomm.allreduce(x, compressor="taco", algorithm="two_shot")
    try:
        graph, stream = _capture(
            lambda: ncomm.allreduce(x, out=out, compressor="taco", algorithm="two_shot"),
            "global",
        )
    except GraphCaptureError as exc:
        assert "relaxed" in str(exc)
        return
    cp.cuda.Device().synchronize()  # the eager call ran on the null stream
    with stream:  # ``stream`` is non-blocking: what the replay reads is written on it
        x *= 3
    graph.launch(stream)
    stream.synchronize()
    want = ncomm.allreduce(x.copy(), compressor="taco", algorithm="two_shot")
    cp.testing.assert_array_equal(out.view(cp.int32), want.view(cp.int32))


def test_capture_refuses_device_data_over_mpi(mcomm):
    import cupy as cp

    from coccl.errors import GraphCaptureError

    x = cp.ones(4096, dtype=cp.float32)
    mcomm.allreduce(x, compressor="taco")
    with pytest.raises(GraphCaptureError, match="over MPI"):
        _capture(lambda: mcomm.allreduce(x, compressor="taco"), "relaxed")


def test_capture_refuses_a_plans_first_call(ncomm):
    import cupy as cp

    from coccl.errors import GraphCaptureError

    x = cp.ones(12345, dtype=cp.float32)  # a count no other test uses: a new plan
    with pytest.raises(GraphCaptureError, match="run this call once"):
        _capture(lambda: ncomm.allreduce(x, compressor="int8"), "relaxed")


def test_the_watchdog_leaves_a_global_capture_of_another_thread_alone(ncomm):
    # the watchdog thread queries the events of earlier calls while the caller captures
    # in global mode, which forbids such queries from other threads in their default mode
    import cupy as cp

    x = cp.ones(1 << 16, dtype=cp.float32)
    y = cp.zeros(1 << 16, dtype=cp.float32)
    for _ in range(3):
        ncomm.allreduce(x, compressor="taco")  # tracked by the watchdog
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture(cp.cuda.runtime.streamCaptureModeGlobal)
            y += 1
            time.sleep(3 * POLL_S)  # the watchdog polls meanwhile
            y *= 2
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    assert float(y[0]) == 14.0  # ((0 + 1) * 2 + 1) * 2 ... three replays
    time.sleep(3 * POLL_S)  # a watchdog that fired has marked the communicator by now
    ncomm.allreduce(x, compressor="taco")  # not aborted: it runs
    cp.cuda.Device().synchronize()


# ------------------------------------------------------------------------ torch
@pytest.fixture(scope="module")
def tp_group():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    import coccl.torch
    from coccl.torch import CocclOptions

    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    if not dist.is_initialized():
        coccl.torch.init_process_group(timeout=timedelta(seconds=60))
    opts = CocclOptions(
        compressor="taco",
        algorithm="two_shot",
        min_compress_bytes=0,
        compress=("allreduce", "reduce_scatter", "allgather"),
    )
    return dist.new_group(backend="coccl", pg_options=opts)


@pytest.fixture(scope="module")
def exact_group(tp_group):
    import torch.distributed as dist

    from coccl.torch import CocclOptions

    opts = CocclOptions(compressor="identity", algorithm="ring", min_compress_bytes=0)
    return dist.new_group(backend="coccl", pg_options=opts)


def _tp_step(group, w1, w2):
    """A Megatron-style MLP step of one TP rank: column-parallel, row-parallel, AllReduce."""
    import torch
    import torch.distributed as dist

    def step(x):
        h = torch.relu(x @ w1)
        y = h @ w2
        dist.all_reduce(y, group=group)
        return y * 0.5

    return step


def _weights(torch):
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = torch.randn(256, 1024, device="cuda", generator=g) / 16
    w2 = torch.randn(1024, 256, device="cuda", generator=g) / 32
    return w1, w2


@pytest.mark.parametrize("mode", ["relaxed", "global"])
def test_torch_cuda_graph_of_a_tp_step_replays_eagerly_equal(tp_group, mode):
    import torch

    from coccl.errors import GraphCaptureError

    step = _tp_step(tp_group, *_weights(torch))
    static_x = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # torch.cuda.graph's warm-up
        for _ in range(3):
            step(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            static_y = step(static_x)
    except GraphCaptureError as exc:
        assert mode == "global" and "relaxed" in str(exc), exc
        return
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        want = step(static_x.clone())
        assert torch.equal(static_y.view(torch.int32), want.view(torch.int32))


def test_a_recorded_call_keeps_no_reference_to_the_callers_tensors(tp_group):
    """Once a recording ends, no coccl object holds a tensor the recorded call was given
    (garbage collector off): a buffer held then by a reference cycle (a schedule's rounds
    and their payloads) stayed allocated in the pool snapshot torch's cudagraph trees take
    when a recording ends."""
    import gc

    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import StorageWeakRef

    x = torch.randn(64, 256, device="cuda")
    for _ in range(3):  # the plan's first call, its own graph's capture, a replay
        dist.all_reduce(x, group=tp_group)
    graph = torch.cuda.CUDAGraph()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph):
            y = x * 1  # a tensor of the graph's pool, as a compiled step's intermediates
            dist.all_reduce(y, group=tp_group)
            held = StorageWeakRef(y.untyped_storage())
            del y
        assert held.expired()
    finally:
        if enabled:
            gc.enable()


@pytest.fixture(scope="module")
def compiled_steps(tp_group, exact_group):
    """Per codec: a TP step compiled with CUDA graphs (reduce-overhead), the same step
    compiled without them (the same inductor kernels, the coccl call run eagerly: the
    bitwise reference) and the eager step, static shapes (a new batch size compiles a
    graph of its own). Built once for the module: every compiled variant of the one code
    object counts against dynamo's recompile limit (six here)."""
    import torch

    out = {}
    for codec, group in (("identity", exact_group), ("taco", tp_group)):
        step = _tp_step(group, *_weights(torch))
        graphed = torch.compile(step, mode="reduce-overhead", dynamic=False)
        out[codec] = (graphed, torch.compile(step, dynamic=False), step)
    return out


def test_torch_compile_reduce_overhead_of_tp_steps(compiled_steps):
    """Compiled TP steps (reduce-overhead) of an exact group and of a taco group, each
    called on new inputs (warm-up, recording, replays): every call gives bitwise what the
    same step compiled without CUDA graphs gives (a stale replay or a skipped collective
    would not) and is close to the eager step. The steps run one after the other, then the
    exact one at a new batch size, so that cudagraph trees restore the previous function's
    pool snapshot at each new warm-up and recording: where a buffer coccl still held as
    a recording ended showed ("tensor(s) in the cudagraph pool not tracked as outputs")."""
    import torch

    calls = [("identity", 64, seed) for seed in range(4)]
    calls += [("taco", 64, seed) for seed in range(4)]
    calls += [("identity", 32, seed) for seed in range(3)]
    calls += [("taco", 64, 9), ("identity", 64, 9)]
    for codec, batch, seed in calls:
        graphed, plain, eager = compiled_steps[codec]
        torch.manual_seed(seed)
        x = torch.randn(batch, 256, device="cuda")
        got = graphed(x).clone()
        want = plain(x.clone())
        torch.cuda.synchronize()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (codec, batch, seed)
        tol = 1e-4 if codec == "identity" else 0.1  # eager's matmuls may round otherwise
        torch.testing.assert_close(got, eager(x.clone()), rtol=tol, atol=tol)
