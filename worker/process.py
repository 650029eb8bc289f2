"""One transcription attempt of one job: claim ▸ fetch audio ▸ engine ▸ name known speakers ▸ store transcript +
metrics ▸ notify.

Idempotent against the job row (see :mod:`diarist.jobs`): a message for a job that is gone, final, canceled
or running under a live lease does nothing; each attempt writes its transcript under its own key and only
the attempt that wins the ``processing → completed`` update (while still holding the lease) keeps it.

Failures, and what each does to the row (every path ends in a final state, a requeue, or a lease that the
sweeper re-drives; nothing is left ``processing`` by a live worker):

- a dependency outage (:mod:`diarist.outages`) before the engine answered → requeue without spending an
  attempt, back off; ``<dependency>_unavailable`` once the job's outage clock passes ``outage_bound_s``;
- an outage after the engine answered (storing the transcript, completing the row) → retried here with
  backoff, so the engine's work is not thrown away (the lease keeps being renewed meanwhile);
- the engine dropped the request → requeue spending an attempt (``engine_error`` after ``engine_attempts``);
- the job's own error (bad audio, a bug) → ``failed`` with its code;
- the worker is stopping (SIGTERM: :meth:`worker.leases.LeaseKeeper.hand_back_all`) → its engine work is
  aborted and the job requeued at once without spending an attempt; a message that arrives while it stops
  is sent back unclaimed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from diarist import jobs, voice_profiles
from diarist.contract.errors import InvalidRequest
from diarist.contract.options import TranscribeOptions
from diarist.contract.result import TranscriptionResult
from diarist.events import StatusEvent
from diarist.models import Job, JobStatus, utcnow
from diarist.outages import Dependency, classify
from diarist.storage import ObjectNotFound
from diarist.transcript import Transcript
from engine_server.client import JobFailure
from worker import routing
from worker.cancel import CancelToken, CancelWatch
from worker.leases import Lease
from worker.runtime import Runtime

log = logging.getLogger("diarist.worker")

PROGRESS_WRITE_INTERVAL_S = 1.0
T = TypeVar("T")


@dataclass
class Outcome:
    """``state``: completed | failed | skipped | retry; ``delay_s`` for retry."""

    state: str
    code: str | None = None
    delay_s: float = 0.0


def outage_delay(settings, n: int) -> float:
    """Backoff before retry ``n`` (0-based) while a dependency is down: ``engine_retry_delay_s`` doubling,
    capped at ``outage_backoff_max_s`` (seconds)."""
    return min(settings.engine_retry_delay_s * 2 ** min(n, 30), settings.outage_backoff_max_s)


class _Progress:
    """Engine events → bus events; progress written to the row at most once a second. A write that finds
    the attempt no longer owns the row (canceled, or its lease went to another attempt) marks the lease
    lost and cancels ``token``, as the :class:`CancelWatch` would."""

    def __init__(self, rt: Runtime, job_id: str, duration: float | None, lease: Lease,
                 token: CancelToken) -> None:
        self.rt, self.job_id, self.duration = rt, job_id, duration or 0.0
        self.lease, self.token = lease, token
        self.last_write = 0.0

    def __call__(self, kind: str, payload: dict) -> None:
        bus = self.rt.services.bus
        if kind == "delta":
            bus.publish(self.job_id, {"type": "delta", "text": payload.get("text", "")})
        elif kind == "stage":
            bus.publish(self.job_id, {"type": "stage", "stage": payload.get("stage")})
        elif kind == "segment":
            bus.publish(self.job_id, {"type": "segment",
                                      **{k: payload.get(k) for k in ("start", "end", "text", "speaker")}})
            if self.duration > 0:
                progress = min(0.99, float(payload.get("end") or 0.0) / self.duration)
                bus.publish(self.job_id, {"type": "progress", "progress": progress})
                now = time.monotonic()
                if now - self.last_write >= PROGRESS_WRITE_INTERVAL_S:
                    self.last_write = now
                    self._write(progress)

    def _write(self, progress: float) -> None:
        try:
            if not jobs.set_progress(self.rt.services, self.job_id, progress, owner=self.lease.owner):
                self.lease.lost = True
                self.token.cancel()
        except Exception as e:  # progress is advisory: a database outage skips the write, not the job
            if classify(e) is None:
                raise
            log.warning("job %s: progress write skipped (%s unavailable)", self.job_id, classify(e).value)


def process_job(rt: Runtime, job_id: str, redeliveries: int = 0) -> Outcome:
    """Run one attempt. Never raises for job-level failures or outages; they end in the row or a retry.

    ``redeliveries``: how many times this message was retried already (paces the backoff of a claim that
    found the database down).
    """
    svc = rt.services
    if rt.leases.closing:  # stopping: leave the job queued for another worker (the task re-sends the message)
        return Outcome("retry", None, 0.0)
    owner = rt.leases.new_owner()
    try:
        job = jobs.claim(svc, job_id, owner)
    except Exception as e:
        dep = classify(e)
        if dep is None:
            raise
        log.warning("job %s not claimed: %s unavailable, retrying", job_id, dep.value)
        return Outcome("retry", dep.code, outage_delay(svc.settings, redeliveries))
    if job is None:
        return Outcome("skipped")
    lease = rt.leases.hold(job_id, owner)
    try:
        return _attempt(rt, job, lease, redeliveries)
    finally:
        rt.leases.release(lease)


def _attempt(rt: Runtime, job: Job, lease: Lease, redeliveries: int) -> Outcome:
    svc, job_id = rt.services, job.id
    if job.attempts > svc.settings.engine_attempts:
        return _fail(rt, job_id, "engine_error", f"gave up after {job.attempts - 1} attempts")
    if not job.audio_key:
        return _fail(rt, job_id, "audio_missing", "the job has no stored audio")
    svc.bus.publish(job_id, StatusEvent(JobStatus.PROCESSING.value, job.progress).to_json())
    token = CancelToken()
    lease.stop = token.cancel
    if lease.handed_back:  # the stop came between the claim and here
        token.cancel()
    progress = _Progress(rt, job_id, job.duration_s, lease, token)
    try:
        if rt.engine is None:
            raise JobFailure("engine_error", "this worker has no engine client", retryable=True)
        t_fetch = time.perf_counter()
        with (svc.store.local_path(job.audio_key) as path,
              CancelWatch(svc, job_id, token, svc.settings.cancel_poll_s, owner=lease.owner)):
            t_engine = time.perf_counter()
            options = TranscribeOptions.from_json(job.options, admission_class=routing.admission_class(job.queue))
            result = rt.engine.transcribe(path, options, on_event=progress, cancel=token)
            t_done = time.perf_counter()
        transcript = Transcript.from_engine(result)
        result.pipeline_metrics.update(worker_fetch_s=t_engine - t_fetch, worker_engine_s=t_done - t_engine)
    except ObjectNotFound:
        # A cancel or delete removed the audio while the message waited.
        return _fail(rt, job_id, "audio_missing", "the uploaded audio is no longer in the object store")
    except InvalidRequest as e:  # options stored with the job that the contract refuses: the job's own error
        return _fail(rt, job_id, e.code, e.message)
    except JobFailure as e:
        if lease.handed_back and not lease.lost:
            return _hand_back(rt, job_id, lease)
        if token.is_set() or lease.lost:  # canceled, or taken over: the engine call was given up on purpose
            return Outcome("skipped")
        if e.outage is not None:
            return _outage(rt, job, lease, e.outage, e.message, redeliveries)
        if e.retryable and job.attempts < svc.settings.engine_attempts:
            log.warning("job %s attempt %d failed (%s), retrying", job_id, job.attempts, e)
            delay = svc.settings.engine_retry_delay_s * (2 ** (job.attempts - 1))
            _durable(rt, lambda: jobs.requeue(svc, job_id, lease.owner, delay))
            return Outcome("retry", e.code, delay)
        return _fail(rt, job_id, e.code, e.message)
    except Exception as e:
        dep = classify(e)
        if dep is not None:
            return _outage(rt, job, lease, dep, f"{type(e).__name__}: {e}", redeliveries)
        log.exception("job %s crashed", job_id)  # a bug must fail the job with a code, not loop the message
        return _fail(rt, job_id, "internal_error", f"{type(e).__name__}: {e}")
    if job.outage_since is not None:
        _durable(rt, lambda: jobs.clear_outage(svc, job_id, lease.owner))
    return _store(rt, job, lease, transcript, result)


def _store(rt: Runtime, job: Job, lease: Lease, transcript: Transcript, result: TranscriptionResult) -> Outcome:
    """Keep the engine's work: outages of the store or the database are waited out here (bounded)."""
    svc, job_id = rt.services, job.id
    key = f"jobs/{job_id}/transcript-{job.attempts}.json"
    t_store = time.perf_counter()
    if wanted := job.options.get("speaker_profiles"):
        # the key's profiles are read now, not at submit: a profile made or deleted meanwhile counts
        profiles = _durable(rt, lambda: voice_profiles.profile_voices(svc.db, job.owner_key, wanted))
        transcript = voice_profiles.identify(transcript, profiles, svc.settings.speaker_match_threshold)
    if transcript.voices:  # kept apart from the transcript, for naming after the fact (never served)
        _durable(rt, lambda: svc.store.put_bytes(voice_profiles.voices_key(job_id),
                                                 voice_profiles.dump_voices(transcript.voices)))
    _durable(rt, lambda: svc.store.put_bytes(key, transcript.model_dump_json().encode()))
    # Where the worker's time went, beside the engine's own metrics (kept in the metrics row's ``extra``):
    # fetching the audio and the engine call (set by _attempt), storing the result.
    result.pipeline_metrics["worker_store_s"] = time.perf_counter() - t_store
    # The engine server names itself in the result; the client's own id is the fallback (in-process).
    engine_id = result.engine_id or rt.engine.engine_id
    if _durable(rt, lambda: jobs.complete(svc, job_id, key, transcript, result, engine_id, owner=lease.owner)):
        # Earlier attempts that died between storing and completing left their transcript behind.
        for n in range(1, job.attempts):
            _durable(rt, lambda n=n: svc.store.delete_prefix(f"jobs/{job_id}/transcript-{n}.json"))
        return Outcome("completed")
    _durable(rt, lambda: svc.store.delete_prefix(key))  # canceled meanwhile, or another attempt won
    return Outcome("skipped")


