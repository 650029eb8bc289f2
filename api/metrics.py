"""Prometheus ``/metrics`` (prometheus-client) for the API and for the engine server.

Names follow https://prometheus.io/docs/practices/naming/ (base units in names, ``_total`` counters,
``_ratio`` for unitless ratios). Two kinds of numbers:

- **Event counters and histograms** (:class:`diarist.metrics.ServiceMetrics`): incremented by this process
  when the event happens, so a ``_total`` never goes down (deleting a job changes no counter). Workers
  expose theirs on ``diarist worker --metrics-port``; see that module for the list, HTTP request metrics
  included.
- **State read at scrape time** (gauges, which may go down): from the database, the broker and the
  engines.

API (``router``), besides the event metrics:
  diarist_jobs{status,class}            gauge: job rows by state and duration class
  diarist_webhook_jobs{status}          gauge: jobs by webhook state (pending|retrying|delivered|failed)
  diarist_database_up                   gauge: 1 when the database answered (0: no job gauges this scrape)
  diarist_broker_up                     gauge: 1 when the broker answered
  diarist_queue_messages{queue}         gauge: messages waiting in each broker queue (queue depth)
  diarist_workers{class}                gauge: worker processes whose heartbeat is within
                                        Settings.worker_beat_bound_s, by class (short|long|webhooks; embedded):
                                        a worker busy with jobs still beats, where a Celery ping it is too busy
                                        to answer in time read 0
  + the engine metrics below for the in-process engine (embedded) or every engine server of
    DIARIST_ADMIN_ENGINE_URLS (default DIARIST_ENGINE_URL), labelled ``engine`` with the configured URL
    whether the engine answers or not (one series per engine, so an alert on ``diarist_engine_up == 0``
    sees it recover); diarist_engine_up is 0 for one that does not answer, and the id the engine reports
    for itself is the ``engine_id`` label of diarist_engine_info, which only an answering engine has.
Engine server: the same engine series, from :mod:`diarist.http.engine_metrics`, which lists them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, select

from diarist.db import Database
from diarist.http.engine_metrics import EngineCollector, exposition, registry
from diarist.metrics import class_of
from diarist.models import Job, JobStatus
from diarist.outages import Dependency, classify

log = logging.getLogger(__name__)
STATUSES = tuple(s.value for s in JobStatus)
WEBHOOK_STATES = ("pending", "retrying", "delivered", "failed")
WORKER_CLASSES = ("short", "long", "webhooks")
BROKER_CACHE_S = 5.0
"""Broker answers (queue depths) are reused this long."""


class JobsCollector:
    """Job-row and worker-heartbeat gauges of one database, read at each scrape; a worker counts while its
    heartbeat is at most ``worker_alive_s`` seconds old (``Settings.worker_beat_bound_s``)."""

    def __init__(self, db: Database, worker_alive_s: float) -> None:
        self.db, self.worker_alive_s = db, worker_alive_s

    def collect(self) -> Iterator[Metric]:
        """The job and worker gauges and ``diarist_database_up``; a database outage gives
        ``diarist_database_up 0`` and no job or worker gauges rather than failing the whole scrape (the outage
        is when the other numbers matter)."""
        # not at import: the metrics module loads before the admin
        from api.admin.queries import alive_workers

        jobs = GaugeMetricFamily("diarist_jobs", "Jobs by status and duration class.", labels=["status", "class"])
        hook_jobs = GaugeMetricFamily("diarist_webhook_jobs", "Jobs by webhook state.", labels=["status"])
        up = GaugeMetricFamily("diarist_database_up", "1 when the database answered.")
        alive = GaugeMetricFamily("diarist_workers", "Worker processes with a recent heartbeat, by class.",
                                  labels=["class"])
        try:
            with self.db.session() as s:
                counts = {(class_of(q), st): n for q, st, n in
                          s.execute(select(Job.queue, Job.status, func.count()).group_by(Job.queue, Job.status))}
                by_hook = dict(s.execute(select(Job.webhook_status, func.count())
                                         .where(Job.webhook_status.is_not(None)).group_by(Job.webhook_status)).all())
                workers = alive_workers(s, datetime.now(UTC), self.worker_alive_s)
        except Exception as e:
            if classify(e) is not Dependency.DATABASE:
                raise
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for c in sorted({"short", "long"} | {c for c, _ in counts}):
            for st in STATUSES:
                jobs.add_metric([st, c], counts.get((c, st), 0))
        for st in sorted(set(WEBHOOK_STATES) | set(by_hook)):
            hook_jobs.add_metric([st], by_hook.get(st, 0))
        for c in sorted(set(WORKER_CLASSES) | set(workers)):
            alive.add_metric([c], workers.get(c, 0))
        yield jobs
        yield hook_jobs
        yield alive


class BrokerCollector:
    """Queue depth from the dispatcher (``queue_depths()``).

    A broker that does not answer gives ``diarist_broker_up 0`` and no depth samples; answers are cached
    for :data:`BROKER_CACHE_S`.
    """

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, int] | None] | None = None

    def _read(self) -> dict[str, int] | None:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > BROKER_CACHE_S:
                try:
                    depths: dict[str, int] | None = self.dispatcher.queue_depths()
                except Exception:  # noqa: BLE001 - a down broker is a value (broker_up 0), not a scrape error
                    depths = None
                self._cached = (now, depths)
            return self._cached[1]

    def collect(self) -> Iterator[Metric]:
        depths = self._read()
        up = GaugeMetricFamily("diarist_broker_up", "1 when the broker answered.")
        up.add_metric([], 0 if depths is None else 1)
        depth = GaugeMetricFamily("diarist_queue_messages", "Messages waiting in each broker queue.",
                                  labels=["queue"])
        for q, n in sorted((depths or {}).items()):
            depth.add_metric([q], n)
        yield up
        yield depth


router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics (text exposition format)", include_in_schema=False)
def api_metrics(request: Request) -> Response:
    app = request.app
    reg = getattr(app.state, "metrics_registry", None)
    if reg is None:
        from api.admin.engines import engine_stats  # not at import: the metrics module loads before the admin

        services = app.state.services
        collectors: list[Any] = [services.metrics, JobsCollector(services.db, services.settings.worker_beat_bound_s),
                                 EngineCollector(lambda: engine_stats(app))]
        if services.dispatcher is not None and hasattr(services.dispatcher, "queue_depths"):
            collectors.append(BrokerCollector(services.dispatcher))
        reg = app.state.metrics_registry = registry(*collectors)
    return exposition(reg)


