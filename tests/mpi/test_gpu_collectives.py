"""Collectives on CuPy (and numba, torch) device arrays over MPI: several ranks may share
one GPU (Open MPI is not CUDA-aware there: pinned host staging). Skipped without a GPU.

The GPU codec kernels are bitwise identical to the CPU ones, and the reduction arithmetic
is the same, so a collective on device data must give bitwise the CPU result."""

import ml_dtypes
import numpy as np
import pytest

from conftest import (
    STAGING_LIMIT,
    all_equal_across_ranks,
    case_seed,
    communicator,
    rank_data,
    stats_at_staging_limit,
)

pytest.importorskip("cupy")
import cupy as cp  # noqa: E402

try:
    if cp.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA GPU", allow_module_level=True)
except Exception:
    pytest.skip("no usable CUDA GPU", allow_module_level=True)

BF16 = np.dtype(ml_dtypes.bfloat16)


def counts(size):
    return [0, 1, size + 1, 4099, 1 << 17]


@pytest.mark.parametrize("count_index", range(5))
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", ["identity", "int8", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_device_equals_host_bitwise(comm, collective, algorithm, codec, dtype, count_index):
    n = comm.size
    count = counts(n)[count_index]
    if collective == "reduce_scatter":
        count *= n
    seed = case_seed("gpu", collective, algorithm, codec, np.dtype(dtype).name, count)
    x = rank_data(seed, comm.rank, count, dtype)
    fn = getattr(comm, collective)
    host = fn(x, algorithm=algorithm, compressor=codec, chunk_bytes=65536)
    dev = fn(cp.asarray(x), algorithm=algorithm, compressor=codec, chunk_bytes=65536)
    assert isinstance(dev, cp.ndarray) and dev.dtype == x.dtype
    got = cp.asnumpy(dev)
    np.testing.assert_array_equal(got.view(np.uint8), host.view(np.uint8))
    if collective != "reduce_scatter":
        assert all_equal_across_ranks(got)


@pytest.mark.parametrize("codec", ["identity", "taco"])
@pytest.mark.parametrize("collective", ["allreduce", "allgather"])
def test_ring_forwards_from_host_copies(comm, collective, codec):
    """Ring AllGather forwards go from the pinned copy their payload arrived in: bitwise
    what forwarding the device copy gives, and every pinned block is back in the pool."""
    count = 70001
    x = cp.asarray(rank_data(case_seed("fwd", collective, codec), comm.rank, count, BF16))
    results = {}
    for forward in (0, 1):
        with communicator(COCCL_FORWARD_FROM_PINNED=forward) as c:
            y = getattr(c, collective)(x, algorithm="ring", compressor=codec, chunk_bytes=8192)
            results[forward] = cp.asnumpy(y)
            assert sum(pool.in_use_bytes for pool in c.pools()) == 0
    np.testing.assert_array_equal(results[1].view(np.uint8), results[0].view(np.uint8))


@pytest.mark.parametrize("codec", ["identity", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_staging_limit_bounds_device_and_pinned_memory(comm, collective, algorithm, codec):
    """For device data the depth keeps pooled device + pinned memory within the limit
    (payloads, their pinned copies, accumulators)."""
    if comm.size == 1:
        pytest.skip("one rank runs no pipeline")
    st = stats_at_staging_limit(collective, algorithm, codec, place=cp.asarray)
    peak = st["peak_pinned_bytes"] + st["peak_device_bytes"]
    assert 0 < st["peak_pinned_bytes"] and peak <= STAGING_LIMIT, f"peak {peak} over the limit"


@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "native", "auto"])
def test_identity_float32_on_device(comm, algorithm):
    parts = [rank_data(3, r, 10007, np.float32) for r in range(comm.size)]
    y = comm.allreduce(cp.asarray(parts[comm.rank]), algorithm=algorithm)
    ref = np.sum([p.astype(np.float64) for p in parts], axis=0)
    np.testing.assert_allclose(cp.asnumpy(y), ref, rtol=1e-5, atol=1e-5)


def test_in_place_and_streams(comm):
    """Input produced on the caller's stream, result read on it: coccl orders itself."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.arange(1 << 20, dtype=cp.float32)
        x *= 1.0  # pending work on the caller's stream
        comm.allreduce(x, x, algorithm="two_shot", compressor="identity")
        total = float(x[12345])
    assert total == 12345.0 * comm.size


def test_numba_device_array_in_and_out(comm):
    from numba import cuda

    x = cuda.to_device(np.ones(1000, dtype=np.float32))
    y = comm.allreduce(x, algorithm="ring")
    assert type(y).__module__.startswith("numba")
    np.testing.assert_array_equal(y.copy_to_host(), np.full(1000, comm.size, np.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_torch_cuda_tensors(comm, dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = torch.ones(4, 250, dtype=getattr(torch, dtype), device="cuda")
    y = comm.allreduce(x, algorithm="two_shot", compressor="taco")
    assert y.dtype == x.dtype and y.device == x.device and y.shape == x.shape
    assert torch.allclose(y.float(), torch.full_like(y.float(), comm.size), rtol=0.07)
