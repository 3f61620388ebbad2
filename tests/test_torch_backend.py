"""The torch.distributed backend "coccl" (coccl/torch.py): its options and op mapping on
one process, and tests/scripts/torch_backend_cases.py on several ranks under both
launchers it supports (torchrun, and mpiexec through ``coccl.torch.init_process_group``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import ROOT, mpiexec

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import coccl.torch  # noqa: E402
from coccl.torch import CocclOptions  # noqa: E402

RANKS = ROOT / "tests" / "scripts" / "torch_ranks.py"
CASES = "tests/scripts/torch_backend_cases.py"
HIERARCHICAL_CASES = "tests/scripts/torch_hierarchical_cases.py"


# ------------------------------------------------------------- one process
def test_backend_is_registered():
    assert dist.Backend.COCCL == "coccl"
    assert "coccl" in dist.Backend.backend_list
    coccl.torch.register_backend()  # a second registration is a no-op
    assert dist.Backend.backend_capability["coccl"] == ["cpu", "cuda"]


def test_default_options_are_exact_and_compress_reductions_only():
    opts = CocclOptions()
    assert opts.codec.lossless
    assert opts.compress == ("allreduce", "reduce_scatter")
    assert opts.min_compress_bytes == coccl.torch.DEFAULT_MIN_COMPRESS_BYTES == 64 << 10


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"compressor": "zstd"}, ValueError),
        ({"algorithm": "fastest"}, ValueError),
        ({"compressor": "taco", "algorithm": "native"}, ValueError),
        ({"chunk_bytes": 0}, ValueError),
        ({"chunk_bytes": True}, ValueError),
        ({"min_compress_bytes": 1.5}, ValueError),
        ({"compress": ("allreduce", "broadcast")}, ValueError),
        ({"device_backend": "mpi"}, ValueError),
        ({"backward_compressor": "zstd"}, ValueError),
        ({"backward_compressor": {"id": "mx", "element": "e9m9"}}, ValueError),
        ({"backward_compressor": "taco", "algorithm": "native"}, ValueError),
        ({"compressor": ("int8", "int8")}, ValueError),  # a pair without "hierarchical"
        ({"backward_compressor": ["int8", "int8"], "algorithm": "two_shot"}, ValueError),
        ({"compressor": ("int8", "int8", "int8"), "algorithm": "hierarchical"}, ValueError),
        ({"compressor": ("int8", "zstd"), "algorithm": "hierarchical"}, ValueError),
        ({"algorithm": "hierarchical", "compress": ("allreduce", "allgather")}, ValueError),
        (
            {
                "compressor": ("int8", "int8"),
                "algorithm": "hierarchical",
                "compress": ("alltoall",),
            },
            ValueError,
        ),
    ],
)
def test_bad_options_are_refused(kwargs, error):
    with pytest.raises(error):
        CocclOptions(**kwargs)


INT4 = {"id": "int", "bits": 4}


def test_a_codec_pair_is_for_the_hierarchical_algorithm():
    """``compressor=(intra, inter)`` as the Communicator takes it: a codec per level,
    with ``algorithm="hierarchical"`` only (a list is taken as the tuple)."""
    opts = CocclOptions(compressor=["int8", INT4], algorithm="hierarchical")
    assert opts.compressor == ("int8", INT4)
    assert [c.codec_id for c in opts.codecs] == ["int8", "int"]
    assert opts.codec is opts.codecs[0] and opts.backward_codecs == opts.codecs
    assert opts.compressor_for(True) == (("int8", INT4), opts.codecs)
    one = CocclOptions(compressor="int8", algorithm="hierarchical", compress=("alltoall",))
    assert len(one.codecs) == 1
    with pytest.raises(ValueError, match="pair is for algorithm='hierarchical', not 'auto'"):
        CocclOptions(compressor=("int8", INT4))
    with pytest.raises(ValueError, match="compresses allreduce, reduce_scatter only"):
        CocclOptions(compressor=("int8", INT4), algorithm="hierarchical", compress=("allgather",))
    with coccl.torch.options(compressor=("int8", INT4)):  # the group's algorithm: at the call
        pass
    with pytest.raises(ValueError, match="pair must be"), coccl.torch.options(compressor=("a",)):
        pass


MXFP6 = {"id": "mx", "element": "e2m3"}
NVFP4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}


def test_backward_compressor_is_the_compressor_unless_given():
    opts = CocclOptions(compressor="taco")
    assert opts.backward_codec is opts.codec
    assert opts.compressor_for(True) == opts.compressor_for(False) == ("taco", (opts.codec,))
    split = CocclOptions(compressor=MXFP6, backward_compressor=NVFP4)
    assert split.compressor_for(False) == (MXFP6, (split.codec,))
    assert split.compressor_for(True) == (NVFP4, (split.backward_codec,))
    assert split.backward_codec.get_config() == {**NVFP4, "id": "mx"}
    CocclOptions(algorithm="native", backward_compressor="identity")  # exact: allowed
    with pytest.raises(ValueError, match="backward_compressor"):
        CocclOptions(algorithm="native", backward_compressor=NVFP4)


def test_in_backward_follows_autograds_pass():
    """Where ``in_backward`` (a call's direction) is True: every piece of a backward
    pass, the forward that activation checkpointing recomputes in it included (the
    documented limit); not outside, nor in a thread a hook starts."""
    import threading  # noqa: PLC0415

    from torch.utils.checkpoint import checkpoint  # noqa: PLC0415

    seen: list[tuple[str, bool]] = []

    def note(where: str) -> None:
        seen.append((where, coccl.torch.in_backward()))

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            note("forward")
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            note("backward")
            return grad

    def in_a_thread(grad):
        thread = threading.Thread(target=note, args=("thread",))
        thread.start()
        thread.join()

    def queue_callback(grad):
        torch.autograd.Variable._execution_engine.queue_callback(lambda: note("callback"))

    note("outside")
    x = torch.randn(3, requires_grad=True)
    y = Probe.apply(x)
    y.register_hook(lambda grad: note("tensor hook"))
    y.register_hook(in_a_thread)
    y.register_hook(queue_callback)
    x.register_post_accumulate_grad_hook(lambda p: note("accumulate hook"))
    y.sum().backward()
    note("after")
    x = torch.randn(3, requires_grad=True)  # no hook
    torch.autograd.grad(Probe.apply(x).sum(), x, create_graph=True)
    checkpoint(lambda t: Probe.apply(t).sin(), x, use_reentrant=False).sum().backward()
    assert seen == [
        ("outside", False), ("forward", False), ("tensor hook", True), ("thread", False),
        ("backward", True), ("accumulate hook", True), ("callback", True), ("after", False),
        ("forward", False), ("backward", True),  # autograd.grad, create_graph=True
        ("forward", False), ("forward", True), ("backward", True),  # recomputed in backward
    ]  # fmt: skip


def test_options_take_codec_configs():
    opts = CocclOptions(compressor={"id": "taco", "group_size": 64}, compress=["allreduce"])
    assert opts.codec.get_config()["group_size"] == 64
    assert opts.compress == ("allreduce",)
    assert CocclOptions(compress="alltoall").compress == ("alltoall",)  # one name alone


@pytest.mark.parametrize(
    "op,expected",
    [
        ("SUM", ("sum", None)),
        ("AVG", ("avg", None)),
        ("MAX", ("max", None)),
        ("MIN", ("min", None)),
        ("PRODUCT", ("prod", None)),
        ("BAND", None),  # forwarded to the inner group
    ],
)
def test_reduce_op_mapping(op, expected):
    opts = dist.AllreduceOptions()
    opts.reduceOp = getattr(dist.ReduceOp, op)
    assert coccl.torch._reduce_op(opts) == expected


def test_premul_sum_mapping():
    op = dist._make_nccl_premul_sum(0.5)
    expected = ("sum", 0.5) if getattr(op, "factor", None) is not None else None
    assert coccl.torch._reduce_op(op) == expected


def run_alone(script: Path, cwd: Path, **extra: str) -> str:
    """Run ``script`` as a lone process (no launcher's rank) with ``extra`` variables; it
    must print ``ok``. Returns its stderr."""
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(extra)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    return proc.stderr


@pytest.mark.launch
def test_world_of_one(tmp_path: Path):
    """A lone process (no launcher) becomes a coccl world of one; creating it leaves
    torch's intra-op thread count alone (numba's OpenMP start would reset it); destroying
    it destroys its inner Gloo groups then, not at the interpreter's exit (where a Gloo
    worker freeing a tensor over numpy memory aborts the process), while torch may
    still hold the group object."""
    script = tmp_path / "alone.py"
    script.write_text(
        "import gc, weakref, torch, torch.distributed as dist, coccl.torch\n"
        "opts = coccl.torch.CocclOptions(compressor='taco')\n"
        "torch.set_num_threads(1)\n"
        "torch.ones(256, 256) @ torch.ones(256, 256)  # torch's OpenMP team has started\n"
        "coccl.torch.init_process_group(pg_options=opts)\n"
        "assert dist.group.WORLD.options is opts\n"
        "assert torch.get_num_threads() == 1, 'creating the group changed torch threads'\n"
        "t = torch.arange(5.0)\n"
        "dist.all_reduce(t, op=dist.ReduceOp.AVG)\n"
        "assert dist.get_world_size() == 1 and torch.equal(t, torch.arange(5.0))\n"
        "pg = dist.group.WORLD\n"
        "inner = [pg._gloo] + [getattr(x, 'group', None) for x in pg.comm._transports()]\n"
        "refs = [weakref.ref(g) for g in inner if isinstance(g, dist.ProcessGroupGloo)]\n"
        "assert len(refs) >= 2, inner  # the forwarding group and the wire's\n"
        "del inner\n"
        "gc.disable()  # freed by the destroy itself, not by a later collection\n"
        "dist.destroy_process_group()\n"
        "assert [r() for r in refs] == [None] * len(refs), 'a Gloo group outlived the destroy'\n"
        "print('ok')\n"
    )
    run_alone(script, ROOT)


@pytest.mark.launch
def test_backend_name_works_without_importing_coccl_torch(tmp_path: Path):
    """torch's backend autoload (the ``torch.backends`` entry point) registers "coccl"
    when torch is imported, cheaply (no coccl package, MPI, numba or CUDA); the first
    group imports coccl.torch."""
    from importlib.metadata import entry_points

    if not any(e.name == "coccl" for e in entry_points(group="torch.backends")):
        pytest.skip("coccl is not installed with its entry points (pip install -e .)")
    script = tmp_path / "autoload.py"
    script.write_text(
        "import sys, torch, torch.distributed as dist\n"
        "assert 'coccl' in dist.Backend.backend_list\n"
        "heavy = [m for m in ('coccl', 'mpi4py', 'numba', 'cupy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert not torch.cuda.is_initialized()\n"
        "dist.init_process_group('coccl', store=dist.HashStore(), rank=0, world_size=1)\n"
        "assert 'coccl.torch' in sys.modules and 'mpi4py.MPI' not in sys.modules\n"
        "t = torch.arange(4.0)\n"
        "dist.all_reduce(t)\n"
        "assert torch.equal(t, torch.arange(4.0))\n"
        "from coccl import config\n"
        "assert config.log_rank() == '0', config.log_rank()  # set where the comm is made\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n"
    )
    log = run_alone(script, tmp_path, COCCL_LOG="debug")
    if "device data travels over" in log:  # no GPU here: the line names the host transport
        assert "device data travels over Gloo" in log, log


@pytest.mark.parametrize("version", ["2.10.2", "2.14.0", "3.0.0+cu130", "nightly"])
def test_torch_outside_the_range_is_refused(version):
    low, high = coccl.torch.TORCH_RANGE
    text = re.escape(f"torch {low} to {high}, found torch {version}")
    with pytest.raises(ImportError, match=text):
        coccl.torch.versions.check_torch_version(version)


@pytest.mark.parametrize("version", ["2.11.0", "2.12.1", "2.13.0+cpu", "2.13.0a0+git1234"])
def test_torch_in_the_range_is_taken(version):
    coccl.torch.versions.check_torch_version(version)


def test_import_checks_the_torch_version(monkeypatch):
    """``import coccl.torch`` refuses a torch outside the range, naming both."""
    import importlib

    monkeypatch.setattr(torch, "__version__", "2.4.1")
    with pytest.raises(ImportError, match="found torch 2.4.1"):
        importlib.reload(coccl.torch)
    monkeypatch.undo()
    importlib.reload(coccl.torch)
    assert "coccl" in dist.Backend.backend_list


# ---------------------------------------------------------------- launches
def run_cases(cmd: list[str], logdir: Path, cases: str = CASES) -> None:
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [*cmd, str(RANKS), str(logdir), cases], cwd=ROOT, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = -1, f"TIMEOUT (a hang is a failure)\n{exc.stdout or ''}{exc.stderr or ''}"
    logs = [f"----- {p.name} -----\n{p.read_text()[-20000:]}" for p in sorted(logdir.glob("*"))]
    assert code == 0, "\n".join([out[-5000:], *logs])


@pytest.mark.launch
def test_cases_under_torchrun(tmp_path: Path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run_cases([*torchrun, "--nproc-per-node", "2"], tmp_path)


@pytest.mark.mpi
def test_cases_under_mpiexec(tmp_path: Path):
    """Three ranks: counts that are not multiples of the group, two-shot unlike ring."""
    run_cases([*mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py"], tmp_path)


@pytest.mark.launch
def test_hierarchical_cases_on_two_nodes_of_two(tmp_path: Path, monkeypatch):
    """The two-level schedule with one codec and a codec pair through a coccl group:
    tests/scripts/torch_hierarchical_cases.py on 4 ranks as 2 emulated nodes of 2."""
    monkeypatch.setenv("COCCL_LOCAL_SIZE", "2")  # every rank inherits it
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run_cases([*torchrun, "--nproc-per-node", "4"], tmp_path, HIERARCHICAL_CASES)


# ------------------------------------------------------------------ example
EXAMPLE = ROOT / "examples" / "tp_dtensor.py"


def run_example(cmd: list[str], groups: str, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "result.json"
    args = ["--tiny", "--steps", "3", "--warmup", "1", "--threads", "1", "--groups", groups]
    proc = subprocess.run(
        [*cmd, str(EXAMPLE), *args, *extra, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    assert "no call was compressed" not in proc.stderr
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == result  # the same JSON
    runs = {r["spec"]: r for r in result["runs"]}
    assert result["tp"] == 2 and list(runs) == groups.split(",")
    assert result["command"].startswith("python examples/tp_dtensor.py --tiny")
    assert result["date"] and result["commit"]  # the provenance of a results file
    for run in runs.values():
        assert run["replicated_identical"] is True
        assert len(run["losses"]) == 3 and run["tokens_per_s"] > 0
    # coccl's exact path computes what the plain group does, to float rounding
    assert runs["identity"]["losses"] == pytest.approx(runs["plain"]["losses"], rel=1e-5)
    assert runs["identity"]["calls"]["allreduce:exact"] > 0
    return runs


@pytest.mark.launch
def test_example_under_torchrun(tmp_path: Path):
    """--tiny as the README runs it: its TP messages are below coccl's default
    min_compress_bytes, so --tiny lowers it, and taco compresses every TP AllReduce."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    runs = run_example([*torchrun, "--nproc-per-node", "2"], "plain,identity,taco", tmp_path)
    taco = runs["taco"]
    assert taco["calls"]["allreduce:compressed"] > 0 and "allreduce:exact" not in taco["calls"]
    assert taco["losses"] != runs["plain"]["losses"]  # quantized, so not bitwise the same
    assert taco["losses"] == pytest.approx(runs["plain"]["losses"], rel=0.02)


