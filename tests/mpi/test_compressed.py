"""Compressed collectives (int8, taco) on every schedule: error against an exact float64
reduction close to what the quantization model predicts, every rank bitwise identical,
chunking (pipelining) bitwise neutral, any count."""

import math

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import coccl
from coccl.compressors import TacoCompressor

from conftest import (
    STAGING_LIMIT,
    all_equal_across_ranks,
    case_seed,
    rank_data,
    stats_at_staging_limit,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
CODECS = [
    "int8",
    "taco",
    {"id": "taco", "fp8_format": "e5m2"},
    {"id": "taco", "group_size": 32},
    {"id": "taco", "ash": False},
    {"id": "taco", "dual_scale": False},
]


def codec_id(spec) -> str:
    return spec if isinstance(spec, str) else "-".join(f"{v}" for v in spec.values())


def quantizations(collective: str, algorithm: str, n: int) -> float:
    """The model: how many independent quantization errors of relative size e (one
    codec roundtrip) the result carries, in units of e^2 relative to the result.

    two-shot: the n-1 foreign contributions are quantized once each (own data exact):
    e^2 (n-1)/n for the sum; the reduced shard once more: + e^2.
    ring: hop t carries a partial sum of t+1 contributions, quantized each hop:
    e^2 sum_{k=1}^{n-1} k / n = e^2 (n-1)/2 relative to the n-term sum; the gather adds e^2.
    """
    if collective == "allgather":
        return 1.0
    reduce = (n - 1) / n if algorithm == "two_shot" else (n - 1) / 2
    return reduce + (1.0 if collective == "allreduce" else 0.0)


def rel_l2(y, ref) -> float:
    return float(np.linalg.norm(y.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300))


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", CODECS, ids=codec_id)
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_error_matches_model(comm, collective, algorithm, codec, dtype):
    n = comm.size
    c = coccl.get_compressor(codec)
    count = 1 << 16 if collective == "allreduce" else (1 << 14) * n
    local = count if collective != "allgather" else count // n
    seed = case_seed(collective, algorithm, codec_id(codec), np.dtype(dtype).name)
    parts = [rank_data(seed, r, local, dtype) for r in range(n)]
    fn = getattr(comm, collective)
    y = fn(parts[comm.rank], algorithm=algorithm, compressor=codec, chunk_bytes=16384)
    if collective == "allgather":
        ref = np.concatenate([p.astype(np.float64) for p in parts])
    else:
        ref = np.sum([p.astype(np.float64) for p in parts], axis=0)
        if collective == "reduce_scatter":
            m = count // n
            ref = ref[comm.rank * m : (comm.rank + 1) * m]
    err = rel_l2(y, ref)
    model = c.rel_error_typical * math.sqrt(quantizations(collective, algorithm, n))
    # bf16 output adds its own rounding (2^-9 relative) on top of the codec's error
    slack = 0.004 if np.dtype(dtype) == BF16 else 0.0
    assert 0.7 * model - slack <= err <= 1.3 * model + slack, (err, model)
    if collective != "reduce_scatter":
        assert all_equal_across_ranks(y)


# 0, 1, fewer than the ranks, not a multiple of them nor of a group (each once: on 1 and 2
# ranks "fewer than the ranks" is 0 or 1)
N = MPI.COMM_WORLD.Get_size()
ANY_COUNTS = sorted({0, 1, N - 1, N + 1, 127, 129, 1000})


@pytest.mark.parametrize("count", ANY_COUNTS)
@pytest.mark.parametrize("codec", ["int8", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "auto"])
def test_any_count(comm, algorithm, codec, count):
    n = comm.size
    parts = [
        rank_data(case_seed("count", algorithm, codec, count), r, count, np.float32)
        for r in range(n)
    ]
    y = comm.allreduce(parts[comm.rank], algorithm=algorithm, compressor=codec, chunk_bytes=512)
    assert y.shape == (count,) and y.dtype == np.float32
    ref = np.sum([p.astype(np.float64) for p in parts], axis=0)
    if count:
        bound = coccl.get_compressor(codec).rel_error_bound * (n + 1)  # worst case: linear
        assert rel_l2(y, ref) <= bound
    assert all_equal_across_ranks(y)


@pytest.mark.parametrize("codec", ["int8", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_pipelining_is_bitwise_neutral(comm, collective, algorithm, codec):
    n = comm.size
    count = 5000 * n + 37 * (collective == "allreduce")
    x = rank_data(case_seed("pipe", collective, algorithm, codec), comm.rank, count, np.float32)
    fn = getattr(comm, collective)
    whole = fn(x, algorithm=algorithm, compressor=codec, chunk_bytes=1 << 30)
    for chunk in (512, 4096, 65536):
        piped = fn(x, algorithm=algorithm, compressor=codec, chunk_bytes=chunk)
        np.testing.assert_array_equal(whole.view(np.uint32), piped.view(np.uint32))


@pytest.mark.parametrize("codec", ["identity", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_staging_memory_does_not_grow_with_the_message(comm, collective, algorithm, codec):
    """Chunk size and depth set the pipeline's extra memory: a message 8 times longer
    (64 and 512 chunks of 4 KiB per shard) holds about the same pooled memory at its
    peak: a few rounds more in flight is timing, a shard's worth of payloads waiting
    (8 times more) would be the schedule. (One rank has no pipeline: it reduces its
    message in one local step.)"""
    n = comm.size
    if n == 1:
        pytest.skip("one rank runs no pipeline")
    peaks = []
    for count in (65536 * n, 524288 * n):
        x = rank_data(case_seed("mem", collective, count), comm.rank, count, np.float32)
        if collective == "allgather":
            x = x[: count // n]
        comm.reset_stats()
        getattr(comm, collective)(x, algorithm=algorithm, compressor=codec, chunk_bytes=4096)
        peaks.append(comm.stats()["peak_host_bytes"])
    assert peaks[1] <= 2 * peaks[0], f"peak pooled bytes {peaks[0]} -> {peaks[1]}"


@pytest.mark.parametrize("codec", ["identity", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_staging_limit_bounds_the_pools(comm, collective, algorithm, codec):
    """COCCL_STAGING_LIMIT_BYTES bounds the pooled memory a collective holds at its peak:
    the pipeline depth is sized from the pools' real block sizes, the window's payloads
    and accumulators, and the payloads waiting between a chunk's steps. With a 1 MiB
    limit, these chunks make the depth drop from the default 4 to 1-3. (A chunk whose
    one round needs more than the limit runs at depth 1.)"""
    if comm.size == 1:
        pytest.skip("one rank runs no pipeline")
    peak = stats_at_staging_limit(collective, algorithm, codec)["peak_host_bytes"]
    assert peak <= STAGING_LIMIT, f"peak pooled bytes {peak} over the {STAGING_LIMIT}-byte limit"


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_avg_divides_once(comm, codec):
    parts = [rank_data(21, r, 4096, np.float32) for r in range(comm.size)]
    s = comm.allreduce(parts[comm.rank], op="sum", algorithm="two_shot", compressor=codec)
    a = comm.allreduce(parts[comm.rank], op="avg", algorithm="two_shot", compressor=codec)
    ref = np.mean([p.astype(np.float64) for p in parts], axis=0)
    assert rel_l2(a, ref) <= 2 * coccl.get_compressor(codec).rel_error_typical
    assert rel_l2(a * comm.size, s) <= 2 * coccl.get_compressor(codec).rel_error_typical


def test_nan_and_inf_stay_visible(comm):
    """A non-finite value spoils its group and nothing else."""
    n, count = comm.size, 128 * 8 * comm.size
    x = rank_data(5, comm.rank, count, np.float32)
    if comm.rank == 0:
        x[3] = np.nan
        x[128 * 5 + 1] = np.inf
    for algorithm in ("ring", "two_shot"):
        for codec in ("int8", "taco"):
            y = comm.allreduce(x, algorithm=algorithm, compressor=codec)
            bad = ~np.isfinite(y)
            assert bad[3] and bad[128 * 5 + 1]
            # at most the two groups of 128 in which they sit
            assert bad.sum() <= 2 * 128
            assert np.isfinite(y[128 : 128 * 5]).all()
            assert all_equal_across_ranks(y)
    del n


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_in_place_and_out(comm, codec):
    x = rank_data(9, comm.rank, 3000, np.float32)
    y = comm.allreduce(x, algorithm="two_shot", compressor=codec)
    out = np.full_like(x, np.nan)
    comm.allreduce(x, out, algorithm="two_shot", compressor=codec)
    np.testing.assert_array_equal(out, y)
    z = x.copy()
    comm.allreduce(z, z, algorithm="two_shot", compressor=codec)
    np.testing.assert_array_equal(z, y)


class _TacoWithHop(TacoCompressor):
    """taco whose ring-hop kernel is its three steps in numpy, so that CPU ranks run the
    schedules' fused-hop path (on a GPU the hop is one CUDA kernel, tested against the
    same three steps in test_codec_gpu.py)."""

    def reduce_encode_kernel(self, like, dtype):
        def hop(own, payload, out, decoded=None):
            acc = own.astype(np.float32)
            self.decode_into(payload, acc, dtype, True)
            self.encode_into(acc, out, dtype)
            if decoded is not None:
                self.decode_into(out, decoded, dtype, False)
            hop.calls += 1

        hop.calls = 0
        self.hops.append(hop)
        return hop


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_fused_ring_hop_is_bitwise_neutral(comm, collective, op, dtype):
    """The ring with a codec's fused hop (middle ReduceScatter steps; an AllReduce sum's
    last step too) gives bitwise what the three-step path gives, at every count."""
    n = comm.size
    fused = _TacoWithHop()
    fused.hops = []
    for count in (0, 1, n + 1, 128 * n + 37, 5000 * n):
        if collective == "reduce_scatter":
            count = (count // n + 1) * n
        x = rank_data(case_seed("hop", collective, op, count), comm.rank, count, dtype)
        fn = getattr(comm, collective)
        for chunk in (1 << 30, 4096):
            want = fn(x, op=op, algorithm="ring", compressor="taco", chunk_bytes=chunk)
            got = fn(x, op=op, algorithm="ring", compressor=fused, chunk_bytes=chunk)
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    if n > 2 or (n == 2 and collective == "allreduce" and op == "sum"):
        assert sum(hop.calls for hop in fused.hops) > 0  # the fused path did run
