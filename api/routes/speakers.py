"""Known speakers: voice profiles (``/v1/speakers``) and naming a job's speakers after the fact
(``PATCH /v1/jobs/{id}/speakers``). Thin: the rules live in :mod:`diarist.voice_profiles`.

Every route is scoped to the caller's API key, admin keys included: another key's profile is 404
``not_found``. Vectors never leave the server (responses list samples by source and seconds only).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from api import intake
from api.deps import JobId, Principal, PrincipalDep, ServicesDep, load_job
from api.routes.jobs import ERRORS, _small_body, _validation_error
from api.schemas import ErrorResponse, _utc
from diarist import voice_profiles as vp
from diarist.contract.errors import CodedError
from diarist.contract.result import SpeakerEmbedding
from diarist.http.errors import ApiError
from diarist.models import SpeakerProfile, utcnow
from diarist.services import Services
from diarist.storage import ObjectNotFound
from diarist.transcript import SpeakerIdentity, Transcript

router = APIRouter(tags=["speakers"])

MAX_SAMPLE_FILES = 10
"""Most clips one request may upload (multipart fields ``file``)."""
SPEAKER_ERRORS = {**ERRORS, 502: {"model": ErrorResponse}}
ProfileId = Annotated[str, Path(max_length=64, description="Voice profile id (`spk_...`).")]


# -- bodies ---------------------------------------------------------------------------------------------
class SampleOut(BaseModel):
    source: str = Field(..., description="`upload`, or `job:<job id>:<speaker>`")
    seconds: float = Field(..., description="seconds of speech in the sample")
    created_at: datetime


class ProfileOut(BaseModel):
    id: str
    object: Literal["speaker_profile"] = "speaker_profile"
    name: str
    model: str = Field(..., description="the embedding model of its vectors (`campplus@<weights hash>`)")
    sample_count: int
    sample_seconds: float = Field(..., description="seconds of speech over all samples")
    samples: list[SampleOut]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, p: SpeakerProfile) -> ProfileOut:
        return cls(id=p.id, name=p.name, model=p.model, sample_count=p.sample_count,
                   sample_seconds=p.sample_seconds, created_at=_utc(p.created_at), updated_at=_utc(p.updated_at),
                   samples=[SampleOut(source=x.source, seconds=x.seconds, created_at=_utc(x.created_at))
                            for x in p.samples])


class ProfileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ProfileOut]


class ProfileFromJob(BaseModel):
    """``POST /v1/speakers`` (or ``PATCH``) with JSON: the voice of one speaker of a completed job."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=vp.NAME_MAX)
    job_id: str | None = Field(None, max_length=64)
    speaker: str | None = Field(None, max_length=16, description="the job's label, e.g. `S02`")


SAMPLE_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "name": {"type": "string"}, "file": {"type": "array", "items": {"type": "string", "format": "binary"}}}}},
    "application/json": {"schema": ProfileFromJob.model_json_schema()},
}}}
"""The two bodies the profile routes read themselves (:func:`_read`): clips, or a job's speaker."""


class Deleted(BaseModel):
    id: str
    object: Literal["speaker_profile"] = "speaker_profile"
    deleted: bool = True


class JobSpeakers(BaseModel):
    object: Literal["job_speakers"] = "job_speakers"
    job_id: str
    speakers: list[str]
    identities: dict[str, SpeakerIdentity]


# -- helpers ----------------------------------------------------------------------------------------------
def _job_voice(services: Services, principal: Principal, job_id: str, speaker: str) -> SpeakerEmbedding:
    """The voice of ``speaker`` in the caller's completed job ``job_id``.

    Raises 404 ``not_found`` (no such job for this key), 409 ``not_ready``/``job_failed``/``job_canceled``,
    422 ``unknown_speaker`` (not a label of the job), 422 ``no_voice`` (the job kept no vector for it:
    multichannel, or transcribed before known speakers existed)."""
    job = load_job(services, principal, job_id)
    if job.owner_key != principal.key_id:  # an admin key sees other keys' jobs; their voices stay theirs
        raise ApiError(404, "not_found", f"no job {job_id}")
    t = _transcript(services, job)
    if speaker not in t.speakers:
        raise ApiError(422, "unknown_speaker", f"job {job_id} has no speaker {speaker!r}; its speakers: "
                       f"{', '.join(t.speakers) or 'none'}")
    voices = _voices(services, job.id)
    if speaker not in voices:
        raise ApiError(422, "no_voice", f"job {job_id} kept no voice for {speaker} (multichannel, or transcribed "
                       "before known speakers)")
    return voices[speaker]


