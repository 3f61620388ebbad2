"""``coccl.tensor_parallel``: the TP layers, kept at this import path
(``coccl.torch.tensor_parallel`` holds them)."""

from coccl.torch.tensor_parallel import *  # noqa: F403
from coccl.torch.tensor_parallel import __all__  # noqa: F401
