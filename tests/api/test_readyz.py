"""``/readyz`` reports the engine servers: down is ``degraded`` (200: jobs are still accepted and wait),
while a dependency the API itself needs answers 503."""

from __future__ import annotations

from fastapi.testclient import TestClient


class Broker:
    def __init__(self, up: bool = True) -> None:
        self.up = up

    def ping(self) -> None:
        if not self.up:
            raise ConnectionError("broker down")


def app_for(tmp_path, broker_up: bool = True, **settings):
    from api.app import create_app
    from diarist.services import Services
    from diarist.settings import Settings

    st = Settings.model_validate({**Settings().model_dump(), "embedded": False, "auth": False,
                                  "database_url": f"sqlite:///{tmp_path / 'db.sqlite3'}", "data_dir": tmp_path,
                                  "engine_url": "http://127.0.0.1:9", **settings})
    svc = Services.from_settings(st, migrate=True)
    svc.dispatcher = Broker(broker_up)
    return svc, create_app(svc)


def test_engine_server_down_is_degraded_not_unavailable(tmp_path):
    svc, app = app_for(tmp_path)
    try:
        with TestClient(app) as c:
            r = c.get("/readyz")
    finally:
        svc.close()
    body = r.json()
    assert r.status_code == 200 and body["status"] == "degraded"
    assert body["checks"]["engine"] == "error"
    assert body["checks"]["database"] == body["checks"]["broker"] == "ok"


def test_broker_down_is_unavailable(tmp_path):
    svc, app = app_for(tmp_path, broker_up=False)
    try:
        with TestClient(app) as c:
            r = c.get("/readyz")
    finally:
        svc.close()
    assert r.status_code == 503 and r.json()["status"] == "unavailable"
    assert r.json()["checks"]["broker"] == "error"


def test_random_weights_are_reported(tmp_path):
    """An engine on random weights is ready (it answers), but /readyz names it and warns."""
    svc, app = app_for(tmp_path)
    app.state.engine_stats = lambda: {"e1": {"random_weights": True}, "e2": {"random_weights": False}}
    try:
        with TestClient(app) as c:
            body = c.get("/readyz").json()
    finally:
        svc.close()
    assert body["random_weights"] is True
    assert body["warnings"] == ["1 engine runs random weights (load_format=dummy): transcripts are noise"]


def test_real_weights_give_no_warning(tmp_path):
    svc, app = app_for(tmp_path)
    app.state.engine_stats = lambda: {"e1": {"random_weights": False}}
    try:
        with TestClient(app) as c:
            body = c.get("/readyz").json()
    finally:
        svc.close()
    assert "warnings" not in body and "random_weights" not in body and body["status"] == "ok"


class LeakyBroker:
    def ping(self) -> None:
        raise ConnectionError("Error 111 connecting to redis-secret.internal:6390. Connection refused.")


def test_unauthenticated_readyz_names_no_host_and_the_details_go_to_the_log_and_the_admin_view(tmp_path, caplog):
    """Issue 33 item 13: the unauthenticated answer is component states only; the driver's message (host,
    port) and the engine servers' addresses are logged once per change and shown on the admin overview."""
    import logging

    from diarist.apikeys import create_key

    svc, app = app_for(tmp_path, auth=True)
    svc.dispatcher = LeakyBroker()
    admin = create_key(svc.db, "ops", admin=True)
    caplog.set_level(logging.INFO, logger="diarist.api")
    try:
        with TestClient(app) as c:
            first, second = c.get("/readyz"), c.get("/readyz")
            overview = c.get("/admin/api/overview", headers={"Authorization": f"Bearer {admin.token}"})
    finally:
        svc.close()
    assert first.status_code == 503
    assert first.json() == {"status": "unavailable",
                            "checks": {"database": "ok", "object_store": "ok", "broker": "error", "engine": "error"}}
    for leak in ("redis-secret", "6390", "127.0.0.1", "ConnectionError", str(tmp_path)):
        assert leak not in first.text and leak not in second.text
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("readiness: ")]
    assert len([m for m in logged if "redis-secret.internal:6390" in m]) == 1  # once per change, not per probe
    assert any("http://127.0.0.1:9" in m for m in logged)
    assert overview.status_code == 200, overview.text
    checks = overview.json()["readiness"]["checks"]
    assert "redis-secret.internal:6390" in checks["broker"] and "http://127.0.0.1:9" in checks["engine"]
