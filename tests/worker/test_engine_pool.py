"""A worker's engines (worker/engine_pool.py): its own engine while it answers, the others while it is down;
an engine that dropped a running request is the job service's retry, not a failover."""

from __future__ import annotations

import io
import threading
from dataclasses import replace

import pytest

from diarist.contract.options import TranscribeOptions
from diarist.contract.result import TranscriptionResult
from diarist.models import Job
from diarist.outages import Dependency
from engine_server.client import HttpEngineClient, JobFailure
from tests.conftest import wav_bytes
from tests.stand_in_engine import stand_in_engine
from tests.worker.fakes import engine_result, typed_result
from worker.engine_pool import EnginePool, engine_client


class Fake:
    """An engine client that answers a result, or raises ``fail`` (a :class:`JobFailure`), recording calls."""

    def __init__(self, name: str, fail: JobFailure | None = None) -> None:
        self.engine_id, self.url, self.fail, self.calls = name, f"http://{name}", fail, []

    def transcribe(self, audio, options, on_event=None, cancel=None) -> TranscriptionResult:
        self.calls.append(options)
        if self.fail is not None:
            raise self.fail
        return replace(typed_result(), engine_id=self.engine_id)

    def ready(self) -> bool:
        return self.fail is None


def down() -> JobFailure:
    return JobFailure("engine_unavailable", "engine server unreachable", outage=Dependency.ENGINE)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_own_engine_serves_while_it_answers(tmp_path):
    a, b = Fake("a"), Fake("b")
    pool = EnginePool([a, b])
    for _ in range(3):
        assert pool.transcribe(tmp_path, TranscribeOptions(language="en", admission_class="long")).engine_id == "a"
    assert len(a.calls) == 3 and b.calls == []
    assert (pool.engine_id, pool.url, pool.ready()) == ("a", "http://a", True)


def test_a_down_engine_fails_over_with_the_same_request_and_is_tried_last_for_the_hold(tmp_path):
    clock = Clock()
    a, b = Fake("a", fail=down()), Fake("b")
    pool = EnginePool([a, b], down_hold_s=5.0, clock=clock)
    out = pool.transcribe(tmp_path, TranscribeOptions(language="en", admission_class="long"))
    assert out.engine_id == "b"
    # the same attempt, unchanged: the duration class keeps its own admission on the other engine
    want = TranscribeOptions(language="en", admission_class="long")
    assert a.calls == [want] and b.calls == [want]
    assert pool.order() == [1, 0]
    pool.transcribe(tmp_path, TranscribeOptions(admission_class="short"))
    assert len(a.calls) == 1 and len(b.calls) == 2  # held down: not asked again within the hold
    a.fail = None  # the engine is back; after the hold it is the first choice again
    clock.t += 5.0
    assert pool.order() == [0, 1]
    assert pool.transcribe(tmp_path, {}).engine_id == "a"


def test_the_jobs_of_a_dead_engine_spread_over_the_live_ones_by_requests_in_flight(tmp_path):
    a, b, c = Fake("a", fail=down()), Fake("b"), Fake("c")
    pool = EnginePool([a, b, c])
    gate, started = threading.Event(), threading.Event()

    def slow(audio, options, on_event=None, cancel=None):
        started.set()
        gate.wait(10)
        return replace(typed_result(), engine_id="b")

    b.transcribe = slow  # b holds one request in flight
    t = threading.Thread(target=pool.transcribe, args=(tmp_path, {}))
    t.start()
    assert started.wait(10)
    assert pool.in_flight() == [0, 1, 0]
    assert pool.transcribe(tmp_path, {}).engine_id == "c"  # b is busier
    gate.set()
    t.join(10)
    assert pool.in_flight() == [0, 0, 0]