def _hand_back(rt: Runtime, job_id: str, lease: Lease) -> Outcome:
    """The worker is stopping: the job goes back to ``queued`` now, its attempt not spent, and the task
    re-sends its message. One try: if the database does not answer, the lease lapses and the sweeper
    re-drives the job (within ``lease_s + sweep_interval_s``), so stopping is never held up by an outage."""
    try:
        back = jobs.requeue(rt.services, job_id, lease.owner, 0.0, counted=False)
    except Exception as e:
        if classify(e) is None:
            raise
        log.warning("job %s not handed back (%s unavailable): the sweeper re-drives it once its lease lapses",
                    job_id, classify(e).value)
        return Outcome("skipped")
    if not back:  # canceled or taken over meanwhile
        return Outcome("skipped")
    log.info("job %s handed back for re-drive: this worker is stopping", job_id)
    return Outcome("retry", None, 0.0)


def _outage(rt: Runtime, job: Job, lease: Lease, dep: Dependency, message: str, redeliveries: int) -> Outcome:
    """Give the attempt back (not counted) and back off, or fail ``<dep>_unavailable`` past the bound."""
    svc, st = rt.services, rt.services.settings
    since = jobs.aware(job.outage_since) or utcnow()
    waited = (utcnow() - since).total_seconds()
    if waited >= st.outage_bound_s:
        return _fail(rt, job.id, dep.code, f"the {dep.value} was unavailable for {waited:.0f} s (more than "
                     f"outage_bound_s = {st.outage_bound_s:g} s): {message}")
    delay = outage_delay(st, redeliveries)
    log.warning("job %s: %s unavailable (%s); waiting %.1f s, no attempt spent", job.id, dep.value, message, delay)
    _durable(rt, lambda: jobs.requeue(svc, job.id, lease.owner, delay, counted=False, outage=True))
    return Outcome("retry", dep.code, delay)


def _fail(rt: Runtime, job_id: str, code: str, message: str) -> Outcome:
    if _durable(rt, lambda: jobs.fail(rt.services, job_id, code, message)):
        return Outcome("failed", code)
    return Outcome("skipped")


def _durable(rt: Runtime, write: Callable[[], T]) -> T:
    """``write()``, retried with backoff while it meets a dependency outage, for at most ``outage_bound_s``.

    Past the bound the outage error is raised: the worker gives up the attempt, its lease stops being
    renewed, and the sweeper re-drives the job once the dependency is back.
    """
    st = rt.services.settings
    deadline = time.monotonic() + st.outage_bound_s
    n = 0
    while True:
        try:
            return write()
        except Exception as e:
            dep = classify(e)
            if dep is None or time.monotonic() >= deadline:
                raise
            delay = outage_delay(st, n)
            log.warning("%s unavailable (%s: %s); retrying the write in %.1f s", dep.value, type(e).__name__, e,
                        delay)
            time.sleep(delay)
            n += 1
