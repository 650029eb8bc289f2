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
  diarist_workers{class}                gauge: workers answering a Celery ping, by class (short|long|webhooks)
  + the engine metrics below for the in-process engine (embedded) or every engine server of
    DIARIST_ADMIN_ENGINE_URLS (default DIARIST_ENGINE_URL), labelled ``engine`` with the configured URL
    whether the engine answers or not (one series per engine, so an alert on ``diarist_engine_up == 0``
    sees it recover); diarist_engine_up is 0 for one that does not answer, and the id the engine reports
    for itself is the ``engine_id`` label of diarist_engine_info, which only an answering engine has.
Engine server (:func:`engine_metrics_router`), label ``engine`` (its own id there):
  diarist_engine_up, diarist_engine_info{engine_id,model,device}, diarist_engine_running_requests,
  diarist_engine_waiting_requests, diarist_engine_kv_cache_usage_ratio, diarist_engine_kv_cache_capacity_tokens,
  diarist_engine_kv_cache_used_tokens, diarist_engine_tokens_per_second (last 10 s),
  diarist_engine_{steps,prefill_tokens,decode_tokens,requests_finished,request_errors,cuda_graph_replays,
  encoder_cache_hits,encoder_cache_misses}_total.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, select

from diarist.db import Database
from diarist.metrics import class_of
from diarist.models import Job, JobStatus
from diarist.outages import Dependency, classify

log = logging.getLogger(__name__)
STATUSES = tuple(s.value for s in JobStatus)
WEBHOOK_STATES = ("pending", "retrying", "delivered", "failed")
ENGINE_COUNTERS = (("steps", "steps", "Engine steps (one forward pass each)."),
                   ("prefill_tokens", "prefill_tokens", "Prompt tokens prefilled."),
                   ("decode_tokens", "decode_tokens", "Tokens decoded."),
                   ("finished", "requests_finished", "Requests that left the engine."),
                   ("errors", "request_errors", "Requests ended by an engine error."),
                   ("cuda_graph_replays", "cuda_graph_replays", "Decode steps replayed from a CUDA graph."),
                   ("encoder_cache_hits", "encoder_cache_hits", "Encoder windows served from the cache."),
                   ("encoder_cache_misses", "encoder_cache_misses", "Encoder windows computed."))
WORKER_CLASSES = ("short", "long", "webhooks")
BROKER_CACHE_S = 5.0
"""Broker answers (queue depths, worker pings) are reused this long: a ping waits its whole timeout."""


