"""The FastAPI application: ``create_app(services)`` wires routes, error handlers and shared handles."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI

from api import admin, metrics
from api.routes import events, health, jobs, openai, speakers
from diarist.http import errors
from diarist.metrics import ServiceMetrics
from diarist.services import Services

DESCRIPTION = """Queue-backed speaker-attributed transcription.

Submit a recording with `POST /v1/jobs` (multipart `file`, or JSON `audio_url`), poll `GET /v1/jobs/{id}`
(or follow `GET /v1/jobs/{id}/events`, or pass a `webhook_url`), then fetch
`GET /v1/jobs/{id}/transcript?format=json|txt|srt|vtt|rttm`. Known speakers: enroll voices with
`POST /v1/speakers` and pass `speaker_profiles` to name them in transcripts. Times are seconds. Errors are JSON
`{"error": {"code", "message"}}`. `POST /v1/audio/transcriptions` is OpenAI-compatible.
"""


def create_app(services: Services, engine_ready: Callable[[], bool] | None = None) -> FastAPI:
    """The API over ``services`` (whose ``dispatcher`` must be set to accept jobs).

    ``engine_ready``: optional readiness probe of an in-process engine, reported by ``/readyz``.

    Raises:
        diarist.env_settings.InvalidSettings: a ``DIARIST_ADMIN_*`` variable does not validate (read here, at
            startup, rather than at the first ``/metrics`` or ``/readyz``).
    """
    import diarist
    from api.admin.config import get_admin_settings

    get_admin_settings()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Sync routes and SSE streams run on AnyIO worker threads (40 by default); every open SSE client
        # holds one, so a few dozen listeners would otherwise starve every other route.
        anyio.to_thread.current_default_thread_limiter().total_tokens = services.settings.api_threads
        yield

    app = FastAPI(title="Diarist", version=getattr(diarist, "__version__", "0.1.0"), description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.services = services
    app.state.engine_ready = engine_ready
    errors.install(app, retry_after_s=services.settings.retry_after_s)
    app.add_middleware(RequestMetrics, metrics=services.metrics)  # outermost: it sees the 500s too
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(events.router)
    app.include_router(openai.router)
    app.include_router(speakers.router)  # /v1/speakers, PATCH /v1/jobs/{id}/speakers
    app.include_router(admin.router)  # /admin dashboard
    app.include_router(metrics.router)  # /metrics
    return app


class RequestMetrics:
    """ASGI middleware: count each HTTP request and time it (until its last body byte is sent).

    The ``route`` label is the matched path template (``/v1/jobs/{job_id}``), so ids never become label
    values; a request that matched no route is ``unmatched``. An exception that escapes counts as 500.
    """

    def __init__(self, app: Any, metrics: ServiceMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), 500

        async def recording_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.record_http(scope["method"], route, status, time.perf_counter() - t0)
