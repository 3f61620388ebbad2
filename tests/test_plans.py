"""Call plans on one rank: the cache (keys, memory bound, eviction), what ``auto`` runs and
``describe`` reports, and what a failure leaves behind (checks before any byte moves; a
failure after bytes moved makes the communicator refuse every later call)."""

import gc
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import coccl
from coccl.communicator.agreement import disagreement
from coccl.communicator.plans import CallPlan, PlanCache
from coccl.compressors import Compressor


@pytest.fixture
def comm():
    with coccl.init(MPI.COMM_SELF, backend="mpi") as c:
        yield c


def data(n=1000, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# ----------------------------------------------------------------------- the cache
def test_a_repeated_call_reuses_its_plan(comm):
    x = data()
    comm.allreduce(x, algorithm="ring", compressor="taco")
    assert comm.stats()["plans"] == 1
    comm.allreduce(data(seed=1), algorithm="ring", compressor="taco")  # another buffer
    assert comm.stats()["plans"] == 1
    comm.allreduce(data(1001), algorithm="ring", compressor="taco")  # another count
    comm.allreduce(x, algorithm="ring", compressor="int8")  # another codec
    comm.allreduce(x, algorithm="two_shot", compressor="taco")  # another schedule
    comm.allreduce(x.astype(np.float64), algorithm="ring", compressor="taco")  # dtype
    assert comm.stats()["plans"] == 5


def test_plans_follow_the_buffers_of_each_call(comm):
    """A plan holds no buffer of the caller's: every call reads its own x, writes its
    own out, whatever the earlier calls used."""
    for seed in range(4):
        x = data(seed=seed)
        out = np.full_like(x, np.nan)
        y = comm.allreduce(x, out, algorithm="two_shot", compressor="identity")
        assert y is out
        np.testing.assert_array_equal(out, x)


def test_compressor_objects_and_configs_key_their_plans(comm):
    x = data()
    a = coccl.get_compressor("taco", group_size=64)
    b = coccl.get_compressor("taco", group_size=64)
    ya = comm.allreduce(x, algorithm="ring", compressor=a)
    yb = comm.allreduce(x, algorithm="ring", compressor=b)
    yc = comm.allreduce(x, algorithm="ring", compressor={"id": "taco", "group_size": 64})
    np.testing.assert_array_equal(ya, yb)
    np.testing.assert_array_equal(ya, yc)
    yd = comm.allreduce(x, algorithm="ring", compressor={"id": "taco", "group_size": 32})
    assert not np.array_equal(ya, yd)


def _plan(graph_bytes: int, count: int = 1) -> CallPlan:
    return CallPlan(
        collective="allreduce", op="sum", dtype=np.dtype(np.float32), count=count,
        out_count=count, device=0, route="nccl", algorithm="ring",
        codec=coccl.get_compressor("taco"), reason="", requested=("ring", {}),
        chunk_bytes=1, chunk_elems=128, depth=1, link="nvlink", graph_bytes=graph_bytes,
    )  # fmt: skip


def test_plan_cache_evicts_least_recently_used_graphs():
    cache = PlanCache(graph_bytes_limit=100)
    assert cache.add("a", _plan(40)) == []
    assert cache.add("b", _plan(40)) == []
    assert cache.get("a") is not None  # a is now the most recently used
    evicted = cache.add("c", _plan(40))
    assert [p.graph_bytes for p in evicted] == [40]
    assert cache.get("b") is None and cache.get("a") is not None
    assert cache.graph_bytes == 80


def test_a_plan_beyond_the_bound_runs_without_graph():
    cache = PlanCache(graph_bytes_limit=100)
    cache.add("a", _plan(40))
    big = _plan(500)
    assert cache.add("big", big) == []
    assert big.graph_bytes == 0 and "COCCL_PLAN_CACHE_BYTES" in big.graph_reason
    assert cache.graph_bytes == 40


def test_plan_cache_bounds_the_number_of_plans(monkeypatch):
    monkeypatch.setattr("coccl.communicator.plans.MAX_PLANS", 3)
    cache = PlanCache(graph_bytes_limit=100)
    for key in "abcd":
        cache.add(key, _plan(0))
    assert len(cache) == 3 and cache.get("a") is None


def test_disagreement_names_what_differs():
    a, b = _plan(0, count=1000).fingerprint(), _plan(0, count=1001).fingerprint()
    assert disagreement("allreduce", [a, a]) is None
    problem = disagreement("allreduce", [a, b])
    assert "count" in problem and "1000" in problem and "1001" in problem
    refused = disagreement("allreduce", [a, ("error", "TypeError: nope")])
    assert refused == "rank 1 refused this allreduce: TypeError: nope"


# ------------------------------------------------------------------ auto, describe
def test_auto_never_drops_a_named_lossy_codec(comm):
    x = data(64)
    seen = comm.describe("allreduce", x, compressor="taco")
    assert seen["compressor"]["id"] == "taco" and seen["algorithm"] == "two_shot"
    assert "as asked" in seen["reason"]
    y = comm.allreduce(x, compressor="taco")  # one rank: still one encode/decode
    assert not np.array_equal(y, x)
    np.testing.assert_allclose(y, x, rtol=0.1, atol=0.1)


def test_describe_says_what_runs_and_why(comm):
    x = data(64)
    exact = comm.describe("allreduce", x)
    assert exact["algorithm"] == "native" and exact["compressor"] == {"id": "identity"}
    assert exact["transport"] == "mpi" and exact["route"] == "host" and exact["reason"]
    asked = comm.describe("reduce_scatter", x, algorithm="ring", compressor="int8")
    assert asked["algorithm"] == "ring" and asked["reason"] == "as asked"
    with pytest.raises(ValueError, match="unknown op"):
        comm.describe("allreduce", x, op="mean")
    with pytest.raises(ValueError, match="unknown collective"):
        comm.describe("broadcast", x)
    assert comm.stats()["plans"] == 0  # describing moves nothing and caches nothing


# ----------------------------------------------------------------------- failures
def test_read_only_output_is_refused_before_any_byte_moves(comm):
    x = data()
    out = np.empty_like(x)
    out.flags.writeable = False
    for algorithm in ("native", "ring", "two_shot"):
        with pytest.raises(ValueError, match="read-only"):
            comm.allreduce(x, out, algorithm=algorithm)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        comm.allreduce(x, x)  # in place into a read-only input
    np.testing.assert_array_equal(comm.allreduce(x), x)  # still usable


def test_big_endian_data_is_named_as_such(comm):
    with pytest.raises(TypeError, match="big-endian.*byte order"):
        comm.allreduce(np.ones(8, dtype=">f4"))


class _Interrupting(Compressor):
    """A codec whose encode raises KeyboardInterrupt: a failure in the middle of a call
    (passed as an object, never registered: other tests run every registered codec)."""

    codec_id = "test-interrupting"

    def get_config(self):
        return {"id": self.codec_id}

    def encoded_nbytes(self, count, dtype):
        return int(count) * 4

    def encode_into(self, x, payload, dtype):
        raise KeyboardInterrupt

    def decode_into(self, payload, out, dtype, accumulate):
        pass


def test_a_failure_mid_call_leaves_the_communicator_refusing_calls(comm):
    x = data()
    with pytest.raises(KeyboardInterrupt):
        comm.allreduce(x, algorithm="ring", compressor=_Interrupting())
    with pytest.raises(coccl.CocclError, match="unusable after an earlier failure.*Keyboard"):
        comm.allreduce(x)
    comm.close()  # closing a broken communicator still frees it


def test_an_unclosed_communicator_is_freed_and_reported():
    c = coccl.init(MPI.COMM_SELF, backend="mpi")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del c
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)


