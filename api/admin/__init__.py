"""The admin dashboard (``/admin``): one router for ``create_app`` to include (``/metrics`` is ``api.metrics``).

Pages are server-rendered (Jinja2, ``api/templates/admin``) with small local JS and CSS and the vendored
uPlot (``api/static/admin``); nothing is loaded from another origin. Only admin keys get in (a login form
that sets a signed session cookie, or a Bearer admin key); every action is written to the audit log.
"""

from __future__ import annotations

from fastapi import APIRouter

from api.admin import job_views, views

router = APIRouter()
router.include_router(views.router)
router.include_router(job_views.router)
