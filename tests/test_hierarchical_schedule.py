"""The hierarchical schedules (algorithms/hierarchical.py) in one process
(tests/schedule_sim.py), on 1-4 ranks in nodes of ``local_size`` (4 ranks = 2 x 2, 4 x 1
and 1 x 4): AllReduce ends bitwise equal on every rank, ReduceScatter leaves shard r on
rank r as the flat one does; the identity codec is exact against the float64 reference;
a lossy codec stays within its bound for the quantizations the module docstring counts.
"""

import math

import numpy as np
import pytest
from schedule_cases import (  # noqa: F401  (one_numba_thread: an autouse fixture)
    BF16,
    CODECS,
    DTYPES,
    F32,
    F64,
    integer_data,
    no_leaks,
    normal_data,
    one_numba_thread,
    plans,
    reduction_bound,
    rel_error,
)
from schedule_sim import run_ranks

from coccl.algorithms.hierarchical import HierarchicalArgs, allreduce, reduce_scatter
from coccl.compressors import get_compressor
from coccl.core.arrays import accumulate_dtype

STOCHASTIC = {"id": "int", "bits": 4, "rounding": "stochastic", "seed": 7}
# (intra, inter): the 8-bit / 4-bit recipe, its stochastic form, stochastic at both levels
# and inside the node only
PAIRS = [
    ("int8", {"id": "int", "bits": 4}),
    ("int8", STOCHASTIC),
    (STOCHASTIC, STOCHASTIC),
    (STOCHASTIC, "int8"),
]
PAIR_IDS = ["int8+int4", "int8+int4sr", "int4sr+int4sr", "int4sr+int8"]
# (ranks, local_size): one rank, one rank a node, one node, and 2 x 2
LAYOUTS = [(1, 1), (2, 1), (3, 3), (4, 2), (4, 4)]
LEVELS = [("two_shot", "two_shot"), ("ring", "ring"), ("ring", "two_shot")]
COUNTS = [0, 1, 3, 130, 700]  # < ranks, odd (a tail), not multiples of the group size, chunks


def _plans(n, local, codec, dtype, levels, op="sum"):
    intra, inter = levels
    return plans(
        n, codec, dtype, op=op, chunk_elems=128, cls=HierarchicalArgs, local_size=local,
        inter_codec=get_compressor(codec), intra_algorithm=intra, inter_algorithm=inter,
    )  # fmt: skip


def _quantizations(collective, levels, nodes, local):
    """The module docstring's count."""
    per = {
        ("allreduce", "two_shot"): lambda k: 2,
        ("allreduce", "ring"): lambda k: k,
        ("reduce_scatter", "two_shot"): lambda k: 1 if k > 1 else 0,
        ("reduce_scatter", "ring"): lambda k: k - 1,
    }
    intra, inter = levels
    if nodes == 1:
        return per[(collective, intra)](local)
    if local == 1:
        return per[(collective, inter)](nodes)
    if collective == "allreduce":
        return per[("reduce_scatter", intra)](local) + per[(collective, inter)](nodes) + 1
    return per[(collective, intra)](local) + per[(collective, inter)](nodes)


