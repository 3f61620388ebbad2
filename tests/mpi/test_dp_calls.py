"""The data-parallel calls on 1-4 ranks: all-to-all (equal and uneven splits, empty
blocks, a split that does not match), the hierarchical AllReduce and ReduceScatter over
emulated nodes (COCCL_LOCAL_SIZE), sub-communicators, and the salts of a stochastic codec."""

import math

import numpy as np
import pytest
from mpi4py import MPI

import coccl
from coccl.compressors import get_compressor

from conftest import all_equal_across_ranks, case_seed, communicator, gpu_per_rank, rank_data

F32 = np.dtype(np.float32)
U = float(np.finfo(np.float32).eps) / 2
STOCHASTIC = {"id": "int", "bits": 4, "rounding": "stochastic", "seed": 7}


def split_matrix(n: int, kind: str) -> list[list[int]]:
    """``m[r][d]``: the elements rank r sends rank d (uneven: some blocks empty, some
    not a multiple of the codec's group)."""
    if kind == "equal":
        return [[130] * n for _ in range(n)]
    return [[((3 * r + d) % 4) * 67 for d in range(n)] for r in range(n)]


def roundtrip_bound(codec, block: np.ndarray) -> float:
    c = get_compressor(codec)
    norm = float(np.linalg.norm(block.astype(np.float64)))
    return (c.rel_error_bound * (1 + U) + U) * norm + math.sqrt(block.size) * c.abs_error_floor


HADAMARD = {"id": "int", "bits": 4, "hadamard": 32}
A2A_CODECS = {"identity": "identity", "int8": "int8", "taco": "taco", "int4_h32": HADAMARD,
              "int4_sr": STOCHASTIC}  # fmt: skip


@pytest.mark.parametrize("kind", ["equal", "uneven"])
@pytest.mark.parametrize("codec", list(A2A_CODECS.values()), ids=list(A2A_CODECS))
def test_alltoall(comm, codec, kind):
    n, r = comm.size, comm.rank
    m = split_matrix(n, kind)
    seed = case_seed("alltoall", codec, kind)
    xs = [rank_data(seed, s, sum(m[s]), F32) for s in range(n)]
    counts = (
        {} if kind == "equal" else {"send_counts": m[r], "recv_counts": [m[s][r] for s in range(n)]}
    )
    out = comm.alltoall(xs[r], compressor=codec, **counts)
    again = comm.alltoall(xs[r], compressor=codec, **counts)  # the cached plan
    if codec is not STOCHASTIC:  # a stochastic codec's next call draws another stream
        np.testing.assert_array_equal(again, out)
    start = 0
    for s in range(n):
        offset = sum(m[s][:r])
        block = xs[s][offset : offset + m[s][r]]
        slot = out[start : start + block.size]
        start += block.size
        if codec == "identity":
            np.testing.assert_array_equal(slot, block)
        else:
            err = float(np.linalg.norm(slot.astype(np.float64) - block.astype(np.float64)))
            assert err <= roundtrip_bound(codec, block)
    assert start == out.size


def test_alltoall_mismatch_raises_everywhere(comm):
    """Rank 0 expects one more element from the last rank than it sends: every rank
    raises, naming it, and the communicator still works (no byte moved)."""
    n, r = comm.size, comm.rank
    sends = [2] * n
    recvs = [3 if (r == 0 and s == n - 1) else 2 for s in range(n)]
    x = np.arange(2 * n, dtype=F32)
    with pytest.raises(
        coccl.CocclError, match=f"rank {n - 1} sends 2 elements to rank 0, which expects 3"
    ):
        comm.alltoall(x, send_counts=sends, recv_counts=recvs)
    after = comm.alltoall(x, send_counts=sends, recv_counts=sends)
    np.testing.assert_array_equal(after, np.tile(x[2 * r : 2 * r + 2], n))


@pytest.mark.parametrize("other", ["allreduce", "allgather with a state", "split"])
def test_alltoall_beside_another_call_raises_everywhere(comm, other):
    """Rank 0 makes an alltoall where the others make another call (whose agreement
    takes two exchanges, or one): every rank raises CocclError at once, neither an
    AttributeError nor a wait for COCCL_TIMEOUT_S, and the ranks' calls stay paired."""
    n, r = comm.size, comm.rank
    if n == 1:
        pytest.skip("needs two ranks")
    x = np.arange(2 * n, dtype=F32)
    with pytest.raises(coccl.CocclError, match="alltoall|another call"):
        if r == 0:
            comm.alltoall(x, compressor="int8")
        elif other == "allreduce":
            comm.allreduce(x)
        elif other == "split":
            comm.split(0)
        else:
            comm.allgather(x, compressor="int8", delta=coccl.DeltaState())
    np.testing.assert_array_equal(comm.allreduce(x), x * n)


