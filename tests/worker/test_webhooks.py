"""Webhook signing (Standard Webhooks vector), delivery log, retry policy, address guard."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from diarist import jobs
from diarist.models import Job, WebhookDelivery, WebhookOutbox
from tests.servers import QuietHandler
from worker.webhooks import deliver, sign, verify


def test_signature_matches_the_standard_webhooks_published_vector():
    # The example of https://www.standardwebhooks.com/ (spec "Signature scheme" / its libraries' tests).
    sig = sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
               b'{"test": 2432232314}')
    assert sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_verify_rejects_tampering_and_stale_timestamps():
    secret, body, now = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", b'{"a":1}', int(time.time())
    h = {"webhook-id": "msg_1", "webhook-timestamp": str(now), "webhook-signature": sign(secret, "msg_1", now, body)}
    assert verify(secret, h, body)
    assert not verify(secret, h, b'{"a":2}')
    assert not verify(secret, {**h, "webhook-id": "msg_2"}, body)
    old = now - 3600
    assert not verify(secret, {**h, "webhook-timestamp": str(old),
                               "webhook-signature": sign(secret, "msg_1", old, body)}, body)


class Server:
    def __init__(self, codes):
        self.codes, self.bodies = list(codes), []
        outer = self

        class H(QuietHandler):
            def do_POST(self):
                outer.bodies.append((dict(self.headers), self.rfile.read(int(self.headers["content-length"]))))
                self.reply(outer.codes.pop(0) if outer.codes else 200)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/h"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def rt(services):
    from worker.celery_app import CeleryDispatcher
    from worker.runtime import Runtime

    services.settings.webhook_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    return Runtime(services=services, engine=None, dispatcher=CeleryDispatcher(services.settings))


def outbox(services, job_id, event, message_id=None):
    """The job's outbox message (as a final transition writes it); returns its id."""
    with services.db.session() as s:
        job = s.get(Job, job_id)
        msg = jobs.enqueue_webhook(s, job, event, 600.0)
    if message_id is not None:
        with services.db.session() as s:
            s.get(WebhookOutbox, msg).id = message_id
        return message_id
    return msg


def deliveries(services, job_id):
    with services.db.session() as s:
        return [(d.attempt, d.status_code, d.error) for d in
                s.query(WebhookDelivery).filter_by(job_id=job_id).order_by(WebhookDelivery.id)]


@pytest.mark.parametrize(("code", "state"), [(200, "delivered"), (204, "delivered"), (500, "retry"), (503, "retry"),
                                             (408, "retry"), (429, "retry"), (400, "failed"), (404, "failed"),
                                             (410, "failed")])
def test_retry_policy(rt, make_job, code, state):
    srv = Server([code])
    try:
        job_id = make_job(status="failed", error_code="decode_failed", webhook_url=srv.url)
        a = deliver(rt, outbox(rt.services, job_id, "job.failed"))
        assert a.state == state and a.status_code == code
        if state == "retry":
            assert a.delay_s == pytest.approx(0.5)
        headers, body = srv.bodies[0]
        assert json.loads(body)["data"] == {"id": job_id, "status": "failed", "error": {"code": "decode_failed"}}
        assert verify(rt.services.settings.webhook_secret, {k.lower(): v for k, v in headers.items()}, body)
        assert deliveries(rt.services, job_id) == [(1, code, None)]
    finally:
        srv.close()


def test_backoff_doubles_and_attempts_are_bounded(rt, make_job):
    srv = Server([500, 500, 500])
    try:
        job_id = make_job(status="completed", webhook_url=srv.url)
        msg = outbox(rt.services, job_id, "job.completed")
        delays = [deliver(rt, msg) for _ in (1, 2, 3)]
        assert [d.state for d in delays] == ["retry", "retry", "failed"]  # webhook_max_attempts = 3
        assert [d.delay_s for d in delays[:2]] == [0.5, 1.0]
        with rt.services.db.session() as s:
            job = s.get(Job, job_id)
            assert (job.webhook_status, job.webhook_status_code) == ("failed", 500)
        assert [d[0] for d in deliveries(rt.services, job_id)] == [1, 2, 3]
    finally:
        srv.close()


def test_connection_refused_is_retried_and_private_address_is_refused(rt, make_job):
    job_id = make_job(status="completed", webhook_url="http://127.0.0.1:9/closed")
    msg = outbox(rt.services, job_id, "job.completed")
    a = deliver(rt, msg)
    assert a.state == "retry" and a.status_code is None
    assert "ConnectError" in deliveries(rt.services, job_id)[0][2]
    rt.services.settings.webhook_allow_hosts = []
    b = deliver(rt, msg)
    assert b.state == "failed" and deliveries(rt.services, job_id)[1][2].startswith("url_not_allowed")


def test_a_message_is_posted_once_however_often_it_is_redelivered(rt, make_job):
    """Duplicate broker messages (a sweeper re-send, a redelivery after a crash) find the outbox row
    delivered, or locked by the worker sending it, and post nothing; the webhook-id is the row's id."""
    srv = Server([])
    try:
        job_id = make_job(status="completed", webhook_url=srv.url)
        msg = outbox(rt.services, job_id, "job.completed")
        assert deliver(rt, msg).state == "delivered"
        assert [deliver(rt, msg).state for _ in range(3)] == ["skipped"] * 3
        assert len(srv.bodies) == 1 and srv.bodies[0][0]["webhook-id"] == msg
        other = outbox(rt.services, job_id, "job.completed")
        from worker.webhooks import _take

        assert _take(rt, other) is not None  # a worker holds it (sending) ...
        assert deliver(rt, other).state == "skipped"  # ... so a duplicate message does not post
        assert len(srv.bodies) == 1
    finally:
        srv.close()


def test_the_final_transition_writes_the_outbox_even_when_the_broker_is_down(rt, make_job):
    """The webhook is in the database with the final state; a broker outage only delays it (the message
    is made due for the sweeper)."""

    class DownBroker:
        def webhook(self, *a, **k):
            from kombu.exceptions import OperationalError

            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    rt.services.dispatcher = DownBroker()
    job_id = make_job(status="processing", webhook_url="http://127.0.0.1:9/h")
    assert jobs.fail(rt.services, job_id, "decode_failed", "bad")
    with rt.services.db.session() as s:
        rows = s.query(WebhookOutbox).filter_by(job_id=job_id).all()
        assert [(r.event, r.state, r.attempts, r.locked_until) for r in rows] == [("job.failed", "pending", 0, None)]
        assert s.get(Job, job_id).webhook_status == "pending"