def _exact(xs, op, n):
    """The float64 reduction, and for identity's bitwise check the result as the
    schedules compute it on these small integers (exact partial sums; avg divided once,
    in the accumulate type)."""
    acc = accumulate_dtype(xs[0].dtype)
    stack = np.stack([x.astype(F64) for x in xs]) if xs[0].size else np.zeros((n, 0))
    if op == "max":
        exact = stack.max(0)
    elif op == "prod":
        exact = stack.prod(0)
    else:
        exact = stack.sum(0)
    if op == "avg":
        exact = (exact.astype(acc) / acc.type(n)).astype(F64)
    return exact


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("levels", LEVELS, ids="+".join)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("codec", CODECS)
def test_allreduce(codec, layout, levels, count):
    n, local = layout
    for dtype in (F32, BF16) if codec != "identity" else (F32, BF16, F64):
        rng = np.random.default_rng(count * 10 + n)
        data = integer_data if codec == "identity" else normal_data
        xs = [data(rng, count, dtype) for _ in range(n)]
        outs = [np.full(count, np.nan, dtype) for _ in range(n)]
        ps = _plans(n, local, codec, dtype, levels)
        run_ranks([allreduce(ps[r], xs[r], outs[r]) for r in range(n)], seed=count)
        assert no_leaks(ps)
        for r in range(1, n):  # every rank bitwise equal
            np.testing.assert_array_equal(outs[r].view(np.uint8), outs[0].view(np.uint8))
        exact = _exact(xs, "sum", n)
        if codec == "identity":
            np.testing.assert_array_equal(outs[0], exact.astype(dtype))
            continue
        energy = math.sqrt(sum(float(np.sum(x.astype(F64) ** 2)) for x in xs))
        q = _quantizations("allreduce", levels, n // local, local)
        assert rel_error(outs[0], exact, energy) <= reduction_bound(ps[0].codec, dtype, n, q)


@pytest.mark.parametrize("op", ["avg", "max", "prod"])
@pytest.mark.parametrize("layout", [(2, 1), (4, 2), (4, 4)], ids=lambda t: f"{t[0]}x{t[1]}")
def test_allreduce_ops_identity(op, layout):
    """avg divides once (by every rank, not per level); max and prod pass through both
    levels; in place (out is x)."""
    n, local = layout
    rng = np.random.default_rng(3)
    xs = [integer_data(rng, 300, F32) for _ in range(n)]
    exact = _exact(xs, op, n)
    ps = _plans(n, local, "identity", F32, ("ring", "two_shot"), op=op)
    run_ranks([allreduce(ps[r], xs[r], xs[r]) for r in range(n)], seed=1)
    for r in range(n):
        np.testing.assert_array_equal(xs[r], exact.astype(F32))


def test_allreduce_avg_lossy_divides_once():
    """With a lossy codec, avg is sum / size: the same error bound, scaled."""
    n, local = 4, 2
    rng = np.random.default_rng(4)
    xs = [normal_data(rng, 1000, F32) for _ in range(n)]
    outs = [np.empty_like(x) for x in xs]
    ps = _plans(n, local, "taco", F32, ("two_shot", "two_shot"), op="avg")
    run_ranks([allreduce(ps[r], xs[r], outs[r]) for r in range(n)], seed=2)
    exact = _exact(xs, "sum", n) / n
    energy = math.sqrt(sum(float(np.sum(x.astype(F64) ** 2)) for x in xs)) / n
    assert rel_error(outs[1], exact, energy) <= reduction_bound(ps[0].codec, F32, n, 4)


@pytest.mark.parametrize("count", [0, 1, 5, 200])
@pytest.mark.parametrize("levels", LEVELS, ids="+".join)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("codec", CODECS)
def test_reduce_scatter_layout_is_the_flat_one(codec, layout, levels, count):
    """Rank r ends with the reduced shard r of ``size`` shards of ``count`` elements."""
    n, local = layout
    for dtype in DTYPES if codec == "identity" else (F32, BF16):
        rng = np.random.default_rng(count + n)
        data = integer_data if codec == "identity" else normal_data
        xs = [data(rng, n * count, dtype) for _ in range(n)]
        outs = [np.full(count, np.nan, dtype) for _ in range(n)]
        ps = _plans(n, local, codec, dtype, levels)
        run_ranks([reduce_scatter(ps[r], xs[r], outs[r]) for r in range(n)], seed=count)
        assert no_leaks(ps)
        exact = _exact(xs, "sum", n)
        q = _quantizations("reduce_scatter", levels, n // local, local)
        for r in range(n):
            shard = exact[r * count : (r + 1) * count]
            if codec == "identity":
                np.testing.assert_array_equal(outs[r], shard.astype(dtype))
                continue
            parts = [x[r * count : (r + 1) * count].astype(F64) for x in xs]
            energy = math.sqrt(sum(float(np.sum(p**2)) for p in parts))
            assert rel_error(outs[r], shard, energy) <= reduction_bound(ps[0].codec, dtype, n, q)


def test_phases_talk_inside_the_node_then_across():
    """2 x 2: intra rounds exchange with the other rank of the node, inter rounds with
    the rank of the same local index in the other node; the tags of the three phases
    follow each other."""
    ps = _plans(4, 2, "taco", F32, ("two_shot", "two_shot"))
    x = np.ones(1000, F32)
    rounds = list(allreduce(ps[3], x, np.empty_like(x)))  # rank 3: node 1, index 1
    peers = {}
    for rnd in rounds:
        level = "intra" if " intra " in rnd.label else "inter" if " inter " in rnd.label else "join"
        peers.setdefault(level, set()).update(p for p, _ in rnd.sends + rnd.recvs)
    assert peers == {"intra": {2}, "inter": {1}, "join": set()}
    tags = [rnd.tag for rnd in rounds]
    assert tags == sorted(tags) and len(set(tags)) == len(tags)


@pytest.mark.parametrize("local", [3, 0, -1, 2.0])
def test_refuses_unequal_nodes(local):
    ps = _plans(4, 1, "identity", F32, ("ring", "ring"))
    ps[0].local_size = local
    with pytest.raises(ValueError, match="local_size|equal size"):
        allreduce(ps[0], np.zeros(4, F32), np.zeros(4, F32))


def test_refuses_unknown_level_algorithm_and_bad_counts():
    ps = _plans(4, 2, "identity", F32, ("ring", "native"))
    with pytest.raises(ValueError, match="native"):
        reduce_scatter(ps[0], np.zeros(8, F32), np.zeros(2, F32))
    ps = _plans(4, 2, "identity", F32, ("ring", "ring"))
    with pytest.raises(ValueError, match="4 x 2"):
        reduce_scatter(ps[0], np.zeros(9, F32), np.zeros(2, F32))


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_allreduce_float64_through_a_lossy_codec(codec):
    n, local = 4, 2
    rng = np.random.default_rng(6)
    xs = [normal_data(rng, 700, F64) for _ in range(n)]
    outs = [np.empty_like(x) for x in xs]
    ps = _plans(n, local, codec, F64, ("two_shot", "two_shot"))
    run_ranks([allreduce(ps[r], xs[r], outs[r]) for r in range(n)], seed=3)
    for r in range(1, n):
        np.testing.assert_array_equal(outs[r], outs[0])
    energy = math.sqrt(sum(float(np.sum(x**2)) for x in xs))
    bound = reduction_bound(ps[0].codec, np.float32, n, 4)  # float32 arithmetic inside
    assert rel_error(outs[0], _exact(xs, "sum", n), energy) <= bound


def _pair_plans(n, local, pair, levels, dtype=F32):
    intra, inter = pair
    return plans(
        n, intra, dtype, chunk_elems=128, cls=HierarchicalArgs, local_size=local,
        inter_codec=get_compressor(inter), intra_algorithm=levels[0], inter_algorithm=levels[1],
    )  # fmt: skip


def _worse(pair):
    """The codec of the pair with the larger error bound (the bound both levels obey)."""
    return max((get_compressor(c) for c in pair), key=lambda c: c.rel_error_bound)


@pytest.mark.parametrize("count", [0, 1, 255, 10007])  # 255, 10007: a leftover after the shards
@pytest.mark.parametrize("levels", LEVELS, ids="+".join)
@pytest.mark.parametrize("layout", [(4, 2), (6, 3)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_allreduce_codec_pair_ends_bitwise_equal(pair, layout, levels, count):
    """A codec per level, stochastic rounding at either: every rank ends bitwise equal
    (the encodes several ranks make alike share a stream), within the bound of the
    quantizations the module docstring counts."""
    n, local = layout
    rng = np.random.default_rng(count + n)
    xs = [normal_data(rng, count, F32) for _ in range(n)]
    outs = [np.full(count, np.nan, F32) for _ in range(n)]
    ps = _pair_plans(n, local, pair, levels)
    run_ranks([allreduce(ps[r], xs[r], outs[r]) for r in range(n)], seed=count)
    assert no_leaks(ps)
    for r in range(1, n):
        np.testing.assert_array_equal(outs[r].view(np.uint8), outs[0].view(np.uint8))
    energy = math.sqrt(sum(float(np.sum(x.astype(F64) ** 2)) for x in xs))
    q = _quantizations("allreduce", levels, n // local, local)
    assert rel_error(outs[0], _exact(xs, "sum", n), energy) <= reduction_bound(
        _worse(pair), F32, n, q
    )


@pytest.mark.parametrize("count", [0, 1, 255, 2501])
@pytest.mark.parametrize("levels", LEVELS, ids="+".join)
@pytest.mark.parametrize("layout", [(4, 2), (6, 3)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_reduce_scatter_codec_pair(pair, layout, levels, count):
    """ReduceScatter with a codec per level: no element is reduced by two ranks, so each
    shard is its owner's alone; it stays within the bound of its quantizations."""
    n, local = layout
    rng = np.random.default_rng(count + n)
    xs = [normal_data(rng, n * count, F32) for _ in range(n)]
    outs = [np.full(count, np.nan, F32) for _ in range(n)]
    ps = _pair_plans(n, local, pair, levels)
    run_ranks([reduce_scatter(ps[r], xs[r], outs[r]) for r in range(n)], seed=count)
    assert no_leaks(ps)
    exact = _exact(xs, "sum", n)
    q = _quantizations("reduce_scatter", levels, n // local, local)
    for r in range(n):
        parts = [x[r * count : (r + 1) * count].astype(F64) for x in xs]
        energy = math.sqrt(sum(float(np.sum(p**2)) for p in parts))
        shard = exact[r * count : (r + 1) * count]
        assert rel_error(outs[r], shard, energy) <= reduction_bound(_worse(pair), F32, n, q)


def _record_salts(ps, log, monkeypatch):
    """Log (salt, input bytes) of every stochastic encode of every rank's plans (whose
    codecs may be one cached instance: each is wrapped once, until the test ends)."""
    codecs = {id(c): c for p in ps for c in (p.codec, p.inter_codec)}
    for codec in codecs.values():
        if codec.stochastic:
            encode = codec.encode_into

            def logged(x, payload, dtype, salt=0, encode=encode):
                log.append((salt, np.ascontiguousarray(x).tobytes()))
                encode(x, payload, dtype, salt=salt)

            monkeypatch.setattr(codec, "encode_into", logged)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
@pytest.mark.parametrize("layout", [(4, 2), (6, 3)], ids=lambda t: f"{t[0]}x{t[1]}")
def test_stochastic_streams_are_shared_only_by_equal_encodes(collective, layout, monkeypatch):
    """Over every rank, two encodes with one salt encode the same bytes: a random stream
    is shared only by ranks that compute the same encode, never by two different ones.
    The AllReduce does share some (its redundant encodes), the ReduceScatter none."""
    n, local = layout
    count = 1001  # a main part of whole groups and a leftover
    rng = np.random.default_rng(5)
    total = n * count if collective == "reduce_scatter" else count
    xs = [normal_data(rng, total, F32) for _ in range(n)]
    outs = [np.empty(count, F32) for _ in range(n)]
    ps = _pair_plans(n, local, (STOCHASTIC, STOCHASTIC), ("two_shot", "two_shot"))
    log = []
    _record_salts(ps, log, monkeypatch)
    schedule = allreduce if collective == "allreduce" else reduce_scatter
    run_ranks([schedule(ps[r], xs[r], outs[r]) for r in range(n)], seed=1)
    inputs = {}
    for salt, data in log:
        assert inputs.setdefault(salt, data) == data, f"salt {salt:#x} drawn for two inputs"
    shared = len(log) - len(inputs)
    assert shared > 0 if collective == "allreduce" else shared == 0


def test_allreduce_refuses_more_ranks_than_stochastic_streams():
    p = HierarchicalArgs(
        rank=0, size=1 << 16, codec=get_compressor("int8"), dtype=F32, op="sum",
        chunk_elems=128, pool=None, label="t", local_size=2, inter_codec=get_compressor(STOCHASTIC),
    )  # fmt: skip
    with pytest.raises(ValueError, match="streams"):
        allreduce(p, np.zeros(4, F32), np.zeros(4, F32))
