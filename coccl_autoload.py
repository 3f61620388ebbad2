"""torch's backend autoload entry point for coccl (the ``torch.backends`` group).

torch >= 2.5 calls the entry points of that group when it is imported
(``TORCH_DEVICE_BACKEND_AUTOLOAD``, on by default), so ``backend="coccl"`` is known
without ``import coccl.torch``. This module lives outside the ``coccl`` package so that
loading it stays cheap: it imports no codec, numba, MPI or CUDA; the backend itself is
imported when the first coccl group is created.
"""

from __future__ import annotations

import logging
from typing import Any

BACKEND = "coccl"


def register() -> None:
    """Register ``"coccl"`` with torch.distributed through a creator that imports
    ``coccl.torch`` on first use (nothing if torch has no distributed support, or the
    name is registered already). A failure is logged, never raised: it must not break
    ``import torch``."""
    try:
        import torch.distributed as dist  # noqa: PLC0415

        if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
            return
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    except Exception as exc:  # an old or unusual torch: import coccl.torch still works
        logging.getLogger("coccl.torch").debug("coccl autoload skipped: %s", exc)


def _create(dist_opts: Any, pg_options: Any) -> Any:
    """torch's creator for ``backend="coccl"``: ``coccl.torch``'s, imported now."""
    from coccl.torch import create_group  # noqa: PLC0415

    return create_group(dist_opts, pg_options)
