"""Job routes: submit, get, list, transcript, delete (thin: the work is in api.submit and diarist.jobs)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from sqlalchemy import func, select, tuple_
from starlette.datastructures import UploadFile

from api.deps import JobId, PrincipalDep, ServicesDep, load_job
from api.forms import read_form
from api.schemas import ErrorResponse, JobFromUrl, JobList, JobOptions, JobOut, Status, TranscriptFormat
from api.submit import AudioSource, submit_job
from diarist import jobs
from diarist.formats import MEDIA_TYPES, render
from diarist.http.errors import ApiError, describe_errors
from diarist.models import FINAL_STATES, Job, WebhookDelivery
from diarist.storage import ObjectNotFound
from diarist.transcript import Transcript

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

ERRORS = {c: {"model": ErrorResponse} for c in (401, 404, 409, 413, 415, 422, 503)}
FORM_FIELDS = {"type": "object", "required": ["file"], "properties": {
    "file": {"type": "string", "format": "binary"},
    **{k: {"type": "string"} for k in JobOptions.model_fields},
}}
SUBMIT_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": FORM_FIELDS},
    "application/json": {"schema": {"$ref": "#/components/schemas/JobFromUrl"}},
}}}

JSON_BODY_MAX = 64 << 10
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]


def _validation_error(e: ValidationError) -> ApiError:
    return ApiError(422, "invalid_request", describe_errors(e.errors()))


@router.post("", status_code=202, response_model=JobOut, responses={200: {"model": JobOut}, **ERRORS},
             openapi_extra=SUBMIT_BODY, summary="Submit a recording (multipart `file` or JSON `audio_url`)")
async def create_job(request: Request, services: ServicesDep, principal: PrincipalDep,
                     idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """202 with the new job; 200 with the existing one when the ``Idempotency-Key`` was seen before."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > services.settings.max_upload_bytes + (1 << 20):
        raise ApiError(413, "too_large", f"the upload is larger than {services.settings.max_upload_bytes} bytes")
    if ctype == "multipart/form-data":
        form = await read_form(request, max_fields=32)
        try:
            return await _submit_form(form, services, principal, idempotency_key)
        finally:
            await form.close()  # the upload's spooled temp file
    if ctype == "application/json":
        try:
            body = JobFromUrl.model_validate_json(await _small_body(request))
        except ValidationError as e:
            raise _validation_error(e) from None
        source = AudioSource(url=body.audio_url, headers=body.audio_headers)
        return await _submit(services, principal, body, source, idempotency_key)
    raise ApiError(415, "unsupported_media_type", "send multipart/form-data with `file`, or JSON with `audio_url`")


async def _small_body(request: Request, limit: int = JSON_BODY_MAX) -> bytes:
    """The request body, refusing (413) more than ``limit`` bytes without buffering them."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "too_large", f"a JSON job request is at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _submit_form(form, services, principal, idempotency_key) -> JSONResponse:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ApiError(422, "invalid_request", "multipart field `file` (the recording) is required")
    fields = {k: v for k, v in form.items() if k != "file" and isinstance(v, str) and v != ""}
    try:
        opts = JobOptions.model_validate(fields)
    except ValidationError as e:
        raise _validation_error(e) from None
    source = AudioSource(fileobj=upload.file, filename=upload.filename)
    return await _submit(services, principal, opts, source, idempotency_key)


async def _submit(services, principal, opts, source, idempotency_key) -> JSONResponse:
    job, created = await run_in_threadpool(submit_job, services, principal, opts, source, idempotency_key)
    out = JobOut.from_row(job)
    headers = {"Location": f"/v1/jobs/{job.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(out.model_dump(mode="json"), status_code=202 if created else 200, headers=headers)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS, summary="Job status, progress, metrics, error")
def get_job(job_id: JobId, services: ServicesDep, principal: PrincipalDep) -> JobOut:
    job = load_job(services, principal, job_id)
    with services.db.session() as s:
        n = s.scalar(select(func.count()).select_from(WebhookDelivery).where(WebhookDelivery.job_id == job_id))
    return JobOut.from_row(job, deliveries=n or 0)


FORMAT_HELP = "Output format; svg: the speaker timeline image (who spoke when: one lane per speaker)"


@router.get("/{job_id}/transcript", responses={200: {"content": {t.split(";")[0]: {} for t in MEDIA_TYPES.values()}},
                                               **ERRORS}, summary="The transcript in a format")
def get_transcript(job_id: JobId, services: ServicesDep, principal: PrincipalDep,
                   format: Annotated[TranscriptFormat, Query(description=FORMAT_HELP)] = "json") -> Response:
    job = load_job(services, principal, job_id)
    if job.status != "completed" or not job.transcript_key:
        # a final job without a transcript says so; only a job still on its way is "not ready" (worth polling)
        code = {"failed": "job_failed", "canceled": "job_canceled"}.get(job.status, "not_ready")
        raise ApiError(409, code, f"the job is {job.status}; the transcript exists once it is completed")
    try:
        data = services.store.get_bytes(job.transcript_key)
    except ObjectNotFound:
        raise ApiError(404, "not_found", "the transcript was deleted") from None
    # RTTM's file id names the recording, as reference RTTMs do: the upload's name without its extension
    file_id = PurePath(job.filename or "").stem or job.id
    t = Transcript.model_validate_json(data)
    content, media_type = render(t, format, file_id=file_id)
    # random weights' text is noise: said in every format, the ones without a field for it included
    return Response(content, media_type=media_type,
                    headers={"X-Diarist-Random-Weights": "true"} if t.random_weights else None)


@router.get("", response_model=JobList, responses=ERRORS, summary="List jobs, newest first")
def list_jobs(services: ServicesDep, principal: PrincipalDep,
              status: Annotated[Status | None, Query(description="Only jobs in this state")] = None,
              limit: Annotated[int, Query(ge=1, le=200)] = 20,
              cursor: Annotated[str | None, Query(max_length=64, description="`next_cursor` of the previous page")]
              = None) -> JobList:
    with services.db.session() as s:
        q = select(Job)
        if not principal.admin:
            q = q.where(Job.owner_key == principal.key_id)
        if status:
            q = q.where(Job.status == status)
        if cursor:
            last = s.get(Job, cursor)
            if last is None or not principal.may_see(last):
                raise ApiError(422, "invalid_request", "unknown cursor")
            q = q.where(tuple_(Job.created_at, Job.id) < tuple_(last.created_at, last.id))
        rows = list(s.scalars(q.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)))
        more = len(rows) > limit
        rows = rows[:limit]
        data = [JobOut.from_row(j) for j in rows]
    return JobList(data=data, has_more=more, next_cursor=rows[-1].id if more and rows else None)


@router.delete("/{job_id}", response_model=JobOut, responses=ERRORS,
               summary="Cancel a queued/processing job, or delete a finished one; audio and results are deleted")
def delete_job(job_id: JobId, services: ServicesDep, principal: PrincipalDep) -> JobOut:
    job = load_job(services, principal, job_id)
    if job.status not in FINAL_STATES:
        jobs.cancel(services, job_id)
    services.store.delete_prefix(f"jobs/{job_id}/")
    if job.status in FINAL_STATES:
        with services.db.session() as s:
            row = s.get(Job, job_id)
            if row is not None:
                s.delete(row)
        return JobOut.from_row(job)
    return JobOut.from_row(load_job(services, principal, job_id))
