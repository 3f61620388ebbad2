"""A 3D-parallel job's compression policy, declared once: for each mesh dimension and kind
of traffic, the codec, schedule, size threshold and state; turned into the coccl process
groups of a ``DeviceMesh`` (``init_device_mesh(..., backend_override=...)``).

A policy is a dict (or the same as a JSON or TOML file)::

    {"backend": "coccl",                       # or "plain": torch's own Gloo / NCCL groups
     "tp": {"allreduce": {"codec": {"id": "taco"}, "schedule": "two_shot",
                          "min_compress_bytes": 65536,
                          "backward_codec": {"id": "int8"}}},   # optional
     "pp": {"forward": {"codec": {"id": "tah", "row": "{d_model}"}},
            "backward": {"codec": {"id": "int", "bits": 6, "group_size": 32}}},
     "dp": {"reduce": {"codec": {"id": "int", "bits": 8, "group_size": 128}},
            "gather": {"codec": {"id": "int", "bits": 4, "group_size": 2048},
                       "state": "delta"}}}

Traffic kinds: ``tp``: ``allreduce``, ``reduce_scatter``, ``allgather`` (what DTensor's
TP issues); ``pp``: ``forward`` (activations), ``backward`` (their gradients); ``dp``:
``reduce`` (gradients: ReduceScatter or AllReduce), ``gather`` (parameters). Each entry:
``codec`` (a name or config dict of coccl's registry; default ``identity``), ``schedule``
(``auto``, ``ring``, ``two_shot``, ``native``; not for ``pp``; ``hierarchical`` for the
reductions: ``dp.reduce``, ``tp.allreduce``, ``tp.reduce_scatter``, with no state),
``min_compress_bytes`` (smaller messages run exact; default coccl's 64 KiB), ``state``
(``delta`` for a gather, ``feedback`` for a reduce; default none). With ``hierarchical``,
``codec`` may be a list of two, ``[intra, inter]``: a codec per level (``"dp": {"reduce":
{"codec": ["int8", {"id": "int", "bits": 4}], "schedule": "hierarchical"}}``). A ``tp``
entry may also name a ``backward_codec``: the codec of its collectives issued during
autograd's backward pass (DTensor's AllReduces of input gradients;
``CocclOptions.backward_compressor``), while ``codec`` carries the forward pass's
(activations); absent or null, ``codec`` carries both.
A string value ``"{name}"`` in a codec config is a placeholder the caller fills
(``fill(d_model=768)``): tah's ``row`` is the model width.

One coccl group carries one codec per direction, one schedule and one threshold
(``CocclOptions``), and a mesh dimension is one group. So: on ``tp`` every lossy kind (a
lossy codec in either direction) must share codec, backward codec, schedule and
threshold (the others run exact in both directions); on ``dp`` the group carries
``reduce`` and ``gather`` is applied per call (``call_options("dp", "gather")`` in a
``coccl.torch.options`` block, as the FSDP2 comm objects of ``examples/train_3d.py``
do); ``pp``'s codecs become ``CocclOptions``'
``p2p_forward`` / ``p2p_backward`` where the installed backend has those fields (coccl's
torch send/recv); where it has not, PP traffic runs exact and ``pp_codecs_carried()``
says so (the caller reports it).

State: a ``delta`` gather (every rank keeps the gathered replica; the difference to it is
sent) and a ``feedback`` reduce (the last call's residual is added) need a state per
buffer, kept by their caller. FSDP2's ``fully_shard`` has no place for one: it calls
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` on flat buffers it packs afresh
every step, with no state argument. Its custom comm hooks can keep one, though: a comm
object per FSDP module sees one parameter group, the same flat layout at every call
(``examples/train_3d.py`` keeps the delta gather's replica so). ``without_state(carried)``
turns the stateful entries a caller does not carry exact, and says which.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coccl import algorithms
from coccl.communicator.dp_plans import HIERARCHICAL_COLLECTIVES, is_pair
from coccl.compressors import Compressor, get_compressor
from coccl.torch.backend import DEFAULT_MIN_COMPRESS_BYTES, CocclOptions

DIMS = ("pp", "dp", "tp")
TRAFFIC: dict[str, tuple[str, ...]] = {
    "tp": ("allreduce", "reduce_scatter", "allgather"),
    "pp": ("forward", "backward"),
    "dp": ("reduce", "gather"),
}
ENTRY_KEYS = ("codec", "schedule", "min_compress_bytes", "state", "backward_codec")
BACKWARD_CODEC_DIMS = ("tp",)  # the dimensions whose collectives run in both directions
BACKENDS = ("coccl", "plain")
# which state each kind may keep (a gather sends differences, a reduce feeds back errors)
STATES: dict[str, tuple[str, ...]] = {
    "allreduce": ("feedback",), "reduce_scatter": ("feedback",), "allgather": ("delta",),
    "forward": (), "backward": (), "reduce": ("feedback",), "gather": ("delta",),
}  # fmt: skip
# the coccl collectives a kind's calls are (what CocclOptions.compress names)
COLLECTIVES = {
    "allreduce": ("allreduce",), "reduce_scatter": ("reduce_scatter",),
    "allgather": ("allgather",), "reduce": ("allreduce", "reduce_scatter"),
    "gather": ("allgather",),
}  # fmt: skip
P2P_FIELDS = {"forward": "p2p_forward", "backward": "p2p_backward"}
_PLACEHOLDER = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class PolicyError(ValueError):
    """A policy that cannot be used, with the key path of what is wrong."""


@dataclass(frozen=True)
class Traffic:
    """One kind of traffic on one mesh dimension: how it travels.

    Attributes:
        codec: the codec's config dict (coccl's registry), ``{"id": "identity"}``: exact;
            with schedule ``hierarchical``, an ``(intra, inter)`` pair of them.
        schedule: coccl's algorithm for a collective (``auto`` for point-to-point).
        min_compress_bytes: messages of fewer input bytes run exact.
        state: ``None``, ``"delta"`` or ``"feedback"``.
        backward_codec: ``tp`` only: the config dict of the codec of the calls issued in
            autograd's backward pass; ``None``: ``codec`` in both directions.
    """

    codec: dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]
    schedule: str = "auto"
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES
    state: str | None = None
    backward_codec: dict[str, Any] | tuple[dict[str, Any], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        for name in ("codec", "backward_codec"):
            value = getattr(self, name)
            if isinstance(value, list):  # a pair from JSON: held as a tuple
                object.__setattr__(self, name, tuple(value))
            if isinstance(getattr(self, name), tuple) and self.schedule != "hierarchical":
                raise PolicyError(
                    f"a {name} pair (intra, inter) is for schedule 'hierarchical', "
                    f"not {self.schedule!r}"
                )

    @property
    def lossy(self) -> bool:
        """Whether its codec, in either direction and at either level, loses
        information (its configs have no placeholders left)."""
        configs = [*_configs(self.codec), *_configs(self.backward_codec)]
        return not all(get_compressor(c).lossless for c in configs)

    def options(self, collectives: tuple[str, ...]) -> dict[str, Any]:
        """``CocclOptions`` fields that make ``collectives`` travel this way."""
        fields = {
            "compressor": self.codec, "algorithm": self.schedule,
            "min_compress_bytes": self.min_compress_bytes,
            "compress": collectives if self.lossy else (),
        }  # fmt: skip
        if self.backward_codec is not None:
            fields["backward_compressor"] = self.backward_codec
        return fields


@dataclass(frozen=True)
class Policy:
    """A validated per-dimension policy (build it with ``Policy.from_dict``/``load``).

    Attributes:
        name: what it is called (a named policy's name, or a file's stem).
        backend: ``"coccl"`` (coccl groups on every dimension) or ``"plain"`` (torch's).
        traffic: ``{dim: {kind: Traffic}}`` for every dimension and kind.
    """

    name: str
    backend: str
    traffic: dict[str, dict[str, Traffic]]

    # ----------------------------------------------------------- building
    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], name: str = "custom") -> Policy:
        """Validate ``spec`` (this module's format); ``PolicyError`` names the bad key."""
        if not isinstance(spec, Mapping):
            raise PolicyError(f"a policy is a dict, got {type(spec).__name__}")
        _check_keys(spec, ("name", "backend", *DIMS), "policy")
        backend = spec.get("backend", "coccl")
        if backend not in BACKENDS:
            raise PolicyError(f"policy.backend must be one of {BACKENDS}, got {backend!r}")
        traffic: dict[str, dict[str, Traffic]] = {}
        for dim in DIMS:
            entries = spec.get(dim, {})
            if not isinstance(entries, Mapping):
                raise PolicyError(f"policy.{dim} must be a dict of {TRAFFIC[dim]}")
            _check_keys(entries, TRAFFIC[dim], f"policy.{dim}")
            traffic[dim] = {kind: _entry(entries.get(kind, {}), dim, kind) for kind in TRAFFIC[dim]}
        policy = cls(str(spec.get("name", name)), backend, traffic)
        if backend == "plain" and policy.lossy_kinds():
            raise PolicyError(
                f"policy.backend 'plain' (torch's own groups) compresses nothing, but "
                f"{policy.lossy_kinds()} name lossy codecs"
            )
        if not policy.placeholders():
            policy._check_states()
            policy._check_groups()
        return policy

    def fill(self, **values: Any) -> Policy:
        """The policy with the codecs' ``"{name}"`` placeholders replaced by ``values``
        (``fill(d_model=768)``), checked again; a placeholder left open is an error."""
        traffic = {
            dim: {
                kind: dataclasses.replace(
                    t,
                    codec=_fill(t.codec, values, f"policy.{dim}.{kind}.codec"),
                    backward_codec=_fill(
                        t.backward_codec, values, f"policy.{dim}.{kind}.backward_codec"
                    ),
                )
                for kind, t in kinds.items()
            }
            for dim, kinds in self.traffic.items()
        }
        return Policy.from_dict(_spec(self.name, self.backend, traffic), self.name)

    def without_state(self, carried: tuple[str, ...] = ()) -> tuple[Policy, list[str]]:
        """For a caller that keeps the state of the ``carried`` entries only (``dim.kind``,
        e.g. ``("dp.gather",)``): the policy with every other stateful entry exact, and
        the ``dim.kind: state (codec) -> exact`` lines it changed."""
        unknown = [
            c for c in carried if c.partition(".")[2] not in TRAFFIC.get(c.partition(".")[0], ())
        ]
        if unknown:
            raise PolicyError(f"carried names {unknown}, not dim.kind entries of {TRAFFIC}")
        changed: list[str] = []
        traffic = copy.deepcopy(self.traffic)
        for dim, kinds in traffic.items():
            for kind, t in kinds.items():
                if t.state is not None and f"{dim}.{kind}" not in carried:
                    changed.append(f"{dim}.{kind}: {t.state} ({t.codec['id']}) -> exact")
                    kinds[kind] = Traffic({"id": "identity"}, "auto", t.min_compress_bytes)
        return Policy.from_dict(_spec(self.name, self.backend, traffic), self.name), changed

    def with_threshold(self, min_compress_bytes: int) -> Policy:
        """The policy with every entry's ``min_compress_bytes`` set to one value (a tiny
        model's messages are below the defaults)."""
        traffic = {
            dim: {k: dataclasses.replace(t, min_compress_bytes=min_compress_bytes)
                  for k, t in kinds.items()}
            for dim, kinds in self.traffic.items()
        }  # fmt: skip
        return Policy.from_dict(_spec(self.name, self.backend, traffic), self.name)

    # ---------------------------------------------------------- reading
    def to_dict(self) -> dict[str, Any]:
        """The policy in its own format, every default written out (JSON-serialisable)."""
        return _spec(self.name, self.backend, self.traffic)

    def placeholders(self) -> list[str]:
        """The ``"{name}"`` placeholders still open, as ``dim.kind.key={name}``
        (``dim.kind.backward_codec.key={name}`` in a backward codec)."""
        return [
            f"{dim}.{kind}.{prefix}{key}={value}"
            for dim, kinds in self.traffic.items()
            for kind, t in kinds.items()
            for prefix, codecs in (("", t.codec), ("backward_codec.", t.backward_codec))
            for codec in _configs(codecs)
            for key, value in codec.items()
            if isinstance(value, str) and _PLACEHOLDER.match(value)
        ]

    def lossy_kinds(self) -> list[str]:
        """``dim.kind`` of every entry whose codec is lossy."""
        self._require_filled()
        return [f"{d}.{k}" for d, ks in self.traffic.items() for k, t in ks.items() if t.lossy]

    def group_options(self, dim: str) -> CocclOptions | None:
        """The ``CocclOptions`` of dimension ``dim``'s coccl group (None: ``plain``).

        ``tp``: its lossy kinds' codec, backward codec, schedule and threshold,
        ``compress`` naming them;
        ``dp``: ``reduce``'s (``gather`` per call: ``call_options``); ``pp``: exact
        collectives, the codecs on ``p2p_forward`` / ``p2p_backward`` where the installed
        ``CocclOptions`` has those fields."""
        self._require_filled()
        if dim not in DIMS:
            raise PolicyError(f"mesh dimensions are {DIMS}, not {dim!r}")
        if self.backend == "plain":
            return None
        if dim == "tp":
            return CocclOptions(**self._tp_fields())
        if dim == "dp":
            return CocclOptions(**self.traffic["dp"]["reduce"].options(COLLECTIVES["reduce"]))
        fields = {f.name for f in dataclasses.fields(CocclOptions)}
        p2p = {
            P2P_FIELDS[kind]: t.codec
            for kind, t in self.traffic["pp"].items()
            if P2P_FIELDS[kind] in fields
        }
        thresholds = {t.min_compress_bytes for t in self.traffic["pp"].values() if t.lossy}
        if len(thresholds) > 1:
            raise PolicyError(
                "policy.pp.forward and policy.pp.backward name different thresholds; one "
                "coccl group (a mesh dimension) carries one"
            )
        if thresholds:
            p2p["min_compress_bytes"] = thresholds.pop()
        return CocclOptions(**p2p)

    def call_options(self, dim: str, kind: str) -> dict[str, Any]:
        """``coccl.torch.options(group, **...)`` changes that make one call of ``kind``
        on ``dim``'s group travel as the policy says (e.g. FSDP2's parameter AllGather)."""
        self._require_filled()
        if kind not in COLLECTIVES or kind not in TRAFFIC.get(dim, ()):
            raise PolicyError(f"{dim}.{kind} is not a collective of the policy")
        return self.traffic[dim][kind].options(COLLECTIVES[kind])

    def pp_codecs_carried(self) -> dict[str, bool]:
        """Whether the installed backend carries each PP kind's codec (its
        ``CocclOptions`` has the field): ``{"forward": bool, "backward": bool}``."""
        fields = {f.name for f in dataclasses.fields(CocclOptions)}
        return {kind: P2P_FIELDS[kind] in fields for kind in TRAFFIC["pp"]}

    def backend_override(self, device_type: str) -> dict[str, Any]:
        """``init_device_mesh``'s ``backend_override``: ``("coccl", CocclOptions)`` per
        dimension, or torch's backend for ``device_type`` (``plain``)."""
        if self.backend == "plain":
            return {dim: "nccl" if device_type == "cuda" else "gloo" for dim in DIMS}
        return {dim: ("coccl", self.group_options(dim)) for dim in DIMS}

    def device_mesh(self, device_type: str, shape: tuple[int, int, int]) -> Any:
        """``init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp",
        "tp"))`` with this policy's group on every dimension."""
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

        if len(shape) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                  for s in shape):  # fmt: skip
            raise PolicyError(f"the mesh shape is (pp, dp, tp) of positive ints, got {shape}")
        return init_device_mesh(
            device_type, tuple(shape), mesh_dim_names=DIMS,
            backend_override=self.backend_override(device_type),
        )  # fmt: skip

    # ------------------------------------------------------------ checks
    def _require_filled(self) -> None:
        if self.placeholders():
            raise PolicyError(
                f"policy {self.name!r} has open placeholders {self.placeholders()}: "
                f"fill them first (policy.fill(d_model=...))"
            )

    def _tp_fields(self) -> dict[str, Any]:
        """tp's group options: one codec per direction, one schedule and threshold for
        its lossy kinds."""
        lossy = {k: t for k, t in self.traffic["tp"].items() if t.lossy}
        if not lossy:
            return {"compressor": "identity", "algorithm": self.traffic["tp"]["allreduce"].schedule}
        first_kind, first = next(iter(lossy.items()))

        def travel(t: Traffic) -> tuple:  # a backward codec of None is the codec
            return t.codec, t.backward_codec or t.codec, t.schedule, t.min_compress_bytes

        for kind, t in lossy.items():
            if travel(t) != travel(first):
                raise PolicyError(
                    f"policy.tp.{kind} and policy.tp.{first_kind} name different codecs, "
                    f"backward codecs, schedules or thresholds; one coccl group (a mesh "
                    f"dimension) carries one of each for the lossy collectives DTensor issues"
                )
        names = tuple(c for kind in lossy for c in COLLECTIVES[kind])
        return {**first.options(names), "compress": names}

    def _check_states(self) -> None:
        """A state keeps what a lossy codec loses (a residual, a replica of decoded
        differences): on an exact codec the Communicator and the FSDP2 comm objects
        refuse it at the first call, after the groups exist; refuse it here."""
        for dim, kinds in self.traffic.items():
            for kind, t in kinds.items():
                if t.state is not None and not t.lossy:
                    raise PolicyError(
                        f"policy.{dim}.{kind}.state {t.state!r} needs a lossy codec; "
                        f"{t.codec['id']!r} is exact (drop the state or name a lossy codec)"
                    )

    def _check_groups(self) -> None:
        """Build every dimension's options once, so that a bad combination fails now."""
        for dim in DIMS:
            self.group_options(dim)


# --------------------------------------------------------------------- entries
def _check_keys(spec: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in spec if k not in allowed)
    if unknown:
        raise PolicyError(f"{where} has unknown keys {unknown}; allowed: {list(allowed)}")


def _entry(spec: Any, dim: str, kind: str) -> Traffic:
    """One validated entry (``policy.dim.kind``)."""
    where = f"policy.{dim}.{kind}"
    if not isinstance(spec, Mapping):
        raise PolicyError(f"{where} must be a dict of {list(ENTRY_KEYS)}, got {spec!r}")
    _check_keys(spec, ENTRY_KEYS, where)
    schedule = spec.get("schedule", "auto")
    if dim == "pp" and schedule != "auto":
        raise PolicyError(f"{where}.schedule: point-to-point has no schedule, got {schedule!r}")
    try:
        algorithms.check_algorithm(schedule)
    except ValueError as e:
        raise PolicyError(f"{where}.schedule: {e}") from None
    if schedule == "hierarchical":
        if not set(COLLECTIVES.get(kind, ())) <= set(HIERARCHICAL_COLLECTIVES):
            raise PolicyError(
                f"{where}.schedule 'hierarchical' runs {HIERARCHICAL_COLLECTIVES}, not {kind}"
            )
        if spec.get("state") is not None:
            raise PolicyError(f"{where}: schedule 'hierarchical' carries no state")
    codec = _codec_or_pair(spec.get("codec", "identity"), f"{where}.codec", schedule)
    threshold = spec.get("min_compress_bytes", DEFAULT_MIN_COMPRESS_BYTES)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise PolicyError(f"{where}.min_compress_bytes must be an int >= 0, got {threshold!r}")
    state = spec.get("state")
    if state is not None and state not in STATES[kind]:
        allowed = STATES[kind] or "none"
        raise PolicyError(f"{where}.state must be one of {allowed} (or absent), got {state!r}")
    if schedule == "native" and codec["id"] != "identity":
        raise PolicyError(f"{where}: schedule 'native' is exact, not codec {codec['id']!r}")
    backward = spec.get("backward_codec")
    if backward is not None:
        if dim not in BACKWARD_CODEC_DIMS:
            raise PolicyError(
                f"{where}.backward_codec: only {BACKWARD_CODEC_DIMS} entries have one (a "
                f"{dim} {kind} travels in one direction"
                + ("; pp's backward is its own entry)" if dim == "pp" else ")")
            )
        backward = _codec_or_pair(backward, f"{where}.backward_codec", schedule)
        if schedule == "native" and backward["id"] != "identity":
            raise PolicyError(
                f"{where}: schedule 'native' is exact, not backward_codec {backward['id']!r}"
            )
        if state is not None:
            raise PolicyError(
                f"{where}: state {state!r} keeps one codec's residual or replica; "
                f"backward_codec gives its calls two"
            )
    return Traffic(codec, schedule, threshold, state, backward)


def _codec_or_pair(spec: Any, where: str, schedule: str) -> Any:
    """``_codec``'s config, or for a list or tuple an ``(intra, inter)`` pair of them,
    which only schedule ``hierarchical`` takes."""
    if not is_pair(spec):
        return _codec(spec, where)
    if schedule != "hierarchical":
        raise PolicyError(f"{where}: a pair (intra, inter) is for schedule 'hierarchical'")
    if len(spec) != 2:
        raise PolicyError(f"{where}: a pair is (intra, inter), got {len(spec)} codecs")
    return tuple(_codec(level, f"{where}[{i}]") for i, level in enumerate(spec))


def _configs(codec: Any) -> list[dict[str, Any]]:
    """The config dicts of a codec entry: none (None), one, or a pair's two."""
    if codec is None:
        return []
    return list(codec) if isinstance(codec, tuple) else [codec]


def _codec(spec: Any, where: str) -> dict[str, Any]:
    """A codec's full config from a name or dict, checked against coccl's registry (with
    placeholders, only its id: the rest is checked once they are filled). ``where``: the
    key path of the codec (``policy.tp.allreduce.codec``)."""
    if isinstance(spec, Compressor):
        return spec.get_config()
    if not isinstance(spec, (str, Mapping)):
        raise PolicyError(f"{where} is a codec name or config dict, got {spec!r}")
    if isinstance(spec, Mapping) and _open(spec):
        if "id" not in spec:
            raise PolicyError(f"{where} has no 'id': {dict(spec)}")
        try:
            get_compressor(str(spec["id"]))
        except (ValueError, TypeError) as e:
            raise PolicyError(f"{where}: {e}") from None
        return dict(spec)
    try:
        return get_compressor(spec).get_config()
    except (ValueError, TypeError) as e:
        raise PolicyError(f"{where} {spec!r}: {e}") from None


def _open(codec: Mapping[str, Any]) -> bool:
    return any(isinstance(v, str) and _PLACEHOLDER.match(v) for v in codec.values())


def _fill(codec: Any, values: Mapping[str, Any], where: str) -> Any:
    if codec is None:  # no backward codec
        return None
    if isinstance(codec, tuple):  # a pair: each level
        return tuple(_fill(c, values, f"{where}[{i}]") for i, c in enumerate(codec))
    out = {}
    for key, value in codec.items():
        match = _PLACEHOLDER.match(value) if isinstance(value, str) else None
        if match and match.group(1) in values:
            value = values[match.group(1)]
        elif match:
            raise PolicyError(f"{where}.{key}: no value given for {value}")
        out[key] = value
    return out


def _spec(name: str, backend: str, traffic: dict[str, dict[str, Traffic]]) -> dict[str, Any]:
    return {
        "name": name,
        "backend": backend,
        **{
            dim: {kind: _entry_spec(dim, t) for kind, t in kinds.items()}
            for dim, kinds in traffic.items()
        },
    }


def _entry_spec(dim: str, t: Traffic) -> dict[str, Any]:
    """An entry in the policy's format: every key, ``backward_codec`` where it may be."""
    spec = dataclasses.asdict(t)
    if dim not in BACKWARD_CODEC_DIMS:
        del spec["backward_codec"]
    return spec


# ---------------------------------------------------------------- named ones
_INT6_GROUPS_OF_32 = {"id": "int", "bits": 6, "group_size": 32}
_INT4_H32_GROUPS_OF_32 = {"id": "int", "bits": 4, "group_size": 32, "hadamard": 32}
# issue #33's TP frontier (examples/tp_convergence_gpu.py's fwd_mxfp6_bwd_nvfp4 arm)
MXFP6 = {"id": "mx", "element": "e2m3", "block": 32, "scale": "e8m0"}
NVFP4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}
_TP_MX6_NV4 = {"codec": MXFP6, "backward_codec": NVFP4, "schedule": "two_shot"}


