"""The communicator (L3): the public face (``Communicator``) over the planner (checks,
route, schedule choice, sizing), the runner (run paths, graph capture), the plan cache
and setup (``init``, ``create``, agreement between ranks)."""

from coccl.communicator.face import Communicator
from coccl.communicator.setup import create, init

__all__ = ["Communicator", "create", "init"]
