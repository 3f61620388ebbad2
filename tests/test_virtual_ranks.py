"""coccl.virtual_ranks.simulate_allreduce in one process.

Against a plain reference that walks the schedules shard by shard and rank by rank with
the codecs' public encode/decode (bitwise), against the exact float64 sum (within the
codecs' declared error per quantization), and on the GPU against the CPU (bitwise).
tests/mpi/test_virtual_ranks.py compares it with real AllReduces on 1-4 ranks.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from coccl.algorithms.schedule_args import aligned_shards, chunk_elems
from coccl.compressors import Compressor, get_compressor
from coccl.core.arrays import accumulate_dtype
from coccl.virtual_ranks import simulate_allreduce

from gpu import GPU

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
CODECS = [
    "identity",
    "int8",
    "taco",
    {"id": "taco", "ash": False},
    {"id": "taco", "dual_scale": False},
    {"id": "taco", "fp8_format": "e5m2", "group_size": 32},
]
ALGORITHMS = ["ring", "two_shot"]
NVFP4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}
MXFP6 = {"id": "mx", "element": "e2m3"}
SMALL_TAH = {"id": "tah", "row": 64, "tile": 32}  # tokens of 64: several per chunk
# codec -> payload_scoped: a group's encoding depends on the rest of its payload
PAYLOAD_SCOPED = [
    ("identity", False),
    ("int8", False),
    ("taco", False),
    ({"id": "taco_fp", "element": "e2m1"}, False),
    (MXFP6, False),
    ({"id": "mx", "element": "e2m1", "block": 32, "scale": "e8m0"}, False),
    ({"id": "int", "bits": 4, "hadamard": 32}, False),
    (NVFP4, True),
    ({"id": "mx", "element": "e3m2", "block": 32, "scale": "e4m3"}, True),
    (SMALL_TAH, True),
    ({**SMALL_TAH, "window": 2}, False),  # low tokens per window of alignment elements
    ({"id": "int", "bits": 4, "rounding": "stochastic", "seed": 3}, True),
]


def codec_id(spec: str | dict) -> str:
    if isinstance(spec, str):
        return spec
    return spec["id"] + ":" + ",".join(f"{k}={v}" for k, v in spec.items() if k != "id")


def counts(n: int) -> list[int]:
    """0, 1, fewer than the ranks, not a multiple of the ranks or of a group, several
    groups per shard."""
    return sorted({0, 1, max(1, n - 1), 5 * n + 3, 129, 4099})


def partials(seed: int, n: int, count: int, dtype: np.dtype) -> list[np.ndarray]:
    return [
        np.random.default_rng([seed, j, count]).standard_normal(count).astype(dtype)
        for j in range(n)
    ]


# ------------------------------------------------------------------------ reference
def reference(
    parts: list[np.ndarray], algorithm: str, codec: Compressor, op: str, chunk: int | None = None
) -> np.ndarray:
    """The AllReduce as a rank computes it, one shard and one rank at a time; with
    ``chunk`` (elements), one chunk of a shard at a time, each its own payloads, as the
    real pipeline cuts it (one rank: one payload, whatever the chunk)."""
    n, count, dtype = len(parts), parts[0].size, parts[0].dtype
    acc_dtype = accumulate_dtype(dtype)
    out = np.empty(count, dtype)

    def quantized(values: np.ndarray) -> np.ndarray:
        """decode(encode(values)) in the accumulate dtype: one trip over the wire."""
        got = np.empty(values.size, acc_dtype)
        codec.decode(codec.encode(values, dtype=dtype), got, count=values.size, dtype=dtype)
        return got

    for k, (start, stop) in enumerate(aligned_shards(count, n, codec.alignment)):
        step = chunk if chunk is not None and n > 1 else max(1, stop - start)
        for a in range(start, stop, step):
            b = min(a + step, stop)
            own = parts[k][a:b].astype(acc_dtype)
            if n == 1:
                acc = own
            elif algorithm == "two_shot":  # own data, then every other rank in rank order
                acc = own
                for j in range(n):
                    if j != k:
                        acc = acc + quantized(parts[j][a:b])
            else:  # ring: ranks k+1, ..., k-1 each add and re-encode; the owner adds last
                partial_sum = parts[(k + 1) % n][a:b]
                for t in range(1, n - 1):
                    partial_sum = parts[(k + 1 + t) % n][a:b].astype(acc_dtype) + quantized(
                        partial_sum
                    )
                acc = own + quantized(partial_sum)
            if op == "avg":
                acc = acc / acc_dtype.type(n)
            codec.decode(codec.encode(acc, dtype=dtype), out[a:b], count=b - a, dtype=dtype)
    return out


def assert_bitwise(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("codec", CODECS, ids=codec_id)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_matches_reference_bitwise(n, algorithm, codec, dtype, op):
    c = get_compressor(codec)
    for count in counts(n):
        parts = partials(17, n, count, dtype)
        got = simulate_allreduce(parts, algorithm=algorithm, compressor=c, op=op)
        assert_bitwise(got, reference(parts, algorithm, c, op))


@pytest.mark.parametrize(
    ("codec", "scoped"),
    PAYLOAD_SCOPED,
    ids=lambda c: codec_id(c) if not isinstance(c, bool) else str(c),
)
def test_payload_scoped_is_declared_truly(codec, scoped):
    """The declared property against the codec's own behaviour: four groups of very
    different sizes (one token of tah's carries a spike, so it is the lowest-entropy
    one) encoded as one payload and as two cut on the alignment decode alike exactly when
    the codec is not payload_scoped."""
    c = get_compressor(codec)
    assert c.payload_scoped is scoped
    g = c.alignment
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(g) * 10.0**e for e in (3, -3, 0, 1, 0, 0, 0, 0, 0, 0)])
    x[5 * g] = 1e4  # a spike: a low-entropy token in the second half
    x = x.astype(np.float32)
    whole = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    cut = 5 * g
    halves = np.concatenate(
        [c.decode(c.encode(h), count=h.size, dtype=np.float32) for h in (x[:cut], x[cut:])]
    )
    assert np.array_equal(whole, halves) is not scoped


@pytest.mark.parametrize("codec", [NVFP4, SMALL_TAH], ids=codec_id)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_payload_scoped_matches_chunked_reference(n, algorithm, codec):
    """A payload-scoped codec: one payload per (rank, shard, chunk) as a real rank
    encodes it, with the real chunk of the given chunk_bytes (``chunk_elems``)."""
    c = get_compressor(codec)
    for dtype in (np.dtype(np.float32), BF16):
        for count in sorted({0, 1, max(1, n - 1), 5 * n + 3, 129, 700}):
            parts = partials(11, n, count, dtype)
            for chunk_bytes in (1, 1000, 1 << 30):  # one group, several, whole shards
                op = "avg" if n == 3 else "sum"
                got = simulate_allreduce(
                    parts, algorithm=algorithm, compressor=c, op=op, chunk_bytes=chunk_bytes
                )
                chunk = chunk_elems(chunk_bytes, dtype.itemsize, c.alignment)
                assert_bitwise(got, reference(parts, algorithm, c, op, chunk))


def test_payload_scoped_cut_matters():
    """NVFP4's per-payload scale: where the payloads are cut changes the result (one
    payload per shard against chunks of 1 KiB)."""
    parts = partials(5, 2, 4099, np.dtype(np.float32))
    parts[0][:100] *= 1e3  # one large block sets S of its payload alone
    one = simulate_allreduce(parts, compressor=NVFP4, chunk_bytes=1 << 30)
    small = simulate_allreduce(parts, compressor=NVFP4, chunk_bytes=1024)
    assert not np.array_equal(one, small)


def test_payload_scoped_needs_chunk_bytes():
    """Refused before any work, the same on every rank (it depends on the arguments
    alone); one rank needs none (a real one-rank call encodes one payload)."""
    parts = partials(0, 2, 100, np.dtype(np.float32))
    for codec in (NVFP4, SMALL_TAH):
        with pytest.raises(ValueError, match="needs chunk_bytes"):
            simulate_allreduce(parts, compressor=codec)
        with pytest.raises(ValueError, match="needs chunk_bytes"):
            simulate_allreduce(np.stack(parts), algorithm="ring", compressor=codec)
        simulate_allreduce(parts[:1], compressor=codec)
    with pytest.raises(ValueError, match="stochastic"):
        simulate_allreduce(
            parts, compressor={"id": "int", "rounding": "stochastic"}, chunk_bytes=64
        )


@pytest.mark.parametrize("dtype", [np.dtype(np.float64), np.dtype(np.int32)], ids=str)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_float64_and_integers(algorithm, dtype):
    """float64 reduces in float64; integers travel with identity and sum exactly."""
    n, count = 3, 1001
    if dtype.kind == "i":
        parts = [np.arange(count, dtype=dtype) * (j + 1) - 7 for j in range(n)]
        got = simulate_allreduce(parts, algorithm=algorithm)
        np.testing.assert_array_equal(got, np.sum(parts, axis=0))
        return
    parts = partials(3, n, count, dtype)
    for codec in ("identity", "int8", "taco"):
        c = get_compressor(codec)
        got = simulate_allreduce(parts, algorithm=algorithm, compressor=c)
        assert_bitwise(got, reference(parts, algorithm, c, "sum"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("codec", ["identity", "int8", "taco"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_error_against_exact_sum(algorithm, codec, dtype):
    """Each quantization errs by at most the codec's bound times what it quantizes (at
    most the sum of the contributions' norms), and every rounding to the dtype by its
    unit roundoff: two quantizations for two_shot, one per rank for the ring."""
    c = get_compressor(codec)
    for n in (2, 4, 7):
        parts = partials(5, n, 20000, dtype)
        exact = np.sum([p.astype(np.float64) for p in parts], axis=0)
        got = simulate_allreduce(parts, algorithm=algorithm, compressor=c).astype(np.float64)
        quantizations = 0 if c.lossless else (2 if algorithm == "two_shot" else n)
        norms = sum(float(np.linalg.norm(p.astype(np.float64))) for p in parts)
        growth = 1.0 + quantizations * c.rel_error_bound
        roundoff = (n + 1) * float(ml_dtypes.finfo(dtype).eps)
        bound = (quantizations * c.rel_error_bound * growth + roundoff) * norms
        assert float(np.linalg.norm(got - exact)) <= bound


def test_ring_and_two_shot_agree_on_two_ranks():
    """At two ranks both schedules are: the other rank's data quantized once, added to
    the owner's, the sum quantized once."""
    parts = partials(9, 2, 3001, BF16)
    ring = simulate_allreduce(parts, algorithm="ring", compressor="taco")
    two_shot = simulate_allreduce(parts, algorithm="two_shot", compressor="taco")
    assert_bitwise(ring, two_shot)


