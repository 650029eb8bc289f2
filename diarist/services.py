"""The shared handles every process needs: settings, database, object store, event bus, dispatcher.

``api`` and ``worker`` both take a :class:`Services`; the CLI builds it once per process. The dispatcher
(how a job reaches a worker) is injected so that ``api`` never imports ``worker``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from diarist.db import Database
from diarist.events import EventBus, make_bus
from diarist.metrics import ServiceMetrics
from diarist.settings import Settings
from diarist.speakers import VoiceEmbedder
from diarist.storage import ObjectStore, make_store


class Dispatcher(Protocol):
    """Hands work to the queue (Celery in every mode)."""

    def queue_for(self, duration_s: float | None) -> str:
        """Queue name for a recording of this duration (``transcribe.short`` / ``transcribe.long``)."""

    def transcribe(self, job_id: str, queue: str) -> None:
        """Enqueue the transcription of a job row. Raises on broker failure."""

    def webhook(self, job_id: str, event: str, message_id: str, countdown: float = 0.0) -> None:
        """Enqueue one webhook delivery attempt (``event`` like ``job.completed``)."""

    def ping(self) -> None:
        """Raises when the broker is unreachable."""

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each queue (``{queue name: n}``). Raises when the broker is unreachable."""


@dataclass
class Services:
    settings: Settings
    db: Database
    store: ObjectStore
    bus: EventBus
    dispatcher: Dispatcher | None = None
    voices: VoiceEmbedder | None = None  # enrollment samples' voice vectors (None: enrollment from uploads is off)
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)  # this process's event counters

    @classmethod
    def from_settings(cls, settings: Settings, migrate: bool = False, scratch_dir: Path | None = None) -> Services:
        """Open the database (running the migrations first when ``migrate``), the store (downloading into
        ``scratch_dir``, this process's :class:`diarist.scratch.Scratch` directory) and the bus."""
        if migrate:
            from diarist.db import upgrade

            upgrade(settings.db_url)
        return cls(settings=settings, db=Database(settings.db_url), store=make_store(settings, scratch_dir),
                   bus=make_bus(settings))

    def close(self) -> None:
        self.db.dispose()