def _transcript(services: Services, job: Any) -> Transcript:
    if job.status != "completed" or not job.transcript_key:
        code = {"failed": "job_failed", "canceled": "job_canceled"}.get(job.status, "not_ready")
        raise ApiError(409, code, f"the job is {job.status}; its speakers exist once it is completed")
    try:
        return Transcript.model_validate_json(services.store.get_bytes(job.transcript_key))
    except ObjectNotFound:
        raise ApiError(404, "not_found", "the transcript was deleted") from None


def _voices(services: Services, job_id: str) -> dict[str, SpeakerEmbedding]:
    try:
        return vp.load_voices(services.store.get_bytes(vp.voices_key(job_id)))
    except ObjectNotFound:
        return {}


def _check_speech(voice: SpeakerEmbedding | None, services: Services, what: str) -> SpeakerEmbedding:
    least = services.settings.speaker_sample_min_speech_s
    if voice is None:
        raise ApiError(422, "no_speech", f"{what} holds no speech")
    if voice.speech_s < least:
        raise ApiError(422, "too_little_speech", f"{what} holds {voice.speech_s:.1f} s of speech; a voice sample "
                       f"needs at least {least:g} s")
    return voice


def _embed_uploads(services: Services, uploads: list[UploadFile]) -> list[tuple[SpeakerEmbedding, str]]:
    """The voice of each uploaded clip (one talker each), checked; nothing is stored on failure."""
    st = services.settings
    if services.voices is None:
        raise ApiError(503, "embedding_unavailable", "this API process has no voice embedder; enroll from a "
                       "job's speaker instead")
    if len(uploads) > MAX_SAMPLE_FILES:
        raise ApiError(422, "too_many_files", f"at most {MAX_SAMPLE_FILES} clips per request")
    out, total = [], 0.0
    for i, up in enumerate(uploads):
        tmp, _, _ = intake.save_stream(up.file, st.speaker_sample_max_bytes)  # 413 too_large
        try:
            voice, _duration = services.voices.sample_voice(tmp, st.speaker_sample_max_s)
        except CodedError as e:
            status = {"engine_unavailable": 503, "engine_error": 502, "engine_protocol": 502}.get(e.code, 422)
            raise ApiError(status, e.code, f"clip {i + 1} ({up.filename or 'upload'}): {e.message}") from None
        finally:
            intake.discard(tmp)
        if voice is None:
            raise ApiError(422, "no_speech", f"clip {i + 1} ({up.filename or 'upload'}) holds no speech")
        out.append((voice, "upload"))
        total += voice.speech_s
    least = st.speaker_sample_min_speech_s
    if total < least:
        raise ApiError(422, "too_little_speech", f"the sample holds {total:.1f} s of speech; a voice sample needs "
                       f"at least {least:g} s")
    return out


