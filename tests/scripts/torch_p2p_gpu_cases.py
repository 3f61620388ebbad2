"""Point-to-point of CUDA tensors on a coccl group, 2 ranks sharing one GPU (under
torchrun: tests/scripts/torch_ranks.py LOGDIR tests/scripts/torch_p2p_gpu_cases.py;
bench/scripts/h200_check.sh's ``torchp2p`` part). CUDA tensors travel through host
copies (coccl/torch/p2p.py), so codecs run on the host as in the CPU cases; here: the
identity codec bitwise on CUDA tensors, a producer on a side stream ordered before its
send, the received tensor ordered before its consumer by ``Work.wait()``, and a 2-stage
GPipe schedule on the GPU whose losses are the CPU run's (to float rounding). Skipped
without a GPU."""

from __future__ import annotations

import math
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import coccl.torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_p2p_cases import data, pair_exchange, pipeline_losses  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
    pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning"),
]
CUDA = torch.device("cuda", 0)
_GROUPS: dict[str, dist.ProcessGroup] = {}


@pytest.fixture(scope="session", autouse=True)
def world() -> None:
    if not dist.is_initialized():
        coccl.torch.init_process_group(timeout=timedelta(seconds=60))
    assert dist.get_world_size() == 2, "these cases run on 2 ranks"
    torch.cuda.set_device(0)


def group(name: str, **options) -> dist.ProcessGroup:
    if name not in _GROUPS:
        opts = coccl.torch.CocclOptions(**options)
        _GROUPS[name] = dist.new_group([0, 1], backend="coccl", pg_options=opts)
    return _GROUPS[name]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
@pytest.mark.parametrize("count", [0, 1, 1001])
def test_cuda_identity_is_exact(dtype, count):
    g = group("exact")
    me = dist.get_rank(g)
    fwd, bwd = data(dtype, count, "gpu", 0), data(dtype, count, "gpu", 1)
    got = pair_exchange(g, fwd.to(CUDA), bwd.to(CUDA))
    assert got.is_cuda and torch.equal(got.cpu(), bwd if me == 0 else fwd)


def test_streams_order_the_send_and_the_consumer():
    """The sender produces on a side stream and sends from it; the receiver waits its
    Work on a side stream and consumes there."""
    g = group("exact")
    me = dist.get_rank(g)
    side = torch.cuda.Stream()
    n = 1 << 22
    with torch.cuda.stream(side):
        if me == 0:
            torch.cuda._sleep(50_000_000)  # the producer is still running at the send
            x = torch.arange(n, device=CUDA, dtype=torch.float32)
            dist.send(x, group=g, group_dst=1)
        else:
            out = torch.empty(n, device=CUDA)
            work = dist.irecv(out, group=g, group_src=0)
            work.wait()
            same = (out == torch.arange(n, device=CUDA, dtype=torch.float32)).all()
    if me == 1:  # compared on the side stream, after the copy in
        side.synchronize()
        assert bool(same)


def test_gpipe_on_the_gpu_matches_the_cpu_run():
    g = group("exact")
    cpu_losses, _ = pipeline_losses(g)
    gpu_losses, _ = pipeline_losses(g, CUDA)
    if dist.get_rank(g) == 1:
        assert all(math.isfinite(v) for v in gpu_losses)
        assert gpu_losses == pytest.approx(cpu_losses, rel=1e-4)
