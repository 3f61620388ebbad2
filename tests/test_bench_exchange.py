"""``coccl-bench sendrecv`` and ``alltoall`` (bench/exchange.py): flags and help, end-to-end
sweeps on 1 and 2 CPU ranks whose JSON matches bench/SCHEMA.md, the native row beside
every codec's, outputs checked (identity bitwise, lossy codecs within their bound), the
overlap efficiency measured from ``--overlap-min``; and the collective sweeps' codec
labels and hierarchical rows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from test_bench import fake_row, help_text, run_bench
from test_bench_schema import schema

from coccl.bench import bounds, cli, collective, exchange
from coccl.bench.collective import codec_of, compressor_labels


def test_exchange_commands_registered() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(
        [
            "sendrecv",
            "-b",
            "1M",
            "-e",
            "1G",
            "-f",
            "4",
            "--compressor",
            "identity,tah:row=4096,taco",
        ]
    )
    assert (args.minbytes, args.maxbytes) == (1 << 20, 1 << 30)
    assert args.compressor == ["identity", "tah:row=4096", "taco"]
    args = parser.parse_args(["alltoall", "--compressor", "identity,int:bits=4,int:bits=8"])
    assert args.compressor == ["identity", "int:bits=4", "int:bits=8"]


@pytest.mark.parametrize("name", ["sendrecv", "alltoall"])
def test_exchange_help_shows_defaults(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(name, capsys)
    for expected in (
        "(default: 1K)",
        "(default: 16M)",
        "(default: float32)",
        "(default: identity)",
    ):
        assert expected in text


def test_codec_labels_take_options() -> None:
    assert compressor_labels("identity,int:bits=4,hadamard=32,taco") == [
        "identity",
        "int:bits=4,hadamard=32",
        "taco",
    ]
    codec = codec_of("int:bits=4,hadamard=32")
    assert codec.get_config()["bits"] == 4 and codec.get_config()["hadamard"] == 32


def test_codec_pair_labels() -> None:
    """``intra+inter``: an (intra, inter) pair of --algorithm hierarchical, each side a
    label of its own (the options after ``+`` are the inter codec's); an exponent's
    ``+`` is no join."""
    text = "identity,int8+int:bits=4,hadamard=32,int:bits=8,group_size=64 + int:bits=4,taco"
    assert compressor_labels(text) == [
        "identity",
        "int8+int:bits=4,hadamard=32",
        "int:bits=8,group_size=64+int:bits=4",
        "taco",
    ]
    assert compressor_labels("taco:lambda=1e+6") == ["taco:lambda=1e+6"]
    intra, inter = codec_of("int8+int:bits=4,hadamard=32")
    assert intra.codec_id == "int8" and inter.get_config()["hadamard"] == 32
    assert collective.config_of("int8+int:bits=4")[1]["bits"] == 4
    assert collective.is_pair("int8+int") and not collective.is_pair("taco:lambda=1e+6")
    assert not collective.lossless(codec_of("identity+int8"))
    for bad in ("int8+int+taco", "+int8", "int8+group_size=3"):
        with pytest.raises(argparse.ArgumentTypeError):
            compressor_labels(bad)
    with pytest.raises(collective.UsageError, match="unknown compressor 'zz'"):
        codec_of("int8+zz")


def test_codec_pairs_run_with_hierarchical_only() -> None:
    variants, left_out = collective._variants(["hierarchical", "two_shot"], ["int8", "int8+int"])
    assert variants == [
        ("hierarchical", "int8"),
        ("hierarchical", "int8+int"),
        ("two_shot", "int8"),
    ]
    assert left_out == [
        {"algorithm": "two_shot", "compressor": "int8+int",
         "reason": "a codec pair is for hierarchical"}
    ]  # fmt: skip
    args = cli.build_parser().parse_args(["alltoall", "--compressor", "int8+int:bits=4"])
    assert "a codec pair is for the hierarchical reductions" in exchange.validate(args)


def test_a_pairs_bound_is_its_lossier_codec() -> None:
    ran = {"compressor": {"id": "int8"}, "inter compressor": {"id": "int", "bits": 4}}
    assert collective.bound_codec(ran).get_config()["bits"] == 4
    assert collective.bound_codec({"compressor": {"id": "taco"}}).codec_id == "taco"
    exact_inside = {"compressor": {"id": "identity"}, "inter compressor": {"id": "int8"}}
    assert collective.bound_codec(exact_inside).codec_id == "int8"
    row = fake_row(
        algorithm="hierarchical",
        compressor="int8+int:bits=4",
        ran={"algorithm": "hierarchical", **ran},
    )
    assert row.compressor_label == "int8+int:bits=4"  # as asked, not "...>int8"


@pytest.mark.mpi
def test_hierarchical_pair_sweep_on_two_nodes_of_two(tmp_path: Path, monkeypatch) -> None:
    """``--algorithm hierarchical --compressor int8+int:bits=4`` on 4 ranks as 2 x 2: the
    rows run both codecs, within the bound of the lossier, and the JSON has both."""
    monkeypatch.setenv("COCCL_LOCAL_SIZE", "2")
    args = "allreduce --np 4 -b 4K -e 4K -n 1 -w 0 --no-progress --json p.json"
    args += " --algorithm hierarchical --compressor int8+int:bits=4,rounding=stochastic"
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "p.json").read_text())
    label = "int8+int:bits=4,rounding=stochastic"
    assert [c["id"] for c in record["compressors"][label]] == ["int8", "int"]
    (row,) = [r for r in record["rows"] if r["compressor"] == label]
    assert row["ran"]["nodes"] == 2 and row["ran"]["inter compressor"]["bits"] == 4
    assert row["wrong"] == 0 and 0 < row["rel_err"] <= row["rel_err_bound"]


def test_hierarchical_quantizations_come_from_describe() -> None:
    assert bounds.quantizations("allreduce", "hierarchical", 4, "4 per element (...)") == 4
    with pytest.raises(ValueError, match="hierarchical"):
        bounds.quantizations("allreduce", "hierarchical", 4)


def check_exchange(record: dict, name: str, nranks: int, codecs: list[str]) -> None:
    tables = schema()
    tables["exchange record"].check(record)
    assert record["collective"] == name and record["nranks"] == nranks
    assert record["native"] == "mpi" and record["backend"] == "mpi"
    rows = record["rows"]
    for row in rows:
        tables["exchange rows[]"].check(row)
        assert row["wrong"] == 0 and row["rel_err"] <= row["rel_err_bound"]
        assert row["speedup"] == pytest.approx(row["native_time_us"] / row["time_us"])
        assert row["algbw"] == pytest.approx(row["size"] / row["time_us"] / 1e3)
    per_size = {}
    for row in rows:
        per_size.setdefault(row["size"], []).append((row["algorithm"], row["compressor"]))
    expected = [("native", "identity")] + [("coccl", c) for c in codecs]
    assert all(pairs == expected for pairs in per_size.values()), per_size
    for row in rows:
        if row["compressor"] == "identity" and nranks > 1:
            assert row["rel_err"] == 0.0 and row["ratio"] == 1.0


@pytest.mark.mpi
def test_sendrecv_end_to_end_with_overlap(tmp_path: Path) -> None:
    args = "sendrecv --np 2 -b 4K -e 16K -f 4 -n 2 -w 1 --no-progress"
    args += " --compressor identity,int8 --overlap-min 16K --overlap-iters 1 --json s.json"
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "s.json").read_text())
    check_exchange(record, "sendrecv", 2, ["identity", "int8"])
    for row in record["rows"]:
        measured = row["size"] >= 16384 and row["compressor"] == "int8"
        assert (row["overlap_efficiency"] is not None) == measured, row
        if measured:
            times = row["overlap_times_us"]
            longest = max(times["codec_only"], times["transport_only"])
            assert row["overlap_efficiency"] == pytest.approx(longest / times["pipelined"], 1e-2)
            assert row["ratio"] < 0.3  # int8 sends about a quarter of float32's bytes
    assert "# Out of bounds values : 0 OK" in proc.stdout


@pytest.mark.mpi
def test_sendrecv_to_itself_on_one_rank(tmp_path: Path) -> None:
    args = (
        "sendrecv --np 1 -b 1K -e 4K -f 4 -n 1 -w 0 --no-progress --compressor taco --json s.json"
    )
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_exchange(json.loads((tmp_path / "s.json").read_text()), "sendrecv", 1, ["taco"])


@pytest.mark.mpi
def test_alltoall_end_to_end(tmp_path: Path) -> None:
    args = "alltoall --np 2 -b 4K -e 16K -f 4 -n 2 -w 1 --no-progress"
    args += " --compressor identity,int:bits=4 --json a.json"
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "a.json").read_text())
    check_exchange(record, "alltoall", 2, ["identity", "int:bits=4"])
    assert record["bus_factor"] == 0.5
    assert all(row["count"] % 2 == 0 for row in record["rows"])


@pytest.mark.mpi
def test_hierarchical_allreduce_sweep_on_one_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COCCL_LOCAL_SIZE=1 on two ranks: two nodes of one rank (the 2 x 2 layout runs
    in bench/scripts/h200_check.sh's ncclp2p part, too slow for this machine)."""
    monkeypatch.setenv("COCCL_LOCAL_SIZE", "1")
    args = "allreduce --np 2 -b 4K -e 4K -n 1 -w 0 --no-progress --algorithm hierarchical,native"
    args += " --compressor identity,int:bits=8 --json h.json"
    proc = run_bench(args.split(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "h.json").read_text())["rows"]
    assert {(r["algorithm"], r["compressor"]) for r in rows} == {
        ("native", "identity"),
        ("hierarchical", "identity"),
        ("hierarchical", "int:bits=8"),
    }
    assert all(r["wrong"] == 0 for r in rows)
    lossy = [r for r in rows if r["compressor"] == "int:bits=8"]
    assert lossy[0]["ran"]["quantizations"].startswith("2 per element")


def test_iters_bytes_scales_the_calls_of_large_points_down() -> None:
    """``--iters-bytes``: points where -n calls would move more run fewer calls (at least
    one per timed loop and three overlap runs); smaller points, or 0, run -n."""
    from coccl.bench.exchange import point_iters

    parser = cli.build_parser()
    args = parser.parse_args(["sendrecv", "-n", "20", "-w", "5", "--iters-bytes", "1G"])
    assert args.iters_bytes == 1 << 30
    assert point_iters(args, 1 << 20) == (20, 5, 5)
    assert point_iters(args, 256 << 20) == (4, 1, 3)
    assert point_iters(args, 4 << 30) == (1, 0, 3)
    args = parser.parse_args(["sendrecv", "-n", "20", "-w", "5"])
    assert point_iters(args, 4 << 30) == (20, 5, 5)
