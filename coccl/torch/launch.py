"""``coccl.torch.init_process_group``: torch.distributed's default group under torchrun,
mpiexec or a lone process, with torchrun's variables filled from MPI when mpiexec
started the job."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist

from coccl.config import MPI_LAUNCHER_RANKS
from coccl.torch.backend import BACKEND


def init_process_group(backend: str = BACKEND, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` under torchrun, mpiexec or alone.

    Under torchrun (``RANK`` and ``WORLD_SIZE`` set) torch's environment is used as is.
    Under mpiexec this fills ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE`` from MPI and ``MASTER_ADDR``/``MASTER_PORT`` (unless set) from
    rank 0, so a script written for torchrun runs as it is; MPI is used for nothing else.
    A lone process becomes a world of one. Explicit ``rank``/``world_size``/``store``/
    ``init_method`` arguments are passed through untouched.

    Args:
        backend: the default group's backend (``"coccl"``, or e.g. ``"gloo"`` and coccl
            only for groups made with ``new_group(backend="coccl")``).
        **kwargs: ``torch.distributed.init_process_group``'s other arguments
            (``pg_options=CocclOptions(...)`` for a coccl default group, ``timeout``...).
    """
    explicit = any(k in kwargs for k in ("rank", "world_size", "store", "init_method"))
    if not explicit and not ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        os.environ.update(_launch_env())
    dist.init_process_group(backend=backend, **kwargs)


def _launch_env() -> dict[str, str]:
    """torchrun's variables for this process, from mpiexec's MPI world or a world of one."""
    env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    if not any(k in os.environ for k in MPI_LAUNCHER_RANKS):
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(_free_port()))
        return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                **env}  # fmt: skip
    from mpi4py import MPI  # noqa: PLC0415

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    hosts = world.allgather(socket.gethostname())
    if "MASTER_ADDR" not in env:
        one_host = len(set(hosts)) == 1
        address = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
        env["MASTER_ADDR"] = world.bcast(address if world.Get_rank() == 0 else None)
    if "MASTER_PORT" not in env:
        env["MASTER_PORT"] = world.bcast(str(_free_port()) if world.Get_rank() == 0 else None)
    env.update(
        RANK=str(world.Get_rank()),
        WORLD_SIZE=str(world.Get_size()),
        LOCAL_RANK=str(node.Get_rank()),
        LOCAL_WORLD_SIZE=str(node.Get_size()),
    )
    node.Free()
    return env


def _free_port() -> int:
    """A TCP port that is free now (for torch's store on rank 0)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


__all__ = ["init_process_group"]
