"""Dashboard job pages: the filtered table, one job's detail, and confirmed, audited actions."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select

from api.admin import listing, queries, timeline
from api.admin.config import get_admin_settings
from api.admin.render import SPEAKER_COLORS, page
from api.admin.session import AdminPage, check_csrf
from api.schemas import TranscriptFormat
from diarist import admin_actions, audit
from diarist.formats import render
from diarist.models import Job, SpeakerProfile, WebhookDelivery
from diarist.speaker_timeline import SpeakerTimeline
from diarist.storage import ObjectNotFound
from diarist.transcript import Transcript

router = APIRouter(prefix="/admin/jobs", include_in_schema=False)

PREVIEW_SEGMENTS = 300
JobPath = Annotated[str, Path(max_length=64)]
ACTION_TEXT = {
    "cancel": ("Cancel", "The job stops: a queued job never runs, a running one ends at its next progress update."),
    "retry": ("Retry", "The failed job goes back to its queue with a fresh attempt count and runs again."),
    "delete": ("Delete", "The job, its audio, transcript, metrics and webhook log are deleted for good."),
    "redeliver": ("Redeliver webhook", "The final-state webhook is sent again as a new message."),
}


@router.get("")
def jobs_table(request: Request, user: AdminPage, status: str = "", cls: str = "", key: str = "",
               range_: Annotated[str, Query(alias="range")] = "", since: str = "", until: str = "", q: str = "",
               page_no: Annotated[int, Query(alias="page", ge=1, le=1_000_000)] = 1,
               flash: Annotated[str, Query(max_length=300)] = "") -> Response:
    db = request.app.state.services.db
    f = listing.Filters(status=status, cls=cls, key=key, range=range_, since=since, until=until, q=q).clean()
    result = listing.job_page(db, f, page_no, get_admin_settings().page_size)
    base = f.query()

    def link(n: int) -> str:
        return "/admin/jobs?" + urlencode({**base, "page": n})

    return page(request, "jobs.html", user=user, f=f, result=result, keys=queries.key_names(db), link=link,
                statuses=listing.STATUSES, ranges=list(listing.RANGES), class_of=queries.class_of, flash=flash)


def _transcript(services: Any, job: Job) -> tuple[Transcript | None, str | None]:
    if job.status != "completed" or not job.transcript_key:
        return None, None
    try:
        return Transcript.model_validate_json(services.store.get_bytes(job.transcript_key)), None
    except ObjectNotFound:
        return None, "the transcript object is missing from the store"
    except ValueError as e:
        return None, f"the transcript could not be read: {e}"


def _incomplete_reason(job: Job, tr: Transcript | None) -> str | None:
    if tr is not None and tr.incomplete_reason:
        return tr.incomplete_reason
    m = job.metrics
    if m is not None and m.finish_reason not in (None, "stop"):
        return f"decoding ended with finish_reason={m.finish_reason}"
    return "the transcript is marked incomplete" if job.incomplete else None


def _detail(request: Request, job_id: str) -> dict[str, Any] | None:
    services = request.app.state.services
    with services.db.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            return None
        deliveries = list(s.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
                                    .order_by(WebhookDelivery.id)))
        # the owner key's voice profiles (names and sample counts; vectors are never shown)
        profiles = list(s.scalars(select(SpeakerProfile).where(SpeakerProfile.owner_key == job.owner_key)
                                  .order_by(SpeakerProfile.name)))
        _ = job.metrics
        s.expunge_all()
    tr, tr_error = _transcript(services, job)
    speakers = {sp: i % SPEAKER_COLORS for i, sp in enumerate(tr.speakers)} if tr else {}
    return {"job": job, "m": job.metrics, "deliveries": deliveries, "transcript": tr, "transcript_error": tr_error,
            "segments": tr.segments[:PREVIEW_SEGMENTS] if tr else [], "speakers": speakers,
            "speaker_timeline": SpeakerTimeline.of(tr).to_json() if tr else None,
            "incomplete_reason": _incomplete_reason(job, tr), "cls": queries.class_of(job.queue),
            "owner": queries.key_names(services.db).get(job.owner_key, job.owner_key or "(auth off)"),
            "bar": timeline.bar(timeline.phases(job, job.metrics)), "allowed": admin_actions.allowed(job),
            "audit": audit.recent(services.db, limit=50, target_id=job_id), "profiles": profiles,
            "identities": (tr.identities or {}) if tr else {}}


def _missing(request: Request, user: Any, job_id: str) -> Response:
    return page(request, "message.html", status_code=404, user=user, title="Not found",
                message=f"No job {job_id} (it may have been deleted).")


@router.get("/{job_id}")
async def job_detail(request: Request, user: AdminPage, job_id: JobPath,
                     flash: Annotated[str, Query(max_length=300)] = "") -> Response:
    ctx = await run_in_threadpool(_detail, request, job_id)
    if ctx is None:
        return _missing(request, user, job_id)
    return page(request, "job.html", user=user, flash=flash, **ctx)


@router.get("/{job_id}/transcript")
def transcript(request: Request, user: AdminPage, job_id: JobPath,
               format: Annotated[TranscriptFormat, Query()] = "txt") -> Response:
    """The whole transcript in a format (the public route needs the owner's Bearer key)."""
    with request.app.state.services.db.session() as s:
        job = s.get(Job, job_id)
        if job is not None:
            s.expunge(job)
    tr, _err = _transcript(request.app.state.services, job) if job is not None else (None, None)
    if tr is None:
        return _missing(request, user, job_id)
    content, media_type = render(tr, format, file_id=job_id)
    return Response(content, media_type=media_type)


@router.get("/{job_id}/confirm/{action}")
def confirm(request: Request, user: AdminPage, job_id: JobPath, action: str) -> Response:
    """The confirmation step: what the action will do, and a POST button (nothing happens on GET)."""
    if action not in ACTION_TEXT:
        return page(request, "message.html", status_code=404, user=user, title="Not found",
                    message=f"No action {action!r}.")
    with request.app.state.services.db.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            return _missing(request, user, job_id)
        s.expunge(job)
    label, what = ACTION_TEXT[action]
    return page(request, "confirm.html", user=user, job=job, action=action, label=label, what=what,
                allowed=admin_actions.allowed(job)[action])


@router.post("/{job_id}/{action}")
def act(request: Request, user: AdminPage, job_id: JobPath, action: str,
        csrf: Annotated[str, Form()] = "") -> Response:
    """Perform a confirmed action (audited, whatever its outcome), then show the job (or the table)."""
    check_csrf(request, user, csrf)
    if action not in ACTION_TEXT:
        return page(request, "message.html", status_code=404, user=user, title="Not found",
                    message=f"No action {action!r}.")
    out = admin_actions.perform(request.app.state.services, user.actor, action, job_id)
    flash = f"{ACTION_TEXT[action][0]}: {out.state} — {out.message}"[:280]
    if action == "delete" and out.state == "ok":
        return RedirectResponse("/admin/jobs?" + urlencode({"flash": flash}), status_code=303)
    return RedirectResponse(f"/admin/jobs/{job_id}?" + urlencode({"flash": flash}), status_code=303)