def local_size(n: int) -> int:
    return 2 if n % 2 == 0 else 1


@pytest.fixture(scope="module")
def two_level():
    """Nodes of two ranks (one rank a node on an odd count): 2 x 2 on four ranks."""
    with communicator(COCCL_LOCAL_SIZE=local_size(MPI.COMM_WORLD.Get_size())) as c:
        yield c


def level_data(seed: int, rank: int, count: int, codec) -> np.ndarray:
    if codec == "identity":  # integers: every summation order is exact
        rng = np.random.default_rng([seed, rank])
        return rng.integers(-9, 10, size=count).astype(F32)
    return rank_data(seed, rank, count, F32)


INT4 = {"id": "int", "bits": 4}
LEVEL_CODECS = {  # one codec for both levels, or (intra, inter)
    "identity": "identity",
    "int8": "int8",
    "int8+taco": ("int8", "taco"),
    "int8+int4": ("int8", INT4),
    "int8+int4sr": ("int8", STOCHASTIC),  # stochastic across nodes: ranks still bitwise equal
}


# 255, 1000, 10007: a leftover after the node's whole groups (all of it at 255)
@pytest.mark.parametrize("count", [0, 1, 255, 1000, 10007])
@pytest.mark.parametrize("codec", list(LEVEL_CODECS.values()), ids=list(LEVEL_CODECS))
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_hierarchical(two_level, collective, codec, count):
    comm = two_level
    n, r = comm.size, comm.rank
    total = count * n if collective == "reduce_scatter" else count
    seed = case_seed("hierarchical", collective, str(codec), count)
    xs = [level_data(seed, s, total, codec) for s in range(n)]
    out = getattr(comm, collective)(xs[r], algorithm="hierarchical", compressor=codec)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    if collective == "reduce_scatter":
        exact = exact[r * count : (r + 1) * count]
    else:
        assert all_equal_across_ranks(out)
    if codec == "identity":
        np.testing.assert_array_equal(out, exact.astype(F32))
        return
    nodes, local = n // local_size(n), local_size(n)
    two = nodes > 1 and local > 1
    q = (4 if two else 2) if collective == "allreduce" else (2 if two else 1)
    described = comm.describe(collective, xs[r], algorithm="hierarchical", compressor=codec)
    assert described["quantizations"].startswith(f"{q} per element")
    worst = max(
        get_compressor(c).rel_error_bound for c in (codec if isinstance(codec, tuple) else (codec,))
    )
    energy = math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in xs))
    bound = (worst * (1 + worst) ** q + 2 * U) * math.sqrt(q) + (n + 1) * U * math.sqrt(n)
    assert float(np.linalg.norm(out.astype(np.float64) - exact)) <= bound * energy


def test_hierarchical_refuses_a_layout_that_does_not_divide():
    n = MPI.COMM_WORLD.Get_size()
    with communicator(COCCL_LOCAL_SIZE=n + 1) as comm:
        with pytest.raises(ValueError, match="does not divide"):
            comm.allreduce(np.ones(4, F32), algorithm="hierarchical", compressor="int8")
        comm.barrier()


