"""DDP with coccl's communication hook (coccl/torch/comm_hooks.py), and the ZeRO-1
sharded optimizer (coccl/torch/zero.py), on several CPU ranks:
every rank runs these cases in the same order (tests/scripts/torch_ranks.py under
torchrun; tests/test_torch_comm_hooks.py launches it).

Every rank builds the same model from one seed and trains on rank-seeded batches, so
DDP's replicas must stay bitwise equal and the identity hook must reproduce DDP's own
Gloo AllReduce bit for bit on two ranks (1/2 is exact, so DDP's multiply-then-sum and
coccl's sum-then-divide round alike)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import coccl.torch
from coccl.torch import CocclHookState, CocclOptions, ShardedOptimizer, allreduce_hook

INT4 = {"id": "int", "bits": 4}
_GROUPS: dict[str, dist.ProcessGroup] = {}


def group(name: str) -> dist.ProcessGroup:
    """The gloo group, or a coccl group (identity, or int 4 bits at every size); created
    in the order first asked, the same on every rank."""
    if name not in _GROUPS:
        if name == "gloo":
            _GROUPS[name] = dist.new_group(backend="gloo")
        else:
            codec = "identity" if name == "identity" else INT4
            opts = CocclOptions(compressor=codec, min_compress_bytes=0)
            _GROUPS[name] = dist.new_group(backend="coccl", pg_options=opts)
    return _GROUPS[name]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 4)
    )


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step`` (step -1: a held-out batch, the same on every
    rank) of a smooth regression task."""
    seed = 1000 * step + dist.get_rank() if step >= 0 else 999_999
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(seed))
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
    return x, torch.tanh(x @ w / 4)


def train(ddp: DDP, steps: int, lr: float = 0.1) -> tuple[float, float]:
    """SGD for ``steps``; the held-out loss before and after."""
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    held_x, held_y = batch(-1)
    with torch.no_grad():
        before = float(nn.functional.mse_loss(ddp.module(held_x), held_y))
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    with torch.no_grad():
        after = float(nn.functional.mse_loss(ddp.module(held_x), held_y))
    return before, after


def wrap(pg: dist.ProcessGroup) -> DDP:
    # small buckets: several per model, rebuilt after the first iteration
    return DDP(model(), process_group=pg, bucket_cap_mb=0.004)


def replicas_equal(module: nn.Module) -> bool:
    mine = b"".join(p.detach().numpy().tobytes() for p in module.parameters())
    theirs: list[bytes] = [b""] * dist.get_world_size()
    dist.all_gather_object(theirs, mine, group=group("gloo"))
    return len(set(theirs)) == 1


def test_identity_hook_is_ddps_allreduce():
    reference = wrap(group("gloo"))
    hooked = wrap(group("identity"))
    hooked_state = CocclHookState(group=group("identity"))
    hooked.register_comm_hook(hooked_state, allreduce_hook)
    train(reference, 6)
    train(hooked, 6)  # identical batches and initial weights
    pairs = zip(reference.parameters(), hooked.parameters(), strict=True)
    if dist.get_world_size() == 2:
        assert all(torch.equal(a, b) for a, b in pairs)
    else:  # one division against a multiplication per rank: a few ulps apart
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in pairs)
    assert replicas_equal(hooked.module)
    assert coccl.torch.stats(group("identity"))["comm:plans"] > 0
    assert hooked_state.calls["exact"] > 0


@pytest.mark.parametrize("feedback", [False, True])
def test_lossy_hook_trains(feedback):
    """4-bit gradients (every bucket compressed) train: the held-out loss falls as
    far as within a fifth of the exact run's fall."""
    _, exact_after = train(wrap(group("gloo")), 40)
    lossy = wrap(group("int4"))
    state = CocclHookState(group=group("int4"), feedback=feedback)
    lossy.register_comm_hook(state, allreduce_hook)
    before, after = train(lossy, 40)
    assert replicas_equal(lossy.module)
    assert after < 0.5 * before
    assert after - exact_after < 0.2 * (before - exact_after)
    assert state.calls["compressed"] > 0 and not state.calls["exact"]


def test_hook_with_its_own_codec():
    """``CocclHookState(compressor=...)`` overrides the group's (identity) codec."""
    lossy = wrap(group("identity"))
    state = CocclHookState(group=group("identity"), compressor="int8", feedback=True)
    lossy.register_comm_hook(state, allreduce_hook)
    before, after = train(lossy, 20)
    assert replicas_equal(lossy.module)
    assert after < 0.7 * before
    assert state.calls["compressed"] > 0


# ------------------------------------------------------------------------ ZeRO-1
def train_plain(module: nn.Module, opt: Any, steps: int) -> tuple[float, float]:
    """``train`` without DDP: the optimizer reduces the gradients itself."""
    held_x, held_y = batch(-1)
    with torch.no_grad():
        before = float(nn.functional.mse_loss(module(held_x), held_y))
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(module(x), y).backward()
        opt.step()
    with torch.no_grad():
        after = float(nn.functional.mse_loss(module(held_x), held_y))
    return before, after


def test_zero1_exact_codecs_match_ddp_adamw():
    """Exact codecs: ZeRO-1 (gradients averaged by an exact ReduceScatter, AdamW on the
    shard, an exact AllGather) is DDP + AdamW up to float32 rounding of AdamW's kernels
    on one flat shard instead of per-parameter tensors."""
    reference = wrap(group("gloo"))
    train_plain(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), 8)
    sharded = model()
    opt = ShardedOptimizer(
        sharded.parameters(), group=group("identity"), lr=1e-2,
        reduce_compressor="identity", gather_compressor="identity",
    )  # fmt: skip
    train_plain(sharded, opt, 8)
    for a, b in zip(reference.module.parameters(), sharded.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert replicas_equal(sharded)


@pytest.mark.parametrize("feedback", [False, True])
def test_zero1_lossy_trains(feedback):
    """int8 gradients, 4-bit weight deltas (groups of 2048): the replicas stay bitwise
    equal and the held-out loss falls within a fifth of the exact run's fall."""
    exact = model()
    exact_opt = ShardedOptimizer(
        exact.parameters(), group=group("identity"), lr=1e-2,
        reduce_compressor="identity", gather_compressor="identity",
    )  # fmt: skip
    _, exact_after = train_plain(exact, exact_opt, 40)
    lossy = model()
    opt = ShardedOptimizer(lossy.parameters(), group=group("identity"), lr=1e-2, feedback=feedback)
    before, after = train_plain(lossy, opt, 40)
    assert replicas_equal(lossy)
    assert opt.delta is not None and opt.delta.bound
    assert after < 0.5 * before
    assert after - exact_after < 0.2 * (before - exact_after)
