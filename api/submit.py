"""Creating a job: validate options ▸ receive audio ▸ idempotency ▸ measure ▸ store ▸ row ▸ enqueue."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from api import intake
from api.deps import Principal
from api.schemas import JobOptions
from diarist import voice_profiles
from diarist.events import StatusEvent
from diarist.http.errors import ApiError, unknown_model
from diarist.models import Job, JobStatus, new_id, utcnow
from diarist.netguard import UnsafeURL, check_url
from diarist.outages import Dependency, classify
from diarist.redact import display_url
from diarist.services import Services

log = logging.getLogger("diarist.api")


@dataclass
class AudioSource:
    """Exactly one of ``fileobj`` (an upload, with its ``filename``) or ``url`` (+ ``headers``)."""

    fileobj: BinaryIO | None = None
    filename: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None


def resolve_model(services: Services, name: str | None) -> str:
    """The model to use; 422 ``unknown_model`` for a name the server does not serve."""
    served = services.settings.served_model_names
    if name is None:
        return services.settings.model
    if name not in served:
        raise unknown_model(name, served)
    return name


def request_fingerprint(model: str, opts: JobOptions, source: str) -> str:
    """SHA-256 hex of what makes a job request what it is: the model, the engine options, the webhook and
    the audio (``sha256:<content hash>`` for an upload, ``url:<audio_url>`` for a fetch; a URL is not
    fetched again to replay)."""
    body = {"model": model, "options": opts.stored_options(), "webhook_url": opts.webhook_url, "audio": source}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _replay(job: Job, fingerprint: str) -> Job:
    """The job an Idempotency-Key already made, if this request is the same one (jobs stored before the
    fingerprint existed replay as before); 422 ``idempotency_key_reused`` otherwise (IETF draft
    "The Idempotency-Key HTTP Header Field", §2.7: a key reused with a different payload)."""
    if job.request_sha256 is not None and job.request_sha256 != fingerprint:
        raise ApiError(422, "idempotency_key_reused",
                       f"this Idempotency-Key made job {job.id} from a different request (audio, model or "
                       "options); use a new key for a new request")
    return job


OUTAGE_CODES = tuple(d.code for d in Dependency)


def _resume(services: Services, job: Job) -> Job:
    """A replayed job that failed only because a dependency stayed down (``*_unavailable``: the outage
    bound passed, or an older version failed the submit itself) is queued again instead of replayed as a
    failure: ``failed → queued`` with a fresh attempt count, then sent. Other jobs are returned as they are.
    Raises 503 ``queue_unavailable`` when the broker is still down (the row then stays queued and the
    sweeper sends it)."""
    from sqlalchemy import update

    if job.status != JobStatus.FAILED.value or job.error_code not in OUTAGE_CODES:
        return job
    with services.db.session() as s:
        res = s.execute(update(Job).where(Job.id == job.id, Job.status == JobStatus.FAILED.value).values(
            status=JobStatus.QUEUED.value, attempts=0, progress=0.0, error_code=None, error_message=None,
            finished_at=None, outage_since=None, lease_owner=None, updated_at=utcnow(),
            lease_expires_at=utcnow() + timedelta(seconds=services.settings.queued_redrive_s)))
    if res.rowcount == 1:
        log.info("job %s failed with an outage code; resumed by a retried submit", job.id)
        try:
            services.dispatcher.transcribe(job.id, job.queue)
        except Exception as e:
            if classify(e) is None:
                raise
            with services.db.session() as s:  # due at once for the sweeper
                s.execute(update(Job).where(Job.id == job.id, Job.status == JobStatus.QUEUED.value)
                          .values(lease_expires_at=utcnow()))
            raise unavailable(services, Dependency.QUEUE) from None
    with services.db.session() as s:
        fresh = s.get(Job, job.id)
        _ = fresh.metrics
        s.expunge(fresh)
    return fresh


def unavailable(services: Services, dep: Dependency) -> ApiError:
    """503 with the outage's code (``database_unavailable``, ``storage_unavailable``, ``queue_unavailable``)
    and ``Retry-After: retry_after_s``."""
    return ApiError(503, dep.code, f"the {dep.value} is unavailable; nothing was stored, retry later (the same "
                    "Idempotency-Key is safe)", headers={"Retry-After": str(services.settings.retry_after_s)})


def _outage_guard(services: Services, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, an outage turned into :func:`unavailable`."""
    try:
        return fn(*args, **kwargs)
    except ApiError:
        raise
    except Exception as e:
        dep = classify(e)
        if dep is None:
            raise
        log.warning("submit: %s unavailable (%s: %s)", dep.value, type(e).__name__, e)
        raise unavailable(services, dep) from None


def _discard_job(services: Services, job_id: str) -> None:
    """Undo a submit whose enqueue failed: the row (still queued, never claimed) and its objects. If the
    database is down too, the row stays queued and the sweeper runs it; a retry with the same
    Idempotency-Key then gets that job (resumed, not a failure)."""
    from sqlalchemy import delete

    try:
        with services.db.session() as s:
            s.execute(delete(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value, Job.attempts == 0))
        services.store.delete_prefix(f"jobs/{job_id}/")
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.warning("could not undo job %s after a failed enqueue (%s); the sweeper will run it", job_id,
                    type(e).__name__)


def _discard_objects(services: Services, job_id: str) -> None:
    try:
        services.store.delete_prefix(f"jobs/{job_id}/")
    except Exception as e:  # noqa: BLE001 - an unreferenced object costs bytes, not correctness
        log.warning("could not delete the audio of unsaved job %s (%s)", job_id, type(e).__name__)


