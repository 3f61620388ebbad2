"""Point-to-point and all-to-all on coccl groups (coccl/torch/p2p.py, alltoall.py), on 4
ranks: every rank runs these cases in the same order (tests/scripts/torch_ranks.py
under torchrun, launched by tests/test_torch_p2p.py).

Rings of 4 (every rank) and of 3 (ranks 0-2) exchange in both directions at once; the
codec cases, the mismatches and the pipeline run on ranks 0 and 1, the other ranks only
taking part in creating each group (creation is collective over the world). Data is
rank-seeded, so a receiver builds what its peer sent and checks it without
communicating: the identity codec bitwise, a lossy one as the codec's own
decode(encode(chunk)) of every chunk, bitwise, and within its declared bound.
"""

from __future__ import annotations

import math
import zlib
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import coccl
import coccl.torch
from coccl.torch import CocclOptions

TAH = {"id": "tah", "row": 64}
TAH_WINDOW = {**TAH, "window": 3}  # low tokens per 3 tokens: chunks of whole windows
INT6 = {"id": "int", "bits": 6, "group_size": 32}
CPU = torch.device("cpu")
LOSSY = {"p2p_forward": TAH, "p2p_backward": INT6, "min_compress_bytes": 0}
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")


@pytest.fixture(scope="session", autouse=True)
def world() -> None:
    if not dist.is_initialized():
        coccl.torch.init_process_group(timeout=timedelta(seconds=60))
    assert dist.get_world_size() == 4, "these cases run on 4 ranks"


_GROUPS: dict[tuple, dist.ProcessGroup] = {}


def group(ranks: tuple[int, ...], backend: str = "coccl", fresh: bool = False, **options):
    """A group of ``ranks`` (None on the other ranks), one per set of options unless
    ``fresh``: created by every rank in the same order."""
    key = (ranks, backend, tuple(sorted((k, repr(v)) for k, v in options.items())))
    g = None if fresh else _GROUPS.get(key)
    if g is None:
        opts = CocclOptions(**options) if backend == "coccl" else None
        g = dist.new_group(list(ranks), backend=backend, pg_options=opts)
        if not fresh:
            _GROUPS[key] = g
    return g if dist.get_rank() in ranks else None


def data(dtype: torch.dtype, count: int, *seed) -> torch.Tensor:
    """The same tensor on every rank that builds it for ``seed``."""
    rng = np.random.default_rng(zlib.crc32(repr((count, dtype, *seed)).encode()))
    if dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, count).astype(np.bool_))
    if dtype.is_floating_point:
        return torch.from_numpy(rng.standard_normal(count).astype(np.float32)).to(dtype)
    return torch.from_numpy(rng.integers(-1000, 1000, count)).to(dtype)


