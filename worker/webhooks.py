"""Signed webhook delivery with retries and a delivery log (Standard Webhooks style).

Headers (https://www.standardwebhooks.com/, the spec's "Signature scheme"): ``webhook-id`` (the message id,
stable across retries, for receiver-side dedup), ``webhook-timestamp`` (Unix seconds), ``webhook-signature``
= ``v1,`` + base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}")) where ``key`` is the base64-decoded part of
the ``whsec_…`` secret. Body: ``{"type": "job.completed", "timestamp": ISO-8601, "data": {"id", "status",
"error": {"code"} | null}}``. Retries: exponential backoff, bounded attempts, none after a 4xx other than
408/429 (docs/service.md, Webhooks). Each message is a row of ``webhook_outbox`` (written with the job's final transition,
:func:`diarist.jobs.enqueue_webhook`); its ``id`` is the ``webhook-id`` and its ``attempts`` the attempt count,
so retries and redeliveries keep both.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, or_, update

from diarist.models import ApiKey, Job, WebhookDelivery, WebhookOutbox, utcnow
from diarist.netguard import UnsafeURL, check_url
from diarist.redact import display_url, redact_text
from worker.runtime import Runtime

RETRY_4XX = (408, 429)


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one message (``v1,<base64 HMAC-SHA256>``)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(secret: str, headers: dict, body: bytes, tolerance_s: float = 300.0) -> bool:
    """Receiver-side check (used by tests and documented for clients)."""
    ts = int(headers["webhook-timestamp"])
    if abs(time.time() - ts) > tolerance_s:
        return False
    expected = sign(secret, headers["webhook-id"], ts, body).split(",", 1)[1]
    return any(hmac.compare_digest(expected, s.split(",", 1)[1])
               for s in headers["webhook-signature"].split() if s.startswith("v1,"))


@dataclass
class Attempt:
    """``state``: delivered | retry | failed | skipped (another worker holds or finished the message);
    ``delay_s`` before the next attempt."""

    state: str
    status_code: int | None = None
    delay_s: float = 0.0


def _secret_for(rt: Runtime, owner_key: str) -> str:
    svc = rt.services
    if owner_key:
        with svc.db.session() as s:
            key = s.get(ApiKey, owner_key)
            if key is not None:
                return key.webhook_secret
    if not svc.settings.webhook_secret:
        raise RuntimeError("no webhook secret: set DIARIST_WEBHOOK_SECRET")
    return svc.settings.webhook_secret


def _take(rt: Runtime, message_id: str) -> WebhookOutbox | None:
    """Lock the outbox message for one attempt (``pending``, or ``sending`` whose holder died → ``sending``
    until the request timeout has surely passed) and count the attempt; None when it is not ours to send."""
    svc = rt.services
    now = utcnow()
    hold = timedelta(seconds=svc.settings.webhook_timeout_s * 2 + 30)
    with svc.db.session() as s:
        res = s.execute(update(WebhookOutbox).where(
            WebhookOutbox.id == message_id,
            or_(WebhookOutbox.state == "pending",
                and_(WebhookOutbox.state == "sending", WebhookOutbox.locked_until < now))).values(
            state="sending", attempts=WebhookOutbox.attempts + 1, locked_until=now + hold))
        if res.rowcount != 1:
            return None
        msg = s.get(WebhookOutbox, message_id)
        s.refresh(msg)
        s.expunge(msg)
        return msg


def deliver(rt: Runtime, message_id: str) -> Attempt:
    """Make one delivery attempt of the outbox message ``message_id`` and record it (on the outbox row, the
    delivery log and the job's webhook status). A message already delivered, failed, or being sent by
    another worker is skipped, so a redelivered broker message never posts twice."""
    import httpx

    svc, st = rt.services, rt.services.settings
    msg = _take(rt, message_id)
    if msg is None:
        return Attempt("skipped")
    attempt, event, job_id = msg.attempts, msg.event, msg.job_id
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        if job is None or not job.webhook_url:
            s.execute(update(WebhookOutbox).where(WebhookOutbox.id == message_id).values(state="failed",
                                                                                           locked_until=None))
            return Attempt("failed")
        url, owner = job.webhook_url, job.owner_key
        data = {"id": job.id, "status": job.status,
                "error": {"code": job.error_code} if job.error_code else None}  # as the job row: failed or canceled
    body = json.dumps({"type": event, "timestamp": datetime.now(UTC).isoformat(), "data": data},
                      separators=(",", ":")).encode()
    ts = int(time.time())
    headers = {"content-type": "application/json", "user-agent": "diarist-webhooks/1",
               "webhook-id": message_id, "webhook-timestamp": str(ts),
               "webhook-signature": sign(_secret_for(rt, owner), message_id, ts, body)}
    code, error, t0 = None, None, time.perf_counter()
    try:
        check_url(url, st.webhook_allow_hosts)  # again at delivery: DNS may have changed since submit
        r = httpx.post(url, content=body, headers=headers, timeout=st.webhook_timeout_s, follow_redirects=False)
        code = r.status_code
    except UnsafeURL as e:
        error = f"{e.code}: {e.message}"
    except httpx.HTTPError as e:
        error = f"{type(e).__name__}: {redact_text(str(e))}"
    elapsed = time.perf_counter() - t0
    svc.metrics.record_webhook(code)

    refused = bool(error) and error.startswith(("url_not_allowed", "invalid_url"))
    permanent = code is not None and 400 <= code < 500 and code not in RETRY_4XX
    if code is not None and 200 <= code < 300:
        result = Attempt("delivered", code)
    elif refused or permanent or attempt >= st.webhook_max_attempts:
        result = Attempt("failed", code)
    else:
        delay = min(st.webhook_backoff_s * 2 ** (attempt - 1), st.webhook_backoff_max_s)
        result = Attempt("retry", code, delay)
    now = utcnow()
    with svc.db.session() as s:
        # Pending again for a retry: due at next_attempt_at, and picked up by then + queued_redrive_s (else
        # the sweeper re-sends it).
        s.execute(update(WebhookOutbox).where(WebhookOutbox.id == message_id).values(
            state={"delivered": "delivered", "failed": "failed", "retry": "pending"}[result.state],
            next_attempt_at=now + timedelta(seconds=result.delay_s),
            locked_until=now + timedelta(seconds=result.delay_s + st.queued_redrive_s)
            if result.state == "retry" else None))
        job = s.get(Job, job_id)
        if job is not None:  # deleted meanwhile: nothing to record on
            s.add(WebhookDelivery(job_id=job_id, message_id=message_id, attempt=attempt, url=display_url(url),
                                  event=event,
                                  status_code=code, error=error, duration_s=elapsed))
            job.webhook_status_code = code
            job.webhook_status = {"delivered": "delivered", "failed": "failed", "retry": "retrying"}[result.state]
    return result
