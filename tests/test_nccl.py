"""The NCCL backend on what one GPU allows: a one-rank NCCL communicator runs every
collective, algorithm and compressor correctly; two ranks on one GPU get a clear error
naming backend='mpi'. Skipped without a GPU."""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from gpu import GPU
from mpi_launch import mpiexec

pytestmark = pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")
BF16 = np.dtype(ml_dtypes.bfloat16)


def test_backend_is_nccl(ncomm):
    assert ncomm.backend == "nccl"


@pytest.mark.parametrize("count", [0, 1, 129, 100_003])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", ["identity", "int8", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "native", "auto"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_one_rank_nccl_matches_mpi(ncomm, mcomm, collective, algorithm, codec, dtype, count):
    import cupy as cp

    if algorithm == "native" and codec != "identity":
        pytest.skip("native takes identity only")
    x = np.random.default_rng(count).standard_normal(count).astype(dtype)
    fn_n, fn_m = getattr(ncomm, collective), getattr(mcomm, collective)
    y = fn_n(cp.asarray(x), algorithm=algorithm, compressor=codec, chunk_bytes=65536)
    ref = fn_m(x, algorithm=algorithm, compressor=codec, chunk_bytes=65536)
    got = cp.asnumpy(y)
    if algorithm in ("native", "auto"):
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=1e-2)
    else:  # the same schedule and kernels: bitwise the same
        np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


def test_nccl_native_refuses_int16(ncomm):
    import cupy as cp

    with pytest.raises(TypeError, match="no native"):
        ncomm.allreduce(cp.zeros(8, dtype=cp.int16), algorithm="native")
    y = ncomm.allreduce(cp.ones(8, dtype=cp.int16), algorithm="auto")  # auto avoids it
    assert int(y.sum()) == 8


@pytest.mark.launch
def test_two_ranks_on_one_gpu_is_a_clear_error(tmp_path):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() > 1:
        pytest.skip("several GPUs: ranks would not share one")
    script = tmp_path / "two.py"
    script.write_text(
        "import coccl\n"
        "try:\n"
        "    coccl.init(backend='nccl')\n"
        "except coccl.CocclError as e:\n"
        "    print('REFUSED', e)\n"
        "else:\n"
        "    print('ACCEPTED')\n"
        "c = coccl.init(backend='auto')\n"
        "print('AUTO', c.backend)\n"
    )
    proc = subprocess.run(
        [*mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("REFUSED") == 2
    assert "backend='mpi'" in proc.stdout and "ncclInvalidUsage" in proc.stdout
    assert proc.stdout.count("AUTO mpi") == 2
