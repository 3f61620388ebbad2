"""The coccl torch.distributed backend on several ranks: every rank runs these cases in the
same order (tests/scripts/torch_ranks.py under torchrun or mpiexec; on CUDA tensors,
tests/mpi/test_torch_backend_gpu.py imports them and overrides ``device``).

Data is rank-seeded, so every rank builds every other rank's contribution and checks its
result against an exact float64 reference without communicating. Groups are created in
the order the cases first ask for them, the same on every rank (creation is collective).
"""

from __future__ import annotations

import contextlib
import copy
import math
import zlib
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

import coccl
import coccl.torch
from coccl.torch import CocclOptions, CocclProcessGroup

CODECS = ["identity", "int8", "taco"]
DTYPES = [torch.float32, torch.bfloat16]
COUNTS = [0, 1, 3, 4099]  # per rank (AllGather) or per shard (ReduceScatter)
LARGE = 1024  # from this count, a lossy result is held to the error model
EVERYTHING = ("allreduce", "reduce_scatter", "allgather")
# torch 2.13 renamed reduce_scatter_tensor and all_gather_into_tensor; 2.11 has only these
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cpu")


@pytest.fixture(scope="session", autouse=True)
def world(device: torch.device) -> dist.ProcessGroup:
    if not dist.is_initialized():
        coccl.torch.init_process_group(timeout=timedelta(seconds=60))
    return dist.group.WORLD


_GROUPS: dict[tuple, dist.ProcessGroup] = {}


def group(**options) -> dist.ProcessGroup:
    """A coccl group of every rank with these ``CocclOptions`` (one per set of options)."""
    key = tuple(sorted((k, repr(v)) for k, v in options.items()))
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(backend="coccl", pg_options=CocclOptions(**options))
    return _GROUPS[key]


def lossy_group(codec: str, algorithm: str) -> dist.ProcessGroup:
    """Every collective compressed, whatever its size."""
    return group(compressor=codec, algorithm=algorithm, min_compress_bytes=0, compress=EVERYTHING)


def checker() -> dist.ProcessGroup:
    """A plain Gloo group for comparing results across ranks (independent of coccl)."""
    if "checker" not in _GROUPS:
        _GROUPS["checker"] = dist.new_group(backend="gloo")
    return _GROUPS["checker"]


# -------------------------------------------------------------------- helpers
def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def rank_data(seed: int, rank: int, count: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Rank ``rank``'s data for case ``seed`` (the same on every rank that builds it)."""
    rng = np.random.default_rng([seed, rank, count])
    if dtype.is_floating_point:
        values = torch.from_numpy(rng.standard_normal(count).astype(np.float32))
    else:
        values = torch.from_numpy(rng.integers(-9, 10, size=count))
    return values.to(dtype).to(device)


def everyone(seed: int, count: int, dtype: torch.dtype, device) -> list[torch.Tensor]:
    return [rank_data(seed, r, count, dtype, device) for r in range(dist.get_world_size())]


def exact_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([p.double().cpu() for p in parts]).sum(0)


def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double().cpu() - ref).norm() / max(float(ref.norm()), 1e-300))


def same_on_every_rank(t: torch.Tensor) -> bool:
    mine = bytes(t.detach().cpu().clone().untyped_storage())
    every: list[bytes] = [b""] * dist.get_world_size()
    dist.all_gather_object(every, mine, group=checker())
    return len(set(every)) == 1


def quantizations(collective: str, algorithm: str, n: int) -> float:
    """Independent quantization errors of one codec roundtrip's size that a result
    carries, relative to it, in units of e^2 (tests/mpi/test_compressed.py's model)."""
    if collective == "allgather":
        return 1.0
    reduce = (n - 1) / n if algorithm == "two_shot" else (n - 1) / 2
    return reduce + (1.0 if collective == "allreduce" else 0.0)


def check_result(got, ref, codec, collective, algorithm, dtype, count) -> None:
    """Exact codecs: the float64 reference to the output dtype's rounding. Lossy codecs:
    the error model on large counts, a loose bound on tiny ones."""
    n = dist.get_world_size()
    c = coccl.get_compressor(codec)
    out_rounding = 2.0**-8 if dtype == torch.bfloat16 else 1e-6
    if c.lossless:
        if collective == "allgather":
            assert torch.equal(got.cpu(), ref.to(dtype))
        else:
            torch.testing.assert_close(got.double().cpu(), ref, rtol=out_rounding, atol=1e-6)
        return
    if count == 0:
        return
    err = rel_l2(got, ref)
    if count < LARGE:
        assert err < 0.3, err
        return
    model = c.rel_error_typical * math.sqrt(quantizations(collective, algorithm, n))
    slack = 0.004 if dtype == torch.bfloat16 else 0.0
    assert 0.5 * model - slack <= err <= 1.5 * model + slack, (err, model)


