"""The simulated DP ReduceScatter against the real one (run on 1-4 ranks): every rank
runs the real two-shot ``comm.reduce_scatter`` on its own buffer and
``VirtualDPGroup.reduce_scatter`` on every rank's (rank-seeded data that every rank can
rebuild), and its shard must agree bitwise. The delta AllGather and compressed
point-to-point sends have no real counterpart in the Communicator yet."""

from __future__ import annotations

import numpy as np
import pytest

import coccl

from conftest import case_seed, rank_data

torch = pytest.importorskip("torch")

from coccl.torch.virtual_3d import VirtualDPGroup  # noqa: E402

CODECS = [
    "identity",
    "int8",
    "taco",
    {"id": "int", "bits": 8, "group_size": 128},
    {"id": "int", "bits": 4, "group_size": 128, "hadamard": 32},
]
# per-rank shard lengths: empty, one element, not a multiple of a group, several groups
SHARDS = [0, 1, 129, 1000]


def codec_id(spec: str | dict) -> str:
    if isinstance(spec, str):
        return spec
    return spec["id"] + ":" + ",".join(f"{k}={v}" for k, v in spec.items() if k != "id")


def codec_or_skip(spec: str | dict) -> coccl.Compressor:
    try:
        return coccl.get_compressor(spec)
    except ValueError as exc:  # a codec of another branch, not merged yet
        pytest.skip(f"codec not available: {exc}")


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("m", SHARDS)
@pytest.mark.parametrize("codec", CODECS, ids=codec_id)
def test_reduce_scatter_equals_real(comm, codec, m, op):
    c = codec_or_skip(codec)
    n = comm.size
    seed = case_seed("virtual-dp", codec_id(codec), m, op)
    bufs = [rank_data(seed, j, n * m, np.float32) for j in range(n)]
    real = comm.reduce_scatter(bufs[comm.rank], op=op, algorithm="two_shot", compressor=c)
    sim = VirtualDPGroup(n, c).reduce_scatter([torch.from_numpy(b) for b in bufs], op=op)
    np.testing.assert_array_equal(sim[comm.rank].numpy().view(np.uint8), real.view(np.uint8))


def test_batched_rows_equal_real_per_row(comm):
    """Rows (one DP group each, as one per TP rank) reduced at once: each row bitwise
    its own real ReduceScatter."""
    n, m, rows = comm.size, 256, 3
    seed = case_seed("virtual-dp-rows")
    bufs = [rank_data(seed, j, rows * n * m, np.float32).reshape(rows, n * m) for j in range(n)]
    sim = VirtualDPGroup(n, "taco").reduce_scatter([torch.from_numpy(b) for b in bufs], "avg")
    for r in range(rows):
        mine = np.ascontiguousarray(bufs[comm.rank][r])
        real = comm.reduce_scatter(mine, op="avg", algorithm="two_shot", compressor="taco")
        np.testing.assert_array_equal(sim[comm.rank][r].numpy(), real)