def test_stacked_and_list_inputs_agree_and_inputs_are_untouched():
    parts = partials(4, 4, 777, np.dtype(np.float32))
    before = [p.copy() for p in parts]
    from_list = simulate_allreduce(parts, algorithm="ring", compressor="int8")
    stacked = np.stack(parts).reshape(4, 7, 111)
    from_stack = simulate_allreduce(stacked, algorithm="ring", compressor="int8")
    assert from_stack.shape == (7, 111)
    assert_bitwise(from_stack.reshape(-1), from_list)
    for p, b in zip(parts, before, strict=True):
        assert_bitwise(p, b)


def test_result_keeps_shape_and_the_callers_kind():
    parts = [p.reshape(3, 5) for p in partials(1, 2, 15, np.dtype(np.float16))]
    got = simulate_allreduce(parts, compressor="taco")
    assert isinstance(got, np.ndarray) and got.shape == (3, 5) and got.dtype == np.float16
    empty = simulate_allreduce([np.zeros((0, 4), np.float32)] * 3, algorithm="ring")
    assert empty.shape == (0, 4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_cpu_tensors(dtype):
    torch = pytest.importorskip("torch")
    parts = partials(2, 3, 1000, BF16 if dtype == "bfloat16" else np.dtype(np.float32))
    tensors = [
        torch.from_numpy(p.view(np.int16)).view(torch.bfloat16)
        if dtype == "bfloat16"
        else torch.from_numpy(p)
        for p in parts
    ]
    got = simulate_allreduce(tensors, algorithm="two_shot", compressor="taco")
    assert isinstance(got, torch.Tensor) and got.dtype == getattr(torch, dtype)
    want = simulate_allreduce(parts, algorithm="two_shot", compressor="taco")
    bits = got.view(torch.int16) if dtype == "bfloat16" else got
    assert_bitwise(bits.numpy().view(want.dtype), want)
    stacked = simulate_allreduce(torch.stack(tensors), algorithm="two_shot", compressor="taco")
    assert torch.equal(stacked.view(torch.int16), got.view(torch.int16))


def test_refusals():
    parts = partials(0, 2, 10, np.dtype(np.float32))
    with pytest.raises(ValueError, match="algorithm"):
        simulate_allreduce(parts, algorithm="native")
    with pytest.raises(ValueError, match="algorithm"):
        simulate_allreduce(parts, algorithm="auto")
    with pytest.raises(ValueError, match="op"):
        simulate_allreduce(parts, op="max")
    with pytest.raises(ValueError, match="chunk_bytes"):
        simulate_allreduce(parts, chunk_bytes=0)
    with pytest.raises(ValueError, match="no contribution"):
        simulate_allreduce([])
    with pytest.raises(ValueError, match="shape"):
        simulate_allreduce([parts[0], parts[1][:5]])
    with pytest.raises(TypeError, match="dtype"):
        simulate_allreduce([parts[0], parts[1].astype(np.float16)])
    with pytest.raises(TypeError, match="int32"):
        simulate_allreduce([np.zeros(4, np.int32)] * 2, compressor="taco")
    with pytest.raises(ValueError, match="unknown compressor"):
        simulate_allreduce(parts, compressor="nope")


# ----------------------------------------------------------------------------- GPU
needs_gpu = pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")


def _to_device(a: np.ndarray):
    import cupy  # noqa: PLC0415

    bits = np.dtype(f"u{a.dtype.itemsize}")
    return cupy.asarray(a.view(bits)).view(a.dtype)


def _to_host(d) -> np.ndarray:
    import cupy  # noqa: PLC0415

    bits = np.dtype(f"u{d.dtype.itemsize}")
    return cupy.asnumpy(d.view(bits)).view(d.dtype)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("codec", CODECS, ids=codec_id)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_gpu_equals_cpu_bitwise(n, algorithm, codec, dtype):
    """The CUDA kernels (and on the ring the fused hop kernel, when no padding is
    present) give the numba kernels' bits."""
    for count in [*counts(n), 128 * n * 3, 1 << 16]:
        parts = partials(23, n, count, dtype)
        want = simulate_allreduce(parts, algorithm=algorithm, compressor=codec)
        got = simulate_allreduce(
            [_to_device(p) for p in parts], algorithm=algorithm, compressor=codec
        )
        assert_bitwise(_to_host(got), want)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gpu_torch_tensors_on_the_current_stream(algorithm):
    """torch CUDA tensors produced on a side stream: the simulation runs on that stream."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    parts = partials(8, 4, 1 << 18, BF16)
    want = simulate_allreduce(parts, algorithm=algorithm, compressor="taco")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        stacked = torch.stack(
            [torch.from_numpy(p.view(np.int16)).cuda().view(torch.bfloat16) for p in parts]
        )
        stacked = stacked * 1.0  # pending work on this stream
        got = simulate_allreduce(stacked, algorithm=algorithm, compressor="taco")
        host = got.view(torch.int16).cpu().numpy().view(BF16)
    assert got.device.type == "cuda" and got.dtype == torch.bfloat16
    assert_bitwise(host, want)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("count", [128 * 4 * 16, 3 * 128 * 4 + 5], ids=["whole", "padded"])
@pytest.mark.parametrize("codec", ["identity", "int8", "taco"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gpu_simulation_replays_from_a_cuda_graph(algorithm, codec, count):
    """Captured once, replayed on new data: every temporary comes from the graph's pool
    and every kernel runs on the capturing stream (what the experiment's CUDA graphs of
    whole training steps rely on)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    n = 4

    def device_copy(parts: list[np.ndarray]):
        return torch.stack(
            [torch.from_numpy(p.view(np.int16)).cuda().view(torch.bfloat16) for p in parts]
        )

    static = device_copy(partials(0, n, count, BF16))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled, outside the capture
        simulate_allreduce(static, algorithm=algorithm, compressor=codec)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = simulate_allreduce(static, algorithm=algorithm, compressor=codec)
    for seed in (1, 2):
        parts = partials(seed, n, count, BF16)
        static.copy_(device_copy(parts))
        graph.replay()
        got = out.view(torch.int16).cpu().numpy().view(BF16)
        assert_bitwise(got, simulate_allreduce(parts, algorithm=algorithm, compressor=codec))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("chunk_bytes", [1000, 1 << 30], ids=["chunks", "whole"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [2, 4])
def test_gpu_payload_scoped_equals_cpu_bitwise(n, algorithm, chunk_bytes, dtype):
    """NVFP4's payload-by-payload simulation on the GPU gives the numba kernels' bits."""
    for count in [*counts(n), 128 * n * 3 + 5]:
        parts = partials(29, n, count, dtype)
        kw = {"algorithm": algorithm, "compressor": NVFP4, "chunk_bytes": chunk_bytes}
        want = simulate_allreduce(parts, **kw)
        got = simulate_allreduce([_to_device(p) for p in parts], **kw)
        assert_bitwise(_to_host(got), want)
