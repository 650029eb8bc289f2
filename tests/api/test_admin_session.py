"""Admin sessions across API processes: with DIARIST_ADMIN_SESSION_SECRET set (compose sets one), a login
made on one API instance is valid on another and after a restart; without it (and no webhook secret) each
process signs with its own random key, so the cookie is refused elsewhere."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.admin.config import get_admin_settings
from diarist.apikeys import create_key
from tests.api.conftest import services_with


@pytest.fixture
def make_api(stack, monkeypatch):
    from api.app import create_app

    clients = []

    def make() -> TestClient:  # a fresh app: another API replica, or the same one after a restart
        svc = services_with(stack, auth=True, webhook_secret=None)
        c = TestClient(create_app(svc), base_url="https://testserver", raise_server_exceptions=False)
        clients.append(c)
        return c

    yield make, create_key(stack.services.db, "session-admin", admin=True)
    for c in clients:
        c.close()
    get_admin_settings.cache_clear()


def _session_cookie(client: TestClient, token: str) -> dict:
    r = client.post("/admin/login", data={"api_key": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin"
    return dict(client.cookies)


@pytest.mark.parametrize("secret,carries", [("0123456789abcdef" * 4, True), (None, False)])
def test_a_login_carries_to_another_instance_only_with_a_shared_secret(make_api, monkeypatch, secret, carries):
    if secret is None:
        monkeypatch.delenv("DIARIST_ADMIN_SESSION_SECRET", raising=False)
    else:
        monkeypatch.setenv("DIARIST_ADMIN_SESSION_SECRET", secret)
    get_admin_settings.cache_clear()
    make, admin = make_api
    cookies = _session_cookie(make(), admin.token)
    other = make()
    other.cookies.update(cookies)
    r = other.get("/admin", follow_redirects=False)
    if carries:
        assert r.status_code == 200 and "session-admin" in r.text
    else:
        assert r.status_code == 303 and r.headers["location"] == "/admin/login"
