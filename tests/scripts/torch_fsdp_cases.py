"""FSDP2 (``fully_shard``) over a coccl group with coccl's comm objects
(coccl/torch/fsdp.py), on 2 ranks: every rank runs these cases in the same order
(tests/scripts/torch_ranks.py under torchrun, launched by tests/test_torch_fsdp.py).

A small MLP, each linear and the root sharded, trained a few SGD steps on rank-seeded
data: exact comms bitwise FSDP2's own; a delta gather whose replicas are bitwise equal
on both ranks and far closer to the master weights than a plain 4-bit gather; a
feedback reduce that carries a residual; a lossy traffic over a Gloo group refused;
ranks that chose different traffics raising on both.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

import coccl.torch
from coccl.torch import Traffic

INT4 = {"id": "int", "bits": 4, "group_size": 32}
INT8 = {"id": "int", "bits": 8, "group_size": 32}
CPU = torch.device("cpu")
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")
_GLOO: list[dist.ProcessGroup] = []


@pytest.fixture(scope="session", autouse=True)
def world() -> None:
    if not dist.is_initialized():
        coccl.torch.init_process_group(timeout=timedelta(seconds=60))
    assert dist.get_world_size() == 2, "these cases run on 2 ranks"
    _GLOO.append(dist.new_group(backend="gloo"))


def model(mesh, gather=None, reduce=None, custom=True, device=CPU):
    """The MLP on ``device``, each linear and the root fully_shard-ed over ``mesh`` (with
    coccl comm objects when ``custom``); returns it and every module's comms."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(48, 96), nn.Tanh(), nn.Linear(96, 40)).to(device)
    comms = []
    for m in (net[0], net[2], net):
        fully_shard(m, mesh=mesh)
        if custom:
            comms.append(coccl.torch.shard_comms(m, gather, reduce))
    return net, comms


def batch(step: int, device: torch.device = CPU) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    x, y = torch.randn(16, 48, generator=g), torch.randn(16, 40, generator=g)
    return x.to(device), y.to(device)


def train(net: nn.Module, steps: int, lr: float = 0.05, hook=None, device=CPU) -> list[float]:
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses = []
    for s in range(steps):
        x, y = batch(s, device)
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        if hook is not None:
            hook(net)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def mesh():
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    return init_device_mesh("cpu", (2,))


def full(p: torch.Tensor) -> torch.Tensor:
    """The whole of a sharded parameter, its shards gathered over Gloo."""
    parts: list = [None, None]
    dist.all_gather_object(parts, p.to_local().detach().clone(), group=_GLOO[0])
    return torch.cat(parts)


def test_exact_comms_are_fsdp_own():
    plain, _ = model(mesh(), custom=False)
    ours, comms = model(mesh())
    assert train(plain, 3) == train(ours, 3)
    for a, b in zip(plain.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a.to_local(), b.to_local())
    # the root holds no parameter of its own: its comms are never called
    assert all(c.calls["exact"] > 0 and c.calls["compressed"] == 0 for p in comms[:2] for c in p)


def gathered_error(gather: Traffic, steps: int = 5) -> tuple[float, list[torch.Tensor]]:
    """Train with ``gather``; before each forward of the first linear, the unsharded
    weight FSDP2 computes with against the master shards: the largest difference, and
    the last unsharded weight."""
    net, comms = model(mesh(), gather=gather)
    seen: list[torch.Tensor] = []
    worst = [0.0]

    def look(module: nn.Module, args: tuple) -> None:
        w = module.weight.detach().clone()  # unsharded by FSDP2's own pre-forward hook
        master = full(sharded[0])
        worst[0] = max(worst[0], (w - master).abs().max().item())
        seen[:] = [w]

    sharded = [net[0].weight]  # the DTensor before the first forward unshards it
    net[0].register_forward_pre_hook(look)
    train(net, steps)
    assert comms[0][0].calls["compressed"] == 2 * steps  # gathered again for backward
    return worst[0], seen


def test_delta_gather_keeps_replicas_equal_and_close():
    delta_err, seen = gathered_error(Traffic(INT4, "auto", 0, "delta"))
    plain_err, _ = gathered_error(Traffic(INT4, "two_shot", 0))
    parts: list = [None, None]
    dist.all_gather_object(parts, seen[0], group=_GLOO[0])
    assert torch.equal(parts[0], parts[1])  # every rank computes with the same replica
    assert 0 < delta_err < plain_err / 5, (delta_err, plain_err)


def test_feedback_reduce_carries_a_residual():
    grads: list[torch.Tensor] = []

    def keep(net: nn.Module) -> None:
        grads.append(net[0].weight.grad.to_local().detach().clone())

    exact, _ = model(mesh(), custom=False)
    train(exact, 2, hook=keep)
    fed, comms = model(mesh(), reduce=Traffic(INT8, "two_shot", 0, "feedback"))
    train(fed, 2, hook=keep)
    fb = comms[0][1].feedback
    assert fb.bound and fb.residual is not None and abs(fb.residual).max() > 0
    step0 = (grads[2] - grads[0]).abs().max().item()
    assert 0 < step0 < 0.02 * grads[0].abs().max().item()  # lossy, within int8's error


def test_lossy_traffic_over_gloo_is_refused():
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

    gloo = DeviceMesh.from_group(_GLOO[0], "cpu")
    net, _ = model(gloo, gather=Traffic(INT4, "two_shot", 0))
    with pytest.raises(TypeError, match="needs a coccl group"):
        net(batch(0)[0])


def test_ranks_with_different_traffics_raise_on_both():
    """A comm object's codec is the rank's own choice: ranks that chose differently
    raise CocclError on both, naming the difference, at the first call that differs
    (over a group of their own: the error leaves a group unusable)."""
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

    own = DeviceMesh.from_group(dist.new_group(backend="coccl"), "cpu")
    mine = Traffic(INT4, "two_shot", 0) if dist.get_rank() == 0 else Traffic(INT8, "two_shot", 0)
    net, _ = model(own, gather=mine)
    with pytest.raises(coccl.CocclError, match="'bits': 4") as err:
        net(batch(0)[0])
    assert "'bits': 8" in str(err.value)