ALGOS = [(c, a) for c in CODECS for a in (["auto", "two_shot"] if c == "identity" else [])] + [
    (c, a) for c in CODECS[1:] for a in ("two_shot", "ring")
]


# ------------------------------------------------------ coccl's own collectives
def test_default_group_is_coccl(world):
    assert dist.get_backend() == "coccl"
    assert isinstance(world, CocclProcessGroup)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("codec,algorithm", ALGOS)
def test_all_reduce(device, codec, algorithm, op, dtype, count):
    n = dist.get_world_size()
    parts = everyone(seed_of("ar", codec, algorithm, op, str(dtype), count), count, dtype, device)
    t = parts[dist.get_rank()].clone()
    reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.AVG
    dist.all_reduce(t, op=reduce_op, group=lossy_group(codec, algorithm))
    ref = exact_sum(parts) / (n if op == "avg" else 1)
    check_result(t, ref, codec, "allreduce", algorithm, dtype, count)
    assert same_on_every_rank(t)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("codec,algorithm", ALGOS)
def test_reduce_scatter_tensor(device, codec, algorithm, op, dtype, count):
    n, rank = dist.get_world_size(), dist.get_rank()
    seed = seed_of("rs", codec, algorithm, op, str(dtype), count)
    parts = everyone(seed, n * count, dtype, device)
    out = torch.empty(count, dtype=dtype, device=device)
    x = parts[rank].clone()
    reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.AVG
    dist.reduce_scatter_tensor(out, x, op=reduce_op, group=lossy_group(codec, algorithm))
    ref = exact_sum(parts)[rank * count : (rank + 1) * count] / (n if op == "avg" else 1)
    check_result(out, ref, codec, "reduce_scatter", algorithm, dtype, count)
    assert torch.equal(x, parts[rank])  # the input is left as it was


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec,algorithm", ALGOS)
def test_all_gather_into_tensor(device, codec, algorithm, dtype, count):
    n = dist.get_world_size()
    parts = everyone(seed_of("ag", codec, algorithm, str(dtype), count), count, dtype, device)
    out = torch.empty(n * count, dtype=dtype, device=device)
    dist.all_gather_into_tensor(out, parts[dist.get_rank()], group=lossy_group(codec, algorithm))
    ref = torch.cat([p.cpu() for p in parts]).double()
    check_result(out, ref, codec, "allgather", algorithm, dtype, count)
    assert same_on_every_rank(out)


# ----------------------------------------------------------- what compresses
def test_small_messages_and_all_gather_stay_exact(device):
    """A group with TACO and the default options: a loss scalar and an AllGather run
    exact, a large AllReduce compresses."""
    g = group(compressor="taco", algorithm="two_shot")
    n, rank = dist.get_world_size(), dist.get_rank()
    before = g.stats()

    loss = everyone(seed_of("loss"), 1, torch.float32, device)
    t = loss[rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g)
    torch.testing.assert_close(t.double().cpu(), exact_sum(loss) / n, rtol=1e-6, atol=0)

    shards = everyone(seed_of("gather"), 5000, torch.float32, device)
    out = torch.empty(n * 5000, device=device)
    dist.all_gather_into_tensor(out, shards[rank], group=g)
    assert torch.equal(out.cpu(), torch.cat([s.cpu() for s in shards]))

    count = coccl.torch.DEFAULT_MIN_COMPRESS_BYTES // 4
    big = everyone(seed_of("big"), count, torch.float32, device)
    t = big[rank].clone()
    dist.all_reduce(t, group=g)
    assert rel_l2(t, exact_sum(big)) > 1e-3  # quantized

    after = g.stats()
    assert after.get("allreduce:exact", 0) - before.get("allreduce:exact", 0) == 1
    assert after.get("allgather:exact", 0) - before.get("allgather:exact", 0) == 1
    assert after.get("allreduce:compressed", 0) - before.get("allreduce:compressed", 0) == 1


def test_options_override_per_call(device):
    g = lossy_group("taco", "two_shot")
    rank = dist.get_rank()
    parts = everyone(seed_of("override"), 4096, torch.float32, device)
    ref = exact_sum(parts)
    with coccl.torch.options(g, compressor="identity"):
        t = parts[rank].clone()
        dist.all_reduce(t, group=g)
    torch.testing.assert_close(t.double().cpu(), ref, rtol=1e-6, atol=1e-6)
    with coccl.torch.options(compressor="int8"):  # every coccl group
        t = parts[rank].clone()
        dist.all_reduce(t, group=g)
    int8_err = rel_l2(t, ref)
    t = parts[rank].clone()
    dist.all_reduce(t, group=g)  # the group's own taco again
    taco_err = rel_l2(t, ref)
    assert 0 < int8_err < taco_err  # int8 is the finer of the two (README's table)


