"""examples/train_3d.py under torchrun on 8 CPU ranks (PP 2 x DP 2 x TP 2, tiny): the
coccl identity policy trains to the losses of torch's own groups, taco3d compresses the TP
and DP traffic (the DP parameter gather as delta) and keeps the TP replicas bitwise equal,
and rank 0's JSON has its fields; a rank ends without the interpreter's finalization."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import mpiexec

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "train_3d.py"
STEPS = 2


def run_3d(policy: str, out: Path) -> dict:
    """One 8-rank tiny run of ``policy``; rank 0's JSON."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8"]
    cmd += [str(SCRIPT), "--tp", "2", "--pp", "2", "--dp", "2", "--policy", policy, "--tiny"]
    cmd += ["--steps", str(STEPS), "--warmup", "0", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COCCL_TIMEOUT_S": "300"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return json.loads(out.read_text())


@pytest.mark.launch
def test_identity_trains_as_torch_groups(tmp_path: Path) -> None:
    plain = run_3d("none", tmp_path / "none.json")
    exact = run_3d("identity", tmp_path / "identity.json")
    assert len(plain["losses"]) == len(exact["losses"]) == STEPS
    assert exact["losses"] == pytest.approx(plain["losses"], rel=1e-5, abs=0)
    for record in (plain, exact):
        assert record["mesh"] == {"pp": 2, "dp": 2, "tp": 2}
        assert record["tokens_per_s"] > 0 and record["tp_replicas_identical"] is True
        assert set(record["traffic"]) == {"pp", "dp", "tp"}
    assert {d["backend"] for d in plain["traffic"].values()} == {"gloo"}
    traffic = exact["traffic"]
    assert all(d["backend"] == "coccl" for d in traffic.values())
    assert traffic["tp"]["calls"]["allreduce:exact"] > 0  # DTensor's TP AllReduces
    assert traffic["dp"]["calls"]["allgather:exact"] > 0  # FSDP2's parameter gathers
    assert traffic["dp"]["calls"]["reduce_scatter:exact"] > 0  # and gradient reduces
    assert not any(k.endswith(":compressed") for d in traffic.values() for k in d["calls"])
    assert exact["policy"]["name"] == "identity" and exact["state_dropped"] == []


@pytest.mark.launch
def test_taco3d_compresses_tp_and_dp(tmp_path: Path) -> None:
    record = run_3d("taco3d", tmp_path / "taco3d.json")
    assert len(record["losses"]) == STEPS and all(0 < x < 10 for x in record["losses"])
    assert record["tp_replicas_identical"] is True  # compressed TP sums alike on every rank
    tp, dp = record["traffic"]["tp"], record["traffic"]["dp"]
    assert tp["calls"]["allreduce:compressed"] > 0
    assert dp["calls"]["reduce_scatter:compressed"] > 0
    pp_traffic = record["traffic"]["pp"]
    kinds = ((tp, ["allreduce"]), (dp, ["allgather", "reduce_scatter"]), (pp_traffic, ["send"]))
    for dim, keys in kinds:
        for key in keys:  # a compressed call sends fewer bytes than it reduces
            sent = dim["bytes"][f"{key}:compressed:sent"]
            assert 0 < sent < dim["bytes"][f"{key}:compressed:input"], (key, dim["bytes"])
        # every byte coccl sent is counted under one collective and path
        sent_total = sum(v for k, v in dim["bytes"].items() if k.endswith(":sent"))
        assert sent_total == dim["comm_bytes_sent"]
    # the 4-bit weight differences: the first gather of each FSDP unit exact, then compressed
    assert record["state_dropped"] == []
    assert dp["calls"]["allgather:compressed"] > 0 and dp["calls"]["allgather:exact"] > 0
    assert record["policy"]["pp"]["forward"]["codec"]["row"] == record["model"]["d_model"]
    assert record["pp_codecs_carried"] == {"forward": True, "backward": True}
    pp = record["traffic"]["pp"]["calls"]  # activations forward, gradients back, compressed
    assert pp["send_forward:compressed"] > 0 and pp["send_backward:compressed"] > 0


# A rank of the example that ends by ``exit_now``: it prints without a newline (so that the
# text waits in stdout's buffer) and registers an atexit handler, which only the
# interpreter's finalization would run; under mpiexec one of the C library's exit handlers
# too (MPICH reports a clean exit to its process manager from one of those).
EXITING_RANK = """
import atexit, ctypes, os, sys
sys.path.insert(0, sys.argv[1])
import tp_gpt
atexit.register(print, "finalized", flush=True)
if sys.argv[3:] == ["mpi"]:
    from mpi4py import MPI
    def on_c_exit(status, arg):
        os.write(1, b" exit handlers")
    on_c_exit = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)(on_c_exit)
    ctypes.CDLL(None).on_exit(on_c_exit, None)  # glibc's
print("done", end="")
tp_gpt.exit_now(int(sys.argv[2]))
"""


@pytest.mark.launch
def test_a_rank_exits_without_finalizing() -> None:
    """``exit_now`` skips the finalization, in which a Gloo worker that still drops a
    finished work aborts the process (see its docstring), and keeps the output and the
    exit status."""
    cmd = [sys.executable, "-c", EXITING_RANK, str(SCRIPT.parent), "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stdout) == (3, "done"), proc.stderr[-4000:]


@pytest.mark.mpi
def test_a_rank_exits_without_finalizing_under_mpiexec() -> None:
    """Under mpiexec the C library's exit handlers run too: without MPICH's, its process
    manager may take a rank that leaves before the others for a failed one."""
    cmd = [*mpiexec(), "-n", "2", sys.executable, "-c", EXITING_RANK, str(SCRIPT.parent)]
    proc = subprocess.run(cmd + ["0", "mpi"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    out = proc.stdout
    assert out.count("done") == out.count(" exit handlers") == 2 and "finalized" not in out, out


def test_traffic_paths_of_a_codec_pair_and_a_first_delta_gather() -> None:
    """The JSON's path of a call: a hierarchical codec pair (a policy's ``[intra,
    inter]``) is compressed, a delta gather's first call (state not bound) exact."""
    import coccl  # noqa: PLC0415

    sys.path.insert(0, str(SCRIPT.parent))
    import train_3d  # noqa: PLC0415

    path = train_3d.CountingComm._path
    assert path({"compressor": ("int8", {"id": "int", "bits": 4})}) == "compressed"
    assert path({"compressor": ("identity", "identity")}) == "exact"
    assert path({"compressor": "int8", "delta": coccl.DeltaState()}) == "exact"
    assert path({"compressor": "int8"}) == "compressed"
