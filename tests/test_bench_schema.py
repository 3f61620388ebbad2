"""``bench/SCHEMA.md`` against what ``coccl-bench --json`` really writes: every field
written is documented with its type, and every documented field is written (unless it is
marked optional), for a collective sweep, ``codec`` and ``fidelity``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from test_bench import run_bench

from coccl.bench import cli

SCHEMA = Path(__file__).resolve().parents[1] / "bench" / "SCHEMA.md"
_TYPES = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: (
        (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ("nan", "inf", "-inf")
    ),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


class Table:
    """One table of SCHEMA.md: field -> (types, optional); ``open`` allows more keys."""

    def __init__(self, name: str, open_: bool) -> None:
        self.name, self.open = name, open_
        self.fields: dict[str, tuple[list[str], bool]] = {}

    def check(self, obj: dict) -> None:
        assert isinstance(obj, dict), f"{self.name}: not an object"
        if not self.open:
            undocumented = set(obj) - set(self.fields)
            assert not undocumented, f"{self.name}: not in SCHEMA.md: {sorted(undocumented)}"
        for field, (types, optional) in self.fields.items():
            if field not in obj:
                assert optional, f"{self.name}: {field} is missing"
                continue
            value = obj[field]
            assert any(_TYPES[t](value) for t in types), f"{self.name}.{field}: {value!r}"


def schema() -> dict[str, Table]:
    """The ``### name`` tables of SCHEMA.md."""
    tables: dict[str, Table] = {}
    current: Table | None = None
    for line in SCHEMA.read_text().splitlines():
        heading = re.match(r"^### (.+?)( \(open\))?$", line)
        if heading:
            current = tables[heading.group(1)] = Table(heading.group(1), bool(heading.group(2)))
            continue
        if current is None or not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        field = cells[0].strip("`")
        kind, _, flag = cells[1].replace("\\|", "|").partition(",")
        types = [t.strip() for t in kind.split("|")]
        assert all(t in _TYPES for t in types), f"{current.name}.{field}: type {cells[1]}"
        assert flag.strip() in ("", "optional"), f"{current.name}.{field}: {cells[1]}"
        current.fields[field] = (types, flag.strip() == "optional")
    return tables


def test_schema_parses() -> None:
    tables = schema()
    for name in ("sweep record", "sweep rows[]", "codec record", "fidelity rows[]"):
        assert tables[name].fields, name
    assert tables["sweep ran"].open and not tables["sweep rows[]"].open


@pytest.mark.mpi
def test_sweep_json_matches_schema(tmp_path: Path) -> None:
    args = "allreduce --np 2 -b 1K -e 4K -f 4 -n 1 -w 0 --algorithm ring,two_shot,auto"
    args += " --compressor identity,int8 --overlap-min 4K --overlap-iters 1 --json s.json"
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "s.json").read_text())
    tables = schema()
    tables["sweep record"].check(record)
    for rank in record["ranks"]:
        tables["sweep ranks[]"].check(rank)
    for row in record["rows"]:
        tables["sweep rows[]"].check(row)
        tables["sweep ran"].check(row["ran"])
        if row["algorithm"] != "auto":
            assert row["ran"]["algorithm"] == row["algorithm"]
            assert row["ran"]["compressor"]["id"] == row["compressor"]
    assert any(row["overlap_efficiency"] is not None for row in record["rows"])


def test_codec_json_matches_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    argv = ["codec", "--counts", "1000", "-d", "float32", "--compressor", "identity,taco"]
    assert cli.main([*argv, "-n", "1", "-w", "0", "--json", str(path)]) == 0
    capsys.readouterr()
    record = json.loads(path.read_text())
    tables = schema()
    tables["codec record"].check(record)
    for row in record["rows"]:
        tables["codec rows[]"].check(row)
    for row in record["checks"]:
        tables["codec checks[]"].check(row)
    assert record["rows"] and record["checks"]


def test_fidelity_json_matches_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "f.json"
    argv = ["fidelity", "--shape", "16x256", "--compressor", "identity,int8"]
    assert cli.main([*argv, "--model-quantizations", "--json", str(path)]) == 0
    capsys.readouterr()
    record = json.loads(path.read_text())
    tables = schema()
    tables["fidelity record"].check(record)
    for row in record["rows"]:
        tables["fidelity rows[]"].check(row)
    assert any(row["snr_db"] == "inf" for row in record["rows"])  # identity: exact
    assert not any(isinstance(v, float) and math.isnan(v) for v in record["rows"][0].values())
