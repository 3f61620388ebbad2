"""The coccl torch.distributed backend on CUDA tensors, one GPU per rank (coccl's NCCL
transport for its three collectives, torch's NCCL for the forwarded ones).

Runs every case of tests/scripts/torch_backend_cases.py on the GPU (the ``device``
fixture below overrides the CPU one), then what only a GPU has: a producer on a torch
side stream, ``Work.wait()`` ordering another stream, CUDA-graph replays (a call's second
run), and examples/tp_dtensor.py for a few steps. Skipped unless every rank can have a
GPU of its own.
"""

import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import torch.distributed as dist  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "scripts"))
sys.path.insert(0, str(ROOT / "examples"))
import torch_backend_cases as cases  # noqa: E402
import torch_fsdp_cases  # noqa: E402
from torch_p2p_cases import roundtrip  # noqa: E402

import coccl.torch  # noqa: E402

_ndev = torch.cuda.device_count() if torch.cuda.is_available() else 0
# skipped, not left out: a rank whose whole file is skipped would report no tests
pytestmark = [
    pytest.mark.skipif(
        _ndev < MPI.COMM_WORLD.Get_size(),
        reason=f"needs a GPU per rank ({_ndev} for {MPI.COMM_WORLD.Get_size()} ranks)",
    ),
    pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning"),
]
# the example runs deterministic cuBLAS (replicas must stay bitwise equal): its workspace
# setting must be in place before cuBLAS starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# every CPU case, here on CUDA tensors
world = cases.world
for _name in dir(cases):
    if _name.startswith("test_"):
        globals()[_name] = getattr(cases, _name)


@pytest.fixture(scope="session")
def device() -> torch.device:
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    torch.cuda.set_device(local.Get_rank() % _ndev)
    local.Free()
    if not dist.is_initialized():
        coccl.torch.init_process_group(timeout=timedelta(seconds=120))
    return torch.device("cuda", torch.cuda.current_device())


def test_default_group_runs_over_nccl(world):
    assert world.comm.backend == "nccl"


