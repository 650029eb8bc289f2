"""The sweeper: re-drives what the broker lost or a dead worker left, from the job rows (docs/service.md, Fault tolerance).

Every worker process runs one (a daemon thread, every ``sweep_interval_s``); several sweepers at once are
safe because each step is a conditional UPDATE and a duplicate message is a no-op (:mod:`diarist.jobs`).
One sweep:

1. **expired leases**: a processing job whose lease passed (its worker died: SIGKILL, OOM, a lost node)
   goes back to ``queued`` and is sent again. So a dead worker's job is re-driven within
   ``lease_s + sweep_interval_s`` (75 s with the defaults), whatever the broker's visibility timeout.
   Skipped for one ``lease_s`` after this sweeper last saw the database down, so that live workers get
   to renew the leases the outage kept them from renewing;
2. **lost messages**: a queued job whose pickup deadline passed is sent again; after a broker restart
   (Redis' ``run_id`` changed, or the broker was unreachable at the last sweep) every queued job is, since
   a restarted broker may have lost every message. A job whose message cannot be sent for longer than
   ``outage_bound_s`` fails with ``queue_unavailable``;
3. **webhook outbox**: a message nobody picked up (or whose sender died) is sent again;
4. **heartbeat**: this process's ``worker_beats`` row (alive, engine reachable, jobs held) for the dashboard.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import and_, func, or_, select, update

from diarist import jobs
from diarist.models import Job, JobStatus, WebhookOutbox, WorkerBeat, utcnow
from diarist.outages import classify
from diarist.services import Services

log = logging.getLogger("diarist.sweeper")

BATCH = 500  # rows per step and sweep; a backlog drains over several sweeps


@dataclass
class SweepReport:
    """What one sweep did (counts of rows), for logs and tests."""

    leases_expired: int = 0
    resent: int = 0
    webhooks_resent: int = 0
    failed: list[str] = field(default_factory=list)
    broker_restarted: bool = False
    database_down: bool = False


class Sweeper:
    """One process's sweeper. ``name`` identifies the process on the dashboard; ``held`` (a callable
    returning the job ids this process holds leases on) keeps a forced sweep off this process's own jobs."""

    def __init__(self, services: Services, dispatcher, name: str, queues: list[str], engine=None,
                 leases=None) -> None:
        self.services, self.dispatcher, self.engine, self.leases = services, dispatcher, engine, leases
        self.name, self.queues = f"{name}:{os.getpid()}", queues
        self.started_at = utcnow()
        self._epoch: str | None = None
        self._broker_down = False
        self._db_down_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one sweep ------------------------------------------------------------------------------------
    def sweep(self, force: bool = False) -> SweepReport:
        """Run every step once. ``force`` (embedded start: this process is the only worker, so whatever the
        rows say runs is an orphan of the previous process) re-drives every active job now. Never raises
        for an outage."""
        report = SweepReport()
        restarted = self._broker_restarted()
        report.broker_restarted = restarted
        try:
            now = utcnow()
            db_settled = self._db_down_at is None or time.monotonic() - self._db_down_at >= self.services.settings.lease_s
            if force or db_settled:
                report.leases_expired = self._expired_leases(now, force)
            report.resent = self._resend_queued(now, force or restarted, report)
            report.webhooks_resent = self._resend_webhooks(now, force or restarted)
            self._beat(now)
        except Exception as e:
            if classify(e) is None:
                raise
            report.database_down = True
            self._db_down_at = time.monotonic()
            log.warning("sweep skipped: %s unavailable (%s)", classify(e).value, type(e).__name__)
        return report

    def _broker_restarted(self) -> bool:
        try:
            epoch = self.dispatcher.broker_epoch()
        except Exception as e:  # noqa: BLE001 - the broker is down; decided when it is back
            self._broker_down = True
            log.warning("broker unreachable (%s)", type(e).__name__)
            return False
        restarted = self._broker_down or (self._epoch is not None and epoch != self._epoch)
        self._epoch, self._broker_down = epoch, False
        if restarted:
            log.warning("broker restarted or reconnected: re-sending every queued job and webhook")
        return restarted

    def _held(self) -> set[str]:
        return {lease.job_id for lease in self.leases.held()} if self.leases is not None else set()

    def _expired_leases(self, now, force: bool) -> int:
        svc = self.services
        cond = Job.status == JobStatus.PROCESSING.value
        if not force:
            cond = and_(cond, or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now))
        with svc.db.session() as s:
            rows = s.execute(select(Job.id, Job.lease_owner).where(cond).limit(BATCH)).all()
        held, n = self._held(), 0
        for job_id, owner in rows:
            if job_id in held:
                continue
            with svc.db.session() as s:
                # Conditional on the owner seen: a worker that renewed meanwhile keeps its job.
                owner_cond = Job.lease_owner.is_(None) if owner is None else Job.lease_owner == owner
                res = s.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.PROCESSING.value,
                                                  owner_cond).values(
                    status=JobStatus.QUEUED.value, lease_owner=None, updated_at=now,
                    lease_expires_at=now))  # due now: the next step sends it
            if res.rowcount == 1:
                n += 1
                log.warning("job %s: lease of %s expired (worker gone); re-driving it", job_id, owner)
        return n

    def _resend_queued(self, now, everything: bool, report: SweepReport) -> int:
        svc, st = self.services, self.services.settings
        cond = Job.status == JobStatus.QUEUED.value
        if not everything:
            cond = and_(cond, or_(Job.lease_expires_at.is_(None), Job.lease_expires_at <= now))
        with svc.db.session() as s:
            rows = s.execute(select(Job.id, Job.queue, Job.outage_since).where(cond)
                             .order_by(Job.created_at).limit(BATCH)).all()
        n = 0
        for job_id, queue, outage_since in rows:
            with svc.db.session() as s:
                res = s.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value).values(
                    lease_expires_at=now + timedelta(seconds=st.queued_redrive_s), updated_at=Job.updated_at))
            if res.rowcount != 1:
                continue
            try:
                self.dispatcher.transcribe(job_id, queue)
                n += 1
            except Exception as e:  # noqa: BLE001 - broker down: due again next sweep, bounded
                self._queue_outage(job_id, outage_since, now, e, report)
        return n

    def _queue_outage(self, job_id, outage_since, now, exc, report: SweepReport) -> None:
        svc, st = self.services, self.services.settings
        since = jobs.aware(outage_since) or now
        if (now - since).total_seconds() >= st.outage_bound_s:
            if jobs.fail(svc, job_id, "queue_unavailable", f"the job queue was unavailable for more than "
                         f"outage_bound_s = {st.outage_bound_s:g} s ({type(exc).__name__})"):
                report.failed.append(job_id)
            return
        with svc.db.session() as s:
            s.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value).values(
                lease_expires_at=now, outage_since=func.coalesce(Job.outage_since, now), updated_at=Job.updated_at))

    def _resend_webhooks(self, now, everything: bool) -> int:
        """Send outbox messages nobody picked up; after a broker restart also those waiting out a retry
        backoff (their countdown message was lost with the broker), with the countdown left."""
        svc, st = self.services, self.services.settings
        cond = WebhookOutbox.state.in_(("pending", "sending"))
        if not everything:
            cond = and_(cond, WebhookOutbox.next_attempt_at <= now,
                        or_(WebhookOutbox.locked_until.is_(None), WebhookOutbox.locked_until < now))
        else:  # a sender that is alive keeps its lock; the rest may have been lost with the broker
            cond = and_(cond, or_(WebhookOutbox.state == "pending", WebhookOutbox.locked_until < now))
        with svc.db.session() as s:
            rows = s.execute(select(WebhookOutbox.id, WebhookOutbox.job_id, WebhookOutbox.event,
                                    WebhookOutbox.locked_until, WebhookOutbox.next_attempt_at)
                             .where(cond).limit(BATCH)).all()
        n = 0
        for message_id, job_id, event, locked, due in rows:
            countdown = max(0.0, (jobs.aware(due) - now).total_seconds())
            lock_cond = WebhookOutbox.locked_until.is_(None) if locked is None else WebhookOutbox.locked_until == locked
            with svc.db.session() as s:
                res = s.execute(update(WebhookOutbox).where(WebhookOutbox.id == message_id, lock_cond).values(
                    state="pending", locked_until=now + timedelta(seconds=countdown + st.queued_redrive_s)))
            if res.rowcount == 1:
                jobs.send_webhook(svc, job_id, message_id, event, countdown=countdown)
                n += 1
        return n

    def _beat(self, now) -> None:
        engine_ok = None
        if self.engine is not None:
            try:
                engine_ok = bool(self.engine.ready())
            except Exception:  # noqa: BLE001 - a probe that fails means down
                engine_ok = False
        with self.services.db.session() as s:
            s.merge(WorkerBeat(name=self.name, queues=",".join(self.queues), engine_ok=engine_ok,
                               engine_url=getattr(self.engine, "url", None) if self.engine is not None else None,
                               running=len(self._held()), started_at=self.started_at, seen_at=now))

    # -- the thread -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Sweep every ``sweep_interval_s`` on a daemon thread (the first sweep at once)."""
        def loop() -> None:
            while True:
                try:
                    self.sweep()
                except Exception:  # a bug in one sweep must not end the sweeper
                    log.exception("sweep failed")
                if self._stop.wait(self.services.settings.sweep_interval_s):
                    return

        self._thread = threading.Thread(target=loop, name="diarist-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
