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


def app_for(tmp_path, broker_up: bool = True):
    from api.app import create_app
    from diarist.services import Services
    from diarist.settings import Settings

    st = Settings.model_validate({**Settings().model_dump(), "embedded": False, "auth": False,
                                  "database_url": f"sqlite:///{tmp_path / 'db.sqlite3'}", "data_dir": tmp_path,
                                  "engine_url": "http://127.0.0.1:9"})
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
    assert body["checks"]["engine"] == "error: not answering: http://127.0.0.1:9"
    assert body["checks"]["database"] == body["checks"]["broker"] == "ok"


def test_broker_down_is_unavailable(tmp_path):
    svc, app = app_for(tmp_path, broker_up=False)
    try:
        with TestClient(app) as c:
            r = c.get("/readyz")
    finally:
        svc.close()
    assert r.status_code == 503 and r.json()["status"] == "unavailable"
    assert r.json()["checks"]["broker"].startswith("error: ConnectionError")


def test_random_weights_are_reported(tmp_path):
    """An engine on random weights is ready (it answers), but /readyz names it and warns."""
    svc, app = app_for(tmp_path)
    app.state.engine_stats = lambda: {"e1": {"random_weights": True}, "e2": {"random_weights": False}}
    try:
        with TestClient(app) as c:
            body = c.get("/readyz").json()
    finally:
        svc.close()
    assert body["random_weights"] == ["e1"]
    assert body["warnings"] == ["engine e1 runs random weights (load_format=dummy): its transcripts are noise"]


def test_real_weights_give_no_warning(tmp_path):
    svc, app = app_for(tmp_path)
    app.state.engine_stats = lambda: {"e1": {"random_weights": False}}
    try:
        with TestClient(app) as c:
            body = c.get("/readyz").json()
    finally:
        svc.close()
    assert "warnings" not in body and "random_weights" not in body and body["status"] == "ok"
