"""The simulated AllReduce and virtual TP layers against real GPU ranks (1-4 ranks):
over NCCL when every rank has a GPU of its own, and over MPI with ranks sharing a GPU.
Skipped without CuPy, torch and a CUDA GPU.

Every rank runs the real collective on its torch CUDA tensor and the simulation of all
ranks' tensors on its own GPU; both must agree bitwise (and with the simulation on the
CPU). The layer checks run a column- then row-parallel MLP and a tiny GPT in bfloat16
autocast on real and virtual ranks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import coccl

from conftest import case_seed, rank_data

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU for torch", allow_module_level=True)

from coccl.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    VirtualTPGroup,
)
from coccl.virtual_ranks import simulate_allreduce  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
NDEV = torch.cuda.device_count()
SIZE = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
DEVICE = torch.device("cuda", RANK % NDEV)
BACKENDS = [
    "mpi",
    pytest.param("nccl", marks=pytest.mark.skipif(NDEV < SIZE, reason="GPU per rank")),
]


@pytest.fixture(scope="module", params=BACKENDS)
def gcomm(request):
    torch.cuda.set_device(DEVICE)
    with coccl.init(MPI.COMM_WORLD, backend=request.param) as c:
        yield c


def to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).to(DEVICE).view(torch.bfloat16)
    return torch.from_numpy(a).to(DEVICE)


def bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().view(np.uint8)


@pytest.mark.parametrize("chunk_bytes", [None, 4096], ids=str)
@pytest.mark.parametrize("count", [1, 5, 4099, 128 * 4 * 64, 1 << 18])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", ["identity", "int8", "taco", {"id": "taco", "ash": False}])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_simulation_equals_real_gpu_allreduce(gcomm, algorithm, codec, dtype, count, chunk_bytes):
    seed = case_seed("gpu-virtual", algorithm, str(codec), np.dtype(dtype).name, count)
    parts = [rank_data(seed, j, count, dtype) for j in range(SIZE)]
    real = gcomm.allreduce(
        to_torch(parts[RANK]), algorithm=algorithm, compressor=codec, chunk_bytes=chunk_bytes
    )
    sim = simulate_allreduce(
        torch.stack([to_torch(p) for p in parts]), algorithm=algorithm, compressor=codec
    )
    host = simulate_allreduce(parts, algorithm=algorithm, compressor=codec)
    assert sim.device == DEVICE
    np.testing.assert_array_equal(bits(sim), bits(real))
    np.testing.assert_array_equal(bits(sim), host.view(np.uint8))


def mlp(seed: int = 0) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    g = torch.Generator().manual_seed(seed)
    fc1, fc2 = torch.nn.Linear(64, 256 * 3), torch.nn.Linear(256 * 3, 96)  # 768 splits 1-4
    with torch.no_grad():
        for p in (*fc1.parameters(), *fc2.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return fc1.to(DEVICE), fc2.to(DEVICE)


@pytest.mark.parametrize("compressor", ["identity", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_virtual_mlp_equals_real_in_bf16_autocast(gcomm, algorithm, compressor):
    """The same per-rank matmul calls (cuBLAS, same shapes) and the same AllReduces:
    the output, the input gradient and this rank's weight gradients agree bitwise."""
    fc1, fc2 = mlp()
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(8, 32, 64, generator=g).to(DEVICE)
    dy = torch.randn(8, 32, 96, generator=g).to(DEVICE)

    def run(group):
        col = ColumnParallelLinear.from_linear(fc1, group)
        row = RowParallelLinear.from_linear(fc2, group)
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = row(torch.nn.functional.gelu(col(x)))
        y.backward(dy)
        return y.detach(), x.grad, col, row

    y, dx, col, row = run(TPGroup(gcomm, algorithm, compressor))
    vy, vdx, vcol, vrow = run(VirtualTPGroup(SIZE, algorithm, compressor))
    assert torch.equal(y, vy) and torch.equal(dx, vdx)
    assert torch.equal(col.weight.grad, vcol.rank_weights[RANK].grad)
    assert torch.equal(row.weight.grad, vrow.rank_weights[RANK].grad)


def test_virtual_gpt_steps_close_to_real(gcomm):
    """A tiny GPT (examples/tp_gpt.py), three AdamW steps in bfloat16 autocast on real and
    on virtual ranks. The linears and AllReduces are the same calls; attention runs over
    one rank's heads on a real rank and over all heads at once on virtual ranks, which a
    GPU kernel may tile differently, so the losses must agree closely (and are reported
    when they agree bitwise)."""
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(__file__).resolve().parents[2] / "examples" / "tp_gpt.py"
    spec = importlib.util.spec_from_file_location("tp_gpt", path)
    tp_gpt = importlib.util.module_from_spec(spec)
    sys.modules["tp_gpt"] = tp_gpt
    spec.loader.exec_module(tp_gpt)
    cfg = tp_gpt.GPTConfig(layers=2, d_model=96, heads=12, seq=32)
    data = np.random.default_rng(0).integers(0, 256, size=20000).astype(np.uint8)

    def train(group) -> list[float]:
        torch.manual_seed(3)
        model = tp_gpt.parallelize(tp_gpt.GPT(cfg), group).to(DEVICE)
        opt = tp_gpt.make_optimizer(model, 1e-3)
        batches = tp_gpt.train_batches(data, 8, cfg.seq, 5, DEVICE)
        losses = []
        for _ in range(3):
            x, y = next(batches)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    real = train(TPGroup(gcomm, "two_shot", "taco"))
    virtual = train(VirtualTPGroup(SIZE, "two_shot", "taco"))
    print(f"real {real} virtual {virtual} bitwise {real == virtual}")
    np.testing.assert_allclose(virtual, real, rtol=1e-3)
