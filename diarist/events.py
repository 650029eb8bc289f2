"""Live job events (status, stage, progress, text deltas, segments) from workers to SSE clients.

An event is a JSON-able dict with a ``type`` (``status``, ``stage``, ``progress``, ``delta``, ``segment``)
and its fields. Delivery is best effort: a client that subscribes late misses earlier deltas, which is why every
SSE stream starts from the job row and ends with the stored transcript's state. Embedded mode uses an
in-process bus; production uses Redis pub/sub (channel ``diarist:events:<job id>``).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("diarist.events")


@dataclass(frozen=True)
class StatusEvent:
    """The ``status`` event of a job's stream: its state, its progress (0..1) and its error (``code``,
    ``message``) once it failed. One type for every place that announces a job's state: the submit, the
    worker taking it, the final transition, an admin re-queue, and the SSE stream's own first event."""

    status: str
    progress: float
    error_code: str | None = None
    error_message: str | None = None

    @classmethod
    def of(cls, job: Any) -> StatusEvent:
        """The event that describes ``job`` (a :class:`diarist.models.Job` row) as it is now."""
        return cls(job.status, job.progress, job.error_code, job.error_message)

    def to_json(self) -> dict[str, Any]:
        """The bus / SSE form: ``{"type": "status", "status", "progress", "error": {code, message} | null}``."""
        error = {"code": self.error_code, "message": self.error_message} if self.error_code else None
        return {"type": "status", "status": self.status, "progress": self.progress, "error": error}


class Subscription(Protocol):
    def get(self, timeout: float) -> dict | None:
        """The next event, or None after ``timeout`` seconds without one."""

    def close(self) -> None: ...


class EventBus(Protocol):
    def publish(self, job_id: str, event: dict) -> None:
        """Best effort: never raises (a bus outage must not fail the job that publishes)."""

    def subscribe(self, job_id: str) -> Subscription: ...


class _LocalSubscription:
    def __init__(self, bus: LocalEventBus, job_id: str) -> None:
        self.bus, self.job_id = bus, job_id
        self.q: queue.Queue = queue.Queue(maxsize=10_000)

    def get(self, timeout: float) -> dict | None:
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.bus._remove(self)


class LocalEventBus:
    """Subscribers in this process (embedded mode: the API and the workers share it)."""

    def __init__(self) -> None:
        self._subs: dict[str, set[_LocalSubscription]] = defaultdict(set)
        self._lock = threading.Lock()

    def publish(self, job_id: str, event: dict) -> None:
        with self._lock:
            subs = list(self._subs.get(job_id, ()))
        for s in subs:
            try:
                s.q.put_nowait(event)
            except queue.Full:  # a stalled reader loses deltas, never blocks the worker
                pass

    def subscribe(self, job_id: str) -> _LocalSubscription:
        sub = _LocalSubscription(self, job_id)
        with self._lock:
            self._subs[job_id].add(sub)
        return sub

    def _remove(self, sub: _LocalSubscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.job_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.job_id]


class _RedisSubscription:
    """A Redis outage is quiet time, never an exception: ``get`` then waits out its timeout and returns None,
    so a reader (the SSE route) goes on re-reading the job row and still ends at the final status; the
    subscription is made again once Redis answers (events published meanwhile are lost, as with any
    pub/sub)."""

    def __init__(self, client, channel: str) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.channel, self.subscribed, self.down = channel, False, False
        self._subscribe()

    def _subscribe(self) -> bool:
        import redis

        try:
            self.pubsub.subscribe(self.channel)
        except redis.RedisError as e:
            self._lost(e)
            return False
        self.subscribed = True
        return True

    def _lost(self, e: Exception) -> None:
        if not self.down:
            log.warning("event bus unavailable, live events of %s paused: %s: %s", self.channel, type(e).__name__, e)
        self.down = True

    def get(self, timeout: float) -> dict | None:
        import redis

        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                if not self.subscribed and not self._subscribe():
                    raise redis.ConnectionError("not subscribed")
                # Subscription confirmations come back as None even when ignored: keep reading to the deadline.
                msg = self.pubsub.get_message(timeout=left)
            except redis.RedisError as e:
                self._lost(e)
                # redis-py's reconnect re-subscribes the channels it knows; one whose SUBSCRIBE never
                # succeeded is not among them, hence ``subscribed``.
                time.sleep(max(0.0, deadline - time.monotonic()))
                return None
            self.down = False
            if msg is not None and msg.get("type") == "message":
                return json.loads(msg["data"])
        return None

    def close(self) -> None:
        self.pubsub.close()


class RedisEventBus:
    """Redis pub/sub: workers in other processes publish, any API replica subscribes."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    @staticmethod
    def channel(job_id: str) -> str:
        return f"diarist:events:{job_id}"

    def publish(self, job_id: str, event: dict) -> None:
        """Publish; a Redis error is logged and the event skipped (SSE readers re-read the row at the end)."""
        import redis

        try:
            self.client.publish(self.channel(job_id), json.dumps(event))
        except redis.RedisError as e:
            log.warning("event bus unavailable, %s event of %s skipped: %s: %s", event.get("type"), job_id,
                        type(e).__name__, e)

    def subscribe(self, job_id: str) -> _RedisSubscription:
        return _RedisSubscription(self.client, self.channel(job_id))


def make_bus(settings) -> EventBus:
    """Redis when an events/broker URL is redis, else the in-process bus."""
    url = settings.events_url or settings.broker
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisEventBus(url)
    return LocalEventBus()