def test_many_unclosed_communicators_do_not_exhaust_mpi():
    """An MPI library holds ~2000 communicators; dropped ones are freed as they go."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(2500):
            c = coccl.init(MPI.COMM_SELF, backend="mpi")
            c.allreduce(np.ones(2, np.float32))
            del c


def test_auto_table_over_nccl():
    """Over NCCL: identity runs NCCL's own AllReduce at every size (coccl's uncompressed
    schedules never beat it); a lossy codec runs the ring on 2 ranks from 4 MiB over
    NVLink (measured faster there, and still two quantizations), else two-shot."""
    from coccl.algorithms import choose

    taco, identity = coccl.get_compressor("taco"), coccl.get_compressor("identity")
    for link in ("nvlink", "shm", "socket"):
        for nbytes in (8, 1 << 20, 1 << 30):
            assert choose("allreduce", nbytes, identity, "nccl", link, 2).algorithm == "native"
    assert choose("allreduce", 4 << 20, taco, "nccl", "nvlink", 2).algorithm == "ring"
    assert choose("allreduce", 1 << 20, taco, "nccl", "nvlink", 2).algorithm == "two_shot"
    assert choose("allreduce", 64 << 20, taco, "nccl", "nvlink", 4).algorithm == "two_shot"
    assert choose("allreduce", 64 << 20, taco, "nccl", "socket", 2).algorithm == "two_shot"
    assert choose("allreduce", 64 << 20, taco, "nccl", "shm", 2).algorithm == "two_shot"
    assert choose("reduce_scatter", 64 << 20, taco, "nccl", "shm", 2).algorithm == "two_shot"


def test_graph_buffers_of_a_plan():
    """A lossy codec's graph follows the caller's buffers, so it is captured on an input
    and an output of its own; an AllReduce's graph that copies needs one buffer."""
    taco = _plan(0, count=1000)
    assert taco.graph_follows and not taco.graph_in_place
    assert taco.graph_buffer_bytes == 2 * 1000 * 4
    identity = _plan(0, count=1000)
    identity.codec = coccl.get_compressor("identity")
    assert not identity.graph_follows and identity.graph_in_place
    assert identity.graph_buffer_bytes == 1000 * 4