def _taco3d(pp_forward: dict[str, Any]) -> dict[str, Any]:
    """TACO on TP, SDP4Bit's recipe on DP, TAH-Quant's backward recipe on PP and
    ``pp_forward`` on its activations (examples/train3d_convergence_gpu.py's recipes)."""
    return {
        "backend": "coccl",
        "tp": {"allreduce": {"codec": {"id": "taco"}, "schedule": "two_shot"},
               "reduce_scatter": {"codec": {"id": "taco"}, "schedule": "two_shot"}},
        "pp": {"forward": {"codec": dict(pp_forward)},
               "backward": {"codec": dict(_INT6_GROUPS_OF_32)}},
        "dp": {"reduce": {"codec": {"id": "int", "bits": 8, "group_size": 128},
                          "schedule": "two_shot"},
               "gather": {"codec": {"id": "int", "bits": 4, "group_size": 2048},
                          "schedule": "two_shot", "state": "delta"}},
    }  # fmt: skip


NAMED: dict[str, dict[str, Any]] = {
    "none": {"backend": "plain"},
    "identity": {"backend": "coccl"},
    "taco3d": _taco3d({"id": "tah", "row": "{d_model}"}),
    "taco3d_pp6": _taco3d(_INT6_GROUPS_OF_32),
    "taco3d_pp4h": _taco3d(_INT4_H32_GROUPS_OF_32),
    "tp_mx6_nv4": {"backend": "coccl", "tp": {"allreduce": _TP_MX6_NV4}},
}


