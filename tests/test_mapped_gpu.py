"""Mapped pinned payload buffers (``coccl.pool.MappedPool``): one set of bytes that GPU
kernels write and read as a CuPy array and MPI reads and writes as host memory. Skipped
without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

try:
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
except Exception as exc:  # ImportError, no driver, no device
    pytest.skip(f"needs CuPy and a CUDA GPU ({exc})", allow_module_level=True)

from coccl.compressors import get_compressor  # noqa: E402
from coccl.pool import MappedPool, mapped_host_view  # noqa: E402

pytestmark = pytest.mark.gpu


def test_kernel_writes_are_the_host_bytes_and_host_writes_the_kernels():
    pool = MappedPool(cp.cuda.Device().id)
    block = pool.get(1000)
    dev = block.data
    assert isinstance(dev, cp.ndarray) and dev.size == 1000
    dev[...] = cp.arange(1000, dtype=cp.uint32).astype(cp.uint8)  # a kernel writes
    cp.cuda.get_current_stream().synchronize()
    host = mapped_host_view(dev)
    np.testing.assert_array_equal(host, np.arange(1000, dtype=np.uint32).astype(np.uint8))
    host[:] = 7  # the host writes (as an MPI receive does); a later kernel reads it
    assert int(cp.sum(dev.astype(cp.int64))) == 7000
    pool.close()


def test_views_of_slices_and_what_is_not_mapped():
    pool = MappedPool(cp.cuda.Device().id)
    dev = pool.get(4096).data
    dev[...] = cp.arange(4096, dtype=cp.int32).astype(cp.uint8)
    cp.cuda.get_current_stream().synchronize()
    part = mapped_host_view(dev[100:300])
    assert part.size == 200
    np.testing.assert_array_equal(part, (np.arange(100, 300) % 256).astype(np.uint8))
    assert mapped_host_view(cp.zeros(16, dtype=cp.uint8)) is None  # device memory
    assert mapped_host_view(np.zeros(16, dtype=np.uint8)) is None  # host memory
    pool.close()
    assert mapped_host_view(dev) is None  # a closed pool's buffers are forgotten


@pytest.mark.parametrize("codec", ["taco", "int8"])
def test_codec_kernels_on_mapped_payloads_match_device_payloads(codec):
    """Encode into and decode(-accumulate) from mapped memory: bitwise what the same
    kernels give on device memory."""
    comp = get_compressor(codec)
    x = cp.asarray(np.random.default_rng(5).standard_normal(100003).astype(np.float32))
    nbytes = comp.encoded_nbytes(x.size, np.float32)
    pool = MappedPool(cp.cuda.Device().id)
    mapped = pool.get(nbytes).data
    device = cp.empty(nbytes, dtype=cp.uint8)
    comp.encode_into(x, mapped, np.dtype(np.float32))
    comp.encode_into(x, device, np.dtype(np.float32))
    np.testing.assert_array_equal(cp.asnumpy(mapped), cp.asnumpy(device))
    for accumulate in (False, True):
        a, b = cp.ones_like(x), cp.ones_like(x)
        comp.decode_into(mapped, a, np.dtype(np.float32), accumulate)
        comp.decode_into(device, b, np.dtype(np.float32), accumulate)
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))
    hop = comp.reduce_encode_kernel(x, np.dtype(np.float32))
    if hop is not None:
        out_mapped = pool.get(nbytes).data
        out_device = cp.empty(nbytes, dtype=cp.uint8)
        hop(x, mapped, out_mapped)
        hop(x, device, out_device)
        np.testing.assert_array_equal(cp.asnumpy(out_mapped), cp.asnumpy(out_device))
    pool.close()
