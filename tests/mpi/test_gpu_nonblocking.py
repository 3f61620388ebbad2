"""Nonblocking collectives and buckets on CuPy device arrays (coccl/communicator/
nonblocking.py, buckets.py): a device call runs in its turn on the caller's thread,
ordered on the caller's current stream, and its handle is an event recorded there; the
results equal the host's bitwise, staged over MPI (ranks may share a GPU) and over NCCL
(a GPU per rank). Skipped without a GPU."""

import numpy as np
import pytest
from mpi4py import MPI

import coccl

from conftest import case_seed, gpu_per_rank, rank_data

pytest.importorskip("cupy")
import cupy as cp  # noqa: E402

try:
    if cp.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA GPU", allow_module_level=True)
except Exception:
    pytest.skip("no usable CUDA GPU", allow_module_level=True)

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
COUNTS = [0, 1, 3, 4099]


@pytest.fixture(scope="module", params=["mpi", pytest.param("nccl", marks=gpu_per_rank())])
def dcomm(request):
    with coccl.init(MPI.COMM_WORLD, backend=request.param) as c:
        yield c


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_device_handle_equals_host_on_a_side_stream(comm, dcomm, collective, count):
    n = count * N if collective == "reduce_scatter" else count
    x = rank_data(case_seed("gpu-nb", collective, count), RANK, n, np.float32)
    host = getattr(comm, collective)(x, algorithm="ring")
    side, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with side:
        dx = cp.asarray(x)
        h = getattr(dcomm, "i" + collective)(dx, algorithm="ring")
    with other:  # wait() orders the stream current at the wait after the call
        y = h.wait()
        doubled = y * 2
    other.synchronize()
    assert h.test()
    np.testing.assert_array_equal(cp.asnumpy(y), host)
    np.testing.assert_array_equal(cp.asnumpy(doubled), host * 2)


def test_device_call_waits_for_queued_host_calls(comm, dcomm):
    """A host call queued before a device call runs first (the issue order)."""
    seed = case_seed("gpu-nb-order")
    x = rank_data(seed, RANK, 1000, np.float32)
    h_host = dcomm.iallreduce(x, algorithm="ring")
    h_dev = dcomm.iallreduce(cp.asarray(x), algorithm="ring")
    assert h_host.test()  # the device call waited for it
    np.testing.assert_array_equal(cp.asnumpy(h_dev.wait()), h_host.wait())
    cp.cuda.get_current_stream().synchronize()


@pytest.mark.parametrize("nonblocking", [False, True])
def test_device_bucket_equals_host_bucket(comm, dcomm, nonblocking):
    seed = case_seed("gpu-bucket")
    xs = [rank_data(seed + i, RANK, c, d) for i, (c, d) in enumerate(
        [(5, np.float32), (0, np.float32), (4099, np.float64), (3, np.float32)]
    )]  # fmt: skip
    host = comm.allreduce(xs, algorithm="ring")
    dxs = [cp.asarray(x) for x in xs]
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        if nonblocking:
            dys = dcomm.iallreduce(dxs, algorithm="ring").wait()
        else:
            dys = dcomm.allreduce(dxs, algorithm="ring")
    side.synchronize()
    assert all(isinstance(y, cp.ndarray) for y in dys)
    for h, d in zip(host, dys, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(d), h)


def test_torch_cuda_bucket(comm, dcomm):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    seed = case_seed("gpu-torch-bucket")
    xs = [rank_data(seed + i, RANK, c, np.float32) for i, c in enumerate([7, 300])]
    host = comm.allreduce(xs, algorithm="ring")
    device = torch.device("cuda", cp.cuda.Device().id)  # the one coccl.init made current
    ts = [torch.from_numpy(x).to(device) for x in xs]
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        ys = dcomm.iallreduce(ts, ts, algorithm="ring").wait()  # in place
    stream.synchronize()
    assert all(y is t for y, t in zip(ys, ts, strict=True))
    for h, t in zip(host, ts, strict=True):
        np.testing.assert_array_equal(t.cpu().numpy(), h)
