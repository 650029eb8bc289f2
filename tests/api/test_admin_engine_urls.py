"""``DIARIST_ADMIN_ENGINE_URLS`` (the engines ``/readyz``, ``/metrics`` and the dashboard look at): read at
startup in the forms of ``DIARIST_ENGINE_URL``; a bad value stops the API with an error naming it, and a
failed look at the engines is reported, never a dropped check or a 500."""

from __future__ import annotations

import contextlib
import json

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.admin.config import get_admin_settings
from diarist.env_settings import InvalidSettings
from tests.servers import QuietHandler, serve_http

DOWN = ("http://127.0.0.1:9", "http://127.0.0.1:10")  # discard and an unassigned port: nothing answers


@pytest.fixture
def admin_env(monkeypatch):
    """Set ``DIARIST_ADMIN_ENGINE_URLS`` for one test; the cached admin settings are re-read around it."""
    def set_urls(raw: str) -> None:
        monkeypatch.setenv("DIARIST_ADMIN_ENGINE_URLS", raw)
        get_admin_settings.cache_clear()

    get_admin_settings.cache_clear()
    yield set_urls
    monkeypatch.delenv("DIARIST_ADMIN_ENGINE_URLS", raising=False)
    get_admin_settings.cache_clear()


def services_for(tmp_path):
    from diarist.services import Services
    from diarist.settings import Settings

    st = Settings.model_validate({**Settings().model_dump(), "embedded": False, "auth": False,
                                  "database_url": f"sqlite:///{tmp_path / 'db.sqlite3'}", "data_dir": tmp_path,
                                  "engine_url": "http://127.0.0.1:9"})
    return Services.from_settings(st, migrate=True)


class Broker:
    def ping(self) -> None:
        return None


def readyz_and_metrics(tmp_path):
    """``GET /readyz`` and ``GET /metrics`` of an app over :func:`services_for` with a broker that answers
    (so only the engines can make it degraded), read with the admin settings of the moment."""
    from api.app import create_app

    svc = services_for(tmp_path)
    svc.dispatcher = Broker()
    try:
        with TestClient(create_app(svc)) as c:
            return c.get("/readyz"), c.get("/metrics")
    finally:
        svc.close()


