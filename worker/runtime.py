"""Process-wide handles for the Celery tasks (set once at worker or embedded start)."""

from __future__ import annotations

from dataclasses import dataclass, field

from diarist.services import Services
from engine_server.client import EngineClient
from worker.celery_app import CeleryDispatcher
from worker.leases import LeaseKeeper


@dataclass
class Runtime:
    """What a task needs: the services, its engine client (None in a webhooks worker), the dispatcher and
    the process's :class:`LeaseKeeper` (its renewal thread is started by the worker process)."""

    services: Services
    engine: EngineClient | None
    dispatcher: CeleryDispatcher
    leases: LeaseKeeper = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.leases is None:
            self.leases = LeaseKeeper(self.services)


_current: Runtime | None = None


def set_runtime(rt: Runtime | None) -> None:
    global _current
    _current = rt


def runtime() -> Runtime:
    """The runtime of this process. Raises RuntimeError when the worker was not initialised."""
    if _current is None:
        raise RuntimeError("worker runtime not initialised (start it with `diarist worker` or the embedded stack)")
    return _current
