"""coccl.tensor_parallel on a VirtualTPGroup: every rank of a TP group in one process.

tests/mpi/test_tensor_parallel.py compares virtual layers with real ranks bitwise; here,
in one process: the layout helpers, the layers against the unsharded layers and against
the simulated AllReduce of their own partial products, and the group's checks.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from coccl.algorithms.schedule_args import shard_stride  # noqa: E402
from coccl.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    VirtualTPGroup,
    is_tp_sharded,
    merge_virtual_ranks,
    split_virtual_ranks,
)
from coccl.virtual_ranks import simulate_allreduce  # noqa: E402

D_IN, HIDDEN, D_OUT = 16, 48, 24
F = torch.nn.functional


def full_mlp(seed: int = 0) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    g = torch.Generator().manual_seed(seed)
    fc1, fc2 = torch.nn.Linear(D_IN, HIDDEN), torch.nn.Linear(HIDDEN, D_OUT)
    with torch.no_grad():
        for p in (*fc1.parameters(), *fc2.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return fc1, fc2


def inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, D_IN, generator=g), torch.randn(4, 6, D_OUT, generator=g)


def run(fc1, fc2, x, dy):
    x = x.clone().requires_grad_(True)
    y = fc2(F.gelu(fc1(x)))
    y.backward(dy)
    return y.detach(), x.grad


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("size", [1, 2, 4])
def test_merge_gives_the_unsharded_layout_and_split_inverts_it(size, blocks):
    full = torch.nn.Linear(D_IN, blocks * HIDDEN)
    group = VirtualTPGroup(size)
    col = ColumnParallelLinear.from_linear(full, group, blocks=blocks)
    x, _ = inputs()
    with torch.no_grad():
        torch.testing.assert_close(col(x), full(x), rtol=0, atol=1e-6)
        y = full(x)
        parts = split_virtual_ranks(y, size, blocks)
        assert all(p.is_contiguous() and p.shape[-1] == y.shape[-1] // size for p in parts)
        assert torch.equal(merge_virtual_ranks(parts, blocks), y)


@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_identity_matches_unsharded(size, algorithm):
    fc1, fc2 = full_mlp()
    group = VirtualTPGroup(size, algorithm, "identity")
    col = ColumnParallelLinear.from_linear(fc1, group)
    row = RowParallelLinear.from_linear(fc2, group)
    x, dy = inputs()
    y_ref, dx_ref = run(fc1, fc2, x, dy)
    y, dx = run(col, row, x, dy)
    close = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(y, y_ref, **close)
    torch.testing.assert_close(dx, dx_ref, **close)
    for r in range(size):
        torch.testing.assert_close(col.rank_weights[r].grad, fc1.weight.grad.chunk(size)[r])
        torch.testing.assert_close(
            row.rank_weights[r].grad, fc2.weight.grad.chunk(size, dim=1)[r], **close
        )
    torch.testing.assert_close(row.bias.grad, fc2.bias.grad, **close)


@pytest.mark.parametrize(
    "compressor",
    ["taco", "int8", "mx", {"id": "mx", "block": 16, "scale": "e4m3"}, "taco_fp"],
    ids=str,
)
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_layers_are_their_partials_through_the_simulated_allreduce(algorithm, compressor):
    """Forward: a row layer's output is simulate_allreduce of the ranks' partial
    products, plus the bias. Backward: a column layer's input gradient is
    simulate_allreduce of the ranks' partial input gradients."""
    size = 4
    fc1, fc2 = full_mlp()
    group = VirtualTPGroup(size, algorithm, compressor)
    col = ColumnParallelLinear.from_linear(fc1, group)
    row = RowParallelLinear.from_linear(fc2, group)
    x, dy = inputs()
    h = torch.randn(*x.shape[:-1], HIDDEN)

    def simulate(stacked: torch.Tensor) -> torch.Tensor:
        # the group's default for a payload-scoped codec (NVFP4): one chunk per shard
        codec = group.compressor
        per = shard_stride(stacked[0].numel(), size, codec.alignment)
        chunk = per * stacked.element_size() if codec.payload_scoped else None
        return simulate_allreduce(
            stacked, algorithm=algorithm, compressor=compressor, chunk_bytes=chunk
        )

    with torch.no_grad():
        partials = [
            F.linear(h_r.contiguous(), w)
            for h_r, (w, _) in zip(h.chunk(size, -1), row.shards(), strict=True)
        ]
        want = simulate(torch.stack(partials))
        assert torch.equal(row(h), want + row.bias)

    x = x.clone().requires_grad_(True)
    g = torch.randn(*x.shape[:-1], HIDDEN)
    col(x).backward(g)
    with torch.no_grad():
        partials = [
            g_r.contiguous() @ w
            for g_r, (w, _) in zip(g.chunk(size, -1), col.shards(), strict=True)
        ]
        want = simulate(torch.stack(partials))
    assert torch.equal(x.grad, want)