def readiness_log(caplog) -> list[str]:
    """The ``readiness: ...`` lines the API logged (where /readyz's details go)."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("readiness: ")]


def test_comma_separated_engines_are_checked_by_readyz_and_metrics(tmp_path, admin_env, caplog):
    admin_env(f"{DOWN[0]}, {DOWN[1]}/")
    caplog.set_level("INFO", logger="diarist.api")
    ready, metrics = readyz_and_metrics(tmp_path)
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"
    assert ready.json()["checks"]["engine"] == "error"
    assert readiness_log(caplog) == [f"readiness: engine error: not answering: {DOWN[1]}, {DOWN[0]}"]  # sorted
    assert metrics.status_code == 200
    up = {s.labels["engine"]: s.value for f in text_string_to_metric_families(metrics.text)
          if f.name == "diarist_engine_up" for s in f.samples}
    assert up == {DOWN[0]: 0.0, DOWN[1]: 0.0}


@pytest.mark.parametrize("raw", ["127.0.0.1:8100", '["http://127.0.0.1:8100"', '{"a": "http://x:1"}'])
def test_a_bad_value_stops_the_api_at_startup_naming_the_variable(tmp_path, admin_env, raw):
    from api.app import create_app

    admin_env(raw)
    svc = services_for(tmp_path)
    try:
        with pytest.raises(InvalidSettings) as e:
            create_app(svc)
    finally:
        svc.close()
    assert e.value.variables == ["DIARIST_ADMIN_ENGINE_URLS"]
    assert str(e.value).startswith("DIARIST_ADMIN_ENGINE_URLS: ")


def test_diarist_serve_refuses_a_bad_value_before_listening(admin_env, capsys, monkeypatch):
    import uvicorn

    from cli.main import main

    def serve(*_a, **_k):
        raise AssertionError("diarist serve started listening with a bad DIARIST_ADMIN_ENGINE_URLS")

    monkeypatch.setattr(uvicorn, "run", serve)
    admin_env("gpu-0:8100")
    assert main(["serve", "--port", "9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diarist: error: invalid_setting: DIARIST_ADMIN_ENGINE_URLS: ")
    assert "http:// or https:// with a host" in err and "Traceback" not in err


def test_a_failed_look_at_the_engines_is_reported_not_dropped(tmp_path, admin_env, monkeypatch, caplog):
    """Whatever goes wrong reading the engines' stats, /readyz says so under ``engine`` and /metrics answers
    (without engine series)."""
    from api.admin import engines

    def broken(_app):
        raise RuntimeError("stats table corrupt")

    admin_env(DOWN[0])
    monkeypatch.setattr(engines, "engine_stats", broken)
    caplog.set_level("INFO", logger="diarist.api")
    ready, metrics = readyz_and_metrics(tmp_path)
    assert ready.json()["status"] == "degraded"
    assert ready.json()["checks"]["engine"] == "error"
    assert readiness_log(caplog) == ["readiness: engine error: RuntimeError: stats table corrupt"]
    assert metrics.status_code == 200 and "diarist_jobs{" in metrics.text
    assert "diarist_engine_up{" not in metrics.text


@contextlib.contextmanager
def stats_server(stats: dict):
    """A loopback engine server stand-in answering ``GET /stats`` with ``stats``; yields its base URL."""
    body = json.dumps(stats).encode()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.reply(200 if self.path == "/stats" else 404, body, "application/json")

    with serve_http(Handler) as url:
        yield url


def test_an_engine_is_one_series_labelled_by_its_url_up_and_down(tmp_path, admin_env, monkeypatch):
    """M5: ``diarist_engine_up`` keeps the configured URL as its ``engine`` label when the engine goes down, so
    an alert on ``== 0`` sees the same series; the engine's own id is only a label of ``diarist_engine_info``."""
    from api.admin import engines
    from api.app import create_app

    monkeypatch.setattr(engines, "CACHE_S", 0.0)  # every scrape asks the engines again
    engines._cache.clear()

    def scrape(c) -> dict:
        return {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}

    svc = services_for(tmp_path)
    svc.dispatcher = Broker()
    try:
        with stats_server({"engine_id": "gpu-host:8100:cuda:0", "model": "whisper", "device": "cuda:0",
                           "running_requests": 2, "waiting_requests": 0}) as url:
            admin_env(url)
            with TestClient(create_app(svc)) as c:
                up_fams = scrape(c)
                summary_up = engines.summary(engines.engine_stats(c.app))
        with TestClient(create_app(svc)) as c:  # the server is gone: the same URL, now down
            down_fams = scrape(c)
            summary_down = engines.summary(engines.engine_stats(c.app))
    finally:
        svc.close()
        engines._cache.clear()

    def series(fams, name):
        return {tuple(sorted(s.labels.items())): s.value for s in fams[name].samples} if name in fams else {}

    assert series(up_fams, "diarist_engine_up") == {(("engine", url),): 1.0}
    assert series(down_fams, "diarist_engine_up") == {(("engine", url),): 0.0}
    assert series(up_fams, "diarist_engine_running_requests") == {(("engine", url),): 2.0}
    assert series(up_fams, "diarist_engine_info") == {
        (("device", "cuda:0"), ("engine", url), ("engine_id", "gpu-host:8100:cuda:0"), ("model", "whisper")): 1.0}
    assert series(down_fams, "diarist_engine_info") == {}  # a down engine reports no id
    assert [(r["id"], r["engine_id"], r["up"]) for r in summary_up] == [(url, "gpu-host:8100:cuda:0", True)]
    assert [(r["id"], r["engine_id"], r["up"]) for r in summary_down] == [(url, None, False)]