class JobsCollector:
    """Job-row gauges of one database, read at each scrape."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        """The job gauges and ``diarist_database_up``; a database outage gives ``diarist_database_up 0`` and
        no job gauges rather than failing the whole scrape (the outage is when the other numbers matter)."""
        jobs = GaugeMetricFamily("diarist_jobs", "Jobs by status and duration class.", labels=["status", "class"])
        hook_jobs = GaugeMetricFamily("diarist_webhook_jobs", "Jobs by webhook state.", labels=["status"])
        up = GaugeMetricFamily("diarist_database_up", "1 when the database answered.")
        try:
            with self.db.session() as s:
                counts = {(class_of(q), st): n for q, st, n in
                          s.execute(select(Job.queue, Job.status, func.count()).group_by(Job.queue, Job.status))}
                by_hook = dict(s.execute(select(Job.webhook_status, func.count())
                                         .where(Job.webhook_status.is_not(None)).group_by(Job.webhook_status)).all())
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
        yield jobs
        yield hook_jobs


class BrokerCollector:
    """Queue depth and worker liveness from the dispatcher (``queue_depths()``, ``workers_alive()``).

    A broker that does not answer gives ``diarist_broker_up 0`` and no depth samples; answers are cached
    for :data:`BROKER_CACHE_S`.
    """

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, int] | None, dict[str, int]] | None = None

    def _read(self) -> tuple[dict[str, int] | None, dict[str, int]]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > BROKER_CACHE_S:
                try:
                    depths: dict[str, int] | None = self.dispatcher.queue_depths()
                    workers = self.dispatcher.workers_alive()
                except Exception:  # noqa: BLE001 - a down broker is a value (broker_up 0), not a scrape error
                    depths, workers = None, {}
                self._cached = (now, depths, workers)
            return self._cached[1], self._cached[2]

    def collect(self) -> Iterator[Metric]:
        depths, workers = self._read()
        up = GaugeMetricFamily("diarist_broker_up", "1 when the broker answered.")
        up.add_metric([], 0 if depths is None else 1)
        depth = GaugeMetricFamily("diarist_queue_messages", "Messages waiting in each broker queue.",
                                  labels=["queue"])
        for q, n in sorted((depths or {}).items()):
            depth.add_metric([q], n)
        alive = GaugeMetricFamily("diarist_workers", "Workers answering a ping, by class.", labels=["class"])
        for c in sorted(set(WORKER_CLASSES) | set(workers)):
            alive.add_metric([c], workers.get(c, 0))
        yield up
        yield depth
        yield alive


class EngineCollector:
    """Engine gauges and counters from ``source() -> {engine key: stats | None}`` (None: not answering).

    The key is the ``engine`` label of every series, so it must be the same whether the engine is up or down
    (:func:`api.admin.engines.engine_stats`: the configured URL); the engine's own name (``stats["engine_id"]``,
    else the key) is only the ``engine_id`` label of ``diarist_engine_info``.
    """

    def __init__(self, source: Callable[[], dict[str, dict | None]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self.source()
        except Exception:  # the scrape still answers, without engine series; the log says why
            log.exception("engine stats for /metrics failed")
            stats = {}
        lab = ["engine"]
        up = GaugeMetricFamily("diarist_engine_up", "1 when the engine answered its stats.", labels=lab)
        info = GaugeMetricFamily("diarist_engine_info", "The engine's own id, its model and device.",
                                 labels=["engine", "engine_id", "model", "device"])
        gauges = {k: GaugeMetricFamily(f"diarist_engine_{n}", d, labels=lab) for k, n, d in (
            ("running_requests", "running_requests", "Requests being prefilled or decoded."),
            ("waiting_requests", "waiting_requests", "Requests waiting for admission (KV, batch slots)."),
            ("kv_used_fraction", "kv_cache_usage_ratio", "Fraction of KV cache token slots in use."),
            ("kv_tokens_total", "kv_cache_capacity_tokens", "KV cache size in token slots."),
            ("kv_tokens_used", "kv_cache_used_tokens", "KV cache token slots in use."),
            ("tokens_per_s", "tokens_per_second", "Tokens processed per second over the last 10 s."))}
        counters = {k: CounterMetricFamily(f"diarist_engine_{n}", d, labels=lab) for k, n, d in ENGINE_COUNTERS}
        for eid, st in sorted(stats.items()):
            up.add_metric([eid], 0 if st is None else 1)
            if st is None:
                continue
            own_id = str(st.get("engine_id") or eid)
            info.add_metric([eid, own_id, str(st.get("model")), str(st.get("device"))], 1)
            for k, fam in gauges.items():
                if st.get(k) is not None:
                    fam.add_metric([eid], float(st[k]))
            for k, fam in counters.items():
                if st.get(k) is not None:
                    fam.add_metric([eid], float(st[k]))
        yield up
        yield info
        yield from gauges.values()
        yield from counters.values()


def _registry(*collectors: Any) -> CollectorRegistry:
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    for c in collectors:
        reg.register(c)
    return reg


def _exposition(reg: CollectorRegistry) -> Response:
    return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)


router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics (text exposition format)", include_in_schema=False)
def api_metrics(request: Request) -> Response:
    app = request.app
    reg = getattr(app.state, "metrics_registry", None)
    if reg is None:
        from api.admin.engines import engine_stats  # not at import: the engine server has no dashboard

        services = app.state.services
        collectors: list[Any] = [services.metrics, JobsCollector(services.db),
                                 EngineCollector(lambda: engine_stats(app))]
        if services.dispatcher is not None and hasattr(services.dispatcher, "queue_depths"):
            collectors.append(BrokerCollector(services.dispatcher))
        reg = app.state.metrics_registry = _registry(*collectors)
    return _exposition(reg)


def engine_metrics_router(engine: Any, engine_id: str) -> APIRouter:
    """``GET /metrics`` for the engine server: ``app.include_router(engine_metrics_router(engine, engine_id))``."""
    from api.admin.engines import engine_snapshot

    reg = _registry(EngineCollector(lambda: {engine_id: engine_snapshot(engine)}))
    r = APIRouter(tags=["metrics"])

    @r.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    def metrics() -> Response:
        return _exposition(reg)

    return r
