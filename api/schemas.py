"""Request and response bodies of the job API (times: ISO-8601 UTC; durations: seconds)."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from diarist.contract.options import MAX_SPEAKERS, MAX_TEMPERATURE, OPTION_FIELDS, TASKS, check_hints
from diarist.contract.result import EngineMetrics
from diarist.formats import SUPPORTED_FORMATS
from diarist.models import Job
from diarist.redact import display_url, redact_text
from diarist.voice_profiles import MAX_PROFILE_IDS

PROGRESS_DECIMALS = 3
"""Decimals of a job's ``progress`` (0..1) as the API serves it (job objects and live events): a tenth of a
percent, finer than any progress bar, without the float noise of a fraction like 1/3."""


def served_progress(progress: float) -> float:
    """``progress`` (0..1) rounded to :data:`PROGRESS_DECIMALS`, as every API answer and event carries it."""
    return round(progress, PROGRESS_DECIMALS)

Status = Literal["queued", "processing", "completed", "failed", "canceled"]
TranscriptFormat = Literal[SUPPORTED_FORMATS]  # type: ignore[valid-type] - diarist.formats' one list


class JobOptions(BaseModel):
    """Transcription options (names follow OpenAI / AssemblyAI). An unknown field is refused (422
    ``invalid_request`` naming it): a misspelt option (``num_speaker``) must not silently run with the
    default."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="Model name; see DIARIST_SERVED_MODELS. Default: the server's.")
    language: str | None = Field(None, max_length=16, description="ISO 639-1 code of the speech, e.g. `en`; "
                                 "one the server's model does not transcribe gets 422 unsupported_language.")
    task: Literal[TASKS] | None = Field(  # type: ignore[valid-type] - the contract's one list
        None, description="`translate`: English text of speech in any language (multilingual Whisper only; "
        "otherwise 422 unsupported_task). Unset: `transcribe`, text in the speech's language.")
    prompt: str | None = Field(None, max_length=2000, description="Vocabulary / spelling hint for the decoder.")
    num_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS, description="Speaker count, if known: the transcript "
                                     "lists exactly this many speakers whenever there is enough speech to embed "
                                     "that many windows (1.5 s windows, 0.375 s apart); with fewer, the result's "
                                     "`warnings` has `fewer_speakers` with the count found. Whisper's speaker "
                                     "cascade only: moss-td labels speakers itself and ignores the speaker hints.")
    min_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS, description="Fewest speakers (same condition).")
    max_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS, description="Most speakers.")
    multichannel: bool = Field(False, description="One speaker per channel.")
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, description=(
        "First decoding temperature (OpenAI's `temperature`). Unset or 0: greedy first; a decode that fails "
        "its quality checks (a loop, low confidence) is tried again 0.2 hotter each time up to 1.0. Above 0: "
        "the first decode samples at it (seeded: the same file gives the same transcript), then the same "
        "ladder from there. Sampling usually costs accuracy; it is for retrying a file whose greedy "
        "transcript looped."))
    webhook_url: str | None = Field(None, max_length=2000, description="POSTed on every final state (signed).")
    speaker_profiles: list[str] | Literal["all"] | None = Field(
        None, description="Name known speakers: `all` (every voice profile of this API key) or a list of profile "
        "ids (in a form: comma-separated, or a JSON list). Each speaker whose voice matches a profile at or "
        "above DIARIST_SPEAKER_MATCH_THRESHOLD gets its name in the transcript's `identities` and in every "
        "export; one profile names at most one speaker; an unknown voice stays unnamed. An id that is not "
        "this key's profile: 422 unknown_profile.")

    @field_validator("speaker_profiles", mode="before")
    @classmethod
    def _profiles(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "all":
            return "all"
        if isinstance(v, str):  # a form field: "spk_a,spk_b" or '["spk_a"]'
            text = v.strip()
            v = json.loads(text) if text.startswith("[") else [x.strip() for x in text.split(",") if x.strip()]
        if isinstance(v, list):
            if not v or len(v) > MAX_PROFILE_IDS or not all(isinstance(x, str) and 0 < len(x) <= 64 for x in v):
                raise ValueError(f"speaker_profiles must be 'all' or 1 to {MAX_PROFILE_IDS} profile ids")
            return list(dict.fromkeys(v))
        return v.strip() if isinstance(v, str) else v

    @field_validator("language")
    @classmethod
    def _language(cls, v: str | None) -> str | None:
        if v is None:
            return None
        code = v.strip().lower()
        if not re.fullmatch(r"[a-z]{2,3}", code):
            raise ValueError(f"language must be an ISO 639-1 code such as 'en', got {v!r}")
        return code

    @model_validator(mode="after")
    def _speakers(self) -> JobOptions:
        check_hints(self.num_speakers, self.min_speakers, self.max_speakers)  # ValueError: a 422
        if self.multichannel and self.speaker_profiles is not None:  # refused, not silently ignored
            raise ValueError("speaker_profiles names the voices of one mixed recording; a multichannel job "
                             "keeps no voices (each channel is one speaker): drop one of the two")
        return self

    def engine_options(self) -> dict[str, Any]:
        """The options the engine gets (:data:`diarist.contract.options.OPTION_FIELDS`) that are set."""
        return self.model_dump(include=set(OPTION_FIELDS), exclude_none=True)

    def stored_options(self) -> dict[str, Any]:
        """A job row's ``options``: :meth:`engine_options` and the service's own (``speaker_profiles``, which
        the worker applies after the engine returns) when set."""
        return self.engine_options() | self.model_dump(include={"speaker_profiles"}, exclude_none=True)


class JobFromUrl(JobOptions):
    """``POST /v1/jobs`` with a JSON body: the server fetches ``audio_url``."""

    audio_url: str = Field(..., max_length=4000, description="http(s) URL of the recording.")
    audio_headers: dict[str, str] | None = Field(None, description="Headers for the fetch, e.g. Authorization.")


class ErrorInfo(BaseModel):
    code: str
    message: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


Metrics = create_model(
    "Metrics",
    __doc__="A completed job's engine metrics (seconds, tokens), its finish reason, coverage and engine.",
    # the engine's metric fields, typed and described once (diarist.contract.result.EngineMetrics)
    **{f.name: (f.type, Field(None, description=f.metadata["doc"])) for f in fields(EngineMetrics)},
    finish_reason=(str | None, Field(None, description="why decoding ended; anything but stop may be cut short")),
    coverage=(float | None, Field(None, description="transcribed speech / detected speech, in [0, 1]")),
    engine_id=(str | None, Field(None, description="the engine server (or in-process engine) that ran it")),
)


class WebhookState(BaseModel):
    url: str = Field(..., description="The webhook_url without credentials, query string or fragment.")
    status: str | None = Field(None, description="pending | retrying | delivered | failed")
    last_status_code: int | None = None
    attempts: int = 0


class JobOut(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: Status
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    model: str
    queue: str
    filename: str | None = None
    duration: float | None = Field(None, description="audio seconds")
    progress: float = Field(0.0, description="0..1")
    attempts: int = 0
    options: dict[str, Any] = {}
    language: str | None = Field(None, description="The transcript's language, once completed (the request's "
                                 "hint is in `options`).")
    num_speakers: int | None = Field(None, description="Speakers found in the transcript, once completed (the "
                                     "request's hints are in `options`).")
    incomplete: bool = Field(False, description="The transcript may be cut short (finish_reason != stop).")
    error: ErrorInfo | None = None
    metrics: Metrics | None = None
    webhook: WebhookState | None = None

    @field_serializer("progress")
    def _progress(self, value: float) -> float:
        return served_progress(value)

    @classmethod
    def from_row(cls, job: Job, deliveries: int = 0) -> JobOut:
        m = job.metrics
        return cls(
            id=job.id, status=job.status, created_at=_utc(job.created_at), updated_at=_utc(job.updated_at),
            started_at=_utc(job.started_at), finished_at=_utc(job.finished_at), model=job.model, queue=job.queue,
            filename=redact_text(job.filename) if job.filename else None, duration=job.duration_s,
            progress=job.progress, attempts=job.attempts,
            options=job.options or {}, language=job.language, num_speakers=job.num_speakers,
            incomplete=job.incomplete,
            error=ErrorInfo(code=job.error_code, message=job.error_message) if job.error_code else None,
            metrics=Metrics(**{k: getattr(m, k) for k in Metrics.model_fields}) if m is not None else None,
            webhook=WebhookState(url=display_url(job.webhook_url), status=job.webhook_status,
                                 last_status_code=job.webhook_status_code, attempts=deliveries)
            if job.webhook_url else None,
        )


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobOut]
    has_more: bool
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next (older) page.")


def _utc(dt: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; every time we store is UTC.
    if dt is not None and dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt
