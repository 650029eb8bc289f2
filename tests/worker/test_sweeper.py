"""The sweeper re-drives from the rows what the broker lost or a dead worker left (issue 17 item 2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from diarist import jobs
from diarist.models import Job, WebhookOutbox, WorkerBeat
from worker.leases import LeaseKeeper
from worker.sweeper import Sweeper


class Broker:
    """A dispatcher stand-in: records messages; ``epoch`` is the broker's run id; ``down`` refuses."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.epoch, self.down = "run-1", False

    def _check(self) -> None:
        if self.down:
            from kombu.exceptions import OperationalError

            raise OperationalError("Connection refused")

    def transcribe(self, job_id, queue):
        self._check()
        self.sent.append(("transcribe", job_id, queue))

    def webhook(self, job_id, event, message_id, countdown=0.0):
        self._check()
        self.sent.append(("webhook", job_id, message_id))

    def broker_epoch(self):
        self._check()
        return self.epoch


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


@pytest.fixture
def broker(services):
    b = Broker()
    services.dispatcher = b
    return b


@pytest.fixture
def sweeper(services, broker):
    return Sweeper(services, broker, "test@host", ["transcribe.short"], leases=LeaseKeeper(services))


def row(services, job_id) -> Job:
    with services.db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def test_an_expired_lease_is_re_driven_and_a_live_one_is_left_alone(services, broker, sweeper, make_job):
    dead = make_job(status="processing", attempts=1, lease_owner="gone:1:a", lease_expires_at=ago(5))
    live = make_job(status="processing", attempts=1, lease_owner="alive:2:b", lease_expires_at=ago(-60))
    report = sweeper.sweep()
    assert report.leases_expired == 1 and report.resent == 1
    assert broker.sent == [("transcribe", dead, "transcribe.short")]
    job = row(services, dead)
    assert (job.status, job.lease_owner, job.attempts) == ("queued", None, 1)  # the next claim counts attempt 2
    assert row(services, live).status == "processing" and row(services, live).lease_owner == "alive:2:b"
    assert sweeper.sweep().resent == 0  # sent once; due again only after queued_redrive_s


def test_lost_messages_are_re_sent_when_due_and_all_of_them_after_a_broker_restart(services, broker, sweeper,
                                                                                  make_job):
    due = make_job(lease_expires_at=ago(1))
    waiting = make_job(lease_expires_at=ago(-600))  # submitted recently: its message is in the queue
    assert sweeper.sweep().resent == 1 and [m[1] for m in broker.sent] == [due]
    broker.sent.clear()
    broker.epoch = "run-2"  # Redis restarted without persistence: every message is gone
    report = sweeper.sweep()
    assert report.broker_restarted and sorted(m[1] for m in broker.sent) == sorted([due, waiting])


def test_a_broker_outage_is_bounded_by_outage_bound_s(services, broker, sweeper, make_job):
    job_id = make_job(lease_expires_at=ago(1))
    broker.down = True
    assert sweeper.sweep().resent == 0
    job = row(services, job_id)
    assert job.status == "queued" and job.outage_since is not None
    services.settings.outage_bound_s = 0.0
    report = sweeper.sweep()
    job = row(services, job_id)
    assert report.failed == [job_id] and (job.status, job.error_code) == ("failed", "queue_unavailable")


def test_unsent_webhooks_are_re_sent_and_a_dead_sender_is_replaced(services, broker, sweeper, make_job):
    unsent = make_job(status="processing", webhook_url="http://127.0.0.1:9/h")
    broker.down = True
    assert jobs.fail(services, unsent, "decode_failed", "bad")  # outbox row written, broker refused it
    broker.down = False
    with services.db.session() as s:
        msg = s.query(WebhookOutbox).filter_by(job_id=unsent).one()
        msg_id = msg.id
        stuck = make_job(status="completed", webhook_url="http://127.0.0.1:9/h")
        s.add(WebhookOutbox(id="msg_stuck", job_id=stuck, event="job.completed", state="sending", attempts=1,
                            locked_until=ago(1)))
    sweeper.sweep()
    assert sorted(m[2] for m in broker.sent if m[0] == "webhook") == sorted([msg_id, "msg_stuck"])
    broker.sent.clear()
    sweeper.sweep()
    assert broker.sent == []  # now locked for pickup until queued_redrive_s


def test_leases_are_not_judged_right_after_a_database_outage(services, broker, sweeper, make_job):
    from diarist.db import Database

    job_id = make_job(status="processing", lease_owner="w:1:a", lease_expires_at=ago(5))
    real = services.db
    services.db = Database("postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2")
    try:
        assert sweeper.sweep().database_down
    finally:
        services.db.dispose()
        services.db = real
    # The database is back, but its workers have not had one lease_s to renew yet.
    assert sweeper.sweep().leases_expired == 0 and row(services, job_id).status == "processing"
    sweeper._db_down_at -= services.settings.lease_s
    assert sweeper.sweep().leases_expired == 1


def test_forced_sweep_resumes_every_orphan_and_writes_a_heartbeat(services, broker, sweeper, make_job):
    running = make_job(status="processing", lease_owner="old:1:a", lease_expires_at=ago(-60))
    queued = make_job(lease_expires_at=ago(-600))
    done = make_job(status="completed")
    report = sweeper.sweep(force=True)
    assert report.leases_expired == 1
    assert sorted(m[1] for m in broker.sent) == sorted([running, queued])
    assert row(services, done).status == "completed"
    with services.db.session() as s:
        beat = s.query(WorkerBeat).one()
        assert beat.name.startswith("test@host:") and beat.queues == "transcribe.short" and beat.engine_ok is None


def test_after_a_broker_restart_a_webhook_in_backoff_is_sent_with_its_countdown_left(services, broker, sweeper,
                                                                                      make_job):
    job_id = make_job(status="completed", webhook_url="http://127.0.0.1:9/h")
    with services.db.session() as s:  # attempt 1 failed; attempt 2 is due in 30 s (its countdown message)
        s.add(WebhookOutbox(id="msg_backoff", job_id=job_id, event="job.completed", state="pending", attempts=1,
                            next_attempt_at=ago(-30), locked_until=ago(-630)))
    sent: list[float] = []
    broker.webhook = lambda job_id, event, message_id, countdown=0.0: sent.append(countdown)
    sweeper.sweep()
    assert sent == []  # its message is in the queue: nothing to do
    broker.epoch = "run-2"
    sweeper.sweep()
    assert len(sent) == 1 and 25 < sent[0] <= 30