def test_options_are_checked():
    with pytest.raises(ValueError), coccl.torch.options(compressor="zstd"):
        pass
    with pytest.raises(TypeError), coccl.torch.options(no_such_option=1):
        pass


@pytest.mark.parametrize(
    "op,combine",
    [
        (dist.ReduceOp.MAX, lambda s: s.max(0).values),
        (dist.ReduceOp.MIN, lambda s: s.min(0).values),
        (dist.ReduceOp.PRODUCT, lambda s: s.prod(0)),
    ],
    ids=["max", "min", "product"],
)
def test_other_ops_run_exact_on_a_lossy_group(device, op, combine):
    """MAX (e.g. the logits max of a vocab-parallel cross entropy) is never quantized."""
    parts = everyone(seed_of("ops", str(op)), 2000, torch.float32, device)
    t = parts[dist.get_rank()].clone()
    dist.all_reduce(t, op=op, group=lossy_group("taco", "two_shot"))
    ref = combine(torch.stack([p.double().cpu() for p in parts]))
    torch.testing.assert_close(t.double().cpu(), ref, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integers_run_exact_on_a_lossy_group(device, dtype):
    parts = everyone(seed_of("int", str(dtype)), 3000, dtype, device)
    t = parts[dist.get_rank()].clone()
    dist.all_reduce(t, group=lossy_group("taco", "two_shot"))
    assert torch.equal(t.cpu(), torch.stack([p.cpu() for p in parts]).sum(0).to(dtype))


def test_premul_sum(device):
    factor = 0.25
    op = dist._make_nccl_premul_sum(factor)
    if getattr(op, "factor", None) is None:
        pytest.skip("this torch does not expose PREMUL_SUM's factor (torch < 2.13)")
    parts = everyone(seed_of("premul"), 100, torch.float32, device)
    t = parts[dist.get_rank()].clone()
    dist.all_reduce(t, op=op, group=group(algorithm="two_shot"))
    torch.testing.assert_close(t.double().cpu(), factor * exact_sum(parts), rtol=1e-6, atol=1e-7)


def test_premul_sum_of_integers_is_refused_before_any_byte_moves(device):
    op = dist._make_nccl_premul_sum(2.0)
    if getattr(op, "factor", None) is None or device.type == "cuda":
        pytest.skip("torch hides PREMUL_SUM's factor, or NCCL takes it on integers")
    t = torch.arange(4, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match="PREMUL_SUM"):
        dist.all_reduce(t, op=op, group=group(algorithm="two_shot"))
    assert torch.equal(t.cpu(), torch.arange(4, dtype=torch.int32))


def test_coalescing_manager_waits_for_its_collectives(device):
    """torch keeps the block's Work (``_end_coalescing``'s) in place of the calls' own:
    it covers the collectives issued in the block, which are done after it."""
    g = group(algorithm="two_shot")
    a, b = torch.ones(100, device=device), torch.ones(50, device=device)
    with dist._coalescing_manager(group=g, device=device):
        dist.all_reduce(a, group=g)
        dist.all_reduce(b, group=g)
    n = float(dist.get_world_size())
    assert torch.equal(a.cpu(), torch.full((100,), n))
    assert torch.equal(b.cpu(), torch.full((50,), n))


def test_wait_with_a_timeout_raises_once_it_passes(device):
    """As Gloo's: ``wait(timeout)`` raises once the timeout has passed (the peers post
    only after it), and the call completes later."""
    if device.type == "cuda" or dist.get_world_size() == 1:
        pytest.skip("a CUDA call is enqueued when the group returns; one rank never waits")
    g, order = group(algorithm="two_shot"), dist.new_group(backend="gloo")
    t = torch.ones(10)
    if dist.get_rank() == 0:
        work = dist.all_reduce(t, async_op=True, group=g)
        with pytest.raises(RuntimeError, match="timeout"):
            work.wait(timeout=timedelta(milliseconds=50))
    dist.barrier(group=order)
    if dist.get_rank() != 0:
        work = dist.all_reduce(t, async_op=True, group=g)
    assert work.wait()
    assert torch.equal(t, torch.full((10,), float(dist.get_world_size())))


def test_async_op(device):
    parts = everyone(seed_of("async"), 777, torch.float32, device)
    t = parts[dist.get_rank()].clone()
    work = dist.all_reduce(t, async_op=True, group=group(algorithm="two_shot"))
    assert work.wait()
    assert work.is_completed() or device.type == "cuda"
    (result,) = work.get_future().wait()
    assert result is t
    torch.testing.assert_close(t.double().cpu(), exact_sum(parts), rtol=1e-6, atol=1e-6)


def test_a_works_future_is_done_once_wait_returns(device):
    """``wait()`` returns once the Work's future is complete too, as Gloo's (its value
    was read while another thread was still completing it, and torch asserted)."""
    g = group(algorithm="two_shot")
    for _ in range(200):
        t = torch.ones(8, device=device)
        work = dist.all_reduce(t, async_op=True, group=g)
        work.wait()
        assert work.get_future().done()
        (result,) = work.get_future().value()
        assert result is t


def test_async_work_is_pending_until_the_peer_posts(device):
    """A CPU Work is not complete when it returns: rank 0 sees it pending, and only then
    (told over a plain Gloo group, not by sleeping) do the other ranks post theirs. (Not
    through torch's store: the pending call's agreement waits on the store's client, and
    the client runs one operation at a time.)"""
    n, rank = dist.get_world_size(), dist.get_rank()
    if device.type == "cuda" or n < 2:
        pytest.skip("a CPU Work with a peer that posts late")
    g, side = group(algorithm="ring"), checker()
    parts = everyone(seed_of("late"), 300, torch.float32, device)
    t = parts[rank].clone()
    flag = torch.zeros(1)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True, group=g)
        flag += float(not work.is_completed() and not work.get_future().done())
        for r in range(1, n):
            dist.send(flag, dst=r, group=side)
    else:
        dist.recv(flag, src=0, group=side)
        work = dist.all_reduce(t, async_op=True, group=g)
    assert flag.item() == 1.0  # rank 0 saw its Work pending before any peer posted
    halved = work.get_future().then(lambda f: f.value()[0] / 2)  # as a DDP comm hook does
    assert work.wait() and work.is_completed() and work.is_success()
    (result,) = work.get_future().wait()
    assert result is t
    torch.testing.assert_close(t.double(), exact_sum(parts), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(halved.wait(), t / 2)


def test_several_async_works_pending_at_once(device):
    n, rank = dist.get_world_size(), dist.get_rank()
    g = group(algorithm="two_shot")
    cases = [(seed_of("many", i), c) for i, c in enumerate([0, 1, 3, 1001])]
    allparts = [everyone(seed, c * n, torch.float32, device) for seed, c in cases]
    ts = [parts[rank].clone() for parts in allparts]
    shards = [torch.empty(c, device=device) for _, c in cases]
    works = [dist.all_reduce(t, async_op=True, group=g) for t in ts]
    works += [
        dist.reduce_scatter_tensor(out, parts[rank], async_op=True, group=g)
        for out, parts in zip(shards, allparts, strict=True)
    ]
    for work in reversed(works):
        work.wait()
    for (_, c), t, out, parts in zip(cases, ts, shards, allparts, strict=True):
        total = exact_sum(parts)
        torch.testing.assert_close(t.double().cpu(), total, rtol=1e-6, atol=1e-6)
        want = total[rank * c : (rank + 1) * c]
        torch.testing.assert_close(out.double().cpu(), want, rtol=1e-6, atol=1e-6)


def test_ddp_gradients_over_a_coccl_group(device):
    """DDP's reducer on a coccl group: its buckets' AllReduces run asynchronously (several
    pending at once with small buckets) and the averaged gradients are the full batch's."""
    if device.type == "cuda":
        pytest.skip("the CPU Work's asynchrony")
    n, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    ).double()
    ref = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, process_group=group(algorithm="ring"), bucket_cap_mb=0.001
    )
    xs = [
        torch.from_numpy(np.random.default_rng([7, r]).standard_normal((8, 16))) for r in range(n)
    ]
    ddp(xs[rank]).square().sum().backward()
    for x in xs:
        ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad / n, rtol=1e-12, atol=1e-12)