@pytest.mark.parametrize("codec", ["identity", "taco"])
def test_producer_on_a_side_stream(device, codec):
    """A long kernel on a side stream produces the input; the collective issued inside
    ``torch.cuda.stream(s)`` must wait for it, and its result is ordered on ``s``. Three
    rounds: the second and later replay the call's CUDA graph."""
    g = cases.lossy_group(codec, "two_shot")
    count = 1 << 18
    parts = cases.everyone(cases.seed_of("stream", codec), count, torch.float32, device)
    ref = cases.exact_sum(parts)
    side = torch.cuda.Stream()
    results = []
    for _ in range(3):
        x = torch.zeros(count, device=device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s: the input is written long after
            x.copy_(parts[dist.get_rank()])
            dist.all_reduce(x, group=g)
        side.synchronize()
        results.append(x.cpu())
    for got in results:
        cases.check_result(got, ref, codec, "allreduce", "two_shot", torch.float32, count)
    assert all(torch.equal(r, results[0]) for r in results)  # replays compute the same
    assert cases.same_on_every_rank(results[0])


def test_work_wait_orders_the_current_stream(device):
    """async_op on a side stream; ``wait()`` on the default stream makes it wait."""
    g = cases.lossy_group("taco", "two_shot")
    count = 1 << 18
    parts = cases.everyone(cases.seed_of("wait"), count, torch.float32, device)
    side = torch.cuda.Stream()
    x = torch.zeros(count, device=device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        x.copy_(parts[dist.get_rank()])
        work = dist.all_reduce(x, group=g, async_op=True)
    x.record_stream(side)
    work.wait()  # the default stream now waits for the collective on ``side``
    y = x * 1.0  # runs on the default stream
    cases.check_result(
        y, cases.exact_sum(parts), "taco", "allreduce", "two_shot", torch.float32, count
    )
    (out,) = work.get_future().wait()
    assert out is x


def test_example_runs_on_gpus(device, tmp_path):
    """examples/tp_dtensor.py in this process: plain NCCL, coccl identity and taco."""
    import tp_dtensor  # noqa: PLC0415

    out = tmp_path / "result.json"
    args = ["--device", "cuda", "--tiny", "--steps", "4", "--warmup", "1"]
    code = tp_dtensor.main([*args, "--min-compress-bytes", "0", "--out", str(out)])
    assert code == 0  # replicated parameters bitwise identical on every rank
    if dist.get_rank() == 0:
        import json  # noqa: PLC0415

        runs = {r["spec"]: r for r in json.loads(out.read_text())["runs"]}
        plain, identity = runs["plain"]["losses"], runs["identity"]["losses"]
        assert identity == pytest.approx(plain, rel=1e-4)
        if dist.get_world_size() > 1:
            assert runs["taco"]["calls"]["allreduce:compressed"] > 0


def test_all_to_all_single_compressed_on_cuda(device):
    """all_to_all_single of CUDA tensors on a group whose ``compress`` names alltoall:
    every block (uneven rows, an empty one beyond one rank) arrives as the codec's
    roundtrip computed by the host kernels, bitwise."""
    codec = {"id": "int", "bits": 4, "group_size": 32, "hadamard": 32}
    opts = coccl.torch.CocclOptions(compressor=codec, compress=("alltoall",), min_compress_bytes=0)
    g = dist.new_group(backend="coccl", pg_options=opts)
    n, me = dist.get_world_size(), dist.get_rank()

    def block(src: int, dst: int) -> torch.Tensor:
        rows = (3 + 2 * src + dst) % 4
        gen = torch.Generator().manual_seed(100 * src + dst)
        return torch.randn(rows, 64, generator=gen)

    x = torch.cat([block(me, d) for d in range(n)]).to(device)
    send = [block(me, d).shape[0] for d in range(n)]
    recv = [block(s, me).shape[0] for s in range(n)]
    out = torch.full((sum(recv), 64), float("nan"), device=device)
    dist.all_to_all_single(out, x, recv, send, group=g)
    parts = [block(s, me) for s in range(n)]
    expected = torch.cat([roundtrip(codec, p.reshape(-1)).reshape(p.shape) for p in parts])
    assert torch.equal(out.cpu(), expected)
    assert coccl.torch.stats(g)["alltoall:compressed"] == 1


def test_fsdp_comms_on_cuda(device):
    """coccl.torch.fsdp's comm objects on CUDA tensors, called as FSDP2 calls them (FSDP2
    itself makes no collective on a one-rank mesh): a 4-bit delta gather whose replica, on
    the device, follows slowly changing shards far closer than one quantization of them,
    and an 8-bit feedback reduce whose residual stays on the device."""
    g = dist.group.WORLD
    n, me = dist.get_world_size(), dist.get_rank()
    gather, reduce = coccl.torch.fsdp_comms(
        coccl.torch.Traffic(torch_fsdp_cases.INT4, "auto", 0, "delta"),
        coccl.torch.Traffic(torch_fsdp_cases.INT8, "two_shot", 0, "feedback"),
    )
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(n, 4096, generator=gen)
    for step in range(4):
        shards = (base + 1e-3 * step * torch.randn(n, 4096, generator=gen)).to(device)
        out = gather.allocate((n * 4096,), dtype=torch.float32, device=device)
        work = gather(out, shards[me].clone(), g, async_op=True)
        work.wait()
        err = (out.view(n, -1) - shards).abs().max().item()
    assert gather.calls == {"compressed": 4, "exact": 0} and gather.replica.device == device
    one_quantization = (shards.abs().amax() / 7).item()  # int4's step at the largest group
    assert 0 < err < one_quantization / 20
    grads = torch.randn(n * 4096, generator=gen).to(device)
    shard = torch.empty(4096, device=device)
    reduce(shard, grads, g, dist.ReduceOp.SUM)
    assert reduce.calls["compressed"] == 1 and reduce.feedback.bound
