"""Caller-kept states (coccl/communicator/state.py) on CuPy device arrays: a delta
AllGather and error feedback over several calls give bitwise the host's results, call
after call (the codec kernels and the feedback arithmetic are the host's), over MPI (ranks
sharing a GPU, pinned staging) and over NCCL (one GPU per rank). Skipped without a GPU."""

import numpy as np
import pytest
from mpi4py import MPI

import coccl

from conftest import case_seed, rank_data

pytest.importorskip("cupy")
import cupy as cp  # noqa: E402

try:
    if cp.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA GPU", allow_module_level=True)
except Exception:
    pytest.skip("no usable CUDA GPU", allow_module_level=True)

F32 = np.dtype(np.float32)
INT4 = {"id": "int", "bits": 4}


@pytest.fixture(scope="module", params=["mpi", "nccl"])
def dcomm(request, comm):
    """The session's MPI communicator, or a NCCL one where every rank has its own GPU."""
    if request.param == "mpi":
        yield comm
        return
    if cp.cuda.runtime.getDeviceCount() < MPI.COMM_WORLD.Get_size():
        pytest.skip("NCCL needs a GPU per rank")
    cp.cuda.Device(MPI.COMM_WORLD.Get_rank()).use()
    with coccl.init(MPI.COMM_WORLD, backend="nccl") as c:
        yield c


@pytest.mark.parametrize("count", [0, 1, 4099])
@pytest.mark.parametrize("codec", ["int8", INT4], ids=str)
def test_delta_allgather_device_equals_host(comm, dcomm, codec, count):
    r = comm.rank
    seed = case_seed("gpu delta", str(codec), count)
    x = rank_data(seed, r, count, F32)
    host, dev = coccl.DeltaState(), coccl.DeltaState()
    for step in range(4):
        x = x + 0.01 * rank_data(seed + step, r, count, F32)
        h = comm.allgather(x, compressor=codec, delta=host)
        d = dcomm.allgather(cp.asarray(x), compressor=codec, delta=dev)
        np.testing.assert_array_equal(cp.asnumpy(d).view(np.uint8), h.view(np.uint8))


@pytest.mark.parametrize("count", [1, 4099])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "alltoall"])
def test_feedback_device_equals_host(comm, dcomm, collective, algorithm, count):
    n, r = comm.size, comm.rank
    if collective == "alltoall" and algorithm == "ring":
        pytest.skip("all-to-all has one schedule")
    total = count * n if collective != "allreduce" else count
    x = rank_data(case_seed("gpu fb", collective, algorithm, count), r, total, F32)
    kwargs = {} if collective == "alltoall" else {"algorithm": algorithm, "op": "avg"}
    host, dev = coccl.Feedback(), coccl.Feedback()
    for _ in range(4):
        h = getattr(comm, collective)(x, compressor=INT4, feedback=host, **kwargs)
        d = getattr(dcomm, collective)(cp.asarray(x), compressor=INT4, feedback=dev, **kwargs)
        np.testing.assert_array_equal(cp.asnumpy(d).view(np.uint8), h.view(np.uint8))
    np.testing.assert_array_equal(cp.asnumpy(dev.residual), host.residual)