async def _read(request: Request) -> tuple[dict[str, Any], list[UploadFile], Any]:
    """The body as ``(fields, uploads, form)``: multipart (``name``, ``file`` ...) or JSON (:class:`ProfileFromJob`).
    Raises 415 ``unsupported_media_type``, 422 ``invalid_request``."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        try:
            form = await request.form(max_files=MAX_SAMPLE_FILES, max_fields=8)
        except HTTPException as e:  # Starlette's limits ("Too many files", "Too many fields") or a bad body
            code = "too_many_files" if "files" in str(e.detail) else "invalid_request"
            raise ApiError(422, code, f"multipart body refused: {e.detail}") from None
        uploads = [v for k, v in form.multi_items() if k == "file" and isinstance(v, UploadFile)]
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        unknown = set(fields) - {"name"}
        if unknown:
            await form.close()
            raise ApiError(422, "invalid_request", f"unknown form field(s): {', '.join(sorted(unknown))}")
        return fields, uploads, form
    if ctype == "application/json":
        try:
            body = ProfileFromJob.model_validate_json(await _small_body(request))
        except ValidationError as e:
            raise _validation_error(e) from None
        return body.model_dump(exclude_none=True), [], None
    raise ApiError(415, "unsupported_media_type", "send multipart/form-data (`name`, `file`...) or JSON "
                   "(`name`, `job_id`, `speaker`)")


def _samples(services: Services, principal: Principal, fields: dict[str, Any], uploads: list[UploadFile]
             ) -> list[tuple[SpeakerEmbedding, str]]:
    if uploads:
        return _embed_uploads(services, uploads)
    if fields.get("job_id") or fields.get("speaker"):
        if not (fields.get("job_id") and fields.get("speaker")):
            raise ApiError(422, "invalid_request", "a sample from a job needs both `job_id` and `speaker`")
        voice = _job_voice(services, principal, fields["job_id"], fields["speaker"])
        voice = _check_speech(voice, services, f"speaker {fields['speaker']} of job {fields['job_id']}")
        return [(voice, f"job:{fields['job_id']}:{fields['speaker']}")]
    return []


def _out(services: Services, principal: Principal, profile_id: str) -> ProfileOut:
    with services.db.session() as s:
        return ProfileOut.from_row(vp.get_profile(s, principal.key_id, profile_id))


# -- routes -----------------------------------------------------------------------------------------------
@router.post("/v1/speakers", status_code=201, response_model=ProfileOut, responses=SPEAKER_ERRORS,
             openapi_extra=SAMPLE_BODY, summary="Create a voice profile from uploaded clips or from a speaker of a finished job")
async def create_profile(request: Request, services: ServicesDep, principal: PrincipalDep) -> JSONResponse:
    """multipart ``name`` + one or more ``file`` clips of one talker (``speaker_sample_min_speech_s`` of speech
    in all), or JSON ``{"name", "job_id", "speaker"}``. 201 with the profile."""
    fields, uploads, form = await _read(request)
    try:
        name = vp.clean_name(fields.get("name"))
        samples = await run_in_threadpool(_samples, services, principal, fields, uploads)
        if not samples:
            raise ApiError(422, "invalid_request", "a profile needs a sample: `file` clips, or `job_id` and `speaker`")
        pid = await run_in_threadpool(vp.create_profile, services.db, principal.key_id, name, samples,
                                      services.settings.max_speaker_profiles)
    finally:
        if form is not None:
            await form.close()
    out = _out(services, principal, pid)
    return JSONResponse(out.model_dump(mode="json"), status_code=201, headers={"Location": f"/v1/speakers/{pid}"})


@router.get("/v1/speakers", response_model=ProfileList, responses=ERRORS, summary="This key's voice profiles")
def list_profiles(services: ServicesDep, principal: PrincipalDep) -> ProfileList:
    with services.db.session() as s:
        rows = s.scalars(select(SpeakerProfile).where(SpeakerProfile.owner_key == principal.key_id)
                         .order_by(SpeakerProfile.name))
        return ProfileList(data=[ProfileOut.from_row(p) for p in rows])


@router.get("/v1/speakers/{profile_id}", response_model=ProfileOut, responses=ERRORS, summary="One voice profile")
def get_profile(profile_id: ProfileId, services: ServicesDep, principal: PrincipalDep) -> ProfileOut:
    return _out(services, principal, profile_id)


@router.patch("/v1/speakers/{profile_id}", response_model=ProfileOut, responses=SPEAKER_ERRORS,
              openapi_extra=SAMPLE_BODY, summary="Rename a voice profile and/or add samples to it")
async def update_profile(profile_id: ProfileId, request: Request, services: ServicesDep,
                         principal: PrincipalDep) -> ProfileOut:
    """JSON ``{"name"?, "job_id"?, "speaker"?}`` or multipart ``name``? + ``file`` clips: a new name (409
    ``duplicate_name`` when another profile has it) and/or samples added (the vector is recomputed)."""
    fields, uploads, form = await _read(request)
    try:
        with services.db.session() as s:
            vp.get_profile(s, principal.key_id, profile_id)  # 404 before any model work
        name = vp.clean_name(fields["name"]) if "name" in fields else None
        samples = await run_in_threadpool(_samples, services, principal, fields, uploads)
        if name is None and not samples:
            raise ApiError(422, "invalid_request", "nothing to change: send `name` and/or samples")
        await run_in_threadpool(_apply, services, principal, profile_id, name, samples)
    finally:
        if form is not None:
            await form.close()
    return _out(services, principal, profile_id)


def _apply(services: Services, principal: Principal, profile_id: str, name: str | None,
           samples: list[tuple[SpeakerEmbedding, str]]) -> None:
    from sqlalchemy.exc import IntegrityError

    try:
        with services.db.session() as s:
            p = vp.get_profile(s, principal.key_id, profile_id)
            if name is not None and name != p.name:
                if vp.by_name(s, principal.key_id, name) is not None:
                    raise ApiError(409, "duplicate_name", f"a speaker profile named {name!r} exists")
                p.name = name
            if samples:
                vp.add_samples(p, samples)
            else:
                p.updated_at = utcnow()
    except IntegrityError:
        raise ApiError(409, "duplicate_name", f"a speaker profile named {name!r} exists") from None


@router.delete("/v1/speakers/{profile_id}", response_model=Deleted, responses=ERRORS,
               summary="Delete a voice profile with all its samples' vectors")
def delete_profile(profile_id: ProfileId, services: ServicesDep, principal: PrincipalDep) -> Deleted:
    """The profile row and its samples (ON DELETE CASCADE) are deleted; no audio of a sample was kept. Past
    transcripts keep the names they were given."""
    with services.db.session() as s:
        s.delete(vp.get_profile(s, principal.key_id, profile_id))
    return Deleted(id=profile_id)


@router.patch("/v1/jobs/{job_id}/speakers", response_model=JobSpeakers, responses=SPEAKER_ERRORS,
              summary="Name a completed job's speakers (every export follows); optionally save their voices")
async def name_job_speakers(job_id: JobId, request: Request, services: ServicesDep,
                            principal: PrincipalDep) -> JobSpeakers:
    """JSON ``{"S01": "Alice Chen", "S02": null, "save_profile": true}``: each label gets the name (``null``
    removes it); with ``save_profile`` each named speaker's voice is added to the key's profile of that name,
    or makes a new one. 422 ``unknown_speaker``, ``duplicate_name`` (two speakers given one name),
    ``no_voice``, ``too_little_speech``; 409 ``not_ready``; 404 ``not_found``."""
    import json

    try:
        body = json.loads(await _small_body(request))
    except ValueError:
        raise ApiError(422, "invalid_request", "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(422, "invalid_request", "the body must be a JSON object of label -> name")
    save = body.pop("save_profile", False)
    if not isinstance(save, bool):
        raise ApiError(422, "invalid_request", "save_profile must be true or false")
    if not body:
        raise ApiError(422, "invalid_request", "name at least one speaker: {\"S01\": \"Alice Chen\"}")
    names = {k: None if v is None else vp.clean_name(v) if isinstance(v, str) else _bad_name(k)
             for k, v in body.items()}
    return await run_in_threadpool(_name_speakers, services, principal, job_id, names, save)


def _bad_name(label: str) -> None:
    raise ApiError(422, "invalid_request", f"{label}: a name must be a string or null")


def _name_speakers(services: Services, principal: Principal, job_id: str, names: dict[str, str | None],
                   save: bool) -> JobSpeakers:
    job = load_job(services, principal, job_id)
    t = _transcript(services, job)
    unknown = [k for k in names if k not in t.speakers]
    if unknown:
        raise ApiError(422, "unknown_speaker", f"job {job_id} has no speaker {', '.join(unknown)}; its speakers: "
                       f"{', '.join(t.speakers) or 'none'}")
    ids = {k: (t.identities or {}).get(k, SpeakerIdentity()) for k in t.speakers}
    for k, name in names.items():
        ids[k] = SpeakerIdentity(name=name)  # a name given by hand replaces a match
    # what each speaker is shown as (a name, else its label) must tell them apart: no two names alike, and
    # no name that is another speaker's label ({"S01": "S02"} would print two speakers as S02)
    shown = [x.name or k for k, x in ids.items()]
    if len(shown) != len(set(shown)):
        raise ApiError(422, "duplicate_name", "two speakers of one job cannot be shown alike: a name is given "
                       "twice, or is the label of another speaker of the job")
    if save:
        if job.owner_key != principal.key_id:
            raise ApiError(404, "not_found", f"no job {job_id}")
        voices = _voices(services, job_id)
        for k, name in names.items():
            if name is None:
                continue
            if k not in voices:
                raise ApiError(422, "no_voice", f"job {job_id} kept no voice for {k}")
            voice = _check_speech(voices[k], services, f"speaker {k}")
            ids[k].profile_id = _save(services, principal, name, voice, f"job:{job_id}:{k}")
    t.identities = ids
    services.store.put_bytes(job.transcript_key, t.model_dump_json().encode())
    return JobSpeakers(job_id=job_id, speakers=t.speakers, identities=ids)


def _save(services: Services, principal: Principal, name: str, voice: SpeakerEmbedding, source: str) -> str:
    """The id of the key's profile ``name`` with ``voice`` added, made when there is none."""
    with services.db.session() as s:
        p = vp.by_name(s, principal.key_id, name)
        if p is not None:
            vp.add_samples(p, [(voice, source)])
            return p.id
    return vp.create_profile(services.db, principal.key_id, name, [(voice, source)],
                             services.settings.max_speaker_profiles)
