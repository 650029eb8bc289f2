"""Job event bus: in-process, and Redis pub/sub across connections (what API replicas and workers use)."""

from __future__ import annotations

import pytest

from diarist.events import LocalEventBus, RedisEventBus


def roundtrip(bus) -> None:
    sub = bus.subscribe("job_1")
    other = bus.subscribe("job_2")
    try:
        bus.publish("job_1", {"type": "delta", "text": "héllo"})
        bus.publish("job_1", {"type": "status", "status": "completed"})
        got = [sub.get(timeout=5), sub.get(timeout=5)]
        assert got == [{"type": "delta", "text": "héllo"}, {"type": "status", "status": "completed"}]
        assert other.get(timeout=0.2) is None
        assert sub.get(timeout=0.2) is None
    finally:
        sub.close()
        other.close()


def test_local_bus():
    bus = LocalEventBus()
    roundtrip(bus)
    assert not bus._subs  # closed subscriptions are forgotten


@pytest.mark.services
def test_redis_bus():
    from tests.servers import start_redis

    url, stop = start_redis()
    try:
        roundtrip(RedisEventBus(url))
    finally:
        stop()


def test_redis_bus_down_skips_the_event_and_logs(caplog):
    """A progress event published while Redis is unreachable is logged and dropped; it never raises into
    the worker's engine callback (issue 17 item 4)."""
    bus = RedisEventBus("redis://127.0.0.1:9/0?socket_connect_timeout=1")
    with caplog.at_level("WARNING", logger="diarist.events"):
        bus.publish("job_1", {"type": "progress", "progress": 0.5})
    assert "event bus unavailable, progress event of job_1 skipped" in caplog.text


@pytest.mark.services
def test_redis_subscription_outlives_a_redis_restart():
    """Redis restarts under an open subscription (an SSE client): ``get`` returns None (quiet time, so the
    SSE route re-reads the job row) instead of raising out of the stream, and once Redis is back the
    subscription gets events again; one opened while Redis is down subscribes when it returns."""
    import time

    from tests.servers import Redis

    r = Redis()
    try:
        bus = RedisEventBus(r.url)
        sub = bus.subscribe("job_1")
        bus.publish("job_1", {"type": "progress", "progress": 0.1})
        assert sub.get(timeout=5) == {"type": "progress", "progress": 0.1}
        r.down()
        assert sub.get(timeout=0.3) is None and sub.get(timeout=0.3) is None
        late = bus.subscribe("job_2")  # opened during the outage
        assert late.get(timeout=0.3) is None
        r.up()
        got, late_got, deadline = None, None, time.monotonic() + 30
        while (got is None or late_got is None) and time.monotonic() < deadline:
            bus.publish("job_1", {"type": "progress", "progress": 0.9})
            bus.publish("job_2", {"type": "delta", "text": "back"})
            got = got or sub.get(timeout=0.5)
            late_got = late_got or late.get(timeout=0.5)
        assert got == {"type": "progress", "progress": 0.9} and late_got == {"type": "delta", "text": "back"}
        sub.close()
        late.close()
    finally:
        r.stop()