def _existing(services: Services, principal: Principal, key: str) -> Job | None:
    with services.db.session() as s:
        job = s.scalar(select(Job).where(Job.owner_key == principal.key_id, Job.idempotency_key == key))
        if job is not None:
            _ = job.metrics
            s.expunge(job)
        return job


def submit_job(services: Services, principal: Principal, opts: JobOptions, source: AudioSource,
               idempotency_key: str | None = None, origin: str = "api", job_id: str | None = None
               ) -> tuple[Job, bool]:
    """Create and enqueue a job. Returns ``(job, created)``; ``created`` is False for an idempotent replay.

    ``job_id`` may be chosen by the caller (to subscribe to its events before it is enqueued).

    Raises ApiError: 413 ``too_large``; 422 ``unknown_profile`` (a ``speaker_profiles`` id that is not the
    key's), ``unknown_model``, ``unsupported_language``, ``unsupported_task``,
    ``idempotency_key_reused``, ``invalid_url``, ``url_not_allowed``, ``url_fetch_failed``, ``decode_failed``,
    ``no_audio_stream``, ``empty_audio``, ``too_long``, ``too_short``; 503 ``database_unavailable``,
    ``storage_unavailable``, ``queue_unavailable`` (with Retry-After), which leave no row and no object
    behind (or, when the database is down too, a queued row that the sweeper runs and that a retry with
    the same Idempotency-Key gets back).
    """
    st = services.settings
    model = resolve_model(services, opts.model)
    langs = st.accepted_languages
    if opts.language and langs and opts.language not in langs:
        raise ApiError(422, "unsupported_language", f"this server's model transcribes {', '.join(langs)} only; "
                       f"language={opts.language!r} was asked for")
    if opts.task == "translate" and not st.can_translate:
        raise ApiError(422, "unsupported_task", "this server's model is English-only and cannot translate; "
                       "task=translate needs a multilingual Whisper (DIARIST_MODEL_PATH=base)")
    if opts.webhook_url:
        try:
            check_url(opts.webhook_url, st.webhook_allow_hosts)
        except UnsafeURL as e:
            raise ApiError(422, e.code, f"webhook_url: {e.message}") from None
    _outage_guard(services, voice_profiles.check_profile_ids, services.db, principal.key_id, opts.speaker_profiles)
    existing = _outage_guard(services, _existing, services, principal, idempotency_key) if idempotency_key else None
    fingerprint = request_fingerprint(model, opts, f"url:{source.url}") if source.url is not None else None
    if existing is not None and fingerprint is not None:
        return _resume(services, _replay(existing, fingerprint)), False

    tmp: Path | None = None
    try:
        if source.url is not None:
            tmp, size = intake.fetch_url(source.url, source.headers, st)
        else:
            tmp, size, digest = intake.save_stream(source.fileobj, st.max_upload_bytes)
            fingerprint = request_fingerprint(model, opts, f"sha256:{digest}")
            if existing is not None:  # the upload had to be read to know whether it is the same one
                return _resume(services, _replay(existing, fingerprint)), False
        duration = intake.measure_duration(tmp, intake.duration_limit_s(st))
        intake.check_duration(duration, st)
        job_id = job_id or new_id("job")
        audio_key = f"jobs/{job_id}/audio"
        with open(tmp, "rb") as f:
            try:
                services.store.put_file(audio_key, f)
            except Exception as e:
                if classify(e) is not None:  # a multipart upload may have left parts: best effort
                    _outage_guard(services, services.store.delete_prefix, f"jobs/{job_id}/")
                raise
    except ApiError:
        raise
    except Exception as e:
        if classify(e) is None:
            raise
        log.warning("submit: %s unavailable (%s: %s)", classify(e).value, type(e).__name__, e)
        raise unavailable(services, classify(e)) from None
    finally:
        intake.discard(tmp)

    queue = services.dispatcher.queue_for(duration)
    job = Job(id=job_id, owner_key=principal.key_id, idempotency_key=idempotency_key, source=origin,
              filename=(source.filename or None) if source.url is None else display_url(source.url)[:500],
              audio_key=audio_key,
              audio_bytes=size, duration_s=duration, queue=queue, model=model, options=opts.stored_options(),
              webhook_url=opts.webhook_url, request_sha256=fingerprint,
              # picked up by then, else the sweeper sends it again (its message was lost)
              lease_expires_at=utcnow() + timedelta(seconds=st.queued_redrive_s))
    try:
        with services.db.session() as s:
            s.add(job)
    except IntegrityError:
        # A concurrent request with the same Idempotency-Key won the insert.
        services.store.delete_prefix(f"jobs/{job_id}/")
        if idempotency_key and (existing := _existing(services, principal, idempotency_key)) is not None:
            return _resume(services, _replay(existing, fingerprint)), False
        raise
    except Exception as e:
        if classify(e) is None:
            raise
        log.warning("submit: database unavailable (%s: %s)", type(e).__name__, e)
        _discard_objects(services, job_id)
        raise unavailable(services, Dependency.DATABASE) from None
    try:
        services.dispatcher.transcribe(job_id, queue)
    except Exception as e:  # noqa: BLE001 - any broker error: undo the row, answer 503 queue_unavailable
        log.warning("submit: enqueue of %s failed (%s: %s)", job_id, type(e).__name__, e)
        _discard_job(services, job_id)
        raise unavailable(services, Dependency.QUEUE) from None
    services.metrics.record_submitted(queue)
    services.bus.publish(job_id, StatusEvent(JobStatus.QUEUED.value, 0.0).to_json())
    with services.db.session() as s:
        job = s.get(Job, job_id)
        _ = job.metrics
        s.expunge(job)
    return job, True
