"""The Ray actor behind each rank of a RayExecutor: a long-lived process that takes the job's environment,
optionally builds the user's executable object, and runs functions in it."""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Dict, Optional


class Worker:
    """Plain class; the executor wraps it with ``ray.remote`` (so importing this module needs no Ray)."""

    def __init__(self) -> None:
        self.executable: Optional[Any] = None

    def node(self) -> Dict[str, Any]:
        """Where this worker runs: its Ray node's id (the executor looks up the address the node registered
        with), hostname and pid."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    def set_env(self, env: Dict[str, str]) -> None:
        os.environ.update(env)

    def start_executable(self, cls: Optional[type], args: list, kwargs: dict) -> None:
        self.executable = cls(*args, **kwargs) if cls is not None else None

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.executable)

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return fn(*args, **kwargs)
