"""Dashboard pages: login/logout, overview (+ its live JSON), audit log, and the local static assets."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

from api.admin import engines, queries, readiness, series
from api.admin.config import get_admin_settings
from api.admin.render import STATIC_DIR, fragment, page
from api.admin.session import AdminApi, AdminPage, check_csrf, clear_session, resolve, set_session
from diarist import audit
from diarist.apikeys import authenticate
from diarist.http.errors import ApiError

router = APIRouter(prefix="/admin", include_in_schema=False)

STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".png": "image/png",
                ".ico": "image/x-icon", ".md": "text/plain", "": "text/plain"}


def _addr(request: Request) -> str | None:
    return request.client.host if request.client else None


@router.get("/login")
def login_form(request: Request) -> Response:
    try:
        if resolve(request, None) is not None:
            return RedirectResponse("/admin", status_code=303)
    except ApiError:
        pass
    return page(request, "login.html", user=None)


@router.post("/login")
def login(request: Request, api_key: Annotated[str, Form(max_length=200)] = "") -> Response:
    """Check the key from the form body; an admin key gets a session cookie and goes to the overview."""
    services = request.app.state.services
    if not services.settings.auth_enabled:
        return RedirectResponse("/admin", status_code=303)
    key = authenticate(services.db, api_key.strip()) if api_key.strip() else None
    if key is None:
        audit.record(services.db, action="login", outcome="denied", detail="invalid or revoked key",
                     remote_addr=_addr(request))
        return page(request, "login.html", status_code=401, user=None, error="That key is not valid.")
    if not key.admin:
        audit.record(services.db, action="login", outcome="denied", actor_key_id=key.id, actor_name=key.name,
                     detail="not an admin key", remote_addr=_addr(request))
        return page(request, "message.html", status_code=403, user=None, title="Forbidden",
                    message=f"The key “{key.name}” is not an admin key. The dashboard needs one "
                            "(diarist keys create --name NAME --admin).")
    audit.record(services.db, action="login", outcome="ok", actor_key_id=key.id, actor_name=key.name,
                 remote_addr=_addr(request))
    resp = RedirectResponse("/admin", status_code=303)
    set_session(request, resp, key.id)
    return resp


@router.post("/logout")
def logout(request: Request, user: AdminPage, csrf: Annotated[str, Form()] = "") -> Response:
    check_csrf(request, user, csrf)
    audit.record(request.app.state.services.db, action="logout", outcome="ok", actor_key_id=user.key_id,
                 actor_name=user.name, remote_addr=user.remote_addr)
    resp = RedirectResponse("/admin/login", status_code=303)
    clear_session(resp)
    return resp


def _live(request: Request) -> dict:
    st = request.app.state.services.settings
    data = queries.overview(request.app.state.services.db, stall_after_s=st.stall_after_s,
                            worker_alive_s=st.worker_beat_bound_s)
    data["engines"] = engines.summary(engines.engine_stats(request.app))
    # what /readyz found, with the errors it keeps from unauthenticated callers (driver messages, hosts)
    found = readiness.readiness(request, request.app.state.services)
    data["readiness"] = {"status": found.status, "checks": found.details, "random_weights": found.random_weights}
    data["series"] = series.last_hour(request.app.state.services.db)
    return data


@router.get("")
async def overview(request: Request, user: AdminPage) -> Response:
    data = await run_in_threadpool(_live, request)
    return page(request, "overview.html", user=user, data=data, refresh_ms=int(get_admin_settings().refresh_s * 1000))


@router.get("/api/overview")
async def overview_json(request: Request, user: AdminApi, html: bool = False) -> JSONResponse:
    """Every overview number (and the chart series); ``html=1`` adds the rendered live block for the page."""
    data = await run_in_threadpool(_live, request)
    if html:
        data["html"] = fragment("_live.html", data=data)
    return JSONResponse(data, headers={"Cache-Control": "no-store"})


@router.get("/audit")
def audit_log(request: Request, user: AdminPage, target: str | None = None) -> Response:
    rows = audit.recent(request.app.state.services.db, limit=200, target_id=target or None)
    return page(request, "audit.html", user=user, rows=rows, target=target or "")


@router.get("/static/{path:path}")
def static(path: str) -> Response:
    """Files under ``api/static/admin`` only (no directory listing, no way out of the folder)."""
    root = STATIC_DIR.resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise ApiError(404, "not_found", f"no static file {path}")
    return FileResponse(target, media_type=STATIC_TYPES.get(target.suffix, "application/octet-stream"),
                        headers={"Cache-Control": "public, max-age=3600"})