@pytest.mark.parametrize("failure", [
    JobFailure("engine_error", "engine server dropped the request", retryable=True),  # died mid-job
    JobFailure("decode_failed", "not audio"),
    JobFailure("canceled", "the job was canceled; engine request closed"),
])
def test_an_engine_that_answered_is_not_failed_over(tmp_path, failure):
    """Only "did not answer" moves the attempt: a dropped running request spends an attempt (the job
    service's rule, so a job that crashes engines cannot crash them all in one attempt), the job's own
    error and a cancel are final for the attempt."""
    a, b = Fake("a", fail=failure), Fake("b")
    with pytest.raises(JobFailure) as e:
        EnginePool([a, b]).transcribe(tmp_path, {})
    assert e.value is failure and b.calls == []


def test_a_dropped_request_does_not_clear_a_refusal(tmp_path):
    """A request in flight when its engine dies ends as dropped (engine_error) after later ones were
    refused: the engine stays tried last, and the dropped one is not failed over (an attempt is spent)."""
    inside, gate = threading.Event(), threading.Event()

    class Dying(Fake):
        def transcribe(self, audio, options, on_event=None, cancel=None):
            if not inside.is_set():  # the request running when the engine dies
                inside.set()
                gate.wait(10)
                raise JobFailure("engine_error", "engine server dropped the request", retryable=True)
            raise down()  # every request after it: refused

    a, b = Dying("a"), Fake("b")
    pool = EnginePool([a, b])
    dropped: list[JobFailure] = []

    def in_flight() -> None:
        try:
            pool.transcribe(tmp_path, {})
        except JobFailure as e:
            dropped.append(e)

    t = threading.Thread(target=in_flight)
    t.start()
    assert inside.wait(10)
    assert pool.transcribe(tmp_path, {}).engine_id == "b"  # refused by a, served by b
    gate.set()
    t.join(10)
    assert [e.code for e in dropped] == ["engine_error"] and len(b.calls) == 1
    assert pool.order() == [1, 0]


def test_no_engine_answering_is_an_outage(tmp_path):
    a, b = Fake("a", fail=down()), Fake("b", fail=down())
    pool = EnginePool([a, b])
    with pytest.raises(JobFailure) as e:
        pool.transcribe(tmp_path, {})
    assert (e.value.code, e.value.outage) == ("engine_unavailable", Dependency.ENGINE)
    assert len(a.calls) == len(b.calls) == 1 and not pool.ready()
    with pytest.raises(ValueError):
        EnginePool([])


def test_factory_keeps_one_url_a_plain_client():
    one = engine_client(["http://127.0.0.1:8100"], timeout_s=5)
    assert isinstance(one, HttpEngineClient) and one.timeout_s == 5
    two = engine_client(["http://127.0.0.1:8100", "http://127.0.0.1:8101"], timeout_s=5)
    assert isinstance(two, EnginePool) and [c.url for c in two.clients] == ["http://127.0.0.1:8100",
                                                                           "http://127.0.0.1:8101"]


@pytest.fixture
def live_engine():
    """A loopback server speaking the engine's NDJSON stream: a segment, then a result naming it."""
    lines = [{"type": "segment", "start": 0.0, "end": 0.5, "text": "hello"},
             {"type": "result", "result": {**engine_result(), "engine_id": "live:1"}}]
    with stand_in_engine(lambda: lines) as (url, seen):
        yield url, seen


def test_a_job_whose_engine_is_dead_completes_on_the_other_in_one_attempt(services, make_job, live_engine):
    """Real HTTP clients: the worker's own engine refuses connections (dead), the job completes on the
    other engine in its first attempt, and the row records which engine served it."""
    from worker.celery_app import CeleryDispatcher
    from worker.process import process_job
    from worker.runtime import Runtime

    url, seen = live_engine
    rt = Runtime(services=services, engine=engine_client(["http://127.0.0.1:9", url], timeout_s=10),
                 dispatcher=CeleryDispatcher(services.settings))
    services.store.put_file("jobs/p/audio", io.BytesIO(wav_bytes(0.5)))
    job_id = make_job(audio_key="jobs/p/audio", queue="transcribe.long", duration_s=600.0)
    assert process_job(rt, job_id).state == "completed"
    with services.db.session() as s:
        row = s.get(Job, job_id)
        assert (row.status, row.attempts, row.metrics.engine_id) == ("completed", 1, "live:1")
    assert [r["headers"]["x-diarist-admission-class"] for r in seen] == ["long"]
