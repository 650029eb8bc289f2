"""Database tables (SQLAlchemy 2): jobs, job metrics, webhook outbox and deliveries, worker heartbeats, API keys,
voice profiles and their samples.

Times are timezone-aware UTC; durations are seconds. The schema is created by the Alembic migrations in
``migrations/`` (never by ``create_all`` outside tests), so it is identical on Postgres and SQLite.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """A sortable-enough, unguessable id like ``job_3f2a...`` (uuid4 hex)."""
    return f"{prefix}_{uuid.uuid4().hex}"


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict] = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class JobStatus(str, enum.Enum):
    """``queued → processing → completed | failed | canceled`` (docs/service.md)."""

    QUEUED = "queued"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def final(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELED)


FINAL_STATES = (JobStatus.COMPLETED.value, JobStatus.FAILED.value, JobStatus.CANCELED.value)


class ApiKey(Base):
    """A client credential. Only ``sha256(secret)`` is stored; ``prefix`` finds the row."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key"))
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(32), unique=True, index=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    # Signing secret for this key's webhooks (Standard Webhooks ``whsec_<base64>``); shown once at creation.
    webhook_secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Job(Base):
    """One transcription request and its lifecycle."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("owner_key", "idempotency_key", name="uq_jobs_owner_idempotency"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job"))
    # Owner for scoping: the API key id, or "" when auth is off (unique constraints ignore NULLs).
    owner_key: Mapped[str] = mapped_column(String(40), default="", index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), default=None)
    # SHA-256 of the request (model, options, webhook, audio; api.submit.request_fingerprint): a reused
    # Idempotency-Key replays the job only for the same request.
    request_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    source: Mapped[str] = mapped_column(String(16), default="upload")  # upload | url | openai
    filename: Mapped[str | None] = mapped_column(String(500), default=None)
    audio_key: Mapped[str | None] = mapped_column(String(500), default=None)
    audio_bytes: Mapped[int | None] = mapped_column(Integer, default=None)
    duration_s: Mapped[float | None] = mapped_column(Float, default=None)
    queue: Mapped[str] = mapped_column(String(32), default="transcribe.short")
    model: Mapped[str] = mapped_column(String(100), default="whisper")
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)

    progress: Mapped[float] = mapped_column(Float, default=0.0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    transcript_key: Mapped[str | None] = mapped_column(String(500), default=None)
    language: Mapped[str | None] = mapped_column(String(16), default=None)
    num_speakers: Mapped[int | None] = mapped_column(Integer, default=None)
    incomplete: Mapped[bool] = mapped_column(Boolean, default=False)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    error_message: Mapped[str | None] = mapped_column(Text, default=None)

    # The lease (docs/service.md, Fault tolerance: the row, not the broker, is the source of truth). An active job whose
    # ``lease_expires_at`` has passed is re-driven by the sweeper (worker/sweeper.py): a processing job's
    # worker renews it while it runs (so it passing means the worker died); a queued job's is the time by
    # which its message should have been picked up (so it passing means the message was lost).
    lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)  # the attempt holding it
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None, index=True)
    progress_at: Mapped[datetime | None] = mapped_column(default=None)  # last progress change (stall flag)
    # First time an attempt of this job was given back because a dependency was down; the job fails with
    # ``<dependency>_unavailable`` once this is older than ``outage_bound_s``. Cleared when the engine
    # returns a result.
    outage_since: Mapped[datetime | None] = mapped_column(default=None)

    webhook_url: Mapped[str | None] = mapped_column(Text, default=None)
    webhook_status: Mapped[str | None] = mapped_column(String(16), default=None)  # pending|delivered|failed
    webhook_status_code: Mapped[int | None] = mapped_column(Integer, default=None)

    metrics: Mapped[JobMetrics | None] = relationship(back_populates="job", cascade="all, delete-orphan",
                                                      uselist=False, lazy="selectin")
    deliveries: Mapped[list[WebhookDelivery]] = relationship(back_populates="job", cascade="all, delete-orphan",
                                                             order_by="WebhookDelivery.id")


class JobMetrics(Base):
    """Engine measurements of a completed job (seconds, tokens; RTF = processing_s / duration)."""

    __tablename__ = "job_metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    queue_wait_s: Mapped[float | None] = mapped_column(Float, default=None)
    encoder_s: Mapped[float | None] = mapped_column(Float, default=None)
    prefill_s: Mapped[float | None] = mapped_column(Float, default=None)
    decode_s: Mapped[float | None] = mapped_column(Float, default=None)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    output_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    processing_s: Mapped[float | None] = mapped_column(Float, default=None)
    rtf: Mapped[float | None] = mapped_column(Float, default=None)
    finish_reason: Mapped[str | None] = mapped_column(String(16), default=None)
    coverage: Mapped[float | None] = mapped_column(Float, default=None)
    engine_id: Mapped[str | None] = mapped_column(String(200), default=None)
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(back_populates="metrics")


class WebhookOutbox(Base):
    """One webhook message to send (the transactional outbox: written in the same transaction as the job's
    final transition, so a broker outage cannot lose it). ``id`` is the Standard Webhooks ``webhook-id``,
    stable across every retry and redelivery of the message.

    ``state``: ``pending`` (waiting for an attempt, due at ``next_attempt_at``) → ``sending`` (one worker
    holds it until ``locked_until``) → ``pending`` again (retry) | ``delivered`` | ``failed``. The sweeper
    re-sends a pending message that nobody picked up and frees a sending one whose worker died.
    """

    __tablename__ = "webhook_outbox"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("msg"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    locked_until: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WorkerBeat(Base):
    """A worker process's heartbeat (one row per process, written by its sweeper every sweep): the
    dashboard shows a worker as alive while ``seen_at`` is recent, and the engine as its worker saw it."""

    __tablename__ = "worker_beats"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # celery hostname + pid
    queues: Mapped[str] = mapped_column(String(200))
    engine_url: Mapped[str | None] = mapped_column(String(500), default=None)
    engine_ok: Mapped[bool | None] = mapped_column(Boolean, default=None)  # None: no engine (webhooks)
    running: Mapped[int] = mapped_column(Integer, default=0)  # jobs this process holds a lease on
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class WebhookDelivery(Base):
    """One attempt to deliver one webhook message (``message_id`` is stable across its retries)."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    message_id: Mapped[str] = mapped_column(String(40))
    attempt: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(Text)
    event: Mapped[str] = mapped_column(String(32))
    status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    duration_s: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(back_populates="deliveries")


