"""The simulated AllReduce against the real one (run on 1-4 ranks): every rank runs the
real ``comm.allreduce`` on its own contribution and ``simulate_allreduce`` on every
rank's (rank-seeded data that every rank can rebuild), and the two must agree bitwise,
for every schedule, codec, dtype, count and chunk size."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from coccl.virtual_ranks import simulate_allreduce

from conftest import all_equal_across_ranks, case_seed, rank_data

BF16 = np.dtype(ml_dtypes.bfloat16)
CODECS = [
    "identity",
    "int8",
    "taco",
    {"id": "taco", "ash": False},
    {"id": "taco", "dual_scale": False},
]
# chunk sizes in bytes: one chunk (None: the default, larger than these messages), and
# small ones that cut every shard into several chunks
CHUNKS = [None, 512, 4096]
# more codecs whose groups are encoded alone, on fewer dtypes (the CI has two cores)
MORE_CODECS = [
    {"id": "mx", "element": "e2m3"},  # MXFP6: E8M0 scales, per block
    {"id": "taco_fp", "element": "e2m1"},
    {"id": "int", "bits": 6, "group_size": 32},
]
# payload-scoped codecs (a group's encoding depends on its payload): the simulation is
# told the chunk, and the real call gets the same one; 1 MiB is a whole shard here
SCOPED_CODECS = [
    {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"},  # NVFP4: S per payload
    {"id": "tah", "row": 64, "tile": 32},
]
SCOPED_CHUNKS = [512, 4096, 1 << 20]
# (codec, chunk_bytes) of the cases on float32 and bfloat16 only
FEWER_DTYPE_CASES = [(c, chunk) for c in MORE_CODECS for chunk in CHUNKS] + [
    (c, chunk) for c in SCOPED_CODECS for chunk in SCOPED_CHUNKS
]


def codec_id(spec: str | dict) -> str:
    if isinstance(spec, str):
        return spec
    return spec["id"] + ":" + ",".join(f"{k}={v}" for k, v in spec.items() if k != "id")


def counts(n: int) -> list[int]:
    """0, 1, fewer than the ranks, not a multiple of the ranks or of a group (several
    groups and chunks per shard), and a whole number of groups per rank (each once: on 1
    and 2 ranks "fewer than the ranks" is 1)."""
    return sorted({0, 1, max(1, n - 1), 7 * n + 3, 4099, 128 * n * 5})


@pytest.mark.parametrize("chunk_bytes", CHUNKS, ids=str)
@pytest.mark.parametrize("count", counts(MPI.COMM_WORLD.Get_size()))
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", CODECS, ids=codec_id)
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_simulation_equals_real_allreduce(comm, algorithm, codec, dtype, count, chunk_bytes):
    n = comm.size
    seed = case_seed("virtual", algorithm, codec_id(codec), np.dtype(dtype).name, count)
    parts = [rank_data(seed, j, count, dtype) for j in range(n)]
    real = comm.allreduce(
        parts[comm.rank], algorithm=algorithm, compressor=codec, chunk_bytes=chunk_bytes
    )
    sim = simulate_allreduce(parts, algorithm=algorithm, compressor=codec, chunk_bytes=chunk_bytes)
    np.testing.assert_array_equal(sim.view(np.uint8), real.view(np.uint8))
    assert all_equal_across_ranks(sim)


@pytest.mark.parametrize("count", counts(MPI.COMM_WORLD.Get_size()))
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(
    ("codec", "chunk_bytes"),
    FEWER_DTYPE_CASES,
    ids=[f"{codec_id(c)}-{chunk}" for c, chunk in FEWER_DTYPE_CASES],
)
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_more_codecs(comm, algorithm, codec, chunk_bytes, dtype, count):
    """The codecs beyond CODECS; a payload-scoped one (SCOPED_CODECS) with one payload per
    (rank, shard, chunk), as the real ranks encode them."""
    test_simulation_equals_real_allreduce(comm, algorithm, codec, dtype, count, chunk_bytes)


def test_payload_scoped_codec_needs_chunk_bytes(comm):
    """Refused on every rank alike, before any work (a real call without chunk_bytes
    cuts by route, which the simulation cannot know)."""
    parts = [rank_data(case_seed("scoped"), j, 1000, np.float32) for j in range(comm.size)]
    if comm.size == 1:  # one payload whatever the chunk: nothing to refuse
        simulate_allreduce(parts, compressor=SCOPED_CODECS[0])
        return
    with pytest.raises(ValueError, match="needs chunk_bytes"):
        simulate_allreduce(parts, compressor=SCOPED_CODECS[0])


@pytest.mark.parametrize("codec", ["identity", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_average(comm, algorithm, codec):
    n = comm.size
    parts = [rank_data(case_seed("avg", algorithm, codec), j, 3001, BF16) for j in range(n)]
    real = comm.allreduce(parts[comm.rank], op="avg", algorithm=algorithm, compressor=codec)
    sim = simulate_allreduce(parts, op="avg", algorithm=algorithm, compressor=codec)
    np.testing.assert_array_equal(sim.view(np.uint8), real.view(np.uint8))


def test_torch_tensors(comm):
    torch = pytest.importorskip("torch")
    n = comm.size
    parts = [
        torch.from_numpy(rank_data(case_seed("torch"), j, 2000, np.float32)).view(4, 500)
        for j in range(n)
    ]
    real = comm.allreduce(parts[comm.rank], algorithm="ring", compressor="int8")
    sim = simulate_allreduce(torch.stack(parts), algorithm="ring", compressor="int8")
    assert sim.shape == (4, 500)
    assert torch.equal(sim, real)
