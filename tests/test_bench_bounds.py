"""Tests of the error bound behind ``coccl-bench``'s ``#wrong`` (``coccl.bench.bounds``):
its parts on cases whose error is known, and the whole bound on the schedules of
DESIGN.md simulated in one process with the real codecs, at the small counts where
quantization errors fluctuate most."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import coccl
from coccl.bench.bounds import Reference, gamma, quantizations, rel_error_bound, unit_roundoff
from coccl.compressors import Compressor

F32 = np.dtype(np.float32)
IDENTITY = coccl.get_compressor("identity")


def reference(parts: list[np.ndarray]) -> tuple[np.ndarray, Reference]:
    """The exact sum of ``parts`` (float64) and what the bound needs of it."""
    exact = np.sum([p.astype(np.float64) for p in parts], axis=0)
    energy = math.sqrt(sum(float(np.sum(p.astype(np.float64) ** 2)) for p in parts))
    return exact, Reference(norm=float(np.linalg.norm(exact)), energy=energy)


def rel_l2(y: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(y.astype(np.float64) - exact) / np.linalg.norm(exact))


# ------------------------------------------------------------------------- parts
@pytest.mark.parametrize(
    ("collective", "algorithm", "nranks", "expected"),
    [
        ("allreduce", "ring", 4, 4),
        ("allreduce", "ring", 8, 8),
        ("allreduce", "two_shot", 8, 2),
        ("reduce_scatter", "ring", 4, 3),
        ("reduce_scatter", "two_shot", 4, 1),
        ("allgather", "ring", 4, 1),
        ("allgather", "two_shot", 4, 1),
        ("allreduce", "native", 4, 0),
        ("reduce_scatter", "ring", 1, 1),
    ],
)
def test_quantizations(collective: str, algorithm: str, nranks: int, expected: int) -> None:
    assert quantizations(collective, algorithm, nranks) == expected


def test_unit_roundoff() -> None:
    assert unit_roundoff(F32) == np.finfo(np.float32).eps / 2
    assert unit_roundoff(np.dtype(np.float16)) == np.finfo(np.float16).eps / 2
    assert unit_roundoff(np.dtype(ml_dtypes.bfloat16)) == 2.0**-8
    assert unit_roundoff(np.dtype(np.int32)) == 0.0
    assert gamma(3, 2.0**-24) == pytest.approx(3 * 2.0**-24)
    assert gamma(2, 0.5) == math.inf


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64])
def test_integers_must_be_exact(dtype: type) -> None:
    ref = Reference(norm=10.0, energy=12.0)
    assert rel_error_bound("allreduce", "ring", IDENTITY, "sum", np.dtype(dtype), 4, ref) == 0


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_and_copies_must_be_exact_up_to_the_type(op: str) -> None:
    ref = Reference(norm=10.0, energy=12.0)
    assert rel_error_bound("allreduce", "ring", IDENTITY, op, F32, 4, ref) <= 2.0**-24
    assert rel_error_bound("allgather", "ring", IDENTITY, "sum", F32, 4, ref) == 0.0


def test_identity_sum_bound_covers_cancellation() -> None:
    # float32 summation that loses the small term completely: the exact sum is 1.0
    parts = [np.array([1e8], np.float32), np.array([1.0], np.float32), np.array([-1e8], np.float32)]
    exact, ref = reference(parts)
    y = (parts[0] + parts[1]) + parts[2]  # one order a ring may use
    assert rel_l2(y, exact) == 1.0
    bound = rel_error_bound("allreduce", "ring", IDENTITY, "sum", F32, 3, ref)
    assert bound >= 1.0


@pytest.mark.parametrize("nranks", [2, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_identity_sum_bound_holds(nranks: int, dtype: type) -> None:
    rng = np.random.default_rng(nranks)
    parts = [rng.standard_normal(4099).astype(dtype) for _ in range(nranks)]
    exact, ref = reference(parts)
    y = parts[0].astype(dtype)
    for part in parts[1:]:  # rounding to the type after every addition: the worst order
        y = (y.astype(np.float32) + part.astype(np.float32)).astype(dtype)
    bound = rel_error_bound("allreduce", "ring", IDENTITY, "sum", np.dtype(dtype), nranks, ref)
    assert 0 < rel_l2(y, exact) <= bound
    assert bound < 20 * nranks * unit_roundoff(np.dtype(dtype))  # and not vacuous


def test_lossy_bound_grows_with_the_schedule() -> None:
    taco = coccl.get_compressor("taco")
    ref = Reference(norm=1.0, energy=1.0)
    two_shot = rel_error_bound("allreduce", "two_shot", taco, "sum", F32, 8, ref)
    ring = rel_error_bound("allreduce", "ring", taco, "sum", F32, 8, ref)
    assert taco.rel_error_bound * math.sqrt(2) < two_shot < ring < 1
    assert ring == pytest.approx(taco.rel_error_bound * math.sqrt(8) * (1 + 0.0625) ** 8, 1e-3)
    cancelled = Reference(norm=0.1, energy=1.0)  # the same inputs summing to less
    assert rel_error_bound("allreduce", "ring", taco, "sum", F32, 8, cancelled) > 9 * ring


def test_zero_result() -> None:
    taco = coccl.get_compressor("taco")
    zero = Reference(norm=0.0, energy=0.0)
    assert rel_error_bound("allreduce", "ring", taco, "sum", F32, 2, zero) == 0.0
    cancelled = Reference(norm=0.0, energy=1.0)
    assert rel_error_bound("allreduce", "ring", taco, "sum", F32, 2, cancelled) == math.inf


# ------------------------------------------------------- simulated schedules
def roundtrip(codec: Compressor, v: np.ndarray) -> np.ndarray:
    return codec.decode(codec.encode(v), count=v.size, dtype=np.float32)


def ring_allreduce(codec: Compressor, parts: list[np.ndarray]) -> np.ndarray:
    """DESIGN.md's ring: shard k's partial sum starts at rank k+1 and goes right, each
    hop decoding, adding its own contribution (float32) and re-encoding; the owner k
    encodes the reduced shard once more, and every rank decodes it."""
    n, count = len(parts), parts[0].size
    out = np.empty(count, np.float32)
    for k, shard in enumerate(np.array_split(np.arange(count), n)):
        if shard.size == 0:
            continue
        window = slice(shard[0], shard[-1] + 1)
        acc = parts[(k + 1) % n][window].copy()
        for step in range(2, n + 1):
            acc = roundtrip(codec, acc) + parts[(k + step) % n][window]
        out[window] = roundtrip(codec, acc)
    return out


def two_shot_allreduce(codec: Compressor, parts: list[np.ndarray]) -> np.ndarray:
    """DESIGN.md's two-shot: the owner of shard k decodes every other rank's encoded
    shard k and adds them to its own; the reduced shard is encoded once more."""
    n, count = len(parts), parts[0].size
    out = np.empty(count, np.float32)
    for k, shard in enumerate(np.array_split(np.arange(count), n)):
        if shard.size == 0:
            continue
        window = slice(shard[0], shard[-1] + 1)
        acc = parts[k][window].copy()
        for i in range(n):
            if i != k:
                acc += roundtrip(codec, parts[i][window])
        out[window] = roundtrip(codec, acc)
    return out


SCHEDULES = {"ring": ring_allreduce, "two_shot": two_shot_allreduce}
CODECS = ["taco", {"id": "taco", "ash": False}, {"id": "taco", "fp8_format": "e5m2"}, "int8"]


@pytest.mark.parametrize("nranks", [2, 3, 8])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("codec_spec", CODECS, ids=lambda c: str(c))
def test_bound_holds_on_simulated_schedules(
    codec_spec: str | dict, algorithm: str, nranks: int
) -> None:
    codec = coccl.get_compressor(codec_spec)
    rng = np.random.default_rng([nranks, len(algorithm)])
    worst = 0.0
    for count in (1, 2, 3, 5, 17, 129, 1000):
        for _ in range(3):
            parts = [rng.standard_normal(count, dtype=np.float32) for _ in range(nranks)]
            exact, ref = reference(parts)
            y = SCHEDULES[algorithm](codec, parts)
            bound = rel_error_bound("allreduce", algorithm, codec, "sum", F32, nranks, ref)
            ratio = rel_l2(y, exact) / bound
            assert ratio <= 1, f"count {count}: error {rel_l2(y, exact)} > bound {bound}"
            worst = max(worst, ratio)
    assert worst > 0.01  # the schedule did quantize: the bound is being tested