def test_async_error_reaches_wait_and_the_future(device):
    """Ranks that disagree: the error is raised by wait() (and set on the future) on
    every rank, and the group works afterwards."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if n < 2:
        pytest.skip("one rank cannot disagree with itself")
    g = group(algorithm="ring")
    t = torch.ones(10 + rank, device=device)
    with pytest.raises(coccl.CocclError, match="count"):
        work = dist.all_reduce(t, async_op=True, group=g)
        work.wait()
    if device.type == "cpu":
        assert not work.is_success() and isinstance(work.exception(), coccl.CocclError)
        with pytest.raises(coccl.CocclError, match="count"):
            work.get_future().wait()
    t = torch.ones(5, device=device)
    dist.all_reduce(t, group=g)
    assert torch.equal(t.cpu(), torch.full((5,), float(n)))


def test_functional_collectives(device, world):
    """The path DTensor takes: torch's functional collectives, resolved by group name."""
    n, rank = dist.get_world_size(), dist.get_rank()
    parts = everyone(seed_of("funcol"), 6 * n, torch.float32, device)
    ref = exact_sum(parts)
    got = funcol.all_reduce(parts[rank], "sum", world)
    torch.testing.assert_close(got.double().cpu(), ref, rtol=1e-6, atol=1e-6)
    got = funcol.reduce_scatter_tensor(parts[rank], "sum", 0, world)
    mine = ref[rank * 6 : (rank + 1) * 6]
    torch.testing.assert_close(got.double().cpu(), mine, rtol=1e-6, atol=1e-6)
    got = funcol.all_gather_tensor(parts[rank][:6], 0, world)
    assert torch.equal(got.cpu(), torch.cat([p[:6].cpu() for p in parts]))


