"""One transcription attempt of one job: fetch audio ▸ engine ▸ store transcript + metrics ▸ notify.

Idempotent against the job row (see :mod:`diarist.jobs`): a message for a job that is gone, final or
canceled does nothing; each attempt writes its transcript under its own key and only the attempt that
wins the ``processing → completed`` update keeps it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from diarist import jobs
from diarist.storage import ObjectNotFound
from diarist.transcript import Transcript
from worker import routing
from worker.cancel import CancelToken, CancelWatch
from worker.engine_client import JobFailure
from worker.runtime import Runtime

log = logging.getLogger("diarist.worker")

PROGRESS_WRITE_INTERVAL_S = 1.0


@dataclass
class Outcome:
    """``state``: completed | failed | skipped | retry; ``delay_s`` for retry."""

    state: str
    code: str | None = None
    delay_s: float = 0.0


class _Progress:
    """Engine events → bus events; progress written to the row at most once a second (a write that finds
    the job no longer processing cancels ``token``, as the :class:`CancelWatch` would)."""

    def __init__(self, rt: Runtime, job_id: str, duration: float | None, token: CancelToken) -> None:
        self.rt, self.job_id, self.duration, self.token = rt, job_id, duration or 0.0, token
        self.last_write = 0.0

    def __call__(self, kind: str, payload: dict) -> None:
        bus = self.rt.services.bus
        if kind == "delta":
            bus.publish(self.job_id, {"type": "delta", "text": payload.get("text", "")})
        elif kind == "segment":
            bus.publish(self.job_id, {"type": "segment", **{k: payload.get(k) for k in ("start", "end", "text")}})
            if self.duration > 0:
                progress = min(0.99, float(payload.get("end") or 0.0) / self.duration)
                bus.publish(self.job_id, {"type": "progress", "progress": progress})
                now = time.monotonic()
                if now - self.last_write >= PROGRESS_WRITE_INTERVAL_S:
                    self.last_write = now
                    if not jobs.set_progress(self.rt.services, self.job_id, progress):
                        self.token.cancel()


def process_job(rt: Runtime, job_id: str) -> Outcome:
    """Run one attempt. Never raises for job-level failures; they end in the row."""
    svc = rt.services
    job = jobs.claim(svc, job_id)
    if job is None:
        return Outcome("skipped")
    if job.attempts > svc.settings.engine_attempts:
        jobs.fail(svc, job_id, "engine_error", f"gave up after {job.attempts - 1} attempts")
        return Outcome("failed", "engine_error")
    svc.bus.publish(job_id, {"type": "status", "status": "processing", "progress": job.progress})
    token = CancelToken()
    progress = _Progress(rt, job_id, job.duration_s, token)
    try:
        if rt.engine is None:
            raise JobFailure("engine_error", "this worker has no engine client", retryable=True)
        t_fetch = time.perf_counter()
        with (svc.store.local_path(job.audio_key) as path,
              CancelWatch(svc, job_id, token, svc.settings.cancel_poll_s)):
            t_engine = time.perf_counter()
            result = rt.engine.transcribe(path, {**job.options, "model": job.model}, on_event=progress,
                                          cancel=token, admission_class=routing.admission_class(job.queue))
            t_done = time.perf_counter()
        transcript = Transcript.from_engine(result)
    except ObjectNotFound:
        # A cancel or delete removed the audio while the message waited.
        if jobs.fail(svc, job_id, "audio_missing", "the uploaded audio is no longer in the object store"):
            return Outcome("failed", "audio_missing")
        return Outcome("skipped")
    except JobFailure as e:
        if token.is_set():  # the row left processing (canceled): the engine call was given up on purpose
            return Outcome("skipped")
        if e.retryable and job.attempts < svc.settings.engine_attempts:
            log.warning("job %s attempt %d failed (%s), retrying", job_id, job.attempts, e)
            jobs.requeue(svc, job_id)
            delay = svc.settings.engine_retry_delay_s * (2 ** (job.attempts - 1))
            return Outcome("retry", e.code, delay)
        jobs.fail(svc, job_id, e.code, e.message)
        return Outcome("failed", e.code)
    except Exception as e:  # a bug must fail the job with a code, not loop the message forever
        log.exception("job %s crashed", job_id)
        jobs.fail(svc, job_id, "internal_error", f"{type(e).__name__}: {e}")
        return Outcome("failed", "internal_error")

    key = f"jobs/{job_id}/transcript-{job.attempts}.json"
    t_store = time.perf_counter()
    svc.store.put_bytes(key, transcript.model_dump_json().encode())
    # Where the worker's time went, beside the engine's own metrics (kept in the metrics row's ``extra``):
    # fetching the audio, the engine call (upload, stream and the engine's processing_s), storing the result.
    result.setdefault("metrics", {}).update(worker_fetch_s=t_engine - t_fetch, worker_engine_s=t_done - t_engine,
                                            worker_store_s=time.perf_counter() - t_store)
    # The engine server names itself in the result; the client's own id is the fallback (in-process).
    if jobs.complete(svc, job_id, key, transcript, result, result.get("engine_id") or rt.engine.engine_id):
        return Outcome("completed")
    svc.store.delete_prefix(key)  # canceled meanwhile, or another attempt won
    return Outcome("skipped")
