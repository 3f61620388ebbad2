"""The all-to-all schedule (algorithms/alltoall.py) on 1-4 ranks in one process
(tests/schedule_sim.py): every slot holds ``decode(encode(block))`` of its sender's block,
bitwise (the identity codec: the block itself), for equal and uneven splits with empty
blocks, chunked or not, in place or not; and the checks of a split and of the ranks'
agreement on it."""

import numpy as np
import pytest
from schedule_cases import (  # noqa: F401  (one_numba_thread: an autouse fixture)
    BF16,
    CODECS,
    DTYPES,
    F32,
    F64,
    no_leaks,
    normal_data,
    one_numba_thread,
    plans,
    roundtrip,
    unit_roundoff,
)
from schedule_sim import run_ranks

from coccl.algorithms.alltoall import alltoall, check_counts, check_split, split_mismatches

# name -> size -> counts[r][d]: rank r's block for rank d (None: an equal split)
SPLITS = {
    "empty": lambda n: [[0] * n for _ in range(n)],
    "one": lambda n: [[1] * n for _ in range(n)],
    "equal-odd": lambda n: [[131] * n for _ in range(n)],
    "equal-chunked": lambda n: [[700] * n for _ in range(n)],
    "uneven": lambda n: [[(7 * r + 13 * d) % 5 * 97 % 301 for d in range(n)] for r in range(n)],
    "sparse": lambda n: [[600 if (r + d) % 3 == 0 else 0 for d in range(n)] for r in range(n)],
}


# float64 travels through every codec alike: once, with identity
CASES = [
    (codec, dtype) for codec in CODECS for dtype in DTYPES if codec == "identity" or dtype != F64
]


def _recv_counts(sends: list[list[int]]) -> list[list[int]]:
    n = len(sends)
    return [[sends[s][r] for s in range(n)] for r in range(n)]


def _blocks(arr: np.ndarray, counts: list[int]) -> list[np.ndarray]:
    return np.split(arr, np.cumsum(counts)[:-1]) if counts else []


def _run(n, codec, dtype, sends, *, equal, in_place=False, seed=None, chunk_elems=256):
    rng = np.random.default_rng(n * 1000 + sum(map(sum, sends)))
    recvs = _recv_counts(sends)
    ps = plans(n, codec, dtype, chunk_elems=chunk_elems)
    xs = [normal_data(rng, sum(sends[r]), dtype) for r in range(n)]
    inputs = [x.copy() for x in xs]
    outs = xs if in_place else [np.full(sum(recvs[r]), np.nan, dtype) for r in range(n)]
    counts = [(None, None) if equal else (sends[r], recvs[r]) for r in range(n)]
    run_ranks([alltoall(ps[r], xs[r], outs[r], *counts[r]) for r in range(n)], seed=seed)
    assert no_leaks(ps)
    return ps[0].codec, inputs, outs, recvs


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("codec, dtype", CASES, ids=str)
def test_alltoall_slots_hold_the_decoded_blocks(codec, dtype, n, split):
    """Slot s of rank r is rank s's block r through one codec roundtrip, bitwise; the
    identity codec moves it exactly; a lossy codec stays within its declared bound."""
    sends = SPLITS[split](n)
    equal = len({c for row in sends for c in row}) == 1
    c, xs, outs, recvs = _run(n, codec, dtype, sends, equal=equal, seed=n)
    for r in range(n):
        for s, slot in enumerate(_blocks(outs[r], recvs[r])):
            block = _blocks(xs[s], sends[s])[r]
            np.testing.assert_array_equal(slot.view(np.uint8), roundtrip(c, block).view(np.uint8))
            if codec == "identity":
                np.testing.assert_array_equal(slot, block)
            else:  # one roundtrip, and the decoded values' rounding to the type
                u = unit_roundoff(dtype)
                err = np.linalg.norm(slot.astype(np.float64) - block.astype(np.float64))
                bound = (c.rel_error_bound * (1 + u) + u) * np.linalg.norm(block.astype(np.float64))
                assert err <= bound


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_alltoall_in_place(codec, n):
    """``out`` is ``x``: the same result as out of place (every block staged). In place
    needs each rank's send and receive counts equal: a symmetric split, empty blocks in
    it."""
    sends = [[(r + d) % 3 * 150 for d in range(n)] for r in range(n)]
    c, xs, outs, recvs = _run(n, codec, F32, sends, equal=False, in_place=True, seed=3)
    for r in range(n):
        for s, slot in enumerate(_blocks(outs[r], recvs[r])):
            expected = roundtrip(c, _blocks(xs[s], sends[s])[r])
            np.testing.assert_array_equal(slot, expected)