def named_policy(name: str) -> Policy:
    """A policy that ships: ``none`` (torch's Gloo / NCCL groups), ``identity`` (coccl
    groups, every byte exact), ``taco3d`` (the TACO paper's system: TACO on TP, SDP4Bit's
    recipe on DP, TAH-Quant's on PP; fill ``d_model`` before use) and ``taco3d_pp6``
    (``taco3d`` with the PP activations at 6 bits, the backward's ``int`` codec, in place
    of TAH-Quant's 4/3-bit ``tah``: the one of the two within the 3D accuracy table's
    target, README), ``taco3d_pp4h`` (``taco3d`` with the PP activations as 4-bit integers
    in groups of 32 after a 32-point Hadamard: ``tah``'s bytes, within the same target on
    18 seeds) and ``tp_mx6_nv4`` (issue #33's TP recipe: TP AllReduces two-shot,
    MXFP6 (mx e2m3, blocks of 32, E8M0 scales) in the forward pass, NVFP4 (mx e2m1,
    blocks of 16, E4M3 scales) in the backward, 0.67 bytes per element, within +0.5% of
    uncompressed in the TP convergence table (README: its NVFP4 runs simulated a coarser
    per-payload scale than coccl sends); every other collective exact)."""
    if name not in NAMED:
        raise PolicyError(f"unknown policy {name!r}; named policies: {sorted(NAMED)}")
    return Policy.from_dict(NAMED[name], name)


def load_policy(source: str | Path | Mapping[str, Any]) -> Policy:
    """A policy from a dict, a named policy, or a ``.json`` / ``.toml`` file."""
    if isinstance(source, Mapping):
        return Policy.from_dict(source)
    if isinstance(source, str) and source in NAMED:
        return named_policy(source)
    path = Path(source)
    if path.suffix not in (".json", ".toml"):
        raise PolicyError(
            f"a policy is one of {sorted(NAMED)} or a .json / .toml file, got {str(source)!r}"
        )
    if not path.is_file():
        raise PolicyError(f"policy file {str(path)!r} does not exist")
    import tomllib  # noqa: PLC0415  (Python >= 3.11)

    try:
        text = path.read_text()
        spec = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, TOMLDecodeError
        raise PolicyError(
            f"policy file {str(path)!r} is not valid {path.suffix[1:]}: {e}"
        ) from None
    return Policy.from_dict(spec, path.stem)


__all__ = [
    "DIMS",
    "NAMED",
    "TRAFFIC",
    "Policy",
    "PolicyError",
    "Traffic",
    "load_policy",
    "named_policy",
]
