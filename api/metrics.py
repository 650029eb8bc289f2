"""Prometheus ``/metrics`` (prometheus-client) for the API and for the engine server.

Names follow https://prometheus.io/docs/practices/naming/ (base units in names, ``_total`` counters,
``_ratio`` for unitless ratios). The API's numbers are read from the database at scrape time, so every
replica reports the same, workers need no metrics port, and a restart loses nothing; counters derived
from job rows drop when jobs are deleted (Prometheus' ``rate()`` treats a drop as a counter reset).

API (``router``):
  diarist_jobs{status,class}                       gauge: job rows by state and duration class
  diarist_job_queue_wait_seconds{class}            histogram: first claim − submit, jobs that started
  diarist_job_rtf_ratio{class}                     histogram: processing s / audio s, completed jobs
  diarist_audio_processed_seconds_total{class}     counter: audio seconds of completed jobs
  diarist_webhook_deliveries_total{outcome}        counter: attempts (success|client_error|server_error|network_error)
  diarist_webhook_jobs{status}                     gauge: jobs by webhook state (pending|retrying|delivered|failed)
  + the engine metrics below when the engine runs in-process (embedded mode), labelled ``engine``.
Engine server (:func:`engine_metrics_router`), label ``engine``:
  diarist_engine_up, diarist_engine_info{model,device}, diarist_engine_running_requests,
  diarist_engine_waiting_requests, diarist_engine_kv_cache_usage_ratio, diarist_engine_kv_cache_capacity_tokens,
  diarist_engine_kv_cache_used_tokens, diarist_engine_tokens_per_second (last 10 s),
  diarist_engine_{steps,prefill_tokens,decode_tokens,requests_finished,request_errors,cuda_graph_replays,
  encoder_cache_hits,encoder_cache_misses}_total.
"""

from __future__ import annotations

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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy import case, extract, func, select

from diarist.db import Database
from diarist.models import Job, JobMetrics, JobStatus, WebhookDelivery

QUEUE_WAIT_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
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


def class_of(queue: str | None) -> str:
    """``transcribe.short`` → ``short`` (same rule as the dashboard's)."""
    return (queue or "").rsplit(".", 1)[-1] or "unknown"


def _seconds_between(db: Database, a: Any, b: Any) -> Any:
    """SQL for ``b − a`` in seconds (no portable datediff: one expression per dialect)."""
    if db.engine.dialect.name == "sqlite":
        return (func.julianday(b) - func.julianday(a)) * 86400.0
    return extract("epoch", b - a)


def _histogram(db: Database, name: str, doc: str, value: Any, where: list, buckets: tuple) -> HistogramMetricFamily:
    """One ``class``-labelled histogram of ``value`` over the rows matching ``where``, counted in SQL."""
    cols = [func.sum(case((value <= b, 1), else_=0)) for b in buckets]
    q = (select(Job.queue, func.count(), func.coalesce(func.sum(value), 0.0), *cols)
         .select_from(Job).join(JobMetrics, JobMetrics.job_id == Job.id, isouter=True)
         .where(*where, value.is_not(None)).group_by(Job.queue))
    fam = HistogramMetricFamily(name, doc, labels=["class"])
    with db.session() as s:
        for queue, n, total, *le in s.execute(q):
            pairs = [(repr(float(b)), int(c or 0)) for b, c in zip(buckets, le, strict=True)] + [("+Inf", int(n))]
            fam.add_metric([class_of(queue)], pairs, float(total))
    return fam


class JobsCollector:
    """Job, audio and webhook metrics of one database, computed at each scrape."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        db = self.db
        jobs = GaugeMetricFamily("diarist_jobs", "Jobs by status and duration class.", labels=["status", "class"])
        audio = CounterMetricFamily("diarist_audio_processed_seconds", "Audio seconds in completed jobs.",
                                    labels=["class"])
        hooks = CounterMetricFamily("diarist_webhook_deliveries", "Webhook delivery attempts by outcome.",
                                    labels=["outcome"])
        hook_jobs = GaugeMetricFamily("diarist_webhook_jobs", "Jobs by webhook state.", labels=["status"])
        code = WebhookDelivery.status_code
        outcome = case((code.is_(None), "network_error"), ((code >= 200) & (code < 300), "success"),
                       ((code >= 400) & (code < 500), "client_error"), else_="server_error")
        with db.session() as s:
            counts = {(class_of(q), st): n for q, st, n in
                      s.execute(select(Job.queue, Job.status, func.count()).group_by(Job.queue, Job.status))}
            secs = s.execute(select(Job.queue, func.coalesce(func.sum(Job.duration_s), 0.0))
                             .where(Job.status == JobStatus.COMPLETED.value).group_by(Job.queue)).all()
            by_outcome = dict(s.execute(select(outcome, func.count()).group_by(outcome)).all())
            by_hook = dict(s.execute(select(Job.webhook_status, func.count()).where(Job.webhook_status.is_not(None))
                                     .group_by(Job.webhook_status)).all())
        classes = sorted({"short", "long"} | {c for c, _ in counts})
        for c in classes:
            for st in STATUSES:
                jobs.add_metric([st, c], counts.get((c, st), 0))
        done = {c: 0.0 for c in classes}
        for q, total in secs:
            done[class_of(q)] = done.get(class_of(q), 0.0) + float(total)
        for c, total in sorted(done.items()):
            audio.add_metric([c], total)
        for o in ("success", "client_error", "server_error", "network_error"):
            hooks.add_metric([o], by_outcome.get(o, 0))
        for st in sorted(set(WEBHOOK_STATES) | set(by_hook)):
            hook_jobs.add_metric([st], by_hook.get(st, 0))
        yield jobs
        yield _histogram(db, "diarist_job_queue_wait_seconds", "Seconds from submit to the first worker claim.",
                         _seconds_between(db, Job.created_at, Job.started_at), [Job.started_at.is_not(None)],
                         QUEUE_WAIT_BUCKETS_S)
        yield _histogram(db, "diarist_job_rtf_ratio", "Real-time factor (processing s / audio s) of completed jobs.",
                         JobMetrics.rtf, [Job.status == JobStatus.COMPLETED.value], RTF_BUCKETS)
        yield audio
        yield hooks
        yield hook_jobs


class EngineCollector:
    """Engine gauges and counters from ``source() -> {engine id: stats | None}`` (None: not answering)."""

    def __init__(self, source: Callable[[], dict[str, dict | None]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        stats = self.source()
        lab = ["engine"]
        up = GaugeMetricFamily("diarist_engine_up", "1 when the engine answered its stats.", labels=lab)
        info = GaugeMetricFamily("diarist_engine_info", "The engine's model and device.",
                                 labels=["engine", "model", "device"])
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
            info.add_metric([eid, str(st.get("model")), str(st.get("device"))], 1)
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
        collectors: list[Any] = [JobsCollector(app.state.services.db)]
        if callable(getattr(app.state, "engine_stats", None)):
            from api.admin.engines import engine_stats  # not at import: api.admin imports this module

            collectors.append(EngineCollector(lambda: engine_stats(app)))
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
