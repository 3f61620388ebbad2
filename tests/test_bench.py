"""Tests of ``coccl-bench``: argument parsing and help, byte counts and bus factors, the
table and JSON writers on fake rows, the plot, and end-to-end sweeps launched with
``--np``, with a correct and with a deliberately broken codec."""

from __future__ import annotations

import argparse
import ast
import importlib.resources
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import coccl
from coccl.bench import cli, launch, timing
from coccl.bench.collective import (
    ALLGATHER,
    ALLREDUCE,
    REDUCE_SCATTER,
    exact_reduction,
    rank_data,
    recorded_environment,
    sweep_counts,
    sweep_sizes,
    worst,
)
from coccl.bench.table import (
    MAX_WIDTH,
    Progress,
    Row,
    TablePlan,
    auto_notes,
    format_summary,
    layout,
    to_record,
    write_json,
)

ROW_FIELDS = {
    "size",
    "count",
    "type",
    "redop",
    "algorithm",
    "compressor",
    "time_us",
    "algbw",
    "busbw",
    "time_us_inplace",
    "algbw_inplace",
    "busbw_inplace",
    "time_us_iters",
    "time_us_iters_inplace",
    "time_us_ranks",
    "time_us_ranks_inplace",
    "ratio",
    "rel_err",
    "rel_err_bound",
    "wrong",
    "native_time_us",
    "speedup",
    "peak_staging_bytes",
    "overlap_efficiency",
    "overlap_times_us",
    "backend",
    "ran",
}
META_FIELDS = {
    "collective",
    "nranks",
    "backend",
    "device",
    "command",
    "date",
    "commit",
    "hostname",
    "cpu",
    "gpu",
    "average",
    "check",
    "rows",
}


# ---------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("0", 0),
        ("1K", 1024),
        ("1k", 1024),
        ("64M", 64 << 20),
        ("2G", 2 << 30),
        ("4KiB", 4096),
        ("16MB", 16 << 20),
        ("1.5K", 1536),
        (" 32M ", 32 << 20),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert cli.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "8X", "-1", "1.3", "1e3", "1KK"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cli.parse_size(text)


def test_comma_list_and_datatype() -> None:
    assert cli.comma_list("ring, two_shot,ring") == ["ring", "two_shot"]
    with pytest.raises(argparse.ArgumentTypeError):
        cli.comma_list(" , ")
    assert cli.datatype("half") == np.float16
    assert cli.datatype("float") == np.float32
    assert cli.datatype("bfloat16").name == "bfloat16"
    with pytest.raises(argparse.ArgumentTypeError):
        cli.datatype("complex64")


def test_subcommands_registered() -> None:
    parser = cli.build_parser()
    assert {"allreduce", "reduce_scatter", "allgather"} <= set(cli.COMMANDS)
    args = parser.parse_args(
        [
            "allreduce",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "4",
            "-n",
            "3",
            "-w",
            "0",
            "-c",
            "0",
            "-d",
            "bfloat16",
            "-o",
            "avg",
            "--algorithm",
            "ring,two_shot",
            "--compressor",
            "identity,taco",
            "--chunk-bytes",
            "64K",
            "--np",
            "2",
        ]
    )
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (1024, 65536, 4)
    assert (args.iters, args.warmup_iters, args.check, args.op) == (3, 0, 0, ["avg"])
    assert args.datatype == [np.dtype(ml_dtypes.bfloat16)]
    assert args.algorithm == ["ring", "two_shot"]
    assert args.compressor == ["identity", "taco"]
    assert (args.chunk_bytes, args.np) == (65536, 2)


