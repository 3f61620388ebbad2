"""coccl.torch.virtual_3d in one process: the PP boundary against encode/decode roundtrips,
the DP ReduceScatter against a float64 reference and its checks, and the delta rule's
properties. tests/mpi/test_virtual_3d.py compares all three with real ranks."""

from __future__ import annotations

import numpy as np
import pytest

import coccl

torch = pytest.importorskip("torch")

from coccl.torch.virtual_3d import PPBoundary, VirtualDPGroup, pp_boundary, roundtrip  # noqa: E402

CODECS = ["identity", "int8", "taco", {"id": "taco", "ash": False}]


def codec_id(spec: str | dict | None) -> str:
    return str(spec) if not isinstance(spec, dict) else ",".join(map(str, spec.values()))


def numpy_roundtrip(x: torch.Tensor, codec: str | dict) -> torch.Tensor:
    """decode(encode(x)) through the codec's public numpy API: one payload."""
    c = coccl.get_compressor(codec)
    flat = x.detach().contiguous().reshape(-1).numpy()
    out = c.decode(c.encode(flat), count=flat.size, dtype=flat.dtype)
    return torch.from_numpy(out).view(x.shape)


def data(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ PP boundary
@pytest.mark.parametrize("shape", [(0,), (1,), (3, 100), (2, 7, 64)], ids=str)
@pytest.mark.parametrize("codec", CODECS, ids=codec_id)
def test_roundtrip_is_one_payload(codec, shape):
    x = data(1, *shape)
    assert torch.equal(roundtrip(x, codec), numpy_roundtrip(x, codec))


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_chunked_roundtrip_is_one_payload_per_chunk(codec):
    c = coccl.get_compressor(codec)
    x = data(2, 5 * c.alignment + 17)
    chunk = 2 * c.alignment
    expected = torch.cat([numpy_roundtrip(p, codec) for p in x.split(chunk)])
    assert torch.equal(roundtrip(x, codec, chunk), expected)
    # a per-group codec: the cut does not change the result
    assert torch.equal(roundtrip(x, codec, chunk), roundtrip(x, codec))


def test_roundtrip_checks_the_chunk():
    with pytest.raises(ValueError, match="alignment"):
        roundtrip(data(0, 1000), "int8", 100)
    with pytest.raises(ValueError, match="positive"):
        roundtrip(data(0, 1000), "int8", 0)


@pytest.mark.parametrize("bwd", [None, "int8", "taco"], ids=codec_id)
@pytest.mark.parametrize("fwd", [None, "int8", "taco"], ids=codec_id)
def test_boundary_forward_and_backward_are_roundtrips(fwd, bwd):
    x = data(3, 4, 96).requires_grad_(True)
    g = data(4, 4, 96)
    y = pp_boundary(x, fwd, bwd)
    expected = x.detach() if fwd is None else numpy_roundtrip(x, fwd)
    assert torch.equal(y.detach(), expected)
    y.backward(g)
    assert torch.equal(x.grad, g if bwd is None else numpy_roundtrip(g, bwd))


def test_boundary_module_matches_function():
    x = data(5, 2, 8, 64).requires_grad_(True)
    module = PPBoundary({"id": "taco"}, "int8")
    assert torch.equal(module(x), pp_boundary(x, "taco", "int8"))
    assert "TacoCompressor" in repr(module)


# ----------------------------------------------------------------- ReduceScatter
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("m", [0, 1, 129, 1000])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_identity_reduce_scatter_is_the_float32_sum_in_rank_order(n, m, op):
    grads = [data(10 + j, n * m) for j in range(n)]
    shards = VirtualDPGroup(n, "identity").reduce_scatter(grads, op)
    for k, shard in enumerate(shards):
        part = [g[k * m : (k + 1) * m].numpy() for g in grads]
        acc = part[k].copy()  # the owner's own part first, then the others in rank order
        for j in range(n):
            if j != k:
                acc += part[j]
        if op == "avg":
            acc /= np.float32(n)
        np.testing.assert_array_equal(shard.numpy(), acc)
        exact = np.sum([p.astype(np.float64) for p in part], axis=0) / (n if op == "avg" else 1)
        np.testing.assert_allclose(shard.numpy(), exact, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_lossy_reduce_scatter_decodes_every_other_part(codec):
    n, m = 3, 300
    grads = [data(20 + j, n * m) for j in range(n)]
    shards = VirtualDPGroup(n, codec).reduce_scatter(grads, "sum")
    for k in range(n):
        acc = grads[k][k * m : (k + 1) * m].clone()
        for j in range(n):
            if j != k:
                acc += numpy_roundtrip(grads[j][k * m : (k + 1) * m], codec)
        assert torch.equal(shards[k], acc)


def test_reduce_scatter_checks():
    g = VirtualDPGroup(2, "int8")
    with pytest.raises(ValueError, match="replicas"):
        g.reduce_scatter([data(0, 4)])
    with pytest.raises(TypeError, match="float32"):
        g.reduce_scatter([data(0, 4).bfloat16()] * 2)
    with pytest.raises(ValueError, match="split"):
        g.reduce_scatter([data(0, 5)] * 2)
    with pytest.raises(ValueError, match="shape"):
        g.reduce_scatter([data(0, 4), data(0, 6)])
    with pytest.raises(ValueError, match="op"):
        g.reduce_scatter([data(0, 4)] * 2, "max")
    with pytest.raises(ValueError, match="alignment"):
        g.reduce_scatter([data(0, 2, 200)] * 2)  # rows in one payload, shards of 100
    with pytest.raises(ValueError, match="size"):
        VirtualDPGroup(0)


def test_batched_rows_refuse_a_payload_scoped_codec():
    """NVFP4's scale is per payload: rows sharing one would not be one payload a row."""
    nvfp4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}
    g = VirtualDPGroup(2, nvfp4, nvfp4, delta=False)
    with pytest.raises(ValueError, match="payload-scoped"):
        g.reduce_scatter([data(0, 2, 64)] * 2)
    with pytest.raises(ValueError, match="payload-scoped"):
        g.allgather_delta([data(1, 2, 32)] * 2, data(2, 2, 64), "w")
    one_row = g.reduce_scatter([data(3, 64), data(4, 64)])  # one row: one payload a shard
    assert len(one_row) == 2 and one_row[0].shape == (32,)


# --------------------------------------------------------------------- AllGather
def slowly_changing(steps: int, count: int) -> list[torch.Tensor]:
    """Weights that move by about 1e-3 of their size per step (an optimizer's steps)."""
    w = data(30, count)
    drift = data(31, count)
    return [w + 1e-3 * t * drift + 1e-4 * data(100 + t, count) for t in range(steps)]


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_delta_allgather_error_stays_at_one_step(codec):
    n, m = 2, 512
    weights = slowly_changing(100, n * m)
    delta, plain = VirtualDPGroup(n, "identity", codec), VirtualDPGroup(n, "identity", codec)
    plain.delta = False
    r_delta, r_plain = weights[0].clone(), weights[0].clone()
    errors_delta, errors_plain = [], []
    for t, w in enumerate(weights):
        before = r_delta.clone()
        shards = list(w.split(m))
        delta.allgather_delta(shards, r_delta, "w")
        plain.allgather_delta(shards, r_plain, "w")
        if t == 0:
            assert torch.equal(r_delta, w)  # the first call sends exact weights
        else:  # the rule: every replica adds the decoded difference of each shard
            expected = torch.cat(
                [
                    b + numpy_roundtrip(s - b, codec)
                    for s, b in zip(shards, before.split(m), strict=True)
                ]
            )
            assert torch.equal(r_delta, expected)
        errors_delta.append((r_delta - w).abs().max().item())
        errors_plain.append((r_plain - w).abs().max().item())
    step = max((weights[t] - weights[t - 1]).abs().max().item() for t in range(1, 100))
    bound = coccl.get_compressor(codec).rel_error_bound * 4 * step
    assert max(errors_delta[1:]) <= bound  # one difference's error, never accumulated
    assert min(errors_plain[1:]) > 10 * max(errors_delta[1:])  # the weights' own error


def test_delta_state_round_trips():
    g = VirtualDPGroup(2, "identity", "int8")
    r = data(0, 256)
    g.allgather_delta(list(data(1, 256).split(128)), r, ("stage", 0))
    other = VirtualDPGroup(2, "identity", "int8")
    other.load_state_dict(g.state_dict())
    a, b = r.clone(), r.clone()
    new = list(data(2, 256).split(128))
    g.allgather_delta(new, a, ("stage", 0))
    other.allgather_delta(new, b, ("stage", 0))
    assert torch.equal(a, b) and not torch.equal(a, torch.cat(new))  # both in delta mode


def test_allgather_checks():
    g = VirtualDPGroup(2, "identity", "int8")
    with pytest.raises(ValueError, match="replica has shape"):
        g.allgather_delta([data(0, 4)] * 2, data(0, 9), "k")
    with pytest.raises(TypeError, match="float32"):
        g.allgather_delta([data(0, 4)] * 2, data(0, 8).double(), "k")
