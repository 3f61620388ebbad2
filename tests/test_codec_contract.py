"""The Compressor contract (compressors/base.py) for identity, int8, int, taco, mx, taco_fp
and tah, the behaviour the lossy codecs share (dtypes, accumulate, every output element
written, NaN groups,
any count, determinism), and the committed wire-format fixtures.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numba
import numpy as np
import pytest

from coccl.compressors import (
    Compressor,
    IdentityCompressor,
    TacoCompressor,
    available_compressors,
    get_compressor,
)

from codec_reference import grouped_gaussian, padded_groups, seed_for

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.float64)]
FIXTURES = Path(__file__).parent / "fixtures" / "codecs.npz"

CONFIGS = [
    {"id": "identity"},
    {"id": "int8"},
    {"id": "int8", "group_size": 32},
    {"id": "int8", "group_size": 512},
    {"id": "taco"},
    {"id": "taco", "fp8_format": "e5m2", "group_size": 64},
    {"id": "taco", "group_size": 32, "ash": False},
    {"id": "taco", "group_size": 512, "dual_scale": False},
    {"id": "taco", "ash": False, "dual_scale": False},
    {"id": "taco", "group_size": 64, "coccl_clamps": True},
    {"id": "mx"},
    {"id": "mx", "element": "e3m2", "block": 16},
    {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"},
    {"id": "mx", "element": "e2m3", "scale": "e4m3"},
    {"id": "taco_fp"},
    {"id": "taco_fp", "element": "e3m2", "group_size": 32},
    {"id": "int"},
    {"id": "int", "bits": 8},
    {"id": "int", "bits": 2, "group_size": 32},
    {"id": "int", "bits": 3, "hadamard": 32},
    {"id": "int", "bits": 6, "group_size": 32},
    {"id": "int", "bits": 5, "group_size": 2048, "hadamard": 1024, "rounding": "stochastic"},
    {"id": "int", "bits": 8, "hadamard": 8, "rounding": "stochastic", "seed": 3},
    # tah with one tile per token, so that a token (its alignment) is a NaN tile's extent
    {"id": "tah", "row": 64},
    {"id": "tah", "row": 32, "tile": 32, "pivot": "off"},
    {"id": "tah", "row": 128, "tile": 128, "bits_high": 8, "bits_low": 2, "low_fraction": 0.5},
]
LOSSY = [c for c in CONFIGS if c["id"] != "identity"]
COUNTS = [0, 1, 31, 127, 128, 129, 1000]


def _id(cfg: dict) -> str:
    return "-".join(str(v) if k == "id" else f"{k}={v}" for k, v in cfg.items())


def _group(cfg: dict) -> int:
    return get_compressor(cfg).alignment


def _bits(a: np.ndarray) -> np.ndarray:
    """The raw bits of a float array, for bitwise comparisons."""
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _assert_bitwise(a: np.ndarray, b: np.ndarray, msg: str = "") -> None:
    assert a.dtype == b.dtype, msg
    np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=msg)


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_config_roundtrip(cfg: dict) -> None:
    c = get_compressor(cfg)
    config = c.get_config()
    assert config["id"] == cfg["id"]
    assert json.loads(json.dumps(config)) == config  # JSON-serialisable, types kept
    again = type(c).from_config(config)
    assert again == c and hash(again) == hash(c) and repr(again) == repr(c)
    assert get_compressor(config) == c
    assert get_compressor(cfg["id"], **{k: v for k, v in cfg.items() if k != "id"}) == c
    options = ",".join(f"{k}={v}" for k, v in config.items() if k != "id")
    assert get_compressor(f"{cfg['id']}:{options}" if options else cfg["id"]) == c  # a label
    assert get_compressor(c) is c
    assert repr(c).startswith(type(c).__name__ + "(")
    for key, value in config.items():
        if key != "id":
            assert f"{key}={value!r}" in repr(c)


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("nope:bits=4", "unknown compressor 'nope'"),
        ("int:bits", "expected key=value"),
        ("int:=4", "expected key=value"),
        ("int:bits=4,bits=6", "'bits' given twice"),
        ("int:bits=9", "bits"),
    ],
)
def test_label_refused(label: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_compressor(label)


def test_label_values() -> None:
    assert get_compressor(" int : bits = 6 , hadamard=32 , rounding=stochastic") == get_compressor(
        {"id": "int", "bits": 6, "hadamard": 32, "rounding": "stochastic"}
    )
    assert get_compressor("taco:ash=false,dual_scale=True").get_config()["ash"] is False
    assert get_compressor("tah:row=64,low_fraction=0.5").low_fraction == 0.5
    assert get_compressor("int:bits=8") == get_compressor("int", bits=8)


def test_registry_and_defaults() -> None:
    assert {"identity", "int8", "int", "taco", "tah"} <= set(available_compressors())
    assert get_compressor("taco").get_config() == {
        "id": "taco",
        "fp8_format": "e4m3",
        "group_size": 128,
        "ash": True,
        "dual_scale": True,
        "coccl_clamps": False,
    }
    assert get_compressor("int8").get_config() == {"id": "int8", "group_size": 128}
    assert isinstance(get_compressor("identity"), IdentityCompressor)
    assert get_compressor("taco") != get_compressor("taco", fp8_format="e5m2")
    assert get_compressor("taco") != get_compressor("int8")
    assert len({get_compressor(c) for c in CONFIGS}) == len(CONFIGS)


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown compressor"):
        get_compressor("zstd")
    with pytest.raises(ValueError, match="unknown compressor"):
        get_compressor({"id": "nope"})


@pytest.mark.parametrize(
    "name, options, option",
    [
        ("int8", {"group_size": 48}, "group_size"),
        ("int8", {"group_size": 16}, "group_size"),
        ("int8", {"group_size": 1024}, "group_size"),
        ("taco", {"group_size": 100}, "group_size"),
        ("taco", {"group_size": 0}, "group_size"),
        ("taco", {"fp8_format": "e3m4"}, "fp8_format"),
        ("taco", {"fp8_format": "E4M3"}, "fp8_format"),
        ("int", {"bits": 1}, "bits"),
        ("int", {"bits": 9}, "bits"),
        ("int", {"group_size": 16}, "group_size"),
        ("int", {"group_size": 4096}, "group_size"),
        ("int", {"hadamard": 4}, "hadamard"),
        ("int", {"hadamard": 48}, "hadamard"),
        ("int", {"group_size": 64, "hadamard": 128}, "hadamard"),
        ("int", {"rounding": "up"}, "rounding"),
        ("int", {"seed": -1}, "seed"),
        ("int", {"seed": 1 << 64}, "seed"),
        ("tah", {"row": 100}, "row"),
        ("tah", {"tile": 16}, "tile"),
        ("tah", {"bits_low": 5}, "bits_low"),
        ("tah", {"pivot": "always"}, "pivot"),
    ],
)
def test_bad_option_values(name: str, options: dict, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        get_compressor(name, **options)
    with pytest.raises(ValueError, match=option):
        get_compressor({"id": name, **options})


@pytest.mark.parametrize(
    "name, options, option",
    [
        ("int8", {"group_size": "128"}, "group_size"),
        ("int8", {"group_size": 128.0}, "group_size"),
        ("taco", {"group_size": True}, "group_size"),
        ("taco", {"fp8_format": 4}, "fp8_format"),
        ("taco", {"ash": "yes"}, "ash"),
        ("taco", {"dual_scale": 1}, "dual_scale"),
        ("taco", {"coccl_clamps": "no"}, "coccl_clamps"),
        ("int", {"bits": 4.0}, "bits"),
        ("int", {"hadamard": True}, "hadamard"),
        ("int", {"rounding": 0}, "rounding"),
        ("int", {"seed": "1"}, "seed"),
        ("tah", {"row": 64.0}, "row"),
        ("tah", {"pivot": False}, "pivot"),
    ],
)
def test_bad_option_types(name: str, options: dict, option: str) -> None:
    with pytest.raises(TypeError, match=option):
        get_compressor(name, **options)


@pytest.mark.parametrize("name", ["identity", "int8", "int", "taco", "mx", "taco_fp", "tah"])
def test_unknown_option(name: str) -> None:
    with pytest.raises(TypeError, match="bogus"):
        get_compressor(name, bogus=1)


def test_config_id_mismatch() -> None:
    with pytest.raises(ValueError, match="taco"):
        TacoCompressor.from_config({"id": "int8"})


@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_declared_properties(cfg: dict) -> None:
    c = get_compressor(cfg)
    assert not c.lossless
    assert c.ops == frozenset({"sum", "avg"})
    assert set(c.dtypes) == set(FLOATS)
    by_codec = {"mx": cfg.get("block", 32), "tah": cfg.get("row", 4096)}
    assert c.alignment == by_codec.get(cfg["id"], cfg.get("group_size", 128))
    assert 0 < c.rel_error_typical < c.rel_error_bound
    c.check_op("sum")
    with pytest.raises(ValueError, match="max"):
        c.check_op("max")


@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint16, np.complex64])
def test_unsupported_dtype(cfg: dict, dtype: type) -> None:
    c = get_compressor(cfg)
    with pytest.raises(TypeError):
        c.check_dtype(dtype)
    with pytest.raises(TypeError):
        c.encode(np.zeros(10, dtype=dtype))
    payload = c.encode(np.zeros(10, np.float32))
    with pytest.raises(TypeError):
        c.decode(payload, count=10, dtype=dtype)


def test_identity_takes_integers() -> None:
    c = get_compressor("identity")
    x = np.arange(10, dtype=np.int32)
    np.testing.assert_array_equal(c.decode(c.encode(x), count=10, dtype=np.int32), x)
    c.check_op("max")


# ------------------------------------------------------------- public numpy API
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_public_encode_decode(cfg: dict, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    c = get_compressor(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), 600, 128, -1, 1).reshape(20, 30)
    payload = c.encode(x)
    assert isinstance(payload, np.ndarray) and payload.dtype == np.uint8 and payload.ndim == 1
    assert payload.size == c.encoded_nbytes(x.size, x.dtype)
    y = c.decode(payload, count=x.size, dtype=x.dtype)
    assert y.shape == (600,) and y.dtype == np.float32
    bound = c.rel_error_bound + 1e-7
    assert np.linalg.norm(y - x.ravel()) <= bound * np.linalg.norm(x), f"seed={seed}"
    # Preallocated payload and output (of the caller's shape) give the same results.
    buf = np.empty_like(payload)
    assert c.encode(x, buf) is buf and np.array_equal(buf, payload)
    out = np.empty((20, 30), np.float32)
    assert c.decode(payload, out, count=600, dtype=np.float32) is out
    _assert_bitwise(out.ravel(), y)


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_public_api_errors(cfg: dict) -> None:
    c = get_compressor(cfg)
    x = np.ones(1300, np.float32)
    payload = c.encode(x)
    with pytest.raises(ValueError):
        c.encode(x, np.empty(payload.size + 1, np.uint8))
    with pytest.raises(TypeError):
        c.encode(x, np.empty(payload.size, np.int8))
    with pytest.raises(ValueError):
        c.decode(payload[:-1], count=1300, dtype=np.float32)
    with pytest.raises(ValueError):
        c.decode(payload, count=100, dtype=np.float32)  # a payload of another size
    with pytest.raises(ValueError):
        c.decode(payload, np.empty(1301, np.float32), count=1300, dtype=np.float32)
    with pytest.raises(ValueError):
        c.decode(payload, count=1300, dtype=np.float32, accumulate=True)
    with pytest.raises(ValueError):
        c.decode(payload, count=-1, dtype=np.float32)
    with pytest.raises(ValueError):
        c.encode(np.ones((4, 4), np.float32)[:, ::2])
    # encoded_nbytes checks its arguments as encode and decode do
    assert c.encoded_nbytes(np.int64(1300), "float32") == payload.size
    for count in (-1, "3", 1.0, True):
        with pytest.raises(ValueError, match="count"):
            c.encoded_nbytes(count, np.float32)
    with pytest.raises(TypeError, match="dtype"):
        c.encoded_nbytes(10, np.complex64)


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_read_only_out_is_refused_up_front(cfg: dict) -> None:
    c = get_compressor(cfg)
    x = np.linspace(-2, 2, 300, dtype=np.float32)
    payload = c.encode(x)
    frozen_payload = np.zeros_like(payload)
    frozen_payload.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        c.encode(x, frozen_payload)
    assert not frozen_payload.any()
    frozen = np.full(300, 5.0, np.float32)
    frozen.flags.writeable = False
    for accumulate in (False, True):
        with pytest.raises(ValueError, match="out is read-only"):
            c.decode(payload, frozen, count=300, dtype=np.float32, accumulate=accumulate)
    assert (frozen == 5.0).all()
    # A read-only input is fine: encoding only reads it.
    x.flags.writeable = False
    assert np.array_equal(c.encode(x), payload)


def test_docstring_examples_run() -> None:
    import doctest

    from coccl.compressors import identity, int8, intq, mx, taco, taco_fp, tah

    for module in (identity, int8, intq, taco, mx, taco_fp, tah):
        result = doctest.testmod(module, raise_on_error=False, verbose=False)
        assert result.failed == 0, f"{module.__name__}: {result}"
    assert doctest.testmod(int8).attempted >= 4 and doctest.testmod(taco).attempted >= 4
    assert doctest.testmod(intq).attempted >= 6


# --------------------------------------------------------------- shared behaviour
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_counts_write_exactly_count(cfg: dict, count: int, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    c = get_compressor(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), count, _group(cfg), -1, 1)
    payload = c.encode(x)
    assert payload.size == c.encoded_nbytes(count, np.float32)
    big = np.full(count + 64, 12345.0, dtype=np.float32)
    c.decode(payload, big[:count], count=count, dtype=np.float32)
    assert (big[count:] == 12345.0).all(), f"wrote past count; seed={seed}"
    assert not (big[:count] == 12345.0).any(), f"left an element unwritten; seed={seed}"
    y = big[:count]
    assert np.linalg.norm(y - x) <= (c.rel_error_bound + 1e-7) * np.linalg.norm(x)


@pytest.mark.parametrize("sentinel", [12345.0, np.nan])
@pytest.mark.parametrize("out_dtype", FLOATS, ids=str)
@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_poisoned_output_fully_written(
    cfg: dict, out_dtype: np.dtype, sentinel: float, request: pytest.FixtureRequest
) -> None:
    seed = seed_for(request)
    c = get_compressor(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), 1000, _group(cfg))
    payload = c.encode(x)
    out = np.full(x.size, sentinel, dtype=out_dtype)
    c.decode(payload, out, count=x.size, dtype=out_dtype)
    y32 = c.decode(payload, count=x.size, dtype=np.float32)
    with np.errstate(over="ignore"):
        expect = y32.astype(out_dtype)  # one rounding (RNE) from the float32 decode
    _assert_bitwise(out, expect, f"seed={seed}")


@pytest.mark.parametrize("out_dtype", FLOATS, ids=str)
@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_accumulate(cfg: dict, out_dtype: np.dtype, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    x = grouped_gaussian(rng, 1000, _group(cfg), -1, 1)
    payload = c.encode(x)
    base = rng.standard_normal(x.size).astype(out_dtype)
    out = base.copy()
    assert c.decode(payload, out, count=x.size, dtype=out_dtype, accumulate=True) is out
    y32 = c.decode(payload, count=x.size, dtype=np.float32)
    if out_dtype == np.float64:
        expect = base + y32.astype(np.float64)  # float64 data is reduced in float64
    else:
        expect = (base.astype(np.float32) + y32).astype(out_dtype)  # float32, one rounding
    _assert_bitwise(out, expect, f"seed={seed}")


@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_accumulate_into_float32_for_bfloat16_data(cfg: dict) -> None:
    # An algorithm keeps a float32 partial sum of bfloat16 data and decodes into it.
    c = get_compressor(cfg)
    x = np.linspace(-3, 3, 500).astype(BF16)
    payload = c.encode(x)
    acc = np.ones(500, np.float32)
    c.decode(payload, acc, count=500, dtype=BF16, accumulate=True)
    _assert_bitwise(acc, np.float32(1) + c.decode(payload, count=500, dtype=np.float32))


@pytest.mark.parametrize("in_dtype", [np.dtype(np.float16), BF16, np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_input_dtypes(cfg: dict, in_dtype: np.dtype, request: pytest.FixtureRequest) -> None:
    # Inputs are converted to float32 first (exactly for float16/bfloat16; float64 rounds
    # to nearest), so the payload is that of the float32 conversion.
    seed = seed_for(request)
    c = get_compressor(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), 1000, _group(cfg), -1, 1).astype(in_dtype)
    if in_dtype == np.float64:
        x += np.random.default_rng(seed).standard_normal(x.size) * 1e-9  # not float32-exact
    payload = c.encode(x)
    assert np.array_equal(payload, c.encode(x.astype(np.float32))), f"seed={seed}"
    assert np.array_equal(payload, c.encode(x.astype(np.float32), dtype=in_dtype))


@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_float64_beyond_float32_makes_nan_group(cfg: dict) -> None:
    g = _group(cfg)
    x = np.ones(3 * g, dtype=np.float64)
    x[g + 5] = 1e300  # becomes +Inf in float32
    c = get_compressor(cfg)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float64)
    assert (
        np.isnan(y[g : 2 * g]).all() and np.isfinite(y[:g]).all() and np.isfinite(y[2 * g :]).all()
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_nonfinite_groups_decode_to_nan(
    cfg: dict, bad: float, request: pytest.FixtureRequest
) -> None:
    seed = seed_for(request)
    g = _group(cfg)
    count = 4 * g + g // 2  # the last group partial
    x = grouped_gaussian(np.random.default_rng(seed), count, g, -1, 1)
    x[g + 3] = bad  # group 1
    x[count - 1] = bad  # the partial last group
    c = get_compressor(cfg)
    payload = c.encode(x)
    nan_groups = np.zeros(count, bool)
    nan_groups[g : 2 * g] = nan_groups[4 * g :] = True
    for out_dtype in FLOATS:
        y = c.decode(payload, count=count, dtype=out_dtype)
        np.testing.assert_array_equal(np.isnan(y), nan_groups, err_msg=f"{out_dtype} seed={seed}")
        acc = np.zeros(count, out_dtype)
        c.decode(payload, acc, count=count, dtype=out_dtype, accumulate=True)
        np.testing.assert_array_equal(np.isnan(acc), nan_groups, err_msg=f"{out_dtype} seed={seed}")


@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_deterministic_and_thread_independent(cfg: dict, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    c = get_compressor(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), 40_000 + 17, _group(cfg))
    first = c.encode(x)
    assert np.array_equal(first, c.encode(x))
    y = c.decode(first, count=x.size, dtype=np.float32)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert np.array_equal(first, c.encode(x)), f"seed={seed}"
        _assert_bitwise(c.decode(first, count=x.size, dtype=np.float32), y)
    finally:
        numba.set_num_threads(threads)


def test_concurrent_calls_from_threads() -> None:
    # The pipeline runs codecs on worker threads; concurrent calls must neither crash
    # (numba's workqueue layer aborts on concurrent parallel launches) nor mix results.
    import threading

    x = grouped_gaussian(np.random.default_rng(11), 1 << 16, 128)
    codecs = [get_compressor(c) for c in LOSSY[:4]]
    expect = [c.encode(x) for c in codecs]
    failures: list[str] = []

    def work(i: int) -> None:
        c = codecs[i % len(codecs)]
        for _ in range(10):
            p = c.encode(x)
            if not np.array_equal(p, expect[i % len(codecs)]):
                failures.append(repr(c))
            c.decode(p, count=x.size, dtype=np.float32)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_unaligned_payload(cfg: dict, offset: int) -> None:
    # A payload can be a slice of a larger buffer at any byte offset; its float32 scales
    # then sit at unaligned addresses.
    c = get_compressor(cfg)
    x = grouped_gaussian(np.random.default_rng(offset), 777, _group(cfg))
    payload = c.encode(x)
    big = np.zeros(payload.size + 8, np.uint8)
    view = big[offset : offset + payload.size]
    c.encode(x, view)
    assert np.array_equal(view, payload)
    _assert_bitwise(
        c.decode(view, count=x.size, dtype=np.float32),
        c.decode(payload, count=x.size, dtype=np.float32),
    )


@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_in_place_decode(cfg: dict) -> None:
    # out may be x: decoding into the array that was encoded.
    c = get_compressor(cfg)
    x = grouped_gaussian(np.random.default_rng(7), 500, _group(cfg))
    payload = c.encode(x)
    y = c.decode(payload, count=500, dtype=np.float32)
    c.decode(payload, x, count=500, dtype=np.float32)
    _assert_bitwise(x, y)


def test_per_group_independence() -> None:
    # Groups are independent: encoding a prefix of whole groups gives a prefix payload.
    c = get_compressor("int8")
    x = grouped_gaussian(np.random.default_rng(3), 1024, 128)
    t = get_compressor("taco")
    full, half = t.encode(x), t.encode(x[:512])
    assert np.array_equal(full[:512], half[:512])
    assert np.array_equal(c.encode(x)[:512], c.encode(x[:512])[:512])
    assert padded_groups(x, 128).shape == (8, 128)


# ------------------------------------------------------------ wire-format fixtures
def _fixture_cases() -> list[str]:
    if not FIXTURES.exists():
        return []
    with np.load(FIXTURES) as data:
        return sorted({key.split("__")[0] for key in data.files})


def test_fixture_file_present() -> None:
    assert FIXTURES.exists(), "run tests/fixtures/make_codec_fixtures.py"
    assert FIXTURES.stat().st_size < 400_000  # each case holds its own input
    assert len(_fixture_cases()) >= 43


@pytest.mark.parametrize("case", _fixture_cases())
def test_fixture_payloads_unchanged(case: str) -> None:
    with np.load(FIXTURES) as data:
        config = json.loads(str(data[f"{case}__config"]))
        dtype_name = str(data[f"{case}__dtype"])
        dtype = BF16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
        x = data[f"{case}__input"].view(dtype)
        payload = data[f"{case}__payload"]
        decoded = data[f"{case}__decoded"].view(np.float32)
        salt = int(data[f"{case}__salt"]) if f"{case}__salt" in data.files else 0
    codec: Compressor = get_compressor(config)
    assert codec.get_config() == config
    msg = f"{case}: the wire format changed; if on purpose, rerun make_codec_fixtures.py"
    np.testing.assert_array_equal(codec.encode(x, salt=salt), payload, err_msg=msg)
    out = codec.decode(payload, np.empty(x.size, np.float32), count=x.size, dtype=dtype)
    # Bitwise, except that a NaN's payload bits may differ between machines.
    nan = np.isnan(decoded)
    np.testing.assert_array_equal(np.isnan(out), nan, err_msg=msg)
    np.testing.assert_array_equal(
        out[~nan].view(np.uint32), decoded[~nan].view(np.uint32), err_msg=msg
    )


def _fixture(data, case: str) -> tuple[dict, np.ndarray, np.ndarray]:
    config = json.loads(str(data[f"{case}__config"]))
    return config, data[f"{case}__input"], data[f"{case}__payload"]


@pytest.mark.parametrize("case", [c for c in _fixture_cases() if c.endswith("_coccl")])
def test_fixture_modes_differ_only_in_extended_groups(case: str) -> None:
    # The same input encoded with COCCL's clamps and with the extended range: the payloads
    # agree byte for byte except in the groups that the extended range encoded (those
    # whose s COCCL clamps), which are not empty here.
    with np.load(FIXTURES) as data:
        cfg_old, x_old, p_old = _fixture(data, case)
        cfg_new, x_new, p_new = _fixture(data, case.removesuffix("_coccl"))
    assert cfg_old == {**cfg_new, "coccl_clamps": True} and np.array_equal(x_old, x_new)
    codec = get_compressor(cfg_new)
    g, count = codec.alignment, x_new.view(np.float32).size
    k = -(-count // g)
    differs = np.zeros(k, bool)
    codes = k * g
    differs |= (p_old[:codes] != p_new[:codes]).reshape(k, g).any(axis=1)
    scales = (p_old[codes:] != p_new[codes:]).reshape(-1, k, 4).any(axis=(0, 2))
    differs |= scales
    ext = np.zeros(k, bool)
    if cfg_new["dual_scale"]:
        s = p_new[codes : codes + 4 * k].view("<f4")
        ext = (s < np.float32(1e-12)) | (s > np.float32(1e6))
        if cfg_new["ash"]:
            a = p_new[codes + 4 * k : codes + 8 * k].view("<f4")
            ext = (a > 0) & ((a < np.float32(1e-3)) | (a > np.float32(1e3)))
    np.testing.assert_array_equal(differs, ext)
    assert ext.any() == cfg_new["dual_scale"]


# ------------------------------------------------------- CPU/GPU dispatch bridge
def test_bfloat16_bridge_helpers_match_ml_dtypes() -> None:
    # The GPU path widens/narrows bfloat16 through its bits; check that arithmetic with
    # numpy standing in for CuPy against ml_dtypes' conversions.
    from coccl.compressors._dispatch import narrow_from_f32, widen_to_f32

    bits = np.arange(1 << 16, dtype=np.uint16)
    b = bits.view(BF16)
    wide = widen_to_f32(b, np)
    _assert_bitwise(wide, b.astype(np.float32))
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32),
            np.float32([np.inf, -np.inf, 3.4e38, -3.4e38, 0.0, -0.0, 1e-45]),
        ]
    )
    out = np.empty(x.size, BF16)
    narrow_from_f32(x, out, np)
    with np.errstate(invalid="ignore"):  # NaN inputs
        expect = x.astype(BF16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(np.isnan(out.astype(np.float32)), nan)
    np.testing.assert_array_equal(out.view(np.uint16)[~nan], expect.view(np.uint16)[~nan])


def _cupy_or_skip():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as exc:  # ImportError, no driver, no device
        pytest.skip(f"needs CuPy and a CUDA GPU ({exc})")
    return cupy


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", FLOATS, ids=str)
@pytest.mark.parametrize("cfg", LOSSY, ids=_id)
def test_gpu_path_matches_cpu(
    cfg: dict, out_dtype: np.dtype, request: pytest.FixtureRequest
) -> None:
    # The codecs' CuPy path (float64 and accumulate bridging in _dispatch, then the GPU
    # kernels) gives the CPU path's payload and outputs bit for bit (NaNs as NaN-ness).
    cp = _cupy_or_skip()
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    x = grouped_gaussian(rng, 3000, _group(cfg)).astype(np.float64)
    x[5] = np.nan
    payload = c.encode(x)
    d_payload = c.encode(cp.asarray(x))
    np.testing.assert_array_equal(cp.asnumpy(d_payload), payload, err_msg=f"seed={seed}")

    def dev(a: np.ndarray):
        return cp.asarray(a.view(np.uint16)).view(BF16) if a.dtype == BF16 else cp.asarray(a)

    def host(d) -> np.ndarray:
        if np.dtype(d.dtype) == BF16:
            return cp.asnumpy(d.view(cp.uint16)).view(BF16)
        return cp.asnumpy(d)

    base = rng.standard_normal(x.size).astype(out_dtype)
    for accumulate in (False, True):
        out = base.copy()
        c.decode(payload, out, count=x.size, dtype=out_dtype, accumulate=accumulate)
        d_out = dev(base.copy())
        c.decode(d_payload, d_out, count=x.size, dtype=out_dtype, accumulate=accumulate)
        got = host(d_out)
        nan = np.isnan(out.astype(np.float64))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
        _assert_bitwise(got[~nan], out[~nan], f"accumulate={accumulate} seed={seed}")