@pytest.mark.mpi
def test_example_under_mpiexec(tmp_path: Path):
    mpi = [*mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py"]
    run_example(mpi, "plain,identity", tmp_path, "--min-compress-bytes", "0")


def load_dtensor_example():
    """examples/tp_dtensor.py as a module (it imports its sibling tp_gpt.py)."""
    import importlib  # noqa: PLC0415

    folder = str(EXAMPLE.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("tp_dtensor")


def test_tiny_example_compresses_its_tp_messages():
    """--tiny's TP messages (batch x seq x d_model float32) are below coccl's default
    min_compress_bytes; --tiny lowers it under them unless the flag is given."""
    example = load_dtensor_example()
    tiny = example.parse_args(["--tiny"])
    message = tiny.batch * tiny.seq * tiny.d_model * 4
    assert message < coccl.torch.DEFAULT_MIN_COMPRESS_BYTES
    assert tiny.min_compress_bytes == example.TINY_MIN_COMPRESS_BYTES <= message
    assert example.parse_args([]).min_compress_bytes == coccl.torch.DEFAULT_MIN_COMPRESS_BYTES
    assert example.parse_args(["--tiny", "--min-compress-bytes", "1"]).min_compress_bytes == 1


def test_a_lossy_group_that_compressed_nothing_is_named():
    example = load_dtensor_example()
    taco = coccl.get_compressor("taco").get_config()
    exact = {"group": "coccl", "compressor": taco, "calls": {"allreduce:exact": 160}}
    assert example.uncompressed_lossy(exact)
    both = {**exact, "calls": {"allreduce:exact": 2, "allreduce:compressed": 158}}
    assert not example.uncompressed_lossy(both)
    identity = {"group": "coccl", "compressor": {"id": "identity"}, "calls": exact["calls"]}
    assert not example.uncompressed_lossy(identity)
    assert not example.uncompressed_lossy({"group": "plain", "backend": "gloo"})
