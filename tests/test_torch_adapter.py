"""PyTorch tensors through the public API on one rank: same dtype, device and shape out,
``out=`` honoured (also in place), bfloat16 and float16 included."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
MPI = pytest.importorskip("mpi4py.MPI")

import coccl  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# On one rank every collective returns its input; these codecs have to reproduce it.
CASES = [("ring", "identity"), ("two_shot", "identity"), ("native", "identity")]


@pytest.fixture(scope="module")
def comm():
    c = coccl.init(MPI.COMM_SELF, backend="mpi")
    yield c
    c.close()


def sample(dtype: torch.dtype, shape: tuple[int, ...] = (3, 5, 8)) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn(shape, generator=g).to(dtype)


def same_kind(result: torch.Tensor, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    assert isinstance(result, torch.Tensor)
    assert result.dtype == x.dtype
    assert result.device == x.device
    assert tuple(result.shape) == shape


@pytest.mark.parametrize("algorithm,compressor", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_returns_tensor(comm, dtype, algorithm, compressor):
    x = sample(dtype)
    before = x.clone()
    y = comm.allreduce(x, algorithm=algorithm, compressor=compressor)
    same_kind(y, x, tuple(x.shape))
    assert y.data_ptr() != x.data_ptr()
    assert torch.equal(y, x)
    assert torch.equal(x, before)  # input untouched


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_avg(comm, dtype):
    x = sample(dtype)
    assert torch.equal(comm.allreduce(x, op="avg", algorithm="ring"), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_scatter_and_allgather(comm, dtype):
    x = sample(dtype)
    rs = comm.reduce_scatter(x, algorithm="ring")
    same_kind(rs, x, tuple(x.shape))  # one rank: the whole tensor is shard 0
    assert torch.equal(rs, x)
    ag = comm.allgather(x, algorithm="ring")
    same_kind(ag, x, tuple(x.shape))
    assert torch.equal(ag, x)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_out_is_returned_and_filled(comm, dtype, collective):
    x = sample(dtype)
    out = torch.full_like(x, 123.0)
    result = getattr(comm, collective)(x, out, algorithm="ring")
    assert result is out
    assert torch.equal(out, x)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_in_place(comm, dtype, collective):
    x = sample(dtype)
    expected = x.clone()
    ptr = x.data_ptr()
    result = getattr(comm, collective)(x, x, algorithm="two_shot")
    assert result is x
    assert x.data_ptr() == ptr
    assert torch.equal(x, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lossy_codecs_keep_tensor_kind(comm, dtype):
    """A lossy codec (whichever are registered) still returns a tensor of x's kind, within
    the codec's declared error of x (one rank: one encode-decode round trip; the bound
    holds per group, so for the whole array too, plus the output dtype's rounding)."""
    x = sample(dtype, (4, 300))
    rounding = torch.finfo(dtype).eps  # one rounding of each decoded value to x's dtype
    norm = x.double().norm().item()
    for name in coccl.available_compressors():
        if name == "identity":
            continue
        codec = coccl.get_compressor(name)
        y = comm.allreduce(x, algorithm="two_shot", compressor=name)
        same_kind(y, x, tuple(x.shape))
        err = (y.double() - x.double()).norm().item()
        bound = (codec.rel_error_bound + rounding) * norm + x.numel() ** 0.5 * codec.abs_error_floor
        assert err <= bound, f"{name}: error {err} above its bound {bound}"


def test_requires_grad_tensor_is_accepted(comm):
    x = torch.randn(16, requires_grad=True)
    y = comm.allreduce(x, algorithm="ring")
    assert not y.requires_grad  # coccl is not autograd-aware: coccl.tensor_parallel is
    assert torch.equal(y, x.detach())


def test_scalar_and_empty(comm):
    s = torch.tensor(2.5)
    assert comm.allreduce(s, algorithm="ring").shape == ()
    e = torch.empty(0, 4)
    r = comm.allreduce(e, algorithm="ring")
    assert tuple(r.shape) == (0, 4)


def test_non_contiguous_refused(comm):
    x = torch.randn(4, 6).t()
    with pytest.raises(ValueError, match="contiguous"):
        comm.allreduce(x)


def test_unsupported_dtype_refused(comm):
    with pytest.raises(TypeError):
        comm.allreduce(torch.zeros(4, dtype=torch.complex64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_tensors(comm, dtype):
    x = sample(dtype).cuda()
    y = comm.allreduce(x, algorithm="ring")
    same_kind(y, x, tuple(x.shape))
    assert torch.equal(y, x)
    out = torch.empty_like(x)
    assert comm.allreduce(x, out, algorithm="two_shot") is out
    assert torch.equal(out, x)
