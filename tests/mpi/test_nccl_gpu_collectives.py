"""Collectives over the NCCL backend with one GPU per rank, against the same collective
on host data over MPI. Skipped unless every rank can have a GPU of its own (NCCL refuses
two ranks on one GPU; tests/test_nccl.py covers that refusal and the one-rank case).

coccl's schedules do the same arithmetic on every transport, so ring and two-shot give
bitwise the host result; NCCL's own collectives (native) sum in their own order."""

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import coccl

from conftest import (
    STAGING_LIMIT,
    all_equal_across_ranks,
    case_seed,
    gpu_per_rank,
    rank_data,
    stats_at_staging_limit,
)

pytest.importorskip("cupy")
import cupy as cp  # noqa: E402

pytestmark = gpu_per_rank()

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def ncomm():
    # backend="nccl" raises rather than fall back to MPI: the tests run over NCCL
    with coccl.init(MPI.COMM_WORLD, backend="nccl") as c:
        yield c


@pytest.mark.parametrize("count", [0, 1, 5, 4099, 1 << 17])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", ["identity", "int8", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_nccl_equals_host_bitwise(comm, ncomm, collective, algorithm, codec, dtype, count):
    n = comm.size
    if collective == "reduce_scatter":
        count *= n
    seed = case_seed("nccl", collective, algorithm, codec, np.dtype(dtype).name, count)
    x = rank_data(seed, comm.rank, count, dtype)
    host = getattr(comm, collective)(x, algorithm=algorithm, compressor=codec, chunk_bytes=65536)
    dev = getattr(ncomm, collective)(
        cp.asarray(x), algorithm=algorithm, compressor=codec, chunk_bytes=65536
    )
    got = cp.asnumpy(dev)
    np.testing.assert_array_equal(got.view(np.uint8), host.view(np.uint8))
    if collective != "reduce_scatter":
        assert all_equal_across_ranks(got)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_native_nccl_against_float64(ncomm, collective):
    n = ncomm.size
    count = 10007 * (n if collective == "reduce_scatter" else 1)
    parts = [rank_data(11, r, count, np.float32) for r in range(n)]
    got = cp.asnumpy(getattr(ncomm, collective)(cp.asarray(parts[ncomm.rank]), algorithm="native"))
    if collective == "allgather":
        np.testing.assert_array_equal(got, np.concatenate(parts))
        return
    ref = np.sum([p.astype(np.float64) for p in parts], axis=0)
    if collective == "reduce_scatter":
        ref = ref.reshape(n, -1)[ncomm.rank]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("codec", ["identity", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_nccl_staging_stays_within_the_limit(ncomm, collective, algorithm, codec):
    """The streamed engine's window holds what the depth bound counts: the device blocks
    in use stay within COCCL_STAGING_LIMIT_BYTES (it held one round more before)."""
    if ncomm.size == 1:
        pytest.skip("one rank runs no pipeline")
    st = stats_at_staging_limit(collective, algorithm, codec, "nccl", place=cp.asarray)
    peak = st["peak_device_bytes"]
    assert st["peak_pinned_bytes"] == 0, "NCCL sends device memory, nothing is staged"
    assert peak <= STAGING_LIMIT, f"peak {peak} over the limit {STAGING_LIMIT}"
    # an identity AllGather sends from the input and receives into the output: no blocks
    assert (peak == 0) == (collective == "allgather" and codec == "identity")
