"""``GET /v1/jobs/{id}/events``: Server-Sent Events with the job's status, progress, text deltas, segments.

Events (``event:`` name, JSON ``data``): ``status`` {status, progress, error}, ``stage`` {stage} (the
pipeline stage that begins: :data:`diarist.contract.events.STAGES`), ``progress`` {progress}, ``delta``
{text}, ``segment`` {start, end, text}. The stream starts with the current status and ends after
the final one. Live events come from the event bus; the row is re-read every second so a missed bus
message (late subscription, Redis hiccup) never leaves a client waiting forever.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.sse import EventSourceResponse, ServerSentEvent

from api.deps import JobId, PrincipalDep, ServicesDep, load_job
from api.routes.jobs import ERRORS
from api.schemas import served_progress
from diarist.events import StatusEvent, Subscription
from diarist.models import FINAL_STATES, Job
from diarist.services import Services
from diarist.times import round_seconds

router = APIRouter(tags=["jobs"])

POLL_S = 1.0


class _Stream:
    """The subscription is opened before the row is read, so no event falls between the two."""

    def __init__(self, services: Services, job: Job, sub: Subscription) -> None:
        self.services, self.job, self.sub = services, job, sub


def open_stream(job_id: JobId, services: ServicesDep, principal: PrincipalDep) -> Iterator[_Stream]:
    sub = services.bus.subscribe(job_id)
    try:
        job = load_job(services, principal, job_id)  # 404 before any byte is streamed
        yield _Stream(services, job, sub)
    finally:
        sub.close()


SECONDS_FIELDS = {"segment": ("start", "end")}
"""Fields of a bus event, by type, that are times in seconds: served rounded to the millisecond."""


def _served(ev: dict) -> dict:
    """``ev`` as clients get it: its times rounded (:func:`diarist.times.round_seconds`) and its
    ``progress`` too (:func:`api.schemas.served_progress`), once, here, for every stream that reads
    :func:`job_events` (this route and the OpenAI-compatible one)."""
    fields = SECONDS_FIELDS.get(ev.get("type"), ())
    out = {**ev, **{k: round_seconds(v) for k in fields if isinstance(v := ev.get(k), (int, float))}}
    if isinstance(p := ev.get("progress"), (int, float)):
        out["progress"] = served_progress(p)
    return out


def job_events(services: Services, job: Job, sub: Subscription, ticks: bool = False) -> Iterator[dict]:
    """Bus events for one job until its final status (a blocking iterator; run it in a thread); times in
    seconds come rounded to the millisecond (:data:`SECONDS_FIELDS`), progress to
    :data:`api.schemas.PROGRESS_DECIMALS`.

    ``ticks``: also yield ``{"type": "tick"}`` after each quiet second (lets a caller enforce a deadline).
    """
    for ev in _bus_events(services, job, sub, ticks):
        yield _served(ev)


def _bus_events(services: Services, job: Job, sub: Subscription, ticks: bool) -> Iterator[dict]:
    """:func:`job_events` before :func:`_served`."""
    yield StatusEvent.of(job).to_json()
    status = job.status
    while status not in FINAL_STATES:
        ev = sub.get(timeout=POLL_S)
        if ev is None:
            with services.db.session() as s:
                row = s.get(Job, job.id)
                if row is None:
                    yield StatusEvent("canceled", 0.0, "deleted", "the job was deleted").to_json()
                    return
                if row.status != status:
                    status = row.status
                    yield StatusEvent.of(row).to_json()
                elif ticks:
                    yield {"type": "tick"}
            continue
        if ev.get("type") == "status":
            if ev.get("status") == status and status != "processing":
                continue
            status = ev.get("status", status)
        yield ev


@router.get("/v1/jobs/{job_id}/events", response_class=EventSourceResponse, responses=ERRORS,
            summary="Live job events (SSE): status, stage, progress, delta, segment")
def stream_job_events(stream: Annotated[_Stream, Depends(open_stream)]) -> Iterator[ServerSentEvent]:
    for ev in job_events(stream.services, stream.job, stream.sub):
        yield ServerSentEvent(event=ev["type"], data={k: v for k, v in ev.items() if k != "type"})