def roundtrip(config: dict, x: torch.Tensor, chunk_bytes: int = 4 << 20) -> torch.Tensor:
    """What a receiver holds of ``x`` sent with ``config``: each chunk's decode(encode)."""
    codec = coccl.get_compressor(config)
    a = x.numpy()
    elems = max(codec.alignment, (chunk_bytes // 4) // codec.alignment * codec.alignment)
    out = np.empty_like(a)
    for i in range(0, a.size, elems):
        part = a[i : i + elems]
        out[i : i + part.size] = codec.decode(codec.encode(part), count=part.size, dtype=a.dtype)
    return torch.from_numpy(out)


def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / max(ref.double().norm(), 1e-30))


def ring_exchange(g, n: int, dtype: torch.dtype, count: int, tag: str) -> None:
    """One batch_isend_irecv per rank: send to both neighbours, receive from both; each
    direction's message is distinct; every received tensor checked bitwise."""
    me = dist.get_rank(g)
    right, left = (me + 1) % n, (me - 1) % n
    to_right, to_left = data(dtype, count, tag, me, "r"), data(dtype, count, tag, me, "l")
    from_left, from_right = torch.empty_like(to_right), torch.empty_like(to_left)
    ops = [
        dist.P2POp(dist.isend, to_right, group=g, group_peer=right),
        dist.P2POp(dist.irecv, from_left, group=g, group_peer=left),
        dist.P2POp(dist.isend, to_left, group=g, group_peer=left),
        dist.P2POp(dist.irecv, from_right, group=g, group_peer=right),
    ]
    # on two ranks both neighbours are one rank: its message going right pairs first
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(from_left, data(dtype, count, tag, left, "r"))
    assert torch.equal(from_right, data(dtype, count, tag, right, "l"))


# ------------------------------------------------------------------ identity
@pytest.mark.parametrize("ranks", [(0, 1, 2, 3), (0, 1, 2)], ids=["ring4", "ring3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("count", [0, 1, 1001])
def test_identity_rings_both_ways_are_exact(ranks, dtype, count):
    g = group(ranks)
    if g is None:
        return
    before = g.stats()
    ring_exchange(g, len(ranks), dtype, count, "ring")
    after = g.stats()
    moved = sum(after.values()) - sum(before.values())
    assert moved == 4 and not any("compressed" in k for k in after)  # all through coccl


def test_blocking_send_recv_and_a_pair_ring():
    g = group((0, 1))
    if g is None:
        return
    me = dist.get_rank(g)
    x = data(torch.float32, 77, "blocking", 0)
    got = torch.empty(77)
    if me == 0:
        dist.send(x, group=g, group_dst=1)
        dist.recv(got, group=g, group_src=1)
    else:
        dist.recv(got, group=g, group_src=0)
        dist.send(got, group=g, group_dst=0)  # echo
    assert torch.equal(got, x)
    ring_exchange(g, 2, torch.float32, 33, "pair")


def test_coalescing_manager_returns_one_work_for_the_batch():
    """torch versions that coalesce a CUDA batch_isend_irecv call _start_coalescing /
    _end_coalescing: one Work that completes every message of the batch."""
    g = group((0, 1, 2, 3))
    me, n = dist.get_rank(g), 4
    x = data(torch.float32, 50, "coalesced", me)
    got = torch.empty(50)
    with dist._coalescing_manager(g, torch.device("cpu"), async_ops=True) as cm:
        dist.isend(x, group=g, group_dst=(me + 1) % n)
        dist.irecv(got, group=g, group_src=(me - 1) % n)
    cm.wait()
    assert torch.equal(got, data(torch.float32, 50, "coalesced", (me - 1) % n))


def test_strided_tensors_are_copied_in_and_out():
    g = group((0, 1))
    if g is None:
        return
    me = dist.get_rank(g)
    full = data(torch.float32, 6 * 8, "strided").reshape(6, 8)
    if me == 0:
        dist.send(full.t()[1:5], group=g, group_dst=1)  # a non-contiguous view
    else:
        out = torch.zeros(6, 8).t()  # a strided receive buffer
        dist.recv(out[1:5], group=g, group_src=0)
        assert torch.equal(out[1:5], full.t()[1:5])
        assert torch.equal(out[0], torch.zeros(6)) and torch.equal(out[5:], torch.zeros(3, 6))
        assert g.stats()["copied:recv"] >= 1


def test_recv_from_any_source_is_refused():
    g = group((0, 1, 2, 3))
    with pytest.raises(ValueError, match="any source"):
        dist.recv(torch.empty(3), group=g)


# --------------------------------------------------------------------- lossy
def pair_exchange(g, fwd: torch.Tensor, bwd: torch.Tensor) -> torch.Tensor:
    """Rank 0 sends ``fwd`` to rank 1 (forward) while rank 1 sends ``bwd`` to rank 0
    (backward), in one batch; returns what this rank received."""
    me = dist.get_rank(g)
    mine, theirs = (fwd, bwd) if me == 0 else (bwd, fwd)
    got = torch.empty_like(theirs)
    ops = [
        dist.P2POp(dist.isend, mine, group=g, group_peer=1 - me),
        dist.P2POp(dist.irecv, got, group=g, group_peer=1 - me),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


@pytest.mark.parametrize(
    "count, chunk_bytes, forward",
    [(1, None, TAH), (1001, None, TAH), (4099, 4096, TAH), (4099, 4096, TAH_WINDOW)],
)
def test_a_codec_per_direction(count, chunk_bytes, forward):
    """Activations forward with tah, gradients backward with int bits=6 group_size=32:
    each received as the codec's roundtrip of every chunk, within its bound."""
    g = group((0, 1), chunk_bytes=chunk_bytes, **{**LOSSY, "p2p_forward": forward})
    if g is None:
        return
    me = dist.get_rank(g)
    fwd, bwd = data(torch.float32, count, "fwd"), data(torch.float32, count, "bwd")
    got = pair_exchange(g, fwd, bwd)
    config, sent = (INT6, bwd) if me == 0 else (forward, fwd)
    assert torch.equal(got, roundtrip(config, sent, chunk_bytes or 4 << 20))
    if count > 1:
        bound = coccl.get_compressor(config).rel_error_bound
        assert 0 < rel_l2(got, sent) <= bound
    key = "recv_backward:compressed" if me == 0 else "recv_forward:compressed"
    assert g.stats()[key] >= 1


def test_small_and_integer_messages_stay_exact():
    """Below min_compress_bytes (64 KiB by default) and for integers, a lossy direction
    runs exact; from it on, it compresses."""
    g = group((0, 1), p2p_forward=TAH, p2p_backward=INT6)
    if g is None:
        return
    me = dist.get_rank(g)
    for dtype, count in [(torch.float32, 100), (torch.int64, 20000)]:
        fwd, bwd = data(dtype, count, "small", 0), data(dtype, count, "small", 1)
        got = pair_exchange(g, fwd, bwd)
        assert torch.equal(got, bwd if me == 0 else fwd)
    assert not any("compressed" in k for k in g.stats())
    big = data(torch.float32, 16384, "big")  # 64 KiB
    got = pair_exchange(g, big, big)
    assert torch.equal(got, roundtrip(INT6 if me == 0 else TAH, big))
    assert any("compressed" in k for k in g.stats())


def test_options_override_per_call():
    lossy, exact = group((0, 1), **LOSSY), group((0, 1))
    if lossy is None:
        return
    me = dist.get_rank(lossy)
    fwd, bwd = data(torch.float32, 640, "override", 0), data(torch.float32, 640, "override", 1)
    with coccl.torch.options(lossy, p2p_forward="identity", p2p_backward="identity"):
        got = pair_exchange(lossy, fwd, bwd)
    assert torch.equal(got, bwd if me == 0 else fwd)
    with coccl.torch.options(exact, p2p_backward=INT6, min_compress_bytes=0):
        got = pair_exchange(exact, fwd, bwd)
    assert torch.equal(got, roundtrip(INT6, bwd) if me == 0 else fwd)


def test_bad_p2p_options_are_refused():
    with pytest.raises(ValueError):
        CocclOptions(p2p_forward="zstd")
    with pytest.raises(ValueError):
        CocclOptions(compress=("alltoall", "send"))
    with pytest.raises(ValueError):
        with coccl.torch.options(None, p2p_backward={"id": "int", "bits": 1}):
            pass


# ---------------------------------------------------------------- mismatches
@pytest.mark.parametrize("what", ["count", "dtype", "compressor", "tag"])
def test_ends_that_disagree_raise_on_both(what):
    """Rank 0 sends, rank 1 receives something else: both raise CocclError naming it
    (a fresh group each time: the failure leaves a group's Communicator unusable)."""
    g = group((0, 1), fresh=True)
    if g is None:
        return
    me = dist.get_rank(g)
    count = 20 + (what == "count" and me == 1)
    dtype = torch.int32 if what == "dtype" and me == 1 else torch.float32
    tag = 7 if what == "tag" and me == 1 else 0
    codec = "int8" if what == "compressor" and me == 1 else "identity"
    t = data(dtype, count, "mismatch")
    # the posting itself raises where the peer's signature is already there
    with pytest.raises(coccl.CocclError, match=what):
        with coccl.torch.options(g, p2p_forward=codec, min_compress_bytes=0):
            if me == 0:
                work = dist.isend(t, group=g, group_dst=1, tag=tag)
            else:
                work = dist.irecv(t, group=g, group_src=0, tag=tag)
        work.wait()


def test_a_failed_messages_work_is_completed_and_unsuccessful():
    """A point-to-point Work whose message failed is completed (``is_completed()`` True,
    as Gloo's, not a raise), not successful, and ``wait()`` raises its error. Rank 1
    posts before rank 0, so its own post cannot already find rank 0's header."""
    g = group((0, 1), fresh=True)
    order = group((0, 1), backend="gloo")
    if g is None:
        return
    me = dist.get_rank(g)
    t = data(torch.float32, 10, "failed work")
    if me == 1:
        work = dist.irecv(t, group=g, group_src=0, tag=2)
    dist.barrier(group=order)
    if me == 0:
        try:
            work = dist.isend(t, group=g, group_dst=1, tag=1)
        except coccl.CocclError:  # this post found rank 1's header already there
            return
    while not work.is_completed():
        pass
    assert not work.is_success()
    assert isinstance(work.exception(), coccl.CocclError)
    with pytest.raises(coccl.CocclError, match="tag"):
        work.wait()


# ---------------------------------------------------------------- all-to-all
def blocks(n: int, src: int, rows: list[int], width: int, tag: str) -> list[torch.Tensor]:
    return [
        data(torch.float32, r * width, tag, src, d).reshape(r, width) for d, r in enumerate(rows)
    ]


@pytest.mark.parametrize("ranks", [(0, 1, 2, 3), (0, 1, 2)], ids=["4", "3"])
@pytest.mark.parametrize("split", ["equal0", "equal1", "equal3", "uneven"])
def test_all_to_all_single_is_exact(ranks, split):
    """Equal parts of 0, 1, 3 rows, and uneven parts with empty ones, of 5-wide rows; the
    identity group, and a lossy group that does not name alltoall in compress."""
    groups = [group(ranks), group(ranks, compressor="int8", min_compress_bytes=0)]
    for g in groups:
        if g is None:
            return
        n, me = len(ranks), dist.get_rank(g)

        def splits(s: int, n: int = n) -> list[int]:
            return [(s + 2 * d) % 3 for d in range(n)]

        if split == "uneven":
            send, recv = splits(me), [splits(s)[me] for s in range(n)]
        else:
            send = recv = [int(split[-1])] * n
        x = torch.cat(blocks(n, me, send, 5, split))
        out = torch.full((sum(recv), 5), float("nan"))
        args = ([], []) if split != "uneven" else (recv, send)
        dist.all_to_all_single(out, x, *args, group=g)
        expected = torch.cat(
            [blocks(n, s, splits(s) if split == "uneven" else send, 5, split)[me] for s in range(n)]
        )
        assert torch.equal(out, expected)
        assert g.stats()["alltoall:exact"] >= 1


def test_all_to_all_single_compressed():
    """compress naming alltoall: every block arrives as the codec's roundtrip."""
    g = group((0, 1, 2, 3), compressor="int8", compress=("alltoall",), min_compress_bytes=0)
    n, me = 4, dist.get_rank(g)
    rows = [3, 0, 2, 7]
    x = torch.cat(blocks(n, me, [rows[(me + d) % n] for d in range(n)], 64, "lossy"))
    recv = [rows[(s + me) % n] for s in range(n)]
    out = torch.empty(sum(recv), 64)
    send = [rows[(me + d) % n] for d in range(n)]
    dist.all_to_all_single(out, x, recv, send, group=g)
    parts = [blocks(n, s, [rows[(s + d) % n] for d in range(n)], 64, "lossy")[me] for s in range(n)]
    expected = torch.cat([roundtrip("int8", p.reshape(-1)).reshape(p.shape) for p in parts])
    assert torch.equal(out, expected)
    assert g.stats()["alltoall:compressed"] == 1


# ---------------------------------------------------------------- pipelining
def pipeline_losses(
    g, device: torch.device = CPU, steps: int = 4, schedule_name: str = "gpipe"
) -> tuple[list[float], list[torch.Tensor]]:
    """A 2-stage GPipe (or 1F1B) schedule (4 microbatches) of a small MLP trained with
    SGD on ``g``: the last stage's losses per step, and this stage's parameters after."""
    from torch.distributed import pipelining  # noqa: PLC0415
    from torch.distributed.pipelining import PipelineStage  # noqa: PLC0415

    kind = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule_name]

    me = dist.get_rank(g)
    torch.manual_seed(0)
    stages = [
        nn.Sequential(nn.Linear(16, 64), nn.Tanh()),
        nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)),
    ]
    module = stages[me].to(device)
    stage = PipelineStage(module, me, 2, device, group=g)
    schedule = kind(stage, 4, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(32, 16, generator=gen), torch.randn(16, 4, generator=gen)
    x, target = x.to(device), torch.tanh(x @ w).to(device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        if me == 0:
            schedule.step(x)
        else:
            mb: list = []
            schedule.step(target=target, losses=mb)
            losses.append(float(torch.stack(mb).detach().mean()))
        optimizer.step()
    return losses, [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize("schedule_name", ["gpipe", "1f1b"])
def test_pipelining_on_a_coccl_group_matches_gloo_bitwise(schedule_name):
    gloo, exact, lossy = group((0, 1), "gloo"), group((0, 1)), group((0, 1), **LOSSY)
    if gloo is None:
        return
    me = dist.get_rank(gloo)
    plain_losses, plain_params = pipeline_losses(gloo, schedule_name=schedule_name)
    losses, params = pipeline_losses(exact, schedule_name=schedule_name)
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params, strict=True))
    assert exact.stats()[f"send_{'forward' if me == 0 else 'backward'}:exact"] >= 4
    lossy_losses, _ = pipeline_losses(lossy, schedule_name=schedule_name)
    assert lossy.stats()[f"send_{'forward' if me == 0 else 'backward'}:compressed"] >= 4
    if me == 1:
        assert all(math.isfinite(v) for v in lossy_losses)
        assert lossy_losses[-1] < lossy_losses[0]  # it trains
        assert lossy_losses == pytest.approx(plain_losses, rel=0.01)
