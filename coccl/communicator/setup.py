"""Building a Communicator: ``init`` over MPI, ``create`` over any bootstrap (the
torch.distributed backend's store), collectively: the launcher checked, the settings
agreed, the device transport and its link decided."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from coccl import config
from coccl.communicator.agreement import agree_settings
from coccl.communicator.dp_calls import DpSetup
from coccl.communicator.dp_plans import find_nodes
from coccl.communicator.face import Communicator
from coccl.config import LAUNCHER_SIZES, Settings, configure_logging
from coccl.core.transport import PollingTransport
from coccl.errors import CocclError
from coccl.transports.bootstrap import Bootstrap, MpiBootstrap, node_ranks

log = logging.getLogger(__name__)

BACKENDS = ("auto", "mpi", "nccl")


def check_launcher(mpi_size: int) -> None:
    """CocclError if a launcher started more ranks than MPI sees (each process would be
    a 1-rank world of its own and 'reduce' only its own data)."""
    if mpi_size != 1:
        return
    for var, launcher in LAUNCHER_SIZES:
        raw = os.environ.get(var, "").strip()
        if raw.isdigit() and int(raw) > 1:
            raise CocclError(
                f"{launcher} started {raw} processes ({var}={raw}) but MPI sees a world of "
                "1: each process would run alone. Launch with an mpiexec of the MPI that "
                "mpi4py uses (mpiexec -n N python -m mpi4py script.py), or, under torchrun, "
                "use the torch.distributed backend (import coccl.torch; "
                "dist.init_process_group('coccl'))"
            )


def init(mpi_comm: Any = None, backend: str = "auto") -> Communicator:
    """Create a Communicator over an MPI communicator (default ``MPI.COMM_WORLD``).

    Collective: every rank of ``mpi_comm`` must call it. The ranks check that their
    schedule-shaping settings (``COCCL_CHUNK_BYTES``, ``COCCL_PIPELINE_DEPTH``,
    ``COCCL_STAGING_LIMIT_BYTES``, ``COCCL_GRAPHS``, ``COCCL_NCCL_GATHER``) agree.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm``.
        backend: ``"mpi"``, ``"nccl"`` or ``"auto"`` (NCCL when every rank has a GPU of
            its own, else MPI). Host arrays always travel over MPI.

    Raises:
        ValueError: unknown backend, or a malformed ``COCCL_*`` variable.
        TypeError: ``mpi_comm`` is not an MPI communicator.
        CocclError: the NCCL backend cannot run here (no CuPy/GPU, or ranks share a GPU),
            the ranks' settings differ, or a launcher started more processes than MPI
            sees.

    Example:
        >>> comm = coccl.init()
        >>> y = comm.allreduce(x, compressor="taco")
        >>> comm.close()
    """
    from mpi4py import MPI  # noqa: PLC0415

    if mpi_comm is None:
        mpi_comm = MPI.COMM_WORLD
    if not isinstance(mpi_comm, MPI.Comm):
        raise TypeError(f"mpi_comm must be an mpi4py.MPI.Comm, got {type(mpi_comm).__name__}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; coccl takes {', '.join(BACKENDS)}")
    conf = config.settings()
    if mpi_comm is MPI.COMM_WORLD:
        check_launcher(mpi_comm.Get_size())
    return over_mpi(mpi_comm, backend, conf)


def over_mpi(mpi_comm: Any, backend: str, conf: Settings) -> Communicator:
    """``create`` over a checked MPI communicator (``init``, and ``Communicator.split``
    with its parent's settings)."""
    from coccl.transports.mpi import MpiTransport  # noqa: PLC0415  (initialises MPI)

    def mpi_host(conf: Settings) -> PollingTransport:
        return MpiTransport(
            mpi_comm,
            cuda_aware=conf.mpi_cuda_aware,
            timeout_s=conf.timeout_s,
            forward_from_host=conf.forward_from_pinned,
        )

    # point-to-point runs on a duplicate of its own, so its tags never meet the collectives'
    return create(MpiBootstrap(mpi_comm), mpi_host, backend, conf, make_p2p=mpi_host)


def create(
    boot: Bootstrap,
    make_host: Callable[[Settings], PollingTransport],
    backend: str,
    conf: Settings | None = None,
    make_p2p: Callable[[Settings], PollingTransport] | None = None,
) -> Communicator:
    """Build a Communicator over a bootstrap, collectively (``coccl.init`` does it over
    MPI; ``coccl.torch`` over torch.distributed's store): agree on the settings, decide
    whether device data travels over NCCL (and on which GPU and link), create the host
    transport with ``make_host`` and, if given, point-to-point's own with ``make_p2p``
    (without one, point-to-point calls raise CocclError). Takes ownership of ``boot``
    (closed on failure)."""
    from coccl.transports import nccl as nccl_transport  # noqa: PLC0415

    conf = config.settings() if conf is None else conf
    config.set_log_rank(boot.rank)  # log lines name this rank where no launcher says it
    configure_logging(conf.log_level)
    nccl = host = None
    try:
        local_rank, local_size = node_ranks(boot, conf.timeout_s)
        nodes = find_nodes(boot, conf.timeout_s, conf.local_size)
        threads, pipelined = agree_settings(boot, conf, local_size)
        resolved, device_id, reason = nccl_transport.decide(
            boot, backend, local_rank, conf.timeout_s
        )
        if backend == "nccl" and resolved != "nccl":
            raise CocclError(f"backend='nccl' cannot run here: {reason}")
        link = "mpi"
        if resolved == "nccl":
            assert device_id is not None
            nccl = nccl_transport.NcclTransport(boot, device_id, conf.timeout_s)
            link = nccl_transport.detect_link(boot, device_id, conf.link, conf.timeout_s)
        host = make_host(conf)
        p2p = None if make_p2p is None else make_p2p(conf)
        if reason:  # name the transport that runs: MPI, or Gloo under torchrun
            log.debug("device data travels over %s: %s", _name_of(host), reason)
    except BaseException:
        if host is not None:
            host.close()
        if nccl is not None:
            nccl.close()
        boot.close()
        raise
    return Communicator(
        boot, host, conf, nccl=nccl, link=link, cpu_threads=threads, host_pipelined=pipelined,
        p2p=p2p,
        dp=DpSetup(nodes, over_mpi),
    )  # fmt: skip


def _name_of(host: PollingTransport) -> str:
    """A host transport's name as a log line says it (``MPI``, ``Gloo``)."""
    name = str(getattr(host, "name", "the host transport"))
    return {"mpi": "MPI", "gloo": "Gloo"}.get(name, name)
