"""Single-process tests of the public API on a one-rank communicator: argument checks
(raised before any byte moves), results' kinds and shapes, configuration."""

import gc
import weakref

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import coccl
from coccl.config import settings


@pytest.fixture(scope="module")
def comm():
    with coccl.init(MPI.COMM_SELF, backend="mpi") as c:
        yield c


def x32(n=10):
    return np.arange(n, dtype=np.float32)


def test_init_and_attributes(comm):
    assert (comm.rank, comm.size, comm.backend) == (0, 1, "mpi")
    assert "rank=0" in repr(comm)


def test_init_refuses_bad_arguments():
    with pytest.raises(ValueError, match="unknown backend"):
        coccl.init(MPI.COMM_SELF, backend="gloo")
    with pytest.raises(TypeError, match="mpi4py.MPI.Comm"):
        coccl.init("COMM_WORLD")


def test_nccl_backend_without_gpu_is_a_clear_error():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is present")
    except Exception:
        pass
    with pytest.raises(coccl.CocclError, match="backend='nccl' cannot run here"):
        coccl.init(MPI.COMM_SELF, backend="nccl")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"op": "mean"}, ValueError, "unknown op"),
        ({"algorithm": "tree"}, ValueError, "unknown algorithm"),
        ({"compressor": "zstd"}, ValueError, "unknown compressor"),
        ({"compressor": {"id": "zstd"}}, ValueError, "unknown compressor"),
        ({"chunk_bytes": 0}, ValueError, "chunk_bytes"),
        ({"chunk_bytes": 1.5}, ValueError, "chunk_bytes"),
    ],
)
def test_bad_arguments(comm, kwargs, error, match):
    with pytest.raises(error, match=match):
        comm.allreduce(x32(), **kwargs)
    np.testing.assert_array_equal(comm.allreduce(x32()), x32())  # still works


@pytest.mark.parametrize(
    "dtype", [np.complex64, np.bool_, np.float128 if hasattr(np, "float128") else np.complex128]
)
def test_unsupported_dtype_is_type_error(comm, dtype):
    with pytest.raises(TypeError, match="dtype"):
        comm.allreduce(np.zeros(4, dtype=dtype))


def test_wrong_out(comm):
    with pytest.raises(ValueError, match="elements"):
        comm.allreduce(x32(10), np.empty(9, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        comm.allreduce(x32(10), np.empty(10, np.float64))
    with pytest.raises(ValueError, match="contiguous"):
        comm.allreduce(x32(10), np.empty(20, np.float32)[::2])


def test_non_contiguous_input_is_refused(comm):
    x = np.arange(20, dtype=np.float32)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        comm.allreduce(x)


def test_not_an_array(comm):
    with pytest.raises(TypeError, match="numpy, cupy"):
        comm.allreduce([1.0, 2.0])


def test_native_takes_identity_only(comm):
    with pytest.raises(ValueError, match="native"):
        comm.allreduce(x32(), algorithm="native", compressor="int8")


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_lossy_codecs_refuse_integers_and_max(comm, codec):
    with pytest.raises(TypeError, match="does not support dtype int32"):
        comm.allreduce(np.arange(4, dtype=np.int32), compressor=codec)
    with pytest.raises(ValueError, match="does not support op 'max'"):
        comm.allreduce(x32(), op="max", compressor=codec)


@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "native", "auto"])
@pytest.mark.parametrize("dtype", [np.float32, np.dtype(ml_dtypes.bfloat16), np.int16])
def test_one_rank_results(comm, algorithm, dtype):
    x = (np.arange(24) - 5).astype(dtype).reshape(2, 3, 4)
    y = comm.allreduce(x, algorithm=algorithm)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)
    assert comm.reduce_scatter(x, algorithm=algorithm).shape == (2, 3, 4)
    assert comm.allgather(x, algorithm=algorithm).shape == (2, 3, 4)


def test_compressed_one_rank_allreduce_is_close(comm):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    for codec in ["int8", "taco"]:
        y = comm.allreduce(x, algorithm="two_shot", compressor=codec)
        assert np.linalg.norm(y - x) / np.linalg.norm(x) < 0.05


def test_closed_communicator():
    c = coccl.init(MPI.COMM_SELF, backend="mpi")
    c.close()
    c.close()  # idempotent
    with pytest.raises(coccl.CocclError, match="closed"):
        c.allreduce(x32())


def test_settings_validation(monkeypatch):
    monkeypatch.setenv("COCCL_CHUNK_BYTES", "lots")
    with pytest.raises(ValueError, match="COCCL_CHUNK_BYTES"):
        settings()
    monkeypatch.setenv("COCCL_CHUNK_BYTES", "4096")
    monkeypatch.setenv("COCCL_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="COCCL_TIMEOUT_S"):
        settings()
    monkeypatch.setenv("COCCL_TIMEOUT_S", "2.5")
    assert settings().timeout_s == 2.5 and settings().chunk_bytes == 4096


def test_public_names():
    for name in coccl.__all__:
        assert hasattr(coccl, name)
    assert {"init", "Communicator", "get_compressor", "register_compressor", "CocclError"} <= set(
        coccl.__all__
    )


def test_nccl_wire_types():
    """Uncompressed payloads travel in their own NCCL type (bfloat16 too), others as bytes."""
    from coccl.core.arrays import BFLOAT16
    from coccl.transports.nccl import NCCL_UINT8, wire_type

    assert wire_type(64, np.float32) == (16, 7)
    assert wire_type(64, BFLOAT16) == (32, 9)
    assert wire_type(64, None) == (64, NCCL_UINT8)  # compressed payload: bytes
    assert wire_type(64, np.int16) == (64, NCCL_UINT8)  # no NCCL int16: bytes


@pytest.mark.launch
@pytest.mark.parametrize("variable", ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_a_launcher_that_started_more_ranks_than_mpi_sees_is_an_error(variable):
    """torchrun (or another MPI's mpiexec) starts N processes that each see an MPI world
    of one: coccl.init says so and how to launch, instead of running N 1-rank worlds."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    env.update({variable: "2", "COCCL_UNDER_MPIEXEC": ""})
    proc = subprocess.run(
        [sys.executable, "-c", "import coccl; coccl.init()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "CocclError" in proc.stderr and f"{variable}=2" in proc.stderr
    assert "mpiexec" in proc.stderr


@pytest.mark.parametrize("compressor", ["identity", "taco"])
def test_a_call_keeps_no_reference_to_its_arrays(comm, compressor):
    """With the garbage collector off, the input and the result die with the caller's
    last reference: nothing of the call (its rounds, plan, pools) holds them. A tensor
    held only by a reference cycle stays allocated in the pool snapshot torch's
    cudagraph trees take when a recording ends (engine/streamed: Round.release)."""
    x = np.ones(1 << 12, np.float32)
    comm.allreduce(x, compressor=compressor, algorithm="ring")  # the plan's first call
    enabled = gc.isenabled()
    gc.disable()
    try:
        y = comm.allreduce(x, x, compressor=compressor, algorithm="ring")
        refs = weakref.ref(x), weakref.ref(y)
        del x, y
        assert [r() for r in refs] == [None, None]
    finally:
        if enabled:
            gc.enable()