# ---------------------------------------------------------------- forwarded
def test_broadcast_and_barrier(device):
    t = torch.arange(5.0, device=device) * (1 + dist.get_rank())
    dist.broadcast(t, src=0)
    assert torch.equal(t.cpu(), torch.arange(5.0))
    dist.barrier()
    assert dist.group.WORLD.stats()["barrier"] >= 1


def test_barrier_waits_for_the_groups_earlier_calls(device):
    """As Gloo's: after ``barrier()`` an earlier async all_reduce has completed."""
    g = group(algorithm="two_shot")
    t = torch.ones(1000, device=device)
    work = dist.all_reduce(t, async_op=True, group=g)
    dist.barrier(group=g)
    assert work.is_completed() or device.type == "cuda"
    assert torch.equal(t.cpu(), torch.full((1000,), float(dist.get_world_size())))


def test_send_recv_ring(device):
    n, rank = dist.get_world_size(), dist.get_rank()
    if n == 1:
        pytest.skip("a ring of sends needs two ranks")
    out = torch.full((4,), float(rank), device=device)
    got = torch.empty(4, device=device)
    # Even ranks send first, odd ranks receive first: NCCL runs a rank's point-to-point
    # operations in order, so a ring where every rank sends first would wait forever
    # (for both ranks of a pair, the first send waits for a receive queued behind it).
    send = lambda: dist.isend(out, (rank + 1) % n)  # noqa: E731
    recv = lambda: dist.irecv(got, (rank - 1) % n)  # noqa: E731
    works = [send(), recv()] if rank % 2 == 0 else [recv(), send()]
    for w in works:
        w.wait()
    assert torch.equal(got.cpu(), torch.full((4,), float((rank - 1) % n)))


def test_scatter_gather_all_gather_list(device):
    n, rank = dist.get_world_size(), dist.get_rank()
    pieces = [torch.full((3,), float(k), device=device) for k in range(n)]
    got = torch.empty(3, device=device)
    dist.scatter(got, pieces if rank == 0 else None, src=0)
    assert torch.equal(got.cpu(), torch.full((3,), float(rank)))
    listed = [torch.empty(3, device=device) for _ in range(n)]
    dist.all_gather(listed, got)
    assert all(torch.equal(x.cpu(), torch.full((3,), float(k))) for k, x in enumerate(listed))
    if device.type == "cpu":  # NCCL has no gather
        gathered = [torch.empty(3) for _ in range(n)] if rank == 0 else None
        dist.gather(got, gathered, dst=0)
        if rank == 0:
            assert all(torch.equal(x, torch.full((3,), float(k))) for k, x in enumerate(gathered))


def test_objects_and_all_to_all(device):
    n, rank = dist.get_world_size(), dist.get_rank()
    objs: list = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(n)]
    x = torch.arange(n, dtype=torch.float32, device=device) + 10 * rank
    y = torch.empty(n, device=device)
    dist.all_to_all_single(y, x)
    assert torch.equal(y.cpu(), torch.tensor([10.0 * r + rank for r in range(n)]))


def test_ops_coccl_lacks_are_forwarded(device):
    """BAND (Gloo has it, NCCL not) goes to the inner group."""
    if device.type == "cuda":
        pytest.skip("NCCL has no bitwise reductions")
    parts = everyone(seed_of("band"), 50, torch.int64, device)
    t = parts[dist.get_rank()].clone()
    before = dist.group.WORLD.stats().get("forwarded:allreduce", 0)
    dist.all_reduce(t, op=dist.ReduceOp.BAND)
    expected = parts[0].clone()
    for p in parts[1:]:
        expected &= p
    assert torch.equal(t, expected)
    assert dist.group.WORLD.stats()["forwarded:allreduce"] == before + 1


def test_subgroup_of_one_rank(device):
    solo = dist.new_group([0], backend="coccl")
    if dist.get_rank() != 0:
        assert solo == dist.GroupMember.NON_GROUP_MEMBER
        return
    t = torch.arange(7.0, device=device)
    dist.all_reduce(t, group=solo)
    assert torch.equal(t.cpu(), torch.arange(7.0))


