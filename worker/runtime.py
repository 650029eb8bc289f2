"""Process-wide handles for the Celery tasks (set once at worker or embedded start)."""

from __future__ import annotations

from dataclasses import dataclass

from diarist.services import Services
from worker.celery_app import CeleryDispatcher
from worker.engine_client import EngineClient


@dataclass
class Runtime:
    services: Services
    engine: EngineClient | None
    dispatcher: CeleryDispatcher


_current: Runtime | None = None


def set_runtime(rt: Runtime | None) -> None:
    global _current
    _current = rt


def runtime() -> Runtime:
    """The runtime of this process. Raises RuntimeError when the worker was not initialised."""
    if _current is None:
        raise RuntimeError("worker runtime not initialised (start it with `diarist worker` or the embedded stack)")
    return _current
