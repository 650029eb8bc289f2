"""The Celery application: queues by duration class, crash-safe delivery settings, the dispatcher.

Delivery guarantees (docs/service.md, Processes): ``acks_late`` (a message is acknowledged only after its task ends),
``reject_on_worker_lost`` (a killed worker's message goes back to the queue), ``prefetch_multiplier=1``
(a worker holds at most one waiting message per slot), and a Redis visibility timeout above the longest
job. Tasks are idempotent against the job row, so a redelivered message never completes a job twice.
"""

from __future__ import annotations

from pathlib import Path

from celery import Celery
from kombu import Queue

from diarist.settings import Settings
from worker import routing

app = Celery("diarist", include=["worker.tasks"])


def configure(settings: Settings, celery: Celery = app) -> Celery:
    """Point the app at ``settings``' broker and apply the delivery settings. Returns the app."""
    vt = settings.visibility_timeout_s
    # Redis re-queues a message whose worker died once it has been unacked for ``vt`` seconds; sweep for
    # such messages every vt/3 seconds (at most every 10 s), each sweep a real scan (throttle 1).
    broker_url = settings.broker
    transport_options: dict = {"visibility_timeout": vt, "unacked_restore_interval": max(1, min(10, vt // 3)),
                               "unacked_restore_throttle": 1}
    if settings.broker.startswith("redis://"):
        # kombu's Redis transport, guarded so a broker restart under a running job does not end the worker
        # (worker/redis_broker.py says why). rediss:// keeps kombu's stock transport: its TLS defaults are
        # keyed on that scheme name.
        from worker import redis_broker

        broker_url = settings.broker.replace("redis://", f"{redis_broker.ALIAS}://", 1)
        redis_broker.install_lost_ack_filter()
    elif settings.broker.startswith("memory://"):
        # The in-memory transport polls; 10 ms keeps embedded-mode pickup latency negligible.
        transport_options = {"polling_interval": 0.01}
    elif settings.broker.startswith("filesystem://"):
        # kombu's filesystem transport (publishing made atomic: worker.fs_broker): messages are files under
        # <data_dir>/broker, shared by the processes of one host (API and workers) without a broker server.
        # No visibility timeout: a message taken by a worker that dies is not redelivered, so this is for
        # one-host setups where Redis cannot run (benchmarks/bench_service_gpu.py on the GPU machine).
        from worker import fs_broker

        broker_url = settings.broker.replace("filesystem://", f"{fs_broker.ALIAS}://", 1)
        folder = (Path(settings.data_dir) / "broker").resolve()
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        transport_options = {"data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
                             "processed_folder": str(folder / "processed"), "store_processed": False,
                             "control_folder": str(folder / "control"), "polling_interval": 0.01}
    celery.conf.update(
        broker_url=broker_url,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        # A worker outlives any broker outage (the default gives up after 100 reconnects and exits), and a
        # lost connection does not cancel running jobs: they finish against the database and the store,
        # and the sweeper re-sends whatever the broker lost (worker/sweeper.py).
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        task_queues=[Queue(q, routing_key=q) for q in routing.QUEUES],
        task_default_queue=routing.SHORT,
        task_routes={"diarist.deliver_webhook": {"queue": routing.WEBHOOKS}},
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        task_create_missing_queues=True,
        timezone="UTC",
    )
    if celery is app:
        # Retries (self.retry) build their message through current_app; make it this app in every thread.
        celery.set_default()
    return celery


class CeleryDispatcher:
    """:class:`diarist.services.Dispatcher` over Celery: routes a job by duration and enqueues it."""

    def __init__(self, settings: Settings, celery: Celery = app) -> None:
        self.settings = settings
        self.celery = celery

    def queue_for(self, duration_s: float | None) -> str:
        return routing.queue_for(duration_s, self.settings.long_threshold_s)

    def transcribe(self, job_id: str, queue: str) -> None:
        self.celery.send_task("diarist.transcribe", args=[job_id], queue=queue, routing_key=queue)

    def webhook(self, job_id: str, event: str, message_id: str, countdown: float = 0.0) -> None:
        self.celery.send_task("diarist.deliver_webhook", args=[job_id, event, message_id],
                              queue=routing.WEBHOOKS, routing_key=routing.WEBHOOKS, countdown=countdown or None)

    def ping(self) -> None:
        with self.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each of our queues (a passive declare; a queue Redis has no key for is 0)."""
        from kombu.exceptions import ChannelError

        out = {}
        with self.celery.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            channel = conn.default_channel
            for q in routing.QUEUES:
                try:
                    out[q] = int(channel.queue_declare(queue=q, passive=True).message_count)
                except ChannelError:  # never declared, or emptied (Redis deletes an empty list)
                    out[q] = 0
        return out

    def broker_epoch(self) -> str:
        """An id of the broker's current run (Redis ``run_id``; the transport name for brokers without one):
        when it changes, the broker restarted and may have lost its messages. Raises when unreachable."""
        with self.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            client = getattr(conn.default_channel, "client", None)
            info = getattr(client, "info", None)
            if callable(info):
                return str(info("server").get("run_id"))
            return conn.transport_cls if isinstance(conn.transport_cls, str) else type(conn.transport).__name__
