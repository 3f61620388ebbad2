"""coccl-bench's (datatype, op) cases: ``-d``/``-o`` lists and ``all``, pairs a codec
cannot run skipped with a note instead of ending the sweep, the native baseline's row,
and algbw in the main job's table."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from test_bench import fake_plan, run_bench, titles
from test_bench_schema import schema

import coccl
from coccl.bench import cli
from coccl.bench.cases import NothingToRun, make_cases, skip_notes
from coccl.bench.collective import ALLGATHER, ALLREDUCE, OPS, datatype_list, op_list
from coccl.bench.table import MAX_WIDTH, layout

FLOATS = ("float32", "float16", "bfloat16", "float64")


# ----------------------------------------------------------------- the flags
def test_datatype_list() -> None:
    assert [d.name for d in datatype_list("all")] == list(cli.DTYPES)
    assert datatype_list("float,half,float32") == [np.dtype(np.float32), np.dtype(np.float16)]
    assert datatype_list("bfloat16") == [np.dtype(ml_dtypes.bfloat16)]
    with pytest.raises(argparse.ArgumentTypeError):
        datatype_list("float32,complex64")


def test_op_list() -> None:
    assert op_list("all") == list(OPS) == ["sum", "avg", "max", "min", "prod"]
    assert op_list("max, sum,max") == ["max", "sum"]
    with pytest.raises(argparse.ArgumentTypeError, match="xor"):
        op_list("sum,xor")


def test_all_and_lists_parse() -> None:
    args = cli.build_parser().parse_args(["allreduce", "-d", "all", "-o", "all"])
    assert len(args.datatype) == len(cli.DTYPES) and args.op == list(OPS)
    args = cli.build_parser().parse_args(["allreduce"])
    assert args.datatype == [np.dtype(np.float32)] and args.op == ["sum"]


# ------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class FakeSweep:
    """What make_cases reads of a Sweep: spec, xp, dtype, op and caller (which refuses as
    coccl does: lossy codecs take floats with sum and avg only)."""

    spec: Any
    dtype: np.dtype
    op: str
    xp: Any = np

    def caller(self, algorithm: str, codec: Any, x: Any, out: Any) -> Callable[[], None]:
        def call() -> None:
            if codec.lossless:
                return
            if self.dtype.kind in "iu":
                raise TypeError(f"compressor {codec.codec_id!r} does not support {self.dtype}")
            if self.spec.reduces and self.op not in ("sum", "avg"):
                raise ValueError(f"compressor {codec.codec_id!r} does not support op {self.op}")

        return call


CODECS = {name: coccl.get_compressor(name) for name in ("identity", "int8", "taco")}
PAIRS = [("ring", "identity"), ("ring", "taco"), ("two_shot", "int8")]


def test_cases_skip_what_a_codec_cannot_run() -> None:
    base = FakeSweep(ALLREDUCE, np.dtype(np.float32), "sum")
    dtypes = datatype_list("all")
    cases, skipped = make_cases(base, dtypes, list(OPS), PAIRS, CODECS)
    assert len(cases) == len(dtypes) * len(OPS)  # identity runs everywhere
    for case in cases:
        lossy_ok = case.sweep.dtype.name in FLOATS and case.sweep.op in ("sum", "avg")
        assert case.variants == (PAIRS if lossy_ok else PAIRS[:1]), case.label
        assert case.native_ok
    assert len(skipped) == 2 * (len(dtypes) * len(OPS) - len(FLOATS) * 2)
    assert {s["compressor"] for s in skipped} == {"taco", "int8"}
    assert {"type", "redop", "algorithm", "compressor", "reason"} == set(skipped[0])


def test_allgather_takes_no_op() -> None:
    base = FakeSweep(ALLGATHER, np.dtype(np.float32), "sum")
    cases, skipped = make_cases(base, datatype_list("float32,int8"), list(OPS), PAIRS, CODECS)
    assert [case.label for case in cases] == ["float32 none", "int8 none"]
    assert [(s["type"], s["redop"]) for s in skipped] == [("int8", "none")] * 2


def test_nothing_to_run_is_an_error_naming_why() -> None:
    base = FakeSweep(ALLREDUCE, np.dtype(np.int32), "sum")
    with pytest.raises(NothingToRun, match="int32.*does not support"):
        make_cases(base, [np.dtype(np.int32)], ["sum"], [("ring", "taco")], CODECS)


def test_skip_notes_one_line_per_reason() -> None:
    def skip(alg: str, codec: str, dtype: str, op: str, reason: str) -> dict[str, str]:
        return {"type": dtype, "redop": op, "algorithm": alg, "compressor": codec,
                "reason": reason}  # fmt: skip

    ints = [skip(a, "taco", "int32", op, "taco: no int32") for op in ("sum", "max")
            for a in ("ring", "two_shot")]  # fmt: skip
    assert skip_notes(ints) == ["skipped ring/taco, two_shot/taco with int32 sum, int32 max: "
                                "taco: no int32"]  # fmt: skip
    # a reason that did not skip every pair in every case it names: one line each
    ragged = [*ints[:3], skip("ring", "int8", "int32", "sum", "taco: no int32")]
    assert len(skip_notes(ragged)) == 4
    assert skip_notes(ragged)[0] == "skipped ring/taco with int32 sum: taco: no int32"
    assert skip_notes([]) == []


# ------------------------------------------------------------------- the table
def test_the_main_jobs_table_shows_algbw() -> None:
    """coccl-bench allreduce --np 4 --compressor identity,int8,taco (1K..16M): the native
    row, both schedules, three codecs; out-of-place algbw fits, in-place gives way."""
    plan = fake_plan(
        max_size=16 << 20,
        max_count=4 << 20,
        algorithms=["native", "ring", "two_shot"],
        compressors=["identity", "identity", "int8", "taco"],
    )
    table = layout(plan)
    assert table.width <= MAX_WIDTH
    assert titles(table).count("algbw") == 1 and table.hidden[0] == "algbw_inplace"
    header = table.header().splitlines()[1]
    assert header.index("algbw") < header.index("busbw")  # the out-of-place group's


# ------------------------------------------------------------------- end to end
@pytest.mark.mpi
def test_a_codec_that_cannot_run_a_type_is_skipped(tmp_path: Path) -> None:
    """--compressor identity,taco -d int32: taco's rows are skipped with a note, identity's
    and the native baseline's run (the whole sweep used to abort)."""
    args = "allreduce --np 2 -b 1K -e 4K -n 1 -w 0 --algorithm two_shot --no-progress"
    args += " --compressor identity,taco -d int32 --json i.json"
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    note = "# note: skipped two_shot/taco with int32 sum: compressor 'taco' does not support"
    assert any(line.startswith(note) for line in proc.stdout.splitlines()), proc.stdout
    record = json.loads((tmp_path / "i.json").read_text())
    pairs = [(r["algorithm"], r["compressor"]) for r in record["rows"]]
    assert pairs == [("native", "identity"), ("two_shot", "identity")] * 2
    assert [(s["type"], s["algorithm"], s["compressor"]) for s in record["skipped"]] == [
        ("int32", "two_shot", "taco")
    ]
    for entry in record["skipped"]:
        schema()["sweep skipped[]"].check(entry)


