"""coccl for PyTorch (L4): ``import coccl.torch`` registers the torch.distributed backend
``"coccl"`` (``coccl.torch.backend``); ``coccl.torch.tensor_parallel`` holds the TP layers.
Uses only public names of the layers below."""

from coccl.torch.backend import (
    BACKEND,
    DEFAULT_MIN_COMPRESS_BYTES,
    CocclOptions,
    CocclProcessGroup,
    CocclWork,
    _reduce_op,  # noqa: F401  (the tests check the ReduceOp mapping)
    options,
    register_backend,
)
from coccl.torch.launch import init_process_group

__all__ = [
    "BACKEND",
    "DEFAULT_MIN_COMPRESS_BYTES",
    "CocclOptions",
    "CocclProcessGroup",
    "CocclWork",
    "init_process_group",
    "options",
    "register_backend",
]
