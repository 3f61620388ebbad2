"""Megatron-style TP layers on coccl (run on 1-4 ranks): a column-parallel then
row-parallel MLP computes what the same unsharded MLP computes in one process, forward
and backward, to float rounding with identity and within the codec's error otherwise;
replicated results are bitwise identical on every rank."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import coccl  # noqa: E402
from coccl.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    VirtualTPGroup,
    copy_to_tp_region,
    is_tp_sharded,
    reduce_from_tp_region,
)

from conftest import all_equal_across_ranks  # noqa: E402

D_IN, HIDDEN, D_OUT = 16, 48, 24  # HIDDEN divides by 1, 2, 3 and 4 ranks
SHAPE = (4, 6)  # batch, sequence
ALGORITHMS = ["ring", "two_shot"]
LOSSY = [c for c in ("taco", "int8") if c in coccl.available_compressors()]


def full_mlp(seed: int = 0) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The unsharded MLP, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    fc1, fc2 = torch.nn.Linear(D_IN, HIDDEN), torch.nn.Linear(HIDDEN, D_OUT)
    with torch.no_grad():
        for p in (*fc1.parameters(), *fc2.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return fc1, fc2


def inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """An input and an upstream gradient, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*SHAPE, D_IN, generator=g), torch.randn(*SHAPE, D_OUT, generator=g)


