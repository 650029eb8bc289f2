"""OpenAI-compatible ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` (works with the
official ``openai`` client).

The request becomes an ordinary job (same queue, limits, worker and engine), and the route waits for it.
``response_format``: json (``{text, usage}``), text, srt, vtt, verbose_json, diarized_json. ``stream=true``
answers Server-Sent Events in OpenAI's shapes: ``transcript.text.delta`` {delta} while decoding,
``transcript.text.segment`` {id, start, end, speaker, text} once speakers are known (diarized_json only,
as OpenAI does; MOSS-TD's as each segment completes, the cascade's after diarization), then
``transcript.text.done`` {text}. Extra form fields (``num_speakers``, ``min_speakers``, ``max_speakers``,
``task``, ``speaker_profiles``) pass through. ``temperature`` is the first decoding temperature (a job option: greedy first when
0 or unset, then the quality fallback's ladder from it). ``timestamp_granularities[]`` (``word``,
``segment``) picks verbose_json's ``words``/``segments`` as OpenAI does; another value, another
``response_format``, or ``word`` on a model that times segments only is a 422 before any job exists
(:func:`diarist.formats.timestamp_granularities`).
A translation is a transcription with ``task=translate`` (multilingual Whisper only).
Every JSON shape and the final stream event carry ``finish_reason``, ``incomplete``,
``incomplete_reason``, ``coverage`` and ``warnings`` as extra fields, and every answer carries them as
``X-Diarist-*`` headers (:func:`diarist.formats.render_openai`).
The wait (:mod:`api.sync_wait`): no engine able to serve is 503 ``engine_unavailable`` before any job exists,
the deadline 504 ``timeout`` naming the job (which goes on), and a client that disconnects cancels its job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from api.deps import PrincipalDep, ServicesDep
from api.forms import check_one_file
from api.routes.events import job_events
from api.routes.health import engine_unavailable
from api.routes.jobs import ERRORS
from api.schemas import ErrorResponse, JobOptions
from api.submit import AudioSource, submit_job
from api.sync_wait import stream_unless_gone, sync_timeout, wait_unless_gone
from diarist.contract.options import MAX_SPEAKERS, MAX_TEMPERATURE, TASKS
from diarist.formats import OPENAI_FORMATS, openai_done_event, render_openai, timestamp_granularities
from diarist.http.errors import ApiError, describe_errors
from diarist.models import Job, new_id
from diarist.outages import Dependency
from diarist.services import Services
from diarist.transcript import Transcript

router = APIRouter(tags=["openai"])

OpenAIFormat = Literal[OPENAI_FORMATS]  # json, text, srt, vtt, verbose_json, diarized_json
# The form fields both routes take, declared once (FastAPI reads a route's form from its signature);
# JobOptions checks the same values again, with the speaker-hint rule.
RecordingForm = Annotated[UploadFile, File(description="The recording")]
PromptForm = Annotated[str | None, Form(max_length=2000)]
FormatForm = Annotated[OpenAIFormat, Form()]
TemperatureForm = Annotated[float | None, Form(ge=0, le=MAX_TEMPERATURE)]
# OpenAI's clients send the list as repeated ``timestamp_granularities[]`` fields; plain curl users often
# drop the brackets: both are read (values checked by diarist.formats.timestamp_granularities)
GranularitiesForm = Annotated[list[str] | None, Form(alias="timestamp_granularities[]")]
GranularitiesPlainForm = Annotated[list[str] | None, Form(alias="timestamp_granularities")]
SpeakersForm = Annotated[int | None, Form(ge=1, le=MAX_SPEAKERS)]
ProfilesForm = Annotated[str | None, Form(max_length=8000, description="`all`, or voice profile ids "
                                          "(comma-separated or a JSON list): name known speakers")]

SYNC_ERRORS = {**ERRORS, 504: {"model": ErrorResponse}}  # 504 timeout: the wait passed sync_timeout_s
# A failed job's code → HTTP status of the synchronous answer.
STATUS_FOR = {"engine_error": 500, "internal_error": 500, "audio_missing": 500, "canceled": 409}


def _finished(services: Services, job_id: str, events: Iterator[dict]) -> tuple[Job, Transcript | None]:
    for ev in events:
        if ev.get("type") == "status" and ev.get("status") in ("completed", "failed", "canceled"):
            break
    with services.db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
    if job.status != "completed":
        return job, None
    return job, Transcript.model_validate_json(services.store.get_bytes(job.transcript_key))


def _deadline(events: Iterator[dict], job_id: str, seconds: float) -> Iterator[dict]:
    end = time.monotonic() + seconds
    for ev in events:
        yield ev
        if time.monotonic() > end:
            raise sync_timeout(job_id, seconds)


def _raise_failed(job: Job) -> None:
    code = job.error_code or "internal_error"
    raise ApiError(STATUS_FOR.get(code, 422), code, job.error_message or "the transcription failed")


def _body(t: Transcript, fmt: str, granularities: tuple[str, ...] | None = None) -> Response:
    content, media_type, headers = render_openai(t, fmt, granularities)
    return Response(content, media_type=media_type, headers=headers)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _stream(services: Services, job_id: str, events: Iterator[dict], fmt: str) -> Iterator[str]:
    sent = []
    live = 0  # transcript.text.segment events sent while the model decoded (MOSS-TD)
    try:
        for ev in events:
            if ev.get("type") == "delta" and ev.get("text"):
                sent.append(ev["text"])
                yield _sse({"type": "transcript.text.delta", "delta": ev["text"]})
            elif ev.get("type") == "segment" and fmt == "diarized_json" and ev.get("text") and ev.get("speaker"):
                # a segment that knows its speaker already (MOSS-TD's, as it completes)
                yield _sse({"type": "transcript.text.segment", "id": f"seg_{live}", "start": ev.get("start"),
                            "end": ev.get("end") if ev.get("end") is not None else ev.get("start"),
                            "speaker": ev["speaker"], "text": ev["text"]})
                live += 1
            elif ev.get("type") == "status" and ev.get("status") in ("completed", "failed", "canceled"):
                break
    except ApiError as e:  # the deadline: the stream ends with its error event, the job goes on
        yield _sse({"type": "error", "error": {"code": e.code, "message": e.message}})
        return
    job, t = _finished(services, job_id, iter(()))
    if t is None:
        err = {"code": job.error_code or "internal_error", "message": job.error_message or "failed"}
        yield _sse({"type": "error", "error": err})
        return
    if not sent and t.text:  # deltas missed (or none streamed): the client still gets the whole text
        yield _sse({"type": "transcript.text.delta", "delta": t.text})
    if fmt == "diarized_json":
        for s in t.segments[live:]:  # the rest, from the stored transcript
            yield _sse({"type": "transcript.text.segment", "id": f"seg_{s.id}", "start": s.start, "end": s.end,
                        "speaker": t.display(s.speaker) or "unknown", "text": s.text})
    yield _sse(openai_done_event(t))


@router.post("/v1/audio/transcriptions", responses={200: {"content": {"application/json": {}, "text/plain": {},
                                                                      "text/event-stream": {}}}, **SYNC_ERRORS},
             summary="OpenAI-compatible transcription (synchronous, or SSE with stream=true)")
async def create_transcription(
    request: Request, services: ServicesDep, principal: PrincipalDep,
    file: RecordingForm,
    model: Annotated[str, Form()],
    language: Annotated[str | None, Form(max_length=16)] = None,
    prompt: PromptForm = None,
    response_format: FormatForm = "json",
    temperature: TemperatureForm = None,
    stream: Annotated[bool, Form()] = False,
    num_speakers: SpeakersForm = None,
    min_speakers: SpeakersForm = None,
    max_speakers: SpeakersForm = None,
    task: Annotated[Literal[TASKS] | None, Form()] = None,
    granularities: GranularitiesForm = None,
    granularities_plain: GranularitiesPlainForm = None,
    speaker_profiles: ProfilesForm = None,
) -> Response:
    """The transcript once the job is final (or its events with ``stream=true``).

    Refused at once, before any job exists: 422 ``multiple_files`` for a second file (:mod:`api.forms`),
    503 ``engine_unavailable`` with ``Retry-After`` when no engine can take it
    (:func:`api.routes.health.engine_unavailable`), and what :func:`api.submit.submit_job` refuses. Then
    504 ``timeout`` after ``sync_timeout_s`` (the job goes on; the message names it), the failed job's
    code, and a client that disconnects cancels its job (:mod:`api.sync_wait`).
    """
    check_one_file(await request.form())  # the form FastAPI parsed for the parameters above
    try:
        opts = JobOptions(model=model, language=language, prompt=prompt, num_speakers=num_speakers,
                          min_speakers=min_speakers, max_speakers=max_speakers, task=task, temperature=temperature,
                          speaker_profiles=speaker_profiles)
    except ValidationError as e:
        raise ApiError(422, "invalid_request", describe_errors(e.errors())) from None
    granularity = timestamp_granularities([*(granularities or []), *(granularities_plain or [])],
                                          response_format, services.settings.model)
    if (why := await run_in_threadpool(engine_unavailable, request)) is not None:
        # nobody would wait out the outage for this answer: refuse instead of queueing a job
        raise ApiError(503, Dependency.ENGINE.code, f"{why}; nothing was queued, retry later",
                       headers={"Retry-After": str(services.settings.retry_after_s)})
    job_id = new_id("job")
    sub = services.bus.subscribe(job_id)  # before the job exists: no event can be missed
    try:
        job, _ = await run_in_threadpool(submit_job, services, principal, opts,
                                         AudioSource(fileobj=file.file, filename=file.filename), None, "openai",
                                         job_id)
        events = _deadline(job_events(services, job, sub, ticks=True), job_id, services.settings.sync_timeout_s)
    except BaseException:
        sub.close()
        raise
    if stream:
        body = stream_unless_gone(services, job_id, _stream(services, job_id, events, response_format), sub.close)
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        job, t = await wait_unless_gone(request, services, job_id, lambda: _finished(services, job_id, events))
    finally:
        sub.close()
    if t is None:
        _raise_failed(job)
    return _body(t, response_format, granularity)


@router.post("/v1/audio/translations", responses={200: {"content": {"application/json": {}, "text/plain": {}}},
                                                    **SYNC_ERRORS},
             summary="OpenAI-compatible translation into English (multilingual Whisper only)")
async def create_translation(
    request: Request, services: ServicesDep, principal: PrincipalDep,
    file: RecordingForm,
    model: Annotated[str, Form()],
    prompt: PromptForm = None,
    response_format: FormatForm = "json",
    temperature: TemperatureForm = None,
    num_speakers: SpeakersForm = None,
    min_speakers: SpeakersForm = None,
    max_speakers: SpeakersForm = None,
    speaker_profiles: ProfilesForm = None,
) -> Response:
    """English text of speech in any language: a transcription with ``task=translate`` (422
    ``unsupported_task`` on an English-only model). verbose_json's ``language`` is the speech's language."""
    return await create_transcription(request, services, principal, file, model, None, prompt, response_format, temperature,
                                      False, num_speakers, min_speakers, max_speakers, task="translate",
                                      speaker_profiles=speaker_profiles)
