"""The two-level schedule through the torch backend: 4 CPU ranks as 2 nodes of 2
(``COCCL_LOCAL_SIZE=2``; tests/test_torch_backend.py launches this file through
tests/scripts/torch_ranks.py). A coccl group with ``algorithm="hierarchical"`` and one
codec, or an ``(intra, inter)`` pair (4-bit across nodes, rounded to nearest or
stochastically), runs ``all_reduce`` and ``reduce_scatter_tensor``: every rank's AllReduce
bitwise equal, and each result bitwise what the Communicator's own call computes on the
same data (a twin group's Communicator: its plans' call numbers, hence a stochastic
codec's salts, start where the first group's did).
"""

from __future__ import annotations

import math
import zlib
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

import coccl
import coccl.torch
from coccl.torch import CocclOptions

INT4 = {"id": "int", "bits": 4}
STOCHASTIC = {"id": "int", "bits": 4, "rounding": "stochastic", "seed": 7}
CODECS = {"int8": "int8", "int8+int4": ("int8", INT4), "int8+int4sr": ("int8", STOCHASTIC)}
U = float(np.finfo(np.float32).eps) / 2
# torch 2.13 renamed reduce_scatter_tensor and all_gather_into_tensor; 2.11 has only these
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")


@pytest.fixture(scope="session", autouse=True)
def world() -> dist.ProcessGroup:
    if not dist.is_initialized():
        coccl.torch.init_process_group(timeout=timedelta(seconds=60))
    assert dist.get_world_size() == 4, "2 nodes of 2 ranks (COCCL_LOCAL_SIZE=2)"
    return dist.group.WORLD


_GROUPS: dict[str, tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}


def groups(name: str) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Two coccl groups of every rank with codec ``name``, hierarchical, every message
    compressed: the one torch calls, and the twin whose Communicator is called directly."""
    if name not in _GROUPS:
        opts = CocclOptions(compressor=CODECS[name], algorithm="hierarchical", min_compress_bytes=0)
        made = [dist.new_group(backend="coccl", pg_options=opts) for _ in range(2)]
        _GROUPS[name] = (made[0], made[1])
    return _GROUPS[name]


def rank_data(seed: int, rank: int, count: int) -> torch.Tensor:
    rng = np.random.default_rng([seed, rank, count])
    return torch.from_numpy(rng.standard_normal(count).astype(np.float32))


def same_on_every_rank(t: torch.Tensor) -> bool:
    every: list[bytes] = [b""] * dist.get_world_size()
    dist.all_gather_object(every, t.numpy().tobytes(), group=checker())
    return len(set(every)) == 1


def checker() -> dist.ProcessGroup:
    """A plain Gloo group for comparing results across ranks (independent of coccl)."""
    if "checker" not in _GROUPS:
        _GROUPS["checker"] = (dist.new_group(backend="gloo"),) * 2
    return _GROUPS["checker"][0]


# 255, 10007: a leftover after the node's whole groups of 128 (all of it at 255)
@pytest.mark.parametrize("count", [0, 1, 255, 10007])
@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_two_level_collective(collective, name, count):
    g, twin = groups(name)
    n, rank = dist.get_world_size(), dist.get_rank()
    total = n * count if collective == "reduce_scatter" else count
    seed = zlib.crc32(repr((collective, name, count)).encode())
    parts = [rank_data(seed, r, total) for r in range(n)]
    x = parts[rank].clone()
    if collective == "allreduce":
        got = x.clone()
        dist.all_reduce(got, group=g)
        direct = twin.comm.allreduce(x, algorithm="hierarchical", compressor=CODECS[name])
        assert same_on_every_rank(got)
    else:
        got = torch.empty(count)
        dist.reduce_scatter_tensor(got, x, group=g)
        direct = twin.comm.reduce_scatter(x, algorithm="hierarchical", compressor=CODECS[name])
    assert torch.equal(got.view(torch.int32), direct.view(torch.int32))
    plan = coccl.torch.describe(g, collective, x)
    assert plan["path"] == "compressed" and plan["algorithm"] == "hierarchical"
    assert plan["nodes"] == 2 and plan["local size"] == 2
    # within the bound of tests/mpi/test_dp_calls.py's test_hierarchical
    exact = torch.stack([p.double() for p in parts]).sum(0)
    if collective == "reduce_scatter":
        exact = exact[rank * count : (rank + 1) * count]
    levels = CODECS[name] if isinstance(CODECS[name], tuple) else (CODECS[name],)
    worst = max(coccl.get_compressor(c).rel_error_bound for c in levels)
    q = 4 if collective == "allreduce" else 2
    energy = math.sqrt(sum(float((p.double() ** 2).sum()) for p in parts))
    bound = (worst * (1 + worst) ** q + 2 * U) * math.sqrt(q) + (n + 1) * U * math.sqrt(n)
    assert float((got.double() - exact).norm()) <= bound * energy


def test_a_pair_groups_exact_all_gather_runs_one_level():
    """A hierarchical group's AllGather (exact: ``compress`` cannot name it) runs coccl's
    one-level exact path, the pair set aside."""
    g, _ = groups("int8+int4")
    n, rank = dist.get_world_size(), dist.get_rank()
    parts = [rank_data(5, r, 300) for r in range(n)]
    out = torch.empty(n * 300)
    dist.all_gather_into_tensor(out, parts[rank], group=g)
    assert torch.equal(out, torch.cat(parts))
    assert coccl.torch.describe(g, "allgather", parts[rank])["path"] == "exact"


def test_a_pair_with_another_algorithm_is_refused_at_the_call():
    """``options()`` may name a pair for a hierarchical group; with another algorithm
    every rank refuses the call before any byte moves, and the group still works."""
    g, _ = groups("int8")
    x = rank_data(6, dist.get_rank(), 1000)
    with coccl.torch.options(g, compressor=("int8", INT4)):
        dist.all_reduce(x.clone(), group=g)  # the group's algorithm: hierarchical
    with pytest.raises(ValueError, match="pair is for algorithm='hierarchical'"):
        with coccl.torch.options(g, compressor=("int8", INT4), algorithm="two_shot"):
            dist.all_reduce(x.clone(), group=g)
    dist.all_reduce(x, group=g)
    assert same_on_every_rank(x)