@pytest.mark.parametrize("undefined", [False, True])
def test_split_into_halves(comm, undefined):
    """Two halves (reversed by key), each running an AllReduce of its own; with
    ``undefined``, the last rank joins none."""
    n, r = comm.size, comm.rank
    color = r * 2 // n
    out_of_it = undefined and r == n - 1
    sub = comm.split(None if out_of_it else color, key=-r)
    if out_of_it:
        assert sub is None
        return
    members = [s for s in range(n) if s * 2 // n == color and not (undefined and s == n - 1)]
    try:
        assert sub.size == len(members)
        assert sub.rank == sorted(members, reverse=True).index(r)
        seed = case_seed("split", undefined)
        y = sub.allreduce(rank_data(seed, r, 300, F32), compressor="int8", algorithm="two_shot")
        exact = np.sum([rank_data(seed, s, 300, F32).astype(np.float64) for s in members], axis=0)
        assert float(np.linalg.norm(y - exact)) <= 0.05 * float(np.linalg.norm(exact)) + 1e-6
    finally:
        sub.close()


def test_stochastic_codec_draws_per_rank_and_call(comm):
    """Every rank gathers the same data through a stochastic codec: each rank's slot
    is its own random stream (slots differ on two ranks or more), a second call draws
    anew, and another new communicator's first call repeats the first's bitwise (the
    call numbers count each communicator's stochastic calls from its first)."""
    n = comm.size
    x = rank_data(case_seed("stochastic"), 0, 1000, F32)  # the same on every rank
    with communicator() as new:
        first = new.allgather(x, compressor=STOCHASTIC, algorithm="two_shot")
        second = new.allgather(x, compressor=STOCHASTIC, algorithm="two_shot")
    assert all_equal_across_ranks(first)
    slots = first.reshape(n, -1)
    assert all(not np.array_equal(slots[0], slots[s]) for s in range(1, n))
    assert not np.array_equal(first, second)
    with communicator() as fresh:
        again = fresh.allgather(x, compressor=STOCHASTIC, algorithm="two_shot")
    np.testing.assert_array_equal(again, first)
    reduced = comm.allreduce(x, compressor=STOCHASTIC, algorithm="ring")
    assert all_equal_across_ranks(reduced)


def test_stochastic_calls_of_two_signatures_draw_apart():
    """Two calls of different signatures (here their counts) are two calls of the
    communicator: the second does not repeat the first's random streams on the data
    they share (a count of calls per signature would start both at 0)."""
    x = rank_data(case_seed("two signatures"), 0, 1024, F32)
    with communicator() as fresh:
        n = fresh.size
        first = fresh.allgather(x, compressor=STOCHASTIC, algorithm="two_shot")
        shorter = fresh.allgather(x[:1000], compressor=STOCHASTIC, algorithm="two_shot")
    common = first.reshape(n, -1)[:, :1000]
    assert not np.array_equal(shorter.reshape(n, -1), common)


def _cupy():
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


CP = _cupy()
DEVICE_CALLS = ["alltoall", "hierarchical allreduce", "hierarchical reduce_scatter", "stochastic"]


def run_call(comm, name: str, x, counts):
    """One of ``DEVICE_CALLS`` on ``comm`` (chunks fixed, so the salts' order is too)."""
    chunk = 65536
    if name == "alltoall":
        return comm.alltoall(x, compressor="int8", chunk_bytes=chunk, **counts)
    if name == "stochastic":
        return comm.allgather(x, compressor=STOCHASTIC, algorithm="two_shot", chunk_bytes=chunk)
    collective = name.split()[1]
    return getattr(comm, collective)(
        x, algorithm="hierarchical", compressor=("int8", "taco"), chunk_bytes=chunk
    )


@pytest.mark.skipif(CP is None, reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("backend", ["mpi", pytest.param("nccl", marks=gpu_per_rank())])
@pytest.mark.parametrize("name", DEVICE_CALLS)
def test_device_equals_host_bitwise(comm, name, backend):
    """Device data (staged over MPI, or over NCCL with a GPU per rank) gives bitwise the
    host's result, on the same emulated nodes; both on new communicators, so a
    stochastic codec's call numbers match too."""
    n, r = comm.size, comm.rank
    m = split_matrix(n, "uneven")
    counts = {"send_counts": m[r], "recv_counts": [m[s][r] for s in range(n)]}
    count = sum(m[r]) if name == "alltoall" else 64 * 1024 * n + 37 * n
    x = rank_data(case_seed("device", name), r, count, F32)
    with communicator(COCCL_LOCAL_SIZE=local_size(n)) as on_host:
        host = run_call(on_host, name, x, counts)
    with communicator(backend, COCCL_LOCAL_SIZE=local_size(n)) as dev:
        got = CP.asnumpy(run_call(dev, name, CP.asarray(x), counts))
    np.testing.assert_array_equal(got.view(np.uint8), host.view(np.uint8))


@pytest.mark.skipif(CP is None, reason="needs CuPy and a CUDA GPU")
@gpu_per_rank()
def test_split_over_nccl_has_its_own_nccl(comm):
    with communicator("nccl") as parent:
        sub = parent.split(parent.rank * 2 // parent.size)
        try:
            assert sub.backend == "nccl"
            x = rank_data(case_seed("split nccl"), parent.rank, 5000, F32)
            got = CP.asnumpy(sub.allreduce(CP.asarray(x), compressor="int8", algorithm="two_shot"))
            host = comm.split(comm.rank * 2 // comm.size)
            try:
                want = host.allreduce(x, compressor="int8", algorithm="two_shot")
            finally:
                host.close()
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        finally:
            sub.close()
