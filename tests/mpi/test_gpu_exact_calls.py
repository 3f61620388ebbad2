"""The rooted collectives on CuPy device arrays: staged over MPI (ranks may share a GPU)
and over NCCL (a GPU per rank), bitwise the host result. Skipped without a GPU."""

import numpy as np
import pytest
from mpi4py import MPI

from conftest import case_seed, communicator, gpu_per_rank, rank_data

pytest.importorskip("cupy")
import cupy as cp  # noqa: E402

try:
    if cp.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA GPU", allow_module_level=True)
except Exception:
    pytest.skip("no usable CUDA GPU", allow_module_level=True)

SIZE = MPI.COMM_WORLD.Get_size()
CALLS = ["broadcast", "reduce", "gather", "scatter"]


def _run(comm, call, x, root):
    if call == "broadcast":
        return comm.broadcast(x, root=root)
    if call == "reduce":
        return comm.reduce(x, root=root, op="sum")
    return getattr(comm, call)(x, root=root)


def _check(comm, call, count, dtype):
    root = SIZE - 1
    n = count * SIZE if call == "scatter" else count
    x = rank_data(case_seed("gpu-exact", call, count), comm.rank, n, dtype)
    host = _run(comm, call, x.copy(), root)
    dev = _run(comm, call, cp.asarray(x), root)
    if host is None:
        assert dev is None
        return
    assert isinstance(dev, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(dev), host)


@pytest.mark.parametrize("count", [0, 1, 4099])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32], ids=str)
@pytest.mark.parametrize("call", CALLS)
def test_staged_equals_host(comm, call, dtype, count):
    _check(comm, call, count, dtype)


@gpu_per_rank()
@pytest.mark.parametrize("call", CALLS)
def test_nccl_equals_host(call):
    with communicator("nccl") as comm:  # raises rather than fall back to MPI
        for count in (0, 1, 4099):
            _check(comm, call, count, np.float32)
