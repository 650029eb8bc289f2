"""Event counters of one process (prometheus-client), incremented where the event happens.

A ``_total`` here only goes up: a job counts once when its final transition wins (``jobs._record_final``),
and deleting the row later changes nothing (the old counters were sums over the table, so a delete made
them drop). Each process counts what it does: the API its submits and HTTP requests, a worker the
completions, failures and webhook attempts it made, and the embedded server all of it. Scrape every
process (API ``/metrics``; workers ``diarist worker --metrics-port``) and sum in Prometheus; a restart
starts a process's counters at zero, which ``rate()`` treats as a counter reset.

Names follow https://prometheus.io/docs/practices/naming/; label ``class`` is the duration class
(``short`` / ``long``).

  diarist_jobs_submitted_total{class}                 jobs accepted (202) by this API process
  diarist_jobs_finished_total{class,status,code}      final transitions: completed (code none) | failed (its
                                                      code) | canceled (code canceled)
  diarist_audio_processed_seconds_total{class}        audio seconds of completed jobs
  diarist_job_queue_wait_seconds{class}               histogram: first claim − submit, of finished jobs that ran
  diarist_job_rtf_ratio{class}                        histogram: processing s / audio s, completed jobs
  diarist_webhook_deliveries_total{outcome}           attempts: success|client_error|server_error|network_error
  diarist_http_requests_total{method,route,status}    API requests (route: the path template)
  diarist_http_request_duration_seconds{method,route} histogram: request handling time
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import Metric

QUEUE_WAIT_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
HTTP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
WEBHOOK_OUTCOMES = ("success", "client_error", "server_error", "network_error")


def class_of(queue: str | None) -> str:
    """``transcribe.short`` → ``short`` (the dashboard's rule)."""
    return (queue or "").rsplit(".", 1)[-1] or "unknown"


def webhook_outcome(status_code: int | None) -> str:
    """One of :data:`WEBHOOK_OUTCOMES` for an attempt's HTTP status (None: no answer)."""
    if status_code is None:
        return "network_error"
    if 200 <= status_code < 300:
        return "success"
    return "client_error" if 400 <= status_code < 500 else "server_error"


def _utc(dt: datetime | None) -> datetime | None:
    return dt.replace(tzinfo=UTC) if dt is not None and dt.tzinfo is None else dt  # SQLite gives naive UTC


class ServiceMetrics:
    """The counters and histograms of one process, in their own registry (never the global one).

    Usable as a collector: ``registry.register(metrics)`` exposes them next to other collectors.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs_submitted = Counter("diarist_jobs_submitted", "Jobs accepted by this API process.", ["class"],
                                      registry=r)
        self.jobs_finished = Counter("diarist_jobs_finished", "Jobs that reached a final state, by status and "
                                     "the job's error code (canceled for canceled, none for completed).",
                                     ["class", "status", "code"], registry=r)
        self.audio_processed = Counter("diarist_audio_processed_seconds", "Audio seconds in completed jobs.",
                                       ["class"], registry=r)
        self.queue_wait = Histogram("diarist_job_queue_wait_seconds", "Seconds from submit to the first worker "
                                    "claim, of finished jobs that ran.", ["class"], buckets=QUEUE_WAIT_BUCKETS_S,
                                    registry=r)
        self.rtf = Histogram("diarist_job_rtf_ratio", "Real-time factor (processing s / audio s) of completed "
                             "jobs.", ["class"], buckets=RTF_BUCKETS, registry=r)
        self.webhook_deliveries = Counter("diarist_webhook_deliveries", "Webhook delivery attempts by outcome.",
                                          ["outcome"], registry=r)
        self.http_requests = Counter("diarist_http_requests", "HTTP requests by method, route template and "
                                     "status.", ["method", "route", "status"], registry=r)
        self.http_duration = Histogram("diarist_http_request_duration_seconds", "HTTP request handling time.",
                                       ["method", "route"], buckets=HTTP_BUCKETS_S, registry=r)
        for outcome in WEBHOOK_OUTCOMES:  # present at 0 from the start, so rate() sees the first attempt
            self.webhook_deliveries.labels(outcome)

    def collect(self) -> Iterator[Metric]:
        return self.registry.collect()

    def record_submitted(self, queue: str | None) -> None:
        self.jobs_submitted.labels(class_of(queue)).inc()

    def record_final(self, job: Any) -> None:
        """Count ``job`` (a :class:`diarist.models.Job` just moved to a final state, its ``metrics`` loaded)."""
        klass = class_of(job.queue)
        # the row's own code (diarist.jobs writes it: a failure's, ``canceled``), so a cancel is never "none"
        code = job.error_code if job.status != "completed" and job.error_code else "none"
        self.jobs_finished.labels(klass, job.status, code).inc()
        started, created = _utc(job.started_at), _utc(job.created_at)
        if started is not None and created is not None:
            self.queue_wait.labels(klass).observe(max(0.0, (started - created).total_seconds()))
        if job.status == "completed":
            self.audio_processed.labels(klass).inc(max(0.0, job.duration_s or 0.0))
            rtf = getattr(job.metrics, "rtf", None) if job.metrics is not None else None
            if rtf is not None:
                self.rtf.labels(klass).observe(rtf)

    def record_webhook(self, status_code: int | None) -> None:
        self.webhook_deliveries.labels(webhook_outcome(status_code)).inc()

    def record_http(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_duration.labels(method, route).observe(seconds)
