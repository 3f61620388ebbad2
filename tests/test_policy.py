"""coccl.torch.policy: a 3D job's per-dimension policy, parsed and validated (one process,
no launch): the named policies, files, placeholders, the errors, the groups' options."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from coccl.torch import CocclOptions  # noqa: E402
from coccl.torch.policy import (  # noqa: E402
    DIMS,
    NAMED,
    TRAFFIC,
    Policy,
    PolicyError,
    load_policy,
    named_policy,
)

TACO3D = {"tp": "taco", "dp": "int", "pp_forward": "tah", "pp_backward": "int"}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_policies_parse_and_roundtrip(name: str) -> None:
    policy = named_policy(name).fill(d_model=256)
    assert policy.name == name
    assert set(policy.traffic) == set(DIMS)
    assert all(set(policy.traffic[d]) == set(TRAFFIC[d]) for d in DIMS)
    again = Policy.from_dict(json.loads(json.dumps(policy.to_dict())), name)
    assert again == policy


def test_none_is_plain_and_identity_is_exact() -> None:
    assert named_policy("none").backend_override("cpu") == {d: "gloo" for d in DIMS}
    assert named_policy("none").backend_override("cuda") == {d: "nccl" for d in DIMS}
    assert named_policy("none").group_options("tp") is None
    identity = named_policy("identity")
    assert identity.lossy_kinds() == []
    for dim, (backend, opts) in identity.backend_override("cpu").items():
        assert backend == "coccl" and isinstance(opts, CocclOptions), dim
        assert opts.codec.lossless


def test_taco3d_recipes() -> None:
    policy = named_policy("taco3d")
    assert policy.placeholders() == ["pp.forward.row={d_model}"]
    policy = policy.fill(d_model=768)
    t = policy.traffic
    tp_ar = t["tp"]["allreduce"]
    assert tp_ar.codec["id"] == "taco" and tp_ar.schedule == "two_shot"
    assert t["pp"]["forward"].codec["id"] == "tah" and t["pp"]["forward"].codec["row"] == 768
    assert {k: t["pp"]["backward"].codec[k] for k in ("id", "bits", "group_size")} == {
        "id": "int", "bits": 6, "group_size": 32}  # fmt: skip
    assert {k: t["dp"]["reduce"].codec[k] for k in ("id", "bits", "group_size")} == {
        "id": "int", "bits": 8, "group_size": 128}  # fmt: skip
    gather = t["dp"]["gather"]
    assert (gather.codec["bits"], gather.codec["group_size"], gather.state) == (4, 2048, "delta")
    tp = policy.group_options("tp")
    assert tp.codec.codec_id == "taco" and tp.algorithm == "two_shot"
    assert set(tp.compress) == {"allreduce", "reduce_scatter"}
    dp = policy.group_options("dp")
    assert dp.codec.get_config()["bits"] == 8 and "allgather" not in dp.compress
    changes = policy.call_options("dp", "gather")
    assert changes["compress"] == ("allgather",) and changes["compressor"]["bits"] == 4
    CocclOptions(**changes)  # what coccl.torch.options takes


def test_taco3d_pp4h_is_taco3d_with_4bit_hadamard_activations() -> None:
    taco3d = named_policy("taco3d").fill(d_model=64).traffic
    pp4h = named_policy("taco3d_pp4h").traffic
    assert pp4h["pp"]["backward"] == taco3d["pp"]["backward"]
    codec = pp4h["pp"]["forward"].codec
    want = {"id": "int", "bits": 4, "group_size": 32, "hadamard": 32}
    assert {k: codec[k] for k in want} == want
    assert {**pp4h, "pp": taco3d["pp"]} == taco3d


def test_taco3d_pp6_is_taco3d_with_6bit_activations() -> None:
    taco3d = named_policy("taco3d").fill(d_model=768).traffic
    pp6 = named_policy("taco3d_pp6").traffic
    assert pp6["pp"]["forward"] == pp6["pp"]["backward"] == taco3d["pp"]["backward"]
    assert pp6["pp"]["forward"].codec["bits"] == 6
    assert {**pp6, "pp": taco3d["pp"]} == taco3d


MXFP6 = {"id": "mx", "element": "e2m3", "block": 32, "scale": "e8m0"}
NVFP4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}


def test_tp_mx6_nv4_recipe() -> None:
    """Issue #33's TP recipe: the TP AllReduces MXFP6 forward, NVFP4 backward, two-shot;
    everything else exact."""
    policy = named_policy("tp_mx6_nv4")
    assert policy.placeholders() == [] and policy.lossy_kinds() == ["tp.allreduce"]
    ar = policy.traffic["tp"]["allreduce"]
    assert (ar.codec, ar.backward_codec, ar.schedule) == (MXFP6, NVFP4, "two_shot")
    tp = policy.group_options("tp")
    assert (tp.compressor, tp.backward_compressor, tp.algorithm) == (MXFP6, NVFP4, "two_shot")
    assert tp.compress == ("allreduce",) and tp.min_compress_bytes == 64 << 10
    for dim in ("pp", "dp"):
        opts = policy.group_options(dim)
        assert opts.codec.lossless and opts.backward_codec.lossless, dim
        assert opts.p2p_codecs[0].lossless and opts.p2p_codecs[1].lossless, dim
    assert policy.call_options("tp", "allreduce")["backward_compressor"] == NVFP4


def test_a_backward_codec_fills_and_goes_to_the_tp_group() -> None:
    entry = {"codec": "int8", "schedule": "ring",
             "backward_codec": {"id": "tah", "row": "{d_model}"}}  # fmt: skip
    spec = {"tp": {"allreduce": entry, "reduce_scatter": dict(entry)}}
    policy = Policy.from_dict(spec)
    assert policy.placeholders() == [
        "tp.allreduce.backward_codec.row={d_model}",
        "tp.reduce_scatter.backward_codec.row={d_model}",
    ]
    filled = policy.fill(d_model=64)
    opts = filled.group_options("tp")
    assert opts.backward_codec.get_config()["row"] == 64 and opts.codec.codec_id == "int8"
    assert opts.compress == ("allreduce", "reduce_scatter")
    again = Policy.from_dict(json.loads(json.dumps(filled.to_dict())), filled.name)
    assert again == filled
    assert all("backward_codec" not in e for d in ("pp", "dp") for e in again.to_dict()[d].values())


def test_an_exact_forward_with_a_lossy_backward_is_lossy() -> None:
    policy = Policy.from_dict({"tp": {"allreduce": {"backward_codec": "int8"}}})
    assert policy.lossy_kinds() == ["tp.allreduce"]
    opts = policy.group_options("tp")
    assert opts.codec.lossless and opts.backward_codec.codec_id == "int8"
    assert opts.compress == ("allreduce",)


def test_a_backward_codec_in_toml(tmp_path: Path) -> None:
    (tmp_path / "dirs.toml").write_text(
        '[tp.allreduce]\ncodec = "int8"\nbackward_codec = { id = "mx", element = "e2m1" }\n'
    )
    policy = load_policy(tmp_path / "dirs.toml")
    assert policy.group_options("tp").backward_codec.get_config()["element"] == "e2m1"


def test_without_state_makes_stateful_entries_exact() -> None:
    taco3d = named_policy("taco3d").fill(d_model=64)
    policy, changed = taco3d.without_state()
    assert changed == ["dp.gather: delta (int) -> exact"]
    assert policy.traffic["dp"]["gather"].codec["id"] == "identity"
    assert policy.traffic["dp"]["gather"].state is None
    assert policy.traffic["dp"]["reduce"].lossy  # stateless entries stay
    kept, changed = taco3d.without_state(carried=("dp.gather",))
    assert kept == taco3d and changed == []
    with pytest.raises(PolicyError, match="carried names"):
        taco3d.without_state(carried=("dp.params",))


def test_with_threshold_sets_every_entry() -> None:
    policy = named_policy("taco3d").fill(d_model=64).with_threshold(1024)
    assert {t.min_compress_bytes for ks in policy.traffic.values() for t in ks.values()} == {1024}
    assert policy.group_options("tp").min_compress_bytes == 1024


def test_pp_codecs_go_where_the_backend_has_fields() -> None:
    policy = named_policy("taco3d").fill(d_model=64)
    carried = policy.pp_codecs_carried()
    opts = policy.group_options("pp")
    for kind, field in (("forward", "p2p_forward"), ("backward", "p2p_backward")):
        assert carried[kind] == hasattr(CocclOptions(), field)
        if carried[kind]:
            assert getattr(opts, field) == policy.traffic["pp"][kind].codec
    assert opts.codec.lossless  # the PP group's collectives stay exact


def test_pp_group_takes_the_lossy_entries_threshold() -> None:
    policy = named_policy("taco3d").fill(d_model=64).with_threshold(1024)
    assert policy.group_options("pp").min_compress_bytes == 1024
    traffic = dict(policy.traffic)
    traffic["pp"] = dict(traffic["pp"])
    traffic["pp"]["backward"] = dataclasses.replace(traffic["pp"]["backward"], min_compress_bytes=1)
    with pytest.raises(PolicyError, match="different thresholds"):
        dataclasses.replace(policy, traffic=traffic).group_options("pp")


def test_json_and_toml_files(tmp_path: Path) -> None:
    spec = {"tp": {"allreduce": {"codec": "int8", "schedule": "ring", "min_compress_bytes": 0}}}
    (tmp_path / "mine.json").write_text(json.dumps(spec))
    (tmp_path / "mine.toml").write_text(
        '[tp.allreduce]\ncodec = "int8"\nschedule = "ring"\nmin_compress_bytes = 0\n'
    )
    a, b = load_policy(tmp_path / "mine.json"), load_policy(str(tmp_path / "mine.toml"))
    assert a == b and a.name == "mine" and a.lossy_kinds() == ["tp.allreduce"]
    assert a.group_options("tp").compress == ("allreduce",)
    assert load_policy(spec).traffic == a.traffic
    with pytest.raises(PolicyError, match="does not exist"):
        load_policy(tmp_path / "missing.json")
    with pytest.raises(PolicyError, match="named policies|.json"):
        load_policy("taco4d")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"tpp": {}}, r"policy has unknown keys \['tpp'\]"),
        ({"backend": "mpi"}, "policy.backend must be one of"),
        ({"tp": {"all_reduce": {}}}, r"policy.tp has unknown keys \['all_reduce'\]"),
        ({"tp": {"allreduce": {"codek": "taco"}}}, r"policy.tp.allreduce has unknown keys"),
        ({"tp": {"allreduce": {"codec": "tacco"}}}, "unknown compressor 'tacco'"),
        ({"tp": {"allreduce": {"codec": {"id": "int", "bitz": 4}}}}, "policy.tp.allreduce.codec"),
        ({"tp": {"allreduce": {"codec": {"id": "no", "row": "{d_model}"}}}}, "unknown compressor"),
        ({"tp": {"allreduce": {"schedule": "tree"}}}, "policy.tp.allreduce.schedule"),
        ({"pp": {"forward": {"schedule": "ring"}}}, "point-to-point has no schedule"),
        ({"dp": {"reduce": {"min_compress_bytes": -1}}}, "min_compress_bytes must be an int"),
        ({"dp": {"reduce": {"min_compress_bytes": True}}}, "min_compress_bytes must be an int"),
        ({"dp": {"reduce": {"state": "delta"}}}, r"policy.dp.reduce.state must be one of"),
        ({"dp": {"gather": {"state": "feedback"}}}, r"policy.dp.gather.state must be one of"),
        ({"pp": {"forward": {"state": "delta"}}}, r"policy.pp.forward.state must be one of none"),
        ({"tp": {"allreduce": {"codec": "taco", "schedule": "native"}}}, "'native' is exact"),
        ({"tp": {"allreduce": {"codec": "taco"}, "allgather": {"codec": "int8"}}},
         "one coccl group"),
        ({"backend": "plain", "tp": {"allreduce": {"codec": "taco"}}}, "compresses nothing"),
        ({"tp": []}, "policy.tp must be a dict"),
        ({"tp": {"allreduce": "taco"}}, "policy.tp.allreduce must be a dict"),
        ({"tp": {"allreduce": {"codec": 3}}}, "is a codec name or config dict"),
        ({"dp": {"reduce": {"backward_codec": "int8"}}},
         r"policy.dp.reduce.backward_codec: only \('tp',\) entries"),
        ({"pp": {"forward": {"backward_codec": "int8"}}}, "pp's backward is its own entry"),
        ({"tp": {"allreduce": {"backward_codec": "tacco"}}},
         "policy.tp.allreduce.backward_codec 'tacco': unknown compressor"),
        ({"tp": {"allreduce": {"backward_codec": 3}}},
         "policy.tp.allreduce.backward_codec is a codec name"),
        ({"tp": {"allreduce": {"backward_codec": "taco", "schedule": "native"}}},
         "'native' is exact, not backward_codec"),
        ({"tp": {"allreduce": {"codec": "taco", "backward_codec": "int8", "state": "feedback"}}},
         "backward_codec gives its calls two"),
        ({"tp": {"allreduce": {"codec": "taco", "backward_codec": "int8"},
                 "reduce_scatter": {"codec": "taco"}}}, "different codecs, backward codecs"),
        ({"backend": "plain", "tp": {"allreduce": {"backward_codec": "taco"}}},
         "compresses nothing"),
        ({"dp": {"reduce": {"codec": ["int8", "int8"]}}},
         "policy.dp.reduce.codec: a pair .* is for schedule 'hierarchical'"),
        ({"dp": {"reduce": {"codec": ["int8"] * 3, "schedule": "hierarchical"}}},
         r"a pair is \(intra, inter\), got 3"),
        ({"dp": {"reduce": {"codec": ["int8", "zstd"], "schedule": "hierarchical"}}},
         r"policy.dp.reduce.codec\[1\] 'zstd'"),
        ({"dp": {"gather": {"codec": "int8", "schedule": "hierarchical"}}},
         "policy.dp.gather.schedule 'hierarchical' runs"),
        ({"dp": {"reduce": {"codec": "int8", "schedule": "hierarchical", "state": "feedback"}}},
         "'hierarchical' carries no state"),
        ({"dp": {"gather": {"codec": "identity", "state": "delta"}}},
         r"policy.dp.gather.state 'delta' needs a lossy codec"),
        ({"tp": {"allreduce": {"state": "feedback"}}},
         r"policy.tp.allreduce.state 'feedback' needs a lossy codec"),
    ],
)  # fmt: skip
def test_bad_policies_name_what_is_wrong(spec: dict, match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        Policy.from_dict(spec)


def test_a_dp_codec_pair_goes_to_the_dp_group() -> None:
    """SDP4Bit's reduce: 8-bit inside the node, 4-bit across, as a ``[intra, inter]``
    list with schedule ``hierarchical``; its placeholders fill per level."""
    int4 = {"id": "int", "bits": 4, "group_size": "{g}"}
    spec = {"dp": {"reduce": {"codec": ["int8", int4], "schedule": "hierarchical"},
                   "gather": {"codec": {"id": "int", "bits": 4, "group_size": 2048}}}}  # fmt: skip
    policy = Policy.from_dict(spec)
    assert policy.placeholders() == ["dp.reduce.group_size={g}"]
    policy = policy.fill(g=32)
    reduce = policy.traffic["dp"]["reduce"]
    assert isinstance(reduce.codec, tuple) and reduce.codec[1]["group_size"] == 32
    assert reduce.lossy and policy.lossy_kinds() == ["dp.reduce", "dp.gather"]
    opts = policy.group_options("dp")
    assert opts.algorithm == "hierarchical" and [c.codec_id for c in opts.codecs] == ["int8", "int"]
    assert opts.compress == ("allreduce", "reduce_scatter")
    gather = dataclasses.replace(opts, **policy.call_options("dp", "gather"))  # a valid call
    assert gather.algorithm == "auto" and len(gather.codecs) == 1
    assert Policy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy


@pytest.mark.parametrize(("suffix", "text"), [(".json", '{"tp": '), (".toml", "[tp\nx = ")])
def test_a_malformed_file_is_a_policy_error(tmp_path: Path, suffix: str, text: str) -> None:
    (tmp_path / f"bad{suffix}").write_text(text)
    with pytest.raises(PolicyError, match=f"is not valid {suffix[1:]}"):
        load_policy(tmp_path / f"bad{suffix}")


def test_placeholders_must_be_filled() -> None:
    policy = named_policy("taco3d")
    with pytest.raises(PolicyError, match="open placeholders"):
        policy.group_options("pp")
    with pytest.raises(PolicyError, match="no value given for {d_model}"):
        policy.fill(width=64)
    with pytest.raises(PolicyError, match="row must be"):  # the filled codec is checked
        policy.fill(d_model=30)


def test_unknown_dimension_and_kind() -> None:
    policy = named_policy("identity")
    with pytest.raises(PolicyError, match="mesh dimensions are"):
        policy.group_options("ep")
    with pytest.raises(PolicyError, match="pp.forward is not a collective"):
        policy.call_options("pp", "forward")
    with pytest.raises(PolicyError, match=r"\(pp, dp, tp\)"):
        policy.device_mesh("cpu", (2, 2))
