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