def test_alltoall_rounds_are_chunks_across_peers():
    """One round per chunk index, independent of each other; the identity codec sends
    from x and receives into out, holding no pooled buffer."""
    ps = plans(3, "identity", F32, chunk_elems=128)
    x, out = np.arange(3 * 300, dtype=F32), np.empty(3 * 300, F32)
    rounds = list(alltoall(ps[0], x, out))
    assert len(rounds) == 3  # ceil(300 / 128)
    assert all(not rnd.deps and not rnd.holds for rnd in rounds)
    assert all(np.shares_memory(buf, x) for rnd in rounds for _, buf in rnd.sends)
    assert all(np.shares_memory(buf, out) for rnd in rounds for _, buf in rnd.recvs)
    assert [len(rnd.sends) for rnd in rounds] == [2, 2, 2]


def test_alltoall_lossy_payloads_are_chunk_sized():
    ps = plans(2, "taco", BF16, chunk_elems=256)
    x = np.ones(2 * 1000, BF16)
    rounds = list(alltoall(ps[1], x, np.empty_like(x)))
    limit = ps[1].codec.encoded_nbytes(256, BF16)
    assert len(rounds) == 4
    assert all(buf.nbytes <= limit for rnd in rounds for _, buf in rnd.sends + rnd.recvs)


@pytest.mark.parametrize(
    "counts, match",
    [
        ([1, 2], "one per rank"),
        ([1, -1, 2], "non-negative"),
        ([1, 1.0, 2], "non-negative integers"),
        ([1, True, 2], "non-negative integers"),
        ([1, 1, 1], "sums to 3"),
        (5, "sequence"),
    ],
)
def test_check_counts_refuses(counts, match):
    with pytest.raises(ValueError, match=match):
        check_counts(counts, 4, 3, "send_counts")


def test_check_counts_accepts_numpy_integers():
    assert check_counts(np.array([0, 3, 1]), 4, 3, "send_counts") == [0, 3, 1]


def test_check_split():
    assert check_split(None, None, 6, 6, 3) == ([2, 2, 2], [2, 2, 2])
    with pytest.raises(ValueError, match="multiple of 4"):
        check_split(None, None, 6, 6, 4)
    with pytest.raises(ValueError, match="equal split needs 6"):
        check_split(None, None, 6, 3, 3)
    with pytest.raises(ValueError, match="both"):
        check_split([2, 2, 2], None, 6, 6, 3)
    with pytest.raises(ValueError, match="recv_counts sums to 5"):
        check_split([2, 2, 2], [1, 2, 2], 6, 6, 3)


def test_alltoall_refuses_bad_buffers_before_any_round():
    ps = plans(2, "identity", F32)
    x = np.zeros(8, F32)
    with pytest.raises(ValueError, match="overlaps"):
        alltoall(ps[0], x[:6], x[2:])
    with pytest.raises(ValueError, match="in place"):
        alltoall(ps[0], x[:6], x[:6], [2, 4], [3, 3])
    with pytest.raises(ValueError, match="send_counts"):
        alltoall(ps[0], x[:6], np.zeros(6, F32), [2, 3], [3, 3])


def test_split_mismatches_name_both_ranks():
    sends = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split_mismatches(sends, _recv_counts(sends)) == []
    recvs = _recv_counts(sends)
    recvs[2][0] = 4  # rank 2 expects 4 from rank 0, which sends it 3
    assert split_mismatches(sends, recvs) == [
        "rank 0 sends 3 elements to rank 2, which expects 4 from it"
    ]
    assert split_mismatches([[5]], [[5]]) == []


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_alltoall_float64_through_a_lossy_codec(codec):
    """float64 data: the same per-block roundtrip (the codecs compute in float32)."""
    sends = SPLITS["uneven"](3)
    c, xs, outs, recvs = _run(3, codec, F64, sends, equal=False, seed=2)
    for r in range(3):
        for s, slot in enumerate(_blocks(outs[r], recvs[r])):
            np.testing.assert_array_equal(slot, roundtrip(c, _blocks(xs[s], sends[s])[r]))
