"""A CUDA-aware MPI reads and writes device buffers from the host, outside any stream:
before coccl hands it the caller's device data (a collective's, a point-to-point
message's), the host waits for the work the caller enqueued so far, which may still be
producing the input or reading the output. Checked on the host with stand-ins for CuPy's
streams and events (no GPU needed)."""

from types import SimpleNamespace

import pytest

from coccl import algorithms
from coccl.communicator import p2p_calls
from coccl.communicator.runner import Runner
from coccl.engine.device import DeviceContext


class _Event:
    def __init__(self, log: list[str]):
        self.log = log

    def synchronize(self) -> None:
        self.log.append("host waits")


class _Stream:
    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def wait_event(self, event: _Event) -> None:
        self.log.append(f"{self.name} waits")

    def is_capturing(self) -> bool:
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _ctx(log: list[str]) -> DeviceContext:
    s = {name: _Stream(name, log) for name in ("device", "compute", "comm", "post")}
    ctx = DeviceContext(s["device"], s["compute"], s["comm"], s["post"], None, None)
    ctx.event = lambda stream: _Event(log)  # type: ignore[method-assign]
    return ctx


@pytest.mark.parametrize("host", [False, True])
def test_enter_waits_on_the_host_only_when_asked(host):
    log: list[str] = []
    _ctx(log).enter(_Stream("caller", log), host=host)
    assert log[:3] == ["compute waits", "comm waits", "post waits"]
    assert log[3:] == (["host waits"] if host else [])


@pytest.mark.parametrize("aware", [False, True])
def test_a_staged_collective_waits_for_the_caller_before_mpi_takes_device_data(aware, monkeypatch):
    log: list[str] = []
    runner = Runner.__new__(Runner)
    runner.host = SimpleNamespace(cuda_aware=aware)
    monkeypatch.setattr(algorithms.native, "run", lambda *args: log.append("mpi"))
    plan = SimpleNamespace(algorithm="native", collective="allreduce", op="sum")
    flat = SimpleNamespace(data=None)
    runner._run_staged(plan, flat, flat, _ctx(log), _Stream("caller", log))
    if aware:
        assert log.index("host waits") < log.index("mpi")
    else:
        assert "host waits" not in log


@pytest.mark.parametrize("kind", ["send", "recv"])
@pytest.mark.parametrize("aware", [False, True])
def test_a_staged_message_waits_for_the_caller_before_mpi_takes_device_data(
    aware, kind, monkeypatch
):
    log: list[str] = []
    ctx = _ctx(log)
    monkeypatch.setattr(p2p_calls, "caller_stream", lambda obj: _Stream("caller", log))

    class _Comm(p2p_calls.PointToPointCalls):
        def __init__(self):
            self._runner = SimpleNamespace(_device=lambda device_id: ctx)
            self._p2p = SimpleNamespace(transport=SimpleNamespace(cuda_aware=aware))

        def _p2p_args(self, *args):
            log.append("posting")  # the message is built (and posted) after this

    flat = SimpleNamespace(obj=None, device_id=0, dtype=None, data=None)
    _Comm()._staged(kind, 1, None, {}, flat)
    assert log == ["compute waits"] + (["host waits"] if aware else []) + ["posting"]