@pytest.mark.parametrize(
    "argv",
    [
        ["allreduce", "-o", "xor"],
        ["allreduce", "-o", "sum,xor"],
        ["allreduce", "-d", "float32,complex64"],
        ["allreduce", "--algorithm", "ring,rnig"],
        ["allreduce", "-c", "2"],
        ["allreduce", "-n", "0"],
        ["allreduce", "-b", "1M", "-e", "1K"],
        ["allreduce", "-b", "0"],
        ["allreduce", "--np", "0"],
        ["allreduce", "--overlap-iters", "0"],
        ["allreduce", "--device", "tpu"],
        ["nonsense"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2


def test_command_registry() -> None:
    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--x", type=int, default=1)

    @cli.command("_test_cmd", help="a test", arguments=add, mpi=False)
    def run(args: argparse.Namespace) -> int:
        return args.x + 40

    try:
        assert cli.main(["_test_cmd", "--x", "2"]) == 42
        with pytest.raises(ValueError, match="registered twice"):
            cli.command("_test_cmd", help="again", arguments=add)(run)
        with pytest.raises(SystemExit):  # not an MPI command: no --np
            cli.main(["_test_cmd", "--np", "2"])
    finally:
        del cli.COMMANDS["_test_cmd"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"coccl-bench (coccl {coccl.__version__})"


def help_text(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    """``coccl-bench NAME --help``, whitespace collapsed (argparse wraps lines)."""
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather", "codec", "fidelity"])
def test_help_shows_every_default(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(name, capsys)
    options = argparse.ArgumentParser(formatter_class=cli.DefaultsHelpFormatter)
    cli.COMMANDS[name].add_arguments(options)
    for action in options._actions:  # argparse lists a parser's options only here
        shown = cli.default_text(action.default)
        if shown is None or not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[-1]
        assert flag in text
        # argparse may wrap a long default in the middle: compare without whitespace
        squeezed = "".join(text.split())
        assert "(default" in (action.help or "") or f"(default:{shown})" in squeezed, flag


def test_help_shows_defaults_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text("allreduce", capsys)
    for expected in ("(default: 1K)", "(default: 16M)", "(default: float32)"):
        assert expected in text
    for expected in ("(default: ring,two_shot)", "(default: identity)", "(default: 3)"):
        assert expected in text
    assert "(default: identity,int8,taco)" in help_text("codec", capsys)


@pytest.mark.parametrize("name", ["allreduce", "codec", "fidelity"])
def test_unknown_flag_shows_the_subcommands_usage(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--no-such-flag", "3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: coccl-bench {name} ")
    assert "unrecognized arguments: --no-such-flag 3" in err


def test_package_ships_py_typed() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    assert importlib.resources.files("coccl").joinpath("py.typed").is_file()
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    package_data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["coccl"]  # installed with the package, not only here


SCRIPTS = Path(__file__).resolve().parents[1] / "bench" / "scripts"
# What the probe scripts may import of coccl: its public face, the bench's parsers and the
# provenance its JSON records carry (coccl.bench.table), the codec bench's timing of one
# (codec, dtype, count) (coccl.bench.codec), and the sizing rules the README points to
# (pure functions of a call's arguments and settings).
PUBLIC_MODULES = {
    "coccl",
    "coccl.algorithms",
    "coccl.compressors",
    "coccl.bench.cli",
    "coccl.bench.codec",
    "coccl.bench.table",
    "coccl.communicator.sizing",
}


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.py")), ids=lambda p: p.name)
def test_probe_scripts_use_public_api_only(script: Path) -> None:
    tree = ast.parse(script.read_text(), filename=str(script))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coccl"):
            assert node.module in PUBLIC_MODULES, f"line {node.lineno}: from {node.module}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("coccl"):
                    assert alias.name in PUBLIC_MODULES, f"line {node.lineno}: {alias.name}"
        elif isinstance(node, ast.Attribute):
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            assert not private, f"line {node.lineno}: .{node.attr}"


def test_probe_scripts_are_not_the_cli() -> None:
    assert not (SCRIPTS / "__init__.py").exists()  # not a package: not installed
    for module in Path(cli.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [getattr(node, "module", None) or ""]
                names += [alias.name for alias in node.names]
                assert not any("scripts" in name for name in names), module.name


def test_strip_launch_flags() -> None:
    argv = ["allreduce", "--np", "4", "-b", "8", "--np=2", "--json", "x.json"]
    argv += ["--mpiexec", "srun --mpi=pmix", "--mpiexec=mpiexec"]
    assert launch.strip_launch_flags(argv) == ["allreduce", "-b", "8", "--json", "x.json"]


def test_mpiexec_command(tmp_path: Path) -> None:
    assert launch.mpiexec("srun --mpi=pmix")[:2] == ["srun", "--mpi=pmix"]
    assert launch.mpiexec()[0].endswith("mpiexec")


def test_world_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch.NP_ENV, raising=False)
    assert launch.world_mismatch(1) is None  # not a child of --np
    monkeypatch.setenv(launch.NP_ENV, "4")
    monkeypatch.setenv(launch.LAUNCHER_ENV, "--np 4: /venv/bin/mpiexec -n 4 python ...")
    assert launch.world_mismatch(4) is None
    problem = launch.world_mismatch(1)
    assert problem and "--np 4" in problem and "/venv/bin/mpiexec" in problem
    assert "--mpiexec" in problem


def test_mpiexec_needs_np(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["allreduce", "--mpiexec", "mpiexec"])
    assert exc.value.code == 2 and "give --np too" in capsys.readouterr().err


def test_a_launcher_that_does_not_exist_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["allreduce", "--np", "2", "--mpiexec", "no-such-launcher-here"])
    assert exc.value.code == 2
    assert "cannot start the launcher" in capsys.readouterr().err


@pytest.mark.mpi
def test_launcher_of_another_mpi_is_named(tmp_path: Path) -> None:
    # a "launcher" that starts each rank as its own one-rank job, as a foreign mpiexec does
    fake = tmp_path / "fake-mpiexec"
    fake.write_text(  # drops "-n N" and starts the command twice
        '#!/bin/sh\nshift 2\n"$@" & a=$!\n"$@" & b=$!\n'
        "wait $a; ra=$?\nwait $b; rb=$?\nexit $((ra > rb ? ra : rb))\n"
    )
    fake.chmod(0o755)
    proc = run_bench(["allreduce", "--np", "2", "--mpiexec", str(fake), "-e", "1K"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("--np 2 started ranks that each see an MPI world of 1") == 2
    assert "Abort" not in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------- sizes and bandwidth
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 8])
def test_bus_factors(nranks: int) -> None:
    n = nranks
    assert ALLREDUCE.bus_factor(n) == pytest.approx(2 * (n - 1) / n)
    assert REDUCE_SCATTER.bus_factor(n) == pytest.approx((n - 1) / n)
    assert ALLGATHER.bus_factor(n) == pytest.approx((n - 1) / n)


def test_recorded_environment() -> None:
    env = {
        "COCCL_CHUNK_BYTES": "8M",
        "COCCL_BENCH_COMMAND": "coccl-bench ...",  # the launcher's own: not a setting
        "OMPI_MCA_btl_vader_single_copy_mechanism": "cma",
        "MPIR_CVAR_CH3_NOLOCAL": "1",
        "HOME": "/root",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",  # not a tuning parameter
        # set by Open MPI's mpiexec for its ranks
        "OMPI_MCA_orte_hnp_uri": "1747451904.0;tcp://192.0.2.2:39095",
        "OMPI_MCA_ess_base_vpid": "0",
        "OMPI_MCA_initial_wdir": "/work",
    }
    assert recorded_environment(env) == {
        "COCCL_CHUNK_BYTES": "8M",
        "OMPI_MCA_btl_vader_single_copy_mechanism": "cma",
        "MPIR_CVAR_CH3_NOLOCAL": "1",
    }


def test_sweep_sizes() -> None:
    assert sweep_sizes(8, 64, 2) == [8, 16, 32, 64]
    assert sweep_sizes(8, 100, 4) == [8, 32]
    assert sweep_sizes(1 << 20, 1 << 20, 2) == [1 << 20]


def test_sweep_counts_round_and_skip() -> None:
    sizes = sweep_sizes(1, 64, 2)  # 1, 2, 4, ..., 64 bytes
    counts, skipped = sweep_counts(ALLREDUCE, sizes, 4, 3)
    assert counts == [1, 2, 4, 8, 16] and skipped == [1, 2]
    counts, skipped = sweep_counts(REDUCE_SCATTER, sizes, 4, 3)
    assert counts == [3, 6, 15] and skipped == [1, 2, 4, 8]  # 16 B = 4 elems -> 3
    assert all(c % 3 == 0 for c in counts)
    counts, _ = sweep_counts(ALLGATHER, [24, 28, 48], 4, 3)
    assert counts == [6, 12]  # 24 B and 28 B both round to 6 elements: measured once


# ----------------------------------------------------------------------- data
def test_rank_data_is_deterministic() -> None:
    a = rank_data(1, 1000, np.dtype(np.float32))
    assert np.array_equal(a, rank_data(1, 1000, np.dtype(np.float32)))
    assert not np.array_equal(a, rank_data(2, 1000, np.dtype(np.float32)))
    ints = rank_data(0, 1000, np.dtype(np.int8))
    assert ints.dtype == np.int8 and ints.min() >= -2 and ints.max() <= 2


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
def test_exact_reduction(op: str) -> None:
    parts = [np.array([1.5, -2.0, 3.0]), np.array([0.5, 4.0, -1.0])]
    f = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
    expected = f[op](parts[0], parts[1]) / (2 if op == "avg" else 1)
    got = exact_reduction(iter(parts), op, np.dtype(np.float32), 2)
    assert got.dtype == np.float64 and np.array_equal(got, expected)


def test_exact_reduction_integer_avg_truncates_toward_zero() -> None:
    parts = [np.array([-3, 3, 2], np.int32), np.array([0, 0, 1], np.int32)]
    got = exact_reduction(parts, "avg", np.dtype(np.int32), 2)
    assert got.tolist() == [-1.0, 1.0, 1.0]


class FakeWorld:
    """The allgather of an MPI communicator whose ranks contributed ``per_rank``."""

    def __init__(self, per_rank: list[list[float]]) -> None:
        self.per_rank = per_rank

    def allgather(self, local: object) -> list:
        return [(min(s), float(np.median(s)), max(s)) for s in self.per_rank]


@pytest.mark.parametrize("average", ["rank0", "avg", "min", "max"])
def test_time_summary(average: str) -> None:
    per_rank = [[3.0, 1.0, 2.0], [4.0, 6.0, 5.0, 9.0], [2.0, 2.0, 8.0]]
    stats = timing.summarize(FakeWorld(per_rank), per_rank[0], average)
    medians = [2.0, 5.5, 2.0]
    assert stats.ranks == {"rank0": 2.0, "avg": 9.5 / 3, "min": 2.0, "max": 5.5}
    assert stats.time == stats.ranks[average] == stats.iters["median"]
    pick = {"rank0": lambda v: v[0], "avg": lambda v: sum(v) / 3, "min": min, "max": max}
    assert stats.iters["min"] == pytest.approx(pick[average]([1.0, 4.0, 2.0]))
    assert stats.iters["max"] == pytest.approx(pick[average]([3.0, 9.0, 8.0]))
    assert pick[average](medians) == pytest.approx(stats.time)
    with pytest.raises(ValueError, match="unknown average"):
        timing.combine([1.0], "mean")


def test_worst_keeps_nan() -> None:
    assert worst([1e-3, None, 2e-3]) == 2e-3
    assert math.isnan(worst([1e-3, math.nan]))
    assert worst([None, None]) is None


# ----------------------------------------------------------- table and JSON
def fake_row(**changes: object) -> Row:
    stats = {"min": 700.0, "median": 812.5, "max": 900.0}
    ranks = {"rank0": 800.0, "avg": 806.0, "min": 800.0, "max": 812.5}
    row = Row(
        size=1 << 20,
        count=1 << 18,
        type="float32",
        redop="sum",
        algorithm="two_shot",
        compressor="taco",
        time_us=812.5,
        algbw=1.29,
        busbw=1.94,
        time_us_inplace=799.0,
        algbw_inplace=1.31,
        busbw_inplace=1.97,
        time_us_iters=stats,
        time_us_iters_inplace=stats,
        time_us_ranks=ranks,
        time_us_ranks_inplace=ranks,
        ratio=0.2656,
        rel_err=3.1e-3,
        rel_err_bound=0.09,
        wrong=0,
        native_time_us=1500.0,
        speedup=1.846,
        peak_staging_bytes=4 << 20,
    )
    for key, value in changes.items():
        setattr(row, key, value)
    return row


def fake_plan(**changes: object) -> TablePlan:
    plan = {
        "max_size": 1 << 20,
        "max_count": 1 << 18,
        "type": "float32",
        "redop": "sum",
        "algorithms": ["ring", "two_shot"],
        "compressors": ["identity", "taco"],
        "check": True,
        "lossy": True,
        "baseline": True,
        **changes,
    }
    return TablePlan(**plan)  # type: ignore[arg-type]


def titles(table_layout: object) -> list[str]:
    return table_layout.header().splitlines()[1].lstrip("#").split()  # type: ignore[attr-defined]


def test_table_lines_align() -> None:
    table = layout(fake_plan(baseline=False))
    header = table.header().splitlines()
    assert len(header) == 3 and all(line.startswith("#") for line in header)
    assert "out-of-place" in header[0] and "in-place" in header[0]
    assert titles(table) == [
        "size", "count", "type", "redop", "algorithm", "codec",
        "time", "algbw", "busbw", "time", "algbw", "busbw",
        "ratio", "rel_err", "#wrong",
    ]  # fmt: skip
    assert table.hidden == ()
    line = table.row(fake_row())
    assert len(line) == len(header[1]) == table.width <= MAX_WIDTH
    assert line.split() == [
        "1048576", "262144", "float32", "sum", "two_shot", "taco",
        "812.50", "1.29", "1.94", "799.00", "1.31", "1.97",
        "0.266", "3.10e-03", "0",
    ]  # fmt: skip


def test_table_counts_per_rank_as_nccl_tests_for_sharded_collectives() -> None:
    # ReduceScatter and AllGather: nccl-tests prints the size of the whole buffer and the
    # count of one rank's part; the JSON keeps the whole buffer's count
    line = layout(fake_plan(count_per=4)).row(fake_row(redop="none"))
    assert line.split()[:2] == ["1048576", str((1 << 18) // 4)]


def test_table_leaves_out_columns_that_say_nothing() -> None:
    # one algorithm, one codec, identity only, no check, no baseline, no overlap
    plain = layout(
        fake_plan(algorithms=["ring"], compressors=["identity"], lossy=False, check=False,
                  baseline=False)
    )  # fmt: skip
    assert titles(plain) == [
        "size", "count", "type", "redop", "time", "algbw", "busbw", "time", "algbw", "busbw",
    ]  # fmt: skip
    checked = layout(fake_plan(compressors=["identity"], lossy=False))
    assert titles(checked)[-2:] == ["#wrong", "speedup"]  # identity: no ratio, no rel_err
    overlap = layout(fake_plan(overlap=True, algorithms=["ring"], compressors=["taco"]))
    assert titles(overlap)[-1] == "overlap"


def test_table_fits_the_terminal() -> None:
    # every optional column, the widest sizes and an auto pair: some columns give way
    plan = fake_plan(
        max_size=1 << 30,
        max_count=1 << 29,
        type="bfloat16",
        algorithms=["ring", "two_shot", "auto>native", "auto>two_shot"],
        compressors=["identity", "taco", "int8", "taco>identity", "int8>identity"],
        overlap=True,
    )
    table = layout(plan)
    assert table.width <= MAX_WIDTH
    assert table.hidden and table.hidden[0] == "algbw_inplace"
    assert "#wrong" in titles(table) and "overlap" in titles(table)
    assert len(table.row(fake_row(size=1 << 30, count=1 << 29, type="bfloat16"))) <= MAX_WIDTH


def test_table_missing_values() -> None:
    table = layout(fake_plan())  # in-place bandwidths give way: speedup is the last column
    assert table.hidden == ("algbw_inplace", "busbw_inplace") and titles(table)[-1] == "speedup"
    line = table.row(fake_row(ratio=None, rel_err=None, wrong=None, speedup=None))
    assert line.split()[-4:] == ["N/A", "N/A", "N/A", "N/A"]
    assert "123456789" in table.row(fake_row(time_us=123456789.0))


def test_summary() -> None:
    rows = [fake_row(), fake_row(algorithm="ring", busbw=1.0, wrong=2)]
    verdict, bandwidth = format_summary(rows, check=True)
    assert verdict == "# Out of bounds values : 2 FAILED"
    assert bandwidth.startswith("# Avg bus bandwidth")
    assert "two_shot/taco 1.940" in bandwidth and "ring/taco 1.000" in bandwidth
    assert format_summary(rows[:1], check=True)[0] == "# Out of bounds values : 0 OK"
    assert "not checked" in format_summary(rows, check=False)[0]


def test_auto_notes() -> None:
    def ran(algorithm: str, codec: str, reason: str) -> dict:
        return {"algorithm": algorithm, "compressor": {"id": codec}, "reason": reason}

    small, big = ran("native", "identity", "below 16 MiB"), ran("two_shot", "taco", "from 16 MiB")
    rows = [
        fake_row(algorithm="auto", size=1024, ran=small),
        fake_row(algorithm="auto", size=4096, ran=small),
        fake_row(algorithm="ring", size=4096),
        fake_row(algorithm="auto", size=16384, ran=big),
    ]
    assert rows[0].ran_label == "native/identity" and rows[2].ran_label == "ring/taco"
    assert (rows[0].algorithm_label, rows[0].compressor_label) == ("auto>native", "taco>identity")
    assert (rows[3].algorithm_label, rows[3].compressor_label) == ("auto>two_shot", "taco")
    assert (rows[2].algorithm_label, rows[2].compressor_label) == ("ring", "taco")
    assert auto_notes(rows) == [
        "# auto/taco 1024..4096 B: ran native/identity (below 16 MiB)",
        "# auto/taco 16384 B: ran two_shot/taco (from 16 MiB)",
    ]


def test_write_json(tmp_path: Path) -> None:
    meta = {"collective": "allreduce", "nranks": 4}
    path = tmp_path / "out.json"
    write_json(path, meta, [fake_row(), fake_row(rel_err=math.nan, ratio=None, wrong=2)])
    record = json.loads(path.read_text())
    assert record["collective"] == "allreduce" and len(record["rows"]) == 2
    assert set(record["rows"][0]) == ROW_FIELDS
    assert record["rows"][1]["rel_err"] == "nan"  # a divergence stays visible
    assert record["rows"][1]["ratio"] is None
    assert to_record(meta, [])["rows"] == []


def test_progress(tmp_path: Path) -> None:
    quiet = (tmp_path / "quiet").open("w")
    Progress(10, enabled=False, stream=quiet).update(5, "x")
    quiet.close()
    assert (tmp_path / "quiet").read_text() == ""
    path = tmp_path / "shown"
    with path.open("w", newline="") as stream:
        progress = Progress(10, enabled=True, stream=stream, delay_s=0)
        progress.update(5, "allreduce 1 MiB ring/taco")
        progress.clear()
    text = path.read_bytes().decode()
    assert "50%" in text and "ring/taco" in text and text.endswith("\r\033[K")


def test_plot_fake_rows(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from coccl.bench.plot import plot_sweep

    rows = [
        fake_row(size=s, algorithm=a, busbw=s / 1e6, time_us=10 + s / 1e3)
        for s in (8, 1024, 1 << 20, 16 << 20)
        for a in ("ring", "two_shot")
    ]
    path = tmp_path / "plot.png"
    plot_sweep(path, {"collective": "allreduce", "nranks": 4, "bus_factor": 1.5}, rows)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------- end to end
def bench_command() -> list[str]:
    script = Path(sys.executable).parent / "coccl-bench"
    if script.exists():
        return [str(script)]
    found = shutil.which("coccl-bench")
    return [found] if found else [sys.executable, "-m", "coccl.bench.cli"]


def run_bench(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCCL_BENCH_")}
    for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
        env.pop(name, None)  # a test run under mpiexec still launches its own job
    return subprocess.run(
        [*bench_command(), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_record(
    record: dict, collective: str, nranks: int, variants: set[tuple], average: str = "max"
) -> None:
    assert META_FIELDS <= set(record)
    assert record["collective"] == collective and record["nranks"] == nranks
    assert record["backend"] == "mpi" and record["device"] == "cpu"
    assert record["average"] == average and record["check"] == 1
    assert "--np" in record["command"] and "--np" in record["launcher"]
    rows = record["rows"]
    assert rows and all(set(row) == ROW_FIELDS for row in rows)
    assert {(r["algorithm"], r["compressor"]) for r in rows} == variants
    factor = 2 * (nranks - 1) / nranks if collective == "allreduce" else (nranks - 1) / nranks
    for row in rows:
        assert row["count"] % (1 if collective == "allreduce" else nranks) == 0
        assert row["size"] == row["count"] * 4
        for suffix in ("", "_inplace"):
            time_us = row[f"time_us{suffix}"]
            iters, ranks = row[f"time_us_iters{suffix}"], row[f"time_us_ranks{suffix}"]
            assert time_us > 0 and time_us == iters["median"] == ranks[average]
            assert iters["min"] <= iters["median"] <= iters["max"]
            assert ranks["min"] <= ranks["avg"] <= ranks["max"]
            assert row[f"algbw{suffix}"] == pytest.approx(row["size"] / time_us / 1e3)
            assert row[f"busbw{suffix}"] == pytest.approx(row[f"algbw{suffix}"] * factor)
        assert row["native_time_us"] > 0
        assert row["speedup"] == pytest.approx(row["native_time_us"] / row["time_us"])
        assert row["wrong"] == 0 and row["rel_err"] <= row["rel_err_bound"]
        assert row["rel_err_bound"] < 1e-6  # identity: float32 rounding of the sum only
        if row["compressor"] == "identity":
            assert row["ratio"] == pytest.approx(1.0)


@pytest.mark.mpi
def test_allreduce_end_to_end(tmp_path: Path) -> None:
    proc = run_bench(
        [
            "allreduce",
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "2",
            "-n",
            "2",
            "-w",
            "1",
            "--algorithm",
            "ring,two_shot",
            "--compressor",
            "identity",
            "--json",
            "tmp.json",
            "--plot",
            "tmp.png",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "tmp.json").read_text())
    # the native baseline the speedups are over is a row of its own, first at each size
    variants = {("native", "identity"), ("ring", "identity"), ("two_shot", "identity")}
    check_record(record, "allreduce", 2, variants)
    assert [r["size"] for r in record["rows"][::3]] == [1 << k for k in range(10, 17)]
    assert all(r["algorithm"] == "native" for r in record["rows"][::3])
    assert all(r["speedup"] == 1.0 for r in record["rows"][::3])
    assert record["skipped"] == [] and record["datatype"] == "float32" and record["op"] == "sum"
    assert (tmp_path / "tmp.png").read_bytes()[:4] == b"\x89PNG"
    lines = proc.stdout.splitlines()
    assert any("out-of-place" in line for line in lines)
    assert "# Out of bounds values : 0 OK" in lines
    table = [line for line in lines if not line.startswith("#")]
    assert len(table) == 21  # rank 0 prints, once
    assert all(len(line) <= MAX_WIDTH for line in table)


@pytest.mark.mpi
def test_overlap_measured_from_overlap_min(tmp_path: Path) -> None:
    args = "allreduce --np 2 -b 16K -e 64K -f 4 -n 2 -w 1 --algorithm ring,two_shot"
    args += " --compressor identity,int8 --overlap-min 64K --overlap-iters 2 --json o.json"
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "o.json").read_text())["rows"]
    for row in rows:
        measured = row["size"] >= 65536 and row["compressor"] == "int8"
        assert (row["overlap_efficiency"] is not None) == measured, row
        if measured:
            times = row["overlap_times_us"]
            assert set(times) == {"pipelined", "codec_only", "transport_only"}
            longest = max(times["codec_only"], times["transport_only"])
            assert row["overlap_efficiency"] == pytest.approx(longest / times["pipelined"], 1e-3)


@pytest.mark.mpi
@pytest.mark.parametrize(("collective", "average"), [("reduce_scatter", 0), ("allgather", 1)])
def test_sharded_collectives_end_to_end(collective: str, average: int, tmp_path: Path) -> None:
    proc = run_bench(
        [
            collective,
            "-a",
            str(average),
            "--np",
            "2",
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
            "--algorithm",
            "ring,two_shot,native",
            "--json",
            "out.json",
            "--no-progress",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "out.json").read_text())
    variants = {("ring", "identity"), ("two_shot", "identity"), ("native", "identity")}
    check_record(record, collective, 2, variants, timing.AVERAGES[average])
    assert sorted({r["size"] for r in record["rows"]}) == [8, 64, 512, 4096]


BROKEN_CODEC = Path(__file__).parent / "scripts" / "broken_codec_bench.py"


@pytest.mark.mpi
def test_broken_codec_is_out_of_bounds(tmp_path: Path) -> None:
    script = BROKEN_CODEC
    args = ["allreduce", "-b", "1K", "-e", "4K", "-n", "1", "-w", "0", "--no-progress"]
    args += ["--compressor", "identity,int8,skewed_int8", "--json", "b.json"]
    proc = subprocess.run(
        [*launch.mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(script), *args],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("COCCL_BENCH_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert {r["compressor"] for r in rows} == {"identity", "int8", "skewed_int8"}
    for row in rows:
        broken = row["compressor"] == "skewed_int8"
        assert (row["wrong"] == 4) == broken, row  # 2 ranks x (out-of-place, in-place)
        assert (row["rel_err"] > row["rel_err_bound"]) == broken, row
    wrong = sum(r["wrong"] for r in rows)
    assert f"# Out of bounds values : {wrong} FAILED" in proc.stdout.splitlines()


@pytest.mark.mpi
def test_unknown_compressor_fails_cleanly(tmp_path: Path) -> None:
    proc = run_bench(
        ["allreduce", "--np", "2", "-b", "8", "-e", "8", "--compressor", "identity,nope"],
        tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "compressor 'nope' is not available" in proc.stderr
    assert proc.stderr.count("coccl-bench: error") == 1  # said once, by rank 0


def test_one_plot_per_backend() -> None:
    from coccl.bench.collective import _per_backend

    assert _per_backend("sweep.png", "mpi", 1) == "sweep.png"
    assert _per_backend("out/sweep.png", "nccl", 2) == "out/sweep-nccl.png"
    assert _per_backend("sweep", "mpi", 2) == "sweep-mpi"