def test_init_device_mesh_with_backend_override(device):
    """A mesh dimension of backend coccl with options, as DeviceMesh users declare it."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    opts = CocclOptions(compressor="int8", algorithm="two_shot", min_compress_bytes=0)
    mesh = init_device_mesh(
        device.type, (dist.get_world_size(),), mesh_dim_names=("tp_override",),
        backend_override={"tp_override": ("coccl", opts)},
    )  # fmt: skip
    g = mesh.get_group("tp_override")
    assert isinstance(g, CocclProcessGroup) and g.options == opts
    parts = everyone(seed_of("mesh"), 3000, torch.float32, device)
    got = funcol.all_reduce(parts[dist.get_rank()], "sum", g)
    check_result(got, exact_sum(parts), "int8", "allreduce", "two_shot", torch.float32, 3000)
    assert g.stats() == {"allreduce:compressed": 1}


def test_wrong_pg_options_type():
    with pytest.raises(TypeError, match="CocclOptions"):
        dist.new_group(backend="coccl", pg_options={"compressor": "taco"})


# ----------------------------------------------------------------- DTensor TP
def _tp_step(mesh, device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward/backward/SGD step of a column- then row-parallel MLP on ``mesh``;
    returns the output and every parameter's local shard after the step."""
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)
    ).to(device)
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).to(device)
    out = model(x)
    out.pow(2).mean().backward()
    opt.step()
    return out.detach(), [p.to_local().detach().clone() for p in model.parameters()]


def test_parallelize_module_matches_gloo(device):
    """DTensor TP over a coccl mesh (identity, coccl's two-shot) against a plain group."""
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

    plain = dist.new_group(backend="nccl" if device.type == "cuda" else "gloo")
    ours = group(algorithm="two_shot")
    # DTensor caches sharding decisions by mesh, and meshes of the same ranks compare
    # equal unless their dimension names differ: without distinct names the second run
    # would reuse the first mesh, and its group.
    mesh = DeviceMesh.from_group(plain, device.type, mesh_dim_names=("tp_plain",))
    out_ref, params_ref = _tp_step(mesh, device)
    before = ours.stats().get("allreduce:exact", 0)
    mesh = DeviceMesh.from_group(ours, device.type, mesh_dim_names=("tp_coccl",))
    out, params = _tp_step(mesh, device)
    if dist.get_world_size() > 1:  # DTensor issues no collective over a mesh of one rank
        assert ours.stats().get("allreduce:exact", 0) > before  # the TP AllReduces ran on coccl
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    for p, q in zip(params, params_ref, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# --------------------------------------------------- a codec per direction
MXFP6 = {"id": "mx", "element": "e2m3"}  # issue #33's TP recipe: forward ...
NVFP4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}  # ... and backward


def split_group() -> dist.ProcessGroup:
    """MXFP6 on the forward pass's AllReduces, NVFP4 on the backward's, whatever size."""
    return group(compressor=MXFP6, backward_compressor=NVFP4, algorithm="two_shot",
                 min_compress_bytes=0)  # fmt: skip


def reduced(g, parts: list[torch.Tensor], codec: Any) -> torch.Tensor:
    """``parts``' two-shot AllReduce with ``codec``: the group's Communicator called
    directly (collective). Not ``simulate_allreduce``: NVFP4's per-payload scale spans
    what one payload holds, a shard's chunk on a rank, several shards in the simulation."""
    return g.comm.allreduce(parts[dist.get_rank()].clone(), algorithm="two_shot",
                            compressor=codec)  # fmt: skip


class AllReduceBothWays(torch.autograd.Function):
    """All-reduces its input in the forward pass and its gradient in the backward, over
    ``g``; notes every result in ``seen``."""

    @staticmethod
    def forward(ctx, x, g, seen):
        ctx.g, ctx.seen = g, seen
        out = x.clone()
        dist.all_reduce(out, group=g)
        seen.append(out.detach().clone())
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.g)
        ctx.seen.append(grad.clone())
        return grad, None, None