@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_payload_scoped_default_is_one_chunk_per_shard(algorithm):
    """NVFP4 (one float32 scale per payload): the group's default chunk is a whole
    shard, and a given chunk_bytes is passed on as it is."""
    nvfp4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}
    stacked = torch.randn(4, 3, 1000)
    stacked[0, 0, :50] *= 1e3  # one large block: the scale of its payload alone
    group = VirtualTPGroup(4, algorithm, nvfp4)
    shard = 752 * 4  # ceil(3000 / 4) rounded up to the block of 16, float32 bytes
    want = simulate_allreduce(stacked, algorithm=algorithm, compressor=nvfp4, chunk_bytes=shard)
    assert torch.equal(group.allreduce(list(stacked)), want)
    small = VirtualTPGroup(4, algorithm, nvfp4, chunk_bytes=256)
    want = simulate_allreduce(stacked, algorithm=algorithm, compressor=nvfp4, chunk_bytes=256)
    assert torch.equal(small.allreduce(list(stacked)), want)
    assert not torch.equal(small.allreduce(list(stacked)), group.allreduce(list(stacked)))


def test_lossy_close_to_unsharded():
    fc1, fc2 = full_mlp()
    group = VirtualTPGroup(4, "ring", "taco")
    col = ColumnParallelLinear.from_linear(fc1, group)
    row = RowParallelLinear.from_linear(fc2, group)
    x, dy = inputs()
    y_ref, dx_ref = run(fc1, fc2, x, dy)
    y, dx = run(col, row, x, dy)
    bound = 0.03 * group.size  # a few percent per quantization, one per rank on a ring
    assert float((y - y_ref).norm() / y_ref.norm()) <= bound
    assert float((dx - dx_ref).norm() / dx_ref.norm()) <= bound


def test_fresh_layers_hold_every_ranks_shard():
    group = VirtualTPGroup(3, "two_shot", "taco")
    col = ColumnParallelLinear(D_IN, HIDDEN, group)
    row = RowParallelLinear(HIDDEN, D_OUT, group)
    assert len(col.rank_weights) == 3 and len(col.rank_biases) == 3
    assert all(w.shape == (HIDDEN // 3, D_IN) and is_tp_sharded(w) for w in col.rank_weights)
    assert all(w.shape == (D_OUT, HIDDEN // 3) and is_tp_sharded(w) for w in row.rank_weights)
    assert row.bias.shape == (D_OUT,) and not is_tp_sharded(row.bias)
    assert col.ranks == [0, 1, 2] and len(row.shards()) == 3
    assert "3 virtual ranks" in repr(col)
    x, _ = inputs()
    assert row(F.gelu(col(x))).shape == (4, 6, D_OUT)


def test_group_checks():
    with pytest.raises(ValueError, match="size"):
        VirtualTPGroup(0)
    with pytest.raises(ValueError, match="size"):
        VirtualTPGroup(True)
    with pytest.raises(ValueError, match="ring"):
        VirtualTPGroup(2, "native")
    with pytest.raises(ValueError, match="unknown compressor"):
        VirtualTPGroup(2, "ring", "nope")
    assert VirtualTPGroup(2, compressor={"id": "taco", "ash": False}).compressor.ash is False
    with pytest.raises(ValueError, match="partials"):
        VirtualTPGroup(2).allreduce([torch.ones(3)])
    with pytest.raises(ValueError, match="divisible"):
        ColumnParallelLinear(D_IN, 3 * 5 + 1, VirtualTPGroup(3))
    with pytest.raises(ValueError, match="divisible"):
        ColumnParallelLinear(D_IN, 2 * 3 * 5, VirtualTPGroup(4), blocks=3)
    with pytest.raises(TypeError, match="group"):
        RowParallelLinear(HIDDEN, D_OUT, "not a group")