class SpeakerProfile(Base):
    """A known voice of one API key (``owner_key``): a name and the embeddings of its samples.

    ``model`` is the embedding model that made every sample's vector (``campplus@<weights hash>``); a profile
    only matches voices of that model. ``vector`` is the samples' speech-weighted mean, L2-normalised
    (``diarist.speakers.profile_vector``), kept with the samples so that matching reads one row per profile.
    Names are unique per key (``uq_speaker_profiles_owner_name``): a transcript shows names, so two
    profiles of one name could never be told apart there. No audio is kept, only vectors.
    """

    __tablename__ = "speaker_profiles"
    __table_args__ = (UniqueConstraint("owner_key", "name", name="uq_speaker_profiles_owner_name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("spk"))
    owner_key: Mapped[str] = mapped_column(String(40), default="", index=True)
    name: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(100))
    vector: Mapped[list[float]] = mapped_column(JSON)
    sample_count: Mapped[int] = mapped_column(Integer, default=0)
    sample_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    samples: Mapped[list[SpeakerSample]] = relationship(back_populates="profile", cascade="all, delete-orphan",
                                                        order_by="SpeakerSample.id", lazy="selectin")


class SpeakerSample(Base):
    """One enrollment sample of a profile: its voice ``vector`` (unit length, the profile's ``model``),
    ``seconds`` of speech, and ``source`` (``upload``, or ``job:<job id>:<speaker>``)."""

    __tablename__ = "speaker_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    profile_id: Mapped[str] = mapped_column(ForeignKey("speaker_profiles.id", ondelete="CASCADE"), index=True)
    vector: Mapped[list[float]] = mapped_column(JSON)
    seconds: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    profile: Mapped[SpeakerProfile] = relationship(back_populates="samples")