def both_ways(g, x: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    """``[forward result, backward result]`` of one pass through ``AllReduceBothWays``."""
    seen: list[torch.Tensor] = []
    AllReduceBothWays.apply(x.clone().requires_grad_(), g, seen).backward(grad)
    return seen


def test_each_direction_takes_its_codec(device):
    """The forward AllReduce is the group's MXFP6 one, the backward its NVFP4 one,
    bitwise; NVFP4's error is the larger (against the float64 sum)."""
    g, rank = split_group(), dist.get_rank()
    xs = everyone(seed_of("direction", "x"), 3001, torch.float32, device)
    grads = everyone(seed_of("direction", "grad"), 3001, torch.float32, device)
    forward, backward = both_ways(g, xs[rank], grads[rank])
    assert torch.equal(forward, reduced(g, xs, MXFP6))
    assert torch.equal(backward, reduced(g, grads, NVFP4))
    ref = exact_sum(grads)  # NVFP4's 4-bit elements lose more than MXFP6's 6-bit ones
    assert rel_l2(backward, ref) > 2 * rel_l2(reduced(g, grads, MXFP6), ref)
    assert not torch.equal(forward, reduced(g, xs, NVFP4))
    big = torch.ones(1 << 12, device=device)
    assert coccl.torch.describe(g, "all_reduce", big)["compressor"]["element"] == "e2m3"
    assert coccl.torch.describe(g, "all_reduce", big, backward=True)["compressor"]["block"] == 16


def test_options_override_per_direction(device):
    """An override of ``compressor`` alone sets both directions; ``backward_compressor``
    one; ``backward_compressor=None`` the forward's codec in the backward pass."""
    g, rank = split_group(), dist.get_rank()
    xs = everyone(seed_of("override-dir", "x"), 1500, torch.float32, device)
    grads = everyone(seed_of("override-dir", "grad"), 1500, torch.float32, device)
    with coccl.torch.options(g, compressor="int8"):
        seen = both_ways(g, xs[rank], grads[rank])
    assert torch.equal(seen[0], reduced(g, xs, "int8"))
    assert torch.equal(seen[1], reduced(g, grads, "int8"))
    with coccl.torch.options(g, backward_compressor="int8"):
        seen = both_ways(g, xs[rank], grads[rank])
    assert torch.equal(seen[0], reduced(g, xs, MXFP6))
    assert torch.equal(seen[1], reduced(g, grads, "int8"))
    with coccl.torch.options(g, backward_compressor=None):
        seen = both_ways(g, xs[rank], grads[rank])
    assert torch.equal(seen[1], reduced(g, grads, MXFP6))


def test_checkpoint_recomputes_with_the_backward_codec_unless_told(device):
    """Activation checkpointing recomputes the forward in the backward pass, so with the
    backward codec; ``coccl.torch.in_backward``'s recipe (a recompute context that sets
    ``backward_compressor=None``) recomputes what the forward computed."""
    from torch.utils.checkpoint import checkpoint, noop_context_fn  # noqa: PLC0415

    g, rank = split_group(), dist.get_rank()
    xs = everyone(seed_of("checkpoint"), 1500, torch.float32, device)
    forward, backward = reduced(g, xs, MXFP6), reduced(g, xs, NVFP4)

    def recipe():
        return contextlib.nullcontext(), coccl.torch.options(g, backward_compressor=None)

    def block(t: torch.Tensor, seen: list[torch.Tensor]) -> torch.Tensor:
        return AllReduceBothWays.apply(t, g, seen).sin()  # sin keeps the sum for backward

    for context_fn, recomputed in ((noop_context_fn, backward), (recipe, forward)):
        seen: list[torch.Tensor] = []
        x = xs[rank].clone().requires_grad_()
        y = checkpoint(block, x, seen, use_reentrant=False, context_fn=context_fn)
        y.backward(torch.zeros_like(y))
        assert torch.equal(seen[0], forward) and torch.equal(seen[1], recomputed)


def test_ranks_in_different_directions_are_refused(device):
    """Rank 0 all-reduces in a backward pass (a gradient hook), the others outside one:
    the call's agreement (every rank builds a plan: a count no other call has) refuses
    it on every rank at once, naming both codecs."""
    g, rank = split_group(), dist.get_rank()
    x = torch.ones(1234, device=device)
    with pytest.raises(coccl.CocclError, match="do not make the same allreduce") as err:
        if rank == 0:
            y = x.clone().requires_grad_()
            z = y * 1
            z.register_hook(lambda grad: dist.all_reduce(grad.clone(), group=g))
            z.sum().backward()
        else:
            dist.all_reduce(x.clone(), group=g)
    assert "e2m1" in str(err.value) and "e2m3" in str(err.value)


def test_dtensor_tp_takes_each_directions_codec(device):
    """DTensor's TP over the split group: its forward (the row-parallel output's
    AllReduce) and backward (the column-parallel input gradient's) are bitwise those of
    an MXFP6 group whose ``backward()`` runs in an NVFP4 override; the backward differs
    from the MXFP6 group's own."""
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    def step(mesh, backward_override=None) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)
        ).to(device)
        model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).to(device)
        x.requires_grad_()
        out = model(x)
        with backward_override or contextlib.nullcontext():
            out.pow(2).mean().backward()
        grads = [p.grad.to_local() for p in model.parameters()]
        return [out.detach(), x.grad, *grads]

    mxfp6 = group(compressor=MXFP6, algorithm="two_shot", min_compress_bytes=0)
    # DTensor caches its sharding decisions by mesh, and meshes of the same ranks
    # compare equal unless their dimension names differ
    split = step(DeviceMesh.from_group(split_group(), device.type, mesh_dim_names=("split",)))
    mesh = DeviceMesh.from_group(mxfp6, device.type, mesh_dim_names=("mxfp6",))
    want = step(mesh, coccl.torch.options(mxfp6, compressor=NVFP4))
    assert all(torch.equal(a, b) for a, b in zip(split, want, strict=True))
    one_codec = step(mesh)
    assert torch.equal(split[0], one_codec[0])  # the same forward
    assert not torch.equal(split[1], one_codec[1])  # another backward AllReduce


# ------------------------------------------- what torch's own backends accept
STRIDED = {
    "every other column": lambda t: t.reshape(6, 10)[:, ::2],
    "transposed": lambda t: t.reshape(6, 10).t(),
    "a view at an offset": lambda t: t[7:37],
}


@pytest.mark.parametrize("layout", list(STRIDED))
def test_strided_tensors_are_copied_in_and_out(device, layout):
    """A non-contiguous tensor runs as Gloo's and NCCL's would: a contiguous copy in and
    out, counted in ``copied:<collective>`` (a contiguous view runs in place, uncopied);
    the storage around the view is untouched."""
    g = group()
    parts = everyone(seed_of("strided", layout), 60, torch.float64, device)
    base = parts[dist.get_rank()].clone()
    view = STRIDED[layout](base)
    before = coccl.torch.stats(g).get("copied:allreduce", 0)
    dist.all_reduce(view, group=g)
    want = base.clone()
    STRIDED[layout](want).copy_(STRIDED[layout](exact_sum(parts).to(device)))
    assert torch.equal(base, want)
    copies = 0 if view.is_contiguous() else 1
    assert coccl.torch.stats(g).get("copied:allreduce", 0) == before + copies


def test_strided_output_of_reduce_scatter_and_all_gather(device):
    g = group()
    n, rank = dist.get_world_size(), dist.get_rank()
    parts = everyone(seed_of("strided-rs"), 4 * n, torch.float64, device)
    out = torch.zeros(4, 2, dtype=torch.float64, device=device)
    dist.reduce_scatter_tensor(out[:, 0], parts[rank], group=g)
    assert torch.equal(out[:, 0].cpu(), exact_sum(parts)[4 * rank : 4 * rank + 4])
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))
    gathered = torch.zeros(n * 3, 2, dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(gathered[:, 1], parts[rank][:3], group=g)
    assert torch.equal(gathered[:, 1].cpu(), torch.cat([p[:3].cpu() for p in parts]))


@pytest.mark.parametrize("shape", [(), (0,), (0, 3)], ids=str)
def test_scalars_and_empty_tensors(device, shape):
    g = group()
    n = dist.get_world_size()
    t = torch.full(shape, float(dist.get_rank() + 1), device=device)
    dist.all_reduce(t, group=g)
    assert t.shape == shape
    assert torch.equal(t, torch.full(shape, float(n * (n + 1) // 2), device=device))


def test_stats_and_describe(device):
    """The public counters and ``describe`` of a group: what a call will run."""
    g = group(compressor="taco", algorithm="two_shot")
    big = torch.ones(1 << 16, device=device)
    plan = coccl.torch.describe(g, "all_reduce", big)
    assert plan["path"] == "compressed"
    assert plan["compressor"]["id"] == "taco"
    # what carries the bytes: NCCL, or the backend's own Gloo group (under either launcher)
    assert plan["transport"] == ("nccl" if plan["route"] == "nccl" else "gloo")
    assert plan["algorithm"] == "two_shot"
    assert coccl.torch.describe(g, "all_reduce", torch.ones(4, device=device))["path"] == "exact"
    assert coccl.torch.describe(g, "all_reduce", big, dist.ReduceOp.MAX)["path"] == "exact"
    with coccl.torch.options(g, compressor="identity"):
        assert coccl.torch.describe(g, "all_reduce", big)["path"] == "exact"
    with pytest.raises(ValueError, match="not 'broadcast'"):
        coccl.torch.describe(g, "broadcast", big)
    dist.all_reduce(big, group=g)
    counters = coccl.torch.stats(g)
    assert counters["allreduce:compressed"] >= 1
    assert "comm:bytes_sent" in counters
    with pytest.raises(TypeError, match="not a coccl group"):
        coccl.torch.stats(checker())


@pytest.mark.parametrize("call", ["broadcast", "reduce", "gather", "scatter"])
def test_rooted_calls_of_the_communicator_over_gloo(device, call):
    """A coccl group's Communicator runs the rooted collectives over its Gloo transport."""
    g = group()
    n, rank, root = dist.get_world_size(), dist.get_rank(), dist.get_world_size() - 1
    parts = everyone(seed_of("rooted", call), 5 * n, torch.float64, device)
    x = parts[rank].clone()
    result = getattr(g.comm, call)(x, root=root)
    if call == "broadcast":
        assert torch.equal(x, parts[root])
    elif call == "scatter":
        assert torch.equal(result, parts[root][5 * rank : 5 * rank + 5])
    elif rank != root:
        assert result is None
    elif call == "reduce":
        assert torch.allclose(result.cpu(), exact_sum(parts), rtol=1e-12)
    else:
        assert torch.equal(result.cpu(), torch.cat([p.cpu() for p in parts]))
