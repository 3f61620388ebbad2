"""What rebasing a replayed graph onto the caller's buffers reads from a kernel's
parameters, what the capture checks of the NCCL operations, and how a capture's
allocations switch the thread's capture mode; the driver calls themselves run in the GPU
tests (tests/mpi/test_nccl_graphs_gpu.py, tests/test_caller_graph_gpu.py)."""

import ctypes
import struct
from types import SimpleNamespace

import pytest

from coccl.engine import graphs
from coccl.engine.graph_rebase import (
    CapturedBuffer as Span,
)
from coccl.engine.graph_rebase import (
    NotRebasable,
    Rebase,
    WatchedTransport,
    overlaps,
    pointer_sites,
    role_of,
)

IN = Span(0, 0x7F00_0000_0000, 4096)
OUT = Span(1, 0x7F00_0000_1000, 1024)  # right after the input: the bounds are half-open
SPANS = [IN, OUT]


def test_role_of_is_half_open_and_empty_spans_hold_nothing():
    assert role_of(IN.base, SPANS) == 0
    assert role_of(IN.base + 4095, SPANS) == 0
    assert role_of(IN.base + 4096, SPANS) == 1  # the output's first byte
    assert role_of(OUT.base + 1024, SPANS) is None
    assert role_of(IN.base - 1, SPANS) is None
    assert role_of(5, [Span(0, 5, 0)]) is None


def test_overlaps():
    assert overlaps(IN.base - 8, 9, SPANS)
    assert not overlaps(IN.base - 8, 8, SPANS)
    assert overlaps(OUT.base + 1023, 100, SPANS)
    assert not overlaps(OUT.base + 1024, 100, SPANS)


def test_pointer_sites_finds_pointers_and_array_structs_only():
    pointer = struct.pack("<Q", IN.base + 256)  # a raw pointer into the input
    carray = struct.pack("<QqqqQ", OUT.base + 8, 100, 100, 4, 0)  # ptr, size, shape, stride
    count = struct.pack("<q", 1 << 40)
    scale = struct.pack("<f", 0.5)  # 4 bytes: never a pointer
    elsewhere = struct.pack("<Q", 0x7E00_0000_0000)
    double = struct.pack("<d", 1e300)
    sites = pointer_sites([pointer, carray, count, scale, elsewhere, double], SPANS)
    assert sites == [(0, 0, 0, IN.base + 256), (1, 0, 1, OUT.base + 8)]


def test_pointer_sites_reads_aligned_words_of_a_parameter():
    # a struct holding two pointers, the second one at byte 16
    blob = struct.pack("<QQQ", IN.base, 7, OUT.base + 1)
    assert pointer_sites([blob], SPANS) == [(0, 0, 0, IN.base), (0, 16, 1, OUT.base + 1)]
    # a word straddling an 8-byte boundary is not read as a pointer
    shifted = b"\0\0\0\0" + struct.pack("<Q", IN.base) + b"\0\0\0\0"
    assert pointer_sites([shifted], SPANS) == []


class _Inner:
    bytes_sent = 123

    def __init__(self):
        self.calls = []

    def group_exchange(self, sends, recvs, stream, wire_dtype=None):
        self.calls.append(("group", len(sends), len(recvs), stream))

    def allgather_bytes(self, send, recv, stream):
        self.calls.append(("allgather", stream))


def _array(ptr, nbytes):
    return SimpleNamespace(data=SimpleNamespace(ptr=ptr), nbytes=nbytes)


def test_watched_transport_records_nccl_operations_on_the_callers_buffers():
    inner = _Inner()
    watched = WatchedTransport(inner, SPANS)
    payload = _array(0x6000_0000, 512)
    watched.group_exchange([(1, payload)], [(1, _array(0x6000_1000, 512))], "s")
    watched.allgather_bytes(payload, _array(0x6000_2000, 1024), "s")
    assert watched.touched == ""
    assert watched.bytes_sent == 123  # everything else is the inner transport's
    watched.group_exchange([], [(1, _array(OUT.base + 512, 1024))], "s")
    assert "NCCL sends and receives" in watched.touched
    watched.allgather_bytes(_array(IN.base, 8), payload, "s")
    assert "NCCL sends and receives" in watched.touched  # the first reason stays
    assert [c[0] for c in inner.calls] == ["group", "allgather", "group", "allgather"]


def test_a_graph_that_cannot_be_read_is_not_rebasable():
    """No driver (this machine) or no graph (a GPU machine): NotRebasable, which makes the
    graph copy instead, never another error."""
    with pytest.raises(NotRebasable):
        Rebase(0, 0, SPANS)


def test_relaxed_thread_exchanges_the_capture_mode_and_restores_it(monkeypatch):
    """A capture's allocations (``cudaMalloc`` when the memory pool grows) run with the
    thread in relaxed mode (2), which a global (0) or thread-local (1) capture forbids
    otherwise; the thread's own mode comes back after, also when the block raises."""
    thread_mode = [1]  # thread-local, as torch's cudagraph trees capture
    seen = []

    def exchange(mode_ptr):
        mode = ctypes.cast(mode_ptr, ctypes.POINTER(ctypes.c_int)).contents
        seen.append(mode.value)
        thread_mode[0], mode.value = mode.value, thread_mode[0]
        return 0

    monkeypatch.setattr(graphs, "_exchange", [exchange])
    with graphs.relaxed_thread():
        assert thread_mode == [2]
    assert thread_mode == [1] and seen == [2, 1]
    with pytest.raises(KeyError), graphs.relaxed_thread():
        raise KeyError("inside")
    assert thread_mode == [1]
    monkeypatch.setattr(graphs, "_exchange", [None])  # no driver library: a plain block
    with graphs.relaxed_thread():
        pass
