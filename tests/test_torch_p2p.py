"""Point-to-point and all-to-all of the torch.distributed backend "coccl"
(coccl/torch/p2p.py, coccl/torch/alltoall.py): tests/scripts/torch_p2p_cases.py on 4
ranks under torchrun, in one launch (rings of 4 and 3, the codec per direction, the
mismatches, all_to_all_single, 2-stage GPipe and 1F1B schedules against a plain Gloo group);
tests/scripts/torch_p2p_gpu_cases.py on 2 ranks sharing a GPU where there is one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import ROOT

torch = pytest.importorskip("torch")

RANKS = ROOT / "tests" / "scripts" / "torch_ranks.py"
CASES = "tests/scripts/torch_p2p_cases.py"


def run_cases(cases: str, ranks: int, logdir: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    try:
        proc = subprocess.run(
            [*torchrun, "--nproc-per-node", str(ranks), str(RANKS), str(logdir), cases],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = -1, f"TIMEOUT (a hang is a failure)\n{exc.stdout or ''}{exc.stderr or ''}"
    logs = [f"----- {p.name} -----\n{p.read_text()[-20000:]}" for p in sorted(logdir.glob("*"))]
    assert code == 0, "\n".join([out[-5000:], *logs])


@pytest.mark.launch
def test_p2p_cases_under_torchrun(tmp_path: Path):
    run_cases(CASES, 4, tmp_path)


@pytest.mark.launch
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_p2p_gpu_cases_two_ranks_sharing_a_gpu(tmp_path: Path):
    run_cases("tests/scripts/torch_p2p_gpu_cases.py", 2, tmp_path)


def test_only_nccl_on_the_tensors_gpu_takes_cuda_tensors_as_they_are() -> None:
    """``Communicator.p2p_over_nccl``, which decides whether the torch backend hands a
    CUDA tensor to the Communicator as it is (else through a host copy): never for host
    data, nor on a communicator without NCCL."""
    from mpi4py import MPI

    import coccl

    comm = coccl.init(MPI.COMM_SELF, backend="mpi")
    try:
        assert not comm.p2p_over_nccl(None)
        assert not comm.p2p_over_nccl(0)
    finally:
        comm.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("codec", ["identity", "int8"])
def test_cuda_tensors_travel_over_nccl_as_they_are(codec: str) -> None:
    """On a one-rank NCCL Communicator a CUDA tensor sent to the rank itself goes to the
    Communicator as it is (no host copy counted), over NCCL (its bytes on NCCL's
    counter), and lands bitwise as each chunk's decode(encode(chunk)) on the CPU; the
    receive is ordered before the stream current at its wait (a side stream)."""
    from collections import Counter

    import numpy as np
    from mpi4py import MPI

    import coccl
    from coccl.torch import p2p
    from coccl.torch.backend import CocclOptions

    comm = coccl.init(MPI.COMM_SELF, backend="nccl")
    try:
        opts = CocclOptions(p2p_backward=codec, min_compress_bytes=0, chunk_bytes=64 << 10)
        x = torch.randn(1 << 16, device="cuda")  # four chunks
        out = torch.empty_like(x)
        counts: Counter[str] = Counter()
        comm.reset_stats()
        sent = p2p.post(comm, opts, "send", [x], 0, 3, counts)
        got = p2p.post(comm, opts, "recv", [out], 0, 3, counts)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            got.wait()
            copy = out.clone()
        sent.wait()
        side.synchronize()
        assert not any(k.startswith("copied:") for k in counts)
        assert comm._nccl.bytes_sent == comm.stats()["bytes_sent"] > 0
        host, xs, elems = coccl.get_compressor(codec), x.cpu().numpy(), 16 << 10
        parts = [xs[a : a + elems] for a in range(0, xs.size, elems)]
        expect = np.concatenate(
            [host.decode(host.encode(p), count=p.size, dtype=p.dtype) for p in parts]
        )
        assert np.array_equal(copy.cpu().numpy(), expect)
    finally:
        comm.close()
