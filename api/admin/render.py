"""Jinja2 templates of the dashboard (``api/templates/admin``) and the filters they use for units."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from api.admin.queries import as_utc
from diarist.redact import display_url, redact_text
from diarist.speaker_timeline import clock

API_DIR = Path(__file__).resolve().parents[1]
STATIC_DIR = API_DIR / "static" / "admin"
templates = Jinja2Templates(directory=str(API_DIR / "templates"))
SPEAKER_COLORS = 8  # .spk-0 … .spk-7 in admin.css


def fmt_dt(dt: datetime | None) -> str:
    """``2026-11-29 09:12:03Z`` (UTC) or an en dash."""
    dt = as_utc(dt)
    return dt.strftime("%Y-%m-%d %H:%M:%SZ") if dt else "–"


def fmt_s(v: float | None) -> str:
    """Seconds for people: ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``1 h 02 min``."""
    if v is None:
        return "–"
    v = float(v)
    if v < 1:
        return f"{v * 1000:.0f} ms"
    if v < 60:
        return f"{v:.1f} s"
    if v < 3600:
        return f"{int(v // 60)} min {int(v % 60):02d} s"
    return f"{int(v // 3600)} h {int(v % 3600 // 60):02d} min"


def fmt_num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{float(v):.{digits}f}"


templates.env.filters.update(dt=fmt_dt, secs=fmt_s, num=fmt_num, clock=clock, url=display_url,
                            redact=redact_text)


def page(request: Request, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
    """Render ``admin/<name>`` with the request and ``ctx``; pages are never cached (they hold live data)."""
    resp = templates.TemplateResponse(request, f"admin/{name}", ctx, status_code=status_code)
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["Content-Security-Policy"] = ("default-src 'self'; img-src 'self' data:; style-src 'self'; "
                                               "script-src 'self'; frame-ancestors 'none'; form-action 'self'")
    return resp


def fragment(name: str, **ctx: Any) -> str:
    """Render a partial (no request needed) to a string, e.g. the overview's live block."""
    return templates.env.get_template(f"admin/{name}").render(**ctx)
