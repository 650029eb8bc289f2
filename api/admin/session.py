"""Who is using the dashboard: signed session cookies (set by the login form) or a Bearer admin key.

Cookie ``diarist_admin`` = ``<key_id>.<expires unix s>.<base64url HMAC-SHA256(secret, "key_id.expires")>``,
``HttpOnly``, ``SameSite=Strict``, ``Secure`` (unless ``DIARIST_ADMIN_COOKIE_SECURE=false``), path ``/admin``.
The key itself never leaves the login POST body: not in the cookie, not in a URL. Every request re-reads
the key row, so revoking a key or taking its admin role ends its sessions at once. Forms carry a CSRF
token bound to the session (HMAC of the cookie's signature); SameSite=Strict is the first line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from api.admin.config import get_admin_settings
from api.deps import bearer
from diarist.admin_actions import Actor
from diarist.apikeys import authenticate
from diarist.http.errors import ApiError
from diarist.models import ApiKey

log = logging.getLogger("diarist.admin")

COOKIE = "diarist_admin"
COOKIE_PATH = "/admin"


@dataclass(frozen=True)
class AdminUser:
    """An authenticated admin (``key_id`` None when auth is off: everyone is admin then)."""

    key_id: str | None
    name: str
    via: str  # cookie | bearer | open
    csrf: str
    remote_addr: str | None = None

    @property
    def actor(self) -> Actor:
        return Actor(key_id=self.key_id, name=self.name, remote_addr=self.remote_addr)


def _secret(request: Request) -> bytes:
    """The app's cookie key, chosen once per app (see :class:`api.admin.config.AdminSettings`)."""
    state = request.app.state
    key = getattr(state, "admin_session_secret", None)
    if key is None:
        conf = get_admin_settings()
        webhook_secret = request.app.state.services.settings.webhook_secret
        if conf.session_secret:
            key = conf.session_secret.encode()
        elif webhook_secret:
            # Domain-separated derivation, so the cookie key reveals nothing about the webhook key.
            key = hmac.new(webhook_secret.encode(), b"diarist-admin-session-v1", hashlib.sha256).digest()
        else:
            log.warning("DIARIST_ADMIN_SESSION_SECRET is not set: admin sessions end when this process restarts")
            key = secrets.token_bytes(32)
        state.admin_session_secret = key
    return key


def _sign(secret: bytes, payload: str) -> str:
    mac = hmac.new(secret, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def make_cookie(request: Request, key_id: str, now: float | None = None) -> tuple[str, int]:
    """``(cookie value, max_age seconds)`` for a fresh session of ``key_id``."""
    ttl = get_admin_settings().session_ttl_s
    payload = f"{key_id}.{int((now or time.time()) + ttl)}"
    return f"{payload}.{_sign(_secret(request), payload)}", ttl


def read_cookie(request: Request, value: str | None, now: float | None = None) -> str | None:
    """The key id of a valid, unexpired cookie, else None."""
    if not value or value.count(".") != 2:
        return None
    key_id, expires, sig = value.split(".")
    if not hmac.compare_digest(sig, _sign(_secret(request), f"{key_id}.{expires}")):
        return None
    if not expires.isdigit() or int(expires) < (now or time.time()):
        return None
    return key_id


def set_session(request: Request, response, key_id: str) -> None:  # response: a starlette Response
    value, ttl = make_cookie(request, key_id)
    response.set_cookie(COOKIE, value, max_age=ttl, path=COOKIE_PATH, httponly=True, samesite="strict",
                        secure=get_admin_settings().cookie_secure)


def clear_session(response) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict",
                           secure=get_admin_settings().cookie_secure)


def _csrf(request: Request, basis: str) -> str:
    return _sign(_secret(request), f"csrf.{basis}")[:32]


def check_csrf(request: Request, user: AdminUser, token: str | None) -> None:
    """403 unless the form's token matches the session (Bearer callers carry no ambient credential)."""
    if user.via == "bearer":
        return
    if not token or not hmac.compare_digest(token, user.csrf):
        raise ApiError(403, "csrf_failed", "the form is stale or forged: reload the page and try again")


def _live_admin(services, key_id: str) -> ApiKey | None:
    with services.db.session() as s:
        row = s.get(ApiKey, key_id)
        if row is None or row.revoked_at is not None:
            return None
        s.expunge(row)
        return row


def resolve(request: Request, creds: HTTPAuthorizationCredentials | None) -> AdminUser | None:
    """The admin behind this request, or None when not logged in. Raises 403 for a non-admin key."""
    services = request.app.state.services
    addr = request.client.host if request.client else None
    if not services.settings.auth_enabled:
        return AdminUser(key_id=None, name="anonymous (auth off)", via="open", csrf=_csrf(request, "open"),
                         remote_addr=addr)
    if creds is not None and creds.scheme.lower() == "bearer":
        key = authenticate(services.db, creds.credentials)
        if key is None:
            raise ApiError(401, "unauthorized", "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
        if not key.admin:
            raise ApiError(403, "forbidden", "the dashboard needs an admin key")
        return AdminUser(key_id=key.id, name=key.name, via="bearer", csrf="", remote_addr=addr)
    value = request.cookies.get(COOKIE)
    key_id = read_cookie(request, value)
    if key_id is None:
        return None
    key = _live_admin(services, key_id)
    if key is None or not key.admin:
        return None
    return AdminUser(key_id=key.id, name=key.name, via="cookie", csrf=_csrf(request, value.rsplit(".", 1)[1]),
                     remote_addr=addr)


def page_admin(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> AdminUser:
    """For HTML pages: a browser without a session is sent to the login form (303)."""
    user = resolve(request, creds)
    if user is None:
        raise ApiError(303, "login_required", "log in at /admin/login", headers={"Location": "/admin/login"})
    return user


def api_admin(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> AdminUser:
    """For JSON endpoints: 401 without a session or key."""
    user = resolve(request, creds)
    if user is None:
        raise ApiError(401, "unauthorized", "log in at /admin/login or send an admin Bearer key",
                       headers={"WWW-Authenticate": "Bearer"})
    return user


AdminPage = Annotated[AdminUser, Depends(page_admin)]
AdminApi = Annotated[AdminUser, Depends(api_admin)]