def run(fc1: torch.nn.Module, fc2: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """Forward and backward of fc2(gelu(fc1(x))); returns (y, dx)."""
    x = x.clone().requires_grad_(True)
    y = fc2(torch.nn.functional.gelu(fc1(x)))
    y.backward(dy)
    return y.detach(), x.grad


def my_rows(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t.chunk(size, dim=0)[rank]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def shard(fc1, fc2, comm, algorithm, compressor):
    group = TPGroup(comm, algorithm, compressor)
    return ColumnParallelLinear.from_linear(fc1, group), RowParallelLinear.from_linear(fc2, group)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_mlp_matches_unsharded_identity(comm, algorithm):
    fc1, fc2 = full_mlp()
    col, row = shard(fc1, fc2, comm, algorithm, "identity")
    x, dy = inputs()
    y_ref, dx_ref = run(fc1, fc2, x, dy)
    y, dx = run(col, row, x, dy)
    r, n = comm.rank, comm.size
    close = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(y, y_ref, **close)
    torch.testing.assert_close(dx, dx_ref, **close)
    torch.testing.assert_close(col.weight.grad, my_rows(fc1.weight.grad, r, n), **close)
    torch.testing.assert_close(col.bias.grad, my_rows(fc1.bias.grad, r, n), **close)
    torch.testing.assert_close(row.weight.grad, my_rows(fc2.weight.grad.t(), r, n).t(), **close)
    torch.testing.assert_close(row.bias.grad, fc2.bias.grad, **close)
    # replicated values agree bitwise on every rank
    for t in (y, dx, row.bias.grad):
        assert all_equal_across_ranks(t.numpy())


@pytest.mark.skipif(not LOSSY, reason="no lossy codec registered yet")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("compressor", LOSSY)
def test_mlp_close_with_lossy_codec(comm, compressor, algorithm):
    fc1, fc2 = full_mlp()
    col, row = shard(fc1, fc2, comm, algorithm, compressor)
    x, dy = inputs()
    y_ref, dx_ref = run(fc1, fc2, x, dy)
    y, dx = run(col, row, x, dy)
    # FP8 E4M3 and INT8 keep a few percent of relative error per quantization; a ring
    # quantizes once per rank. One rank communicates nothing: exact.
    bound = 0.0 if comm.size == 1 else 0.03 * comm.size
    assert rel_err(y, y_ref) <= bound + 1e-6
    assert rel_err(dx, dx_ref) <= bound + 1e-6
    r, n = comm.rank, comm.size
    assert rel_err(col.weight.grad, my_rows(fc1.weight.grad, r, n)) <= bound + 1e-6
    for t in (y, dx, row.bias.grad):
        assert all_equal_across_ranks(t.numpy())


def test_fused_qkv_blocks(comm):
    """blocks=3 gives each rank its slice of q, of k and of v."""
    full = torch.nn.Linear(D_IN, 3 * HIDDEN)
    col = ColumnParallelLinear.from_linear(full, TPGroup(comm), blocks=3)
    x, _ = inputs()
    with torch.no_grad():
        q, k, v = full(x).chunk(3, dim=-1)
        mine = torch.cat([my_rows(z.movedim(-1, 0), comm.rank, comm.size) for z in (q, k, v)])
        torch.testing.assert_close(col(x), mine.movedim(0, -1))


def test_adam_on_shards_is_the_sliced_unsharded_adam(comm):
    """AdamW is elementwise: three steps on shards equal the slices of three unsharded
    steps (TP needs no optimizer communication)."""
    fc1, fc2 = full_mlp()
    col, row = shard(fc1, fc2, comm, "two_shot", "identity")
    x, dy = inputs()
    ref_opt = torch.optim.AdamW([*fc1.parameters(), *fc2.parameters()], lr=1e-2)
    tp_opt = torch.optim.AdamW([*col.parameters(), *row.parameters()], lr=1e-2)
    for _ in range(3):
        for model, opt in (((fc1, fc2), ref_opt), ((col, row), tp_opt)):
            opt.zero_grad()
            run(*model, x, dy)
            opt.step()
    r, n = comm.rank, comm.size
    close = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(col.weight.detach(), my_rows(fc1.weight.detach(), r, n), **close)
    torch.testing.assert_close(row.bias.detach(), fc2.bias.detach(), **close)
    assert all_equal_across_ranks(row.bias.detach().numpy())


def test_f_and_g_are_conjugate(comm):
    """f: identity forward, AllReduce backward; g: AllReduce forward, identity backward."""
    group = TPGroup(comm, "ring", "identity")
    g = torch.Generator().manual_seed(comm.rank + 10)
    a = torch.randn(5, 7, generator=g, requires_grad=True)
    f_out = copy_to_tp_region(a, group)
    assert torch.equal(f_out, a)
    f_out.backward(torch.ones_like(a))
    torch.testing.assert_close(a.grad, torch.full_like(a, float(comm.size)))

    b = a.detach().clone().requires_grad_(True)
    g_out = reduce_from_tp_region(b, group)
    total = comm.allreduce(b.detach(), algorithm="native")
    torch.testing.assert_close(g_out, total)
    g_out.backward(torch.full_like(b, 2.0))
    assert torch.equal(b.grad, torch.full_like(b, 2.0))


def test_sharded_parameters_are_marked(comm):
    fc1, fc2 = full_mlp()
    col, row = shard(fc1, fc2, comm, "ring", "identity")
    assert is_tp_sharded(col.weight) and is_tp_sharded(col.bias)
    assert is_tp_sharded(row.weight) and not is_tp_sharded(row.bias)
    assert col.weight.shape == (HIDDEN // comm.size, D_IN)
    assert row.weight.shape == (D_OUT, HIDDEN // comm.size)
    # a fresh layer (own init) is marked too
    fresh = ColumnParallelLinear(D_IN, HIDDEN, comm, compressor="identity")
    assert is_tp_sharded(fresh.weight)
    assert np.isfinite(fresh.weight.detach().numpy()).all()


def test_indivisible_features_refused(comm):
    if comm.size == 1:
        pytest.skip("everything divides by one rank")
    with pytest.raises(ValueError, match="divisible"):
        ColumnParallelLinear(D_IN, comm.size * 5 + 1, comm)
    with pytest.raises(ValueError, match="divisible"):
        RowParallelLinear(comm.size * 5 + 1, D_OUT, comm)


def test_bad_codec_refused_at_construction(comm):
    with pytest.raises(ValueError, match="unknown compressor"):
        TPGroup(comm, "ring", "no-such-codec")
    with pytest.raises(ValueError, match="unknown algorithm"):
        TPGroup(comm, "no-such-schedule", "identity")
    if LOSSY:
        with pytest.raises(ValueError, match="native"):
            TPGroup(comm, "native", LOSSY[0])


# ------------------------------------------------------------------- virtual ranks
def load_tp_gpt():
    """examples/tp_gpt.py as a module (its GPT and parallelize)."""
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(__file__).resolve().parents[2] / "examples" / "tp_gpt.py"
    spec = importlib.util.spec_from_file_location("tp_gpt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tp_gpt"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("compressor", ["identity", *LOSSY])
def test_virtual_mlp_equals_real_bitwise(comm, compressor, algorithm):
    """Every rank's real layers against the virtual layers of all ranks in one process:
    the same partial products (the same calls, shapes and inputs), the same AllReduce."""
    fc1, fc2 = full_mlp()
    col, row = shard(fc1, fc2, comm, algorithm, compressor)
    virtual = VirtualTPGroup(comm.size, algorithm, compressor)
    vcol = ColumnParallelLinear.from_linear(fc1, virtual)
    vrow = RowParallelLinear.from_linear(fc2, virtual)
    x, dy = inputs()
    y, dx = run(col, row, x, dy)
    vy, vdx = run(vcol, vrow, x, dy)
    r = comm.rank
    assert torch.equal(y, vy) and torch.equal(dx, vdx)
    assert torch.equal(col.weight.grad, vcol.rank_weights[r].grad)
    assert torch.equal(col.bias.grad, vcol.rank_biases[r].grad)
    assert torch.equal(row.weight.grad, vrow.rank_weights[r].grad)
    assert torch.equal(row.bias.grad, vrow.bias.grad)


@pytest.mark.parametrize(
    ("algorithm", "compressor"), [("two_shot", "identity"), ("ring", "taco"), ("two_shot", "taco")]
)
def test_virtual_gpt_training_equals_real(comm, algorithm, compressor):
    """Three AdamW steps of a tiny GPT (examples/tp_gpt.py) on real ranks and on virtual
    ranks: losses, every rank's shards and the replicated parameters agree bitwise (on
    CPU; the attention of all heads at once gives each head the same bits as the
    attention of one rank's heads)."""
    tp_gpt = load_tp_gpt()
    cfg = tp_gpt.GPTConfig(layers=2, d_model=48, heads=12, seq=16)  # 12 heads: 1-4 ranks
    data = np.random.default_rng(0).integers(0, 256, size=4000).astype(np.uint8)

    def train(group) -> tuple[list[float], torch.nn.Module]:
        torch.manual_seed(3)
        model = tp_gpt.parallelize(tp_gpt.GPT(cfg), group)
        opt = tp_gpt.make_optimizer(model, 1e-2)
        batches = tp_gpt.train_batches(data, 4, cfg.seq, 5, torch.device("cpu"))
        losses = []
        for _ in range(3):
            x, y = next(batches)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    real_losses, real = train(TPGroup(comm, algorithm, compressor))
    virtual_losses, virtual = train(VirtualTPGroup(comm.size, algorithm, compressor))
    assert real_losses == virtual_losses
    virtual_modules = dict(virtual.named_modules())
    for name, module in real.named_modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            # this rank's shard is the virtual layer's shard of this rank
            mine = module.shards()[0]
            theirs = virtual_modules[name].shards()[comm.rank]
            for p, q in zip(mine, theirs, strict=True):
                assert (p is None) == (q is None), name
                assert p is None or torch.equal(p.detach(), q.detach()), name
    virtual_params = dict(virtual.named_parameters())
    for name, p in real.named_parameters():
        if not is_tp_sharded(p):
            assert torch.equal(p.detach(), virtual_params[name].detach()), name