@pytest.mark.mpi
def test_every_type_and_op(tmp_path: Path) -> None:
    """-d all -o all: one table, a row per (type, op, pair) that runs, a note per reason
    for the rest, every output checked."""
    args = "allreduce --np 2 -b 64 -e 64 -n 1 -w 0 --algorithm ring --no-progress"
    args += " --compressor identity,int8 -d all -o all --json a.json"
    proc = run_bench(args.split(), tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "a.json").read_text())
    assert record["datatype"] == ",".join(cli.DTYPES) and record["op"] == ",".join(OPS)
    cases = {(r["type"], r["redop"]) for r in record["rows"]}
    assert cases == {(t, op) for t in cli.DTYPES for op in OPS}
    int8_rows = {(r["type"], r["redop"]) for r in record["rows"] if r["compressor"] == "int8"}
    assert int8_rows == {(t, op) for t in FLOATS for op in ("sum", "avg")}
    assert all(r["wrong"] == 0 for r in record["rows"])
    assert len(record["skipped"]) == len(cli.DTYPES) * len(OPS) - len(int8_rows)
    notes = [line for line in proc.stdout.splitlines() if line.startswith("# note: skipped")]
    assert len(notes) == len({s["reason"] for s in record["skipped"]})
    table = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(table) == len(record["rows"]) and all(len(line) <= MAX_WIDTH for line in table)
    assert "# Out of bounds values : 0 OK" in proc.stdout.splitlines()
