"""Structured logs (diarist/logs.py): JSON lines, the job id on every line about a job, redaction, and one
traceback for an unexpected error, none for an expected one (through a real uvicorn server)."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import socket
import threading
import time

import httpx
import pytest

from diarist.logs import configure_logging, current_job_id, job_context, make_handler


@pytest.fixture
def capture():
    """``capture(fmt)`` → a buffer receiving what the service's root handler writes (the root at DEBUG)."""
    root = logging.getLogger()
    level, handlers = root.level, []

    def make(fmt: str = "json") -> io.StringIO:
        buf = io.StringIO()
        h = make_handler(fmt, buf)
        root.addHandler(h)
        handlers.append(h)
        root.setLevel(logging.DEBUG)
        return buf

    yield make
    for h in handlers:
        root.removeHandler(h)
    root.setLevel(level)


def lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in buf.getvalue().splitlines() if x.strip()]


def test_every_line_inside_a_job_context_carries_the_job_id(capture):
    buf = capture("json")
    log = logging.getLogger("diarist.test.anywhere")
    log.info("before")
    with job_context("job_abc"):
        log.warning("retrying in %d s", 2)
        ctx = contextvars.copy_context()
        t = threading.Thread(target=ctx.run, args=(lambda: logging.getLogger("x.thread").info("in a thread"),))
        t.start()
        t.join()
        assert current_job_id() == "job_abc"
    log.info("after", extra={"job_id": "job_explicit"})
    out = lines(buf)
    assert [(o["message"], o.get("job_id")) for o in out] == [
        ("before", None), ("retrying in 2 s", "job_abc"), ("in a thread", "job_abc"), ("after", "job_explicit")]
    assert out[1]["level"] == "WARNING" and out[1]["logger"] == "diarist.test.anywhere"
    assert out[1]["ts"].endswith("+00:00")
    assert current_job_id() is None


def test_celery_task_lines_carry_the_job_they_run(capture):
    """Celery logs "received" and "succeeded" outside our context, with the task arguments in a dict."""
    buf = capture("json")
    jid = "job_" + "ab" * 16
    logging.getLogger("celery.worker.strategy").info("Task %(name)s[%(id)s] received",
                                                     {"id": "t-1", "name": "diarist.transcribe", "args": f"['{jid}']"})
    logging.getLogger("celery.app.trace").info("Task %(name)s[%(id)s] succeeded: %(return_value)s",
                                               {"id": "t-1", "name": "x", "return_value": "'ok'", "args": "()"})
    logging.getLogger("diarist.api").error("enqueue failed for %s", jid)
    out = lines(buf)
    assert out[0]["message"] == "Task diarist.transcribe[t-1] received" and out[0]["job_id"] == jid
    assert "job_id" not in out[1]  # a task of no job
    assert out[2]["job_id"] == jid


def test_text_format_tags_the_job(capture):
    buf = capture("text")
    with job_context("job_t"):
        logging.getLogger("diarist.worker").info("claimed")
    assert buf.getvalue().rstrip().endswith("INFO diarist.worker [job_t] claimed")


def test_urls_are_redacted_and_access_lines_lose_their_query(capture, monkeypatch):
    for name in ("uvicorn", "uvicorn.access"):  # as configure_logging leaves them (a uvicorn run elsewhere may not)
        lg = logging.getLogger(name)
        monkeypatch.setattr(lg, "propagate", True)
        monkeypatch.setattr(lg, "disabled", False)
        monkeypatch.setattr(lg, "level", logging.NOTSET)
        monkeypatch.setattr(lg, "handlers", [])
    buf = capture("json")
    logging.getLogger("httpx").warning('HTTP Request: POST https://h.example/hook?token=SEKRIT "HTTP/1.1 500"')
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "POST",
                                             "/internal/transcribe?options=%7B%22prompt%22%3A%22SEKRIT%22%7D", "1.1",
                                             200)
    try:
        raise ValueError("fetch of https://u:SEKRIT@h.example/a.wav failed")
    except ValueError:
        logging.getLogger("diarist.api").exception("boom")
    text = buf.getvalue()
    assert "SEKRIT" not in text
    out = lines(buf)
    assert out[0]["message"] == 'HTTP Request: POST https://h.example/hook "HTTP/1.1 500"'
    assert out[1]["message"] == '127.0.0.1:5 - "POST /internal/transcribe HTTP/1.1" 200'
    assert "https://h.example/a.wav" in out[2]["exc"] and out[2]["exc"].count("Traceback") == 1


def test_configure_logging_is_idempotent_and_routes_uvicorn(monkeypatch):
    from diarist import logs

    root = logging.getLogger()
    before = list(root.handlers)
    monkeypatch.setattr(root, "level", root.level)
    for name in (*logs._ROUTED, *logs._QUIET):  # restored after the test: other tests' loggers stay as they were
        lg = logging.getLogger(name)
        for attr in ("level", "propagate", "disabled"):
            monkeypatch.setattr(lg, attr, getattr(lg, attr))
        monkeypatch.setattr(lg, "handlers", list(lg.handlers))  # a copy: configure_logging clears it in place
    buf = io.StringIO()
    try:
        configure_logging("json", "INFO", stream=buf)
        configure_logging("json", "INFO", stream=buf)
        assert sum(h.get_name() == "diarist" for h in root.handlers) == 1
        assert logging.getLogger("uvicorn.error").propagate and not logging.getLogger("uvicorn.error").handlers
        logging.getLogger("uvicorn.error").info("started")
        assert lines(buf)[-1]["logger"] == "uvicorn.error"
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)


@pytest.fixture
def failing_server():
    """A real uvicorn server over an app with the API's error handling and a route per kind of failure."""
    import uvicorn
    from fastapi import FastAPI

    from diarist.http import errors

    app = FastAPI()
    errors.install(app)

    @app.get("/expected")
    def expected():
        raise errors.ApiError(422, "decode_failed", "the file is not a readable media file")

    @app.get("/unexpected")
    def unexpected():
        raise RuntimeError("a bug")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", lifespan="off", log_config=None))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    t.join(timeout=10)
    sock.close()


def test_an_unexpected_error_logs_one_traceback_and_an_expected_one_none(capture, failing_server):
    buf = capture("text")
    r = httpx.get(f"{failing_server}/expected")
    assert r.status_code == 422 and r.json()["error"]["code"] == "decode_failed"
    assert "Traceback" not in buf.getvalue()
    r = httpx.get(f"{failing_server}/unexpected")
    assert r.status_code == 500 and r.json()["error"] == {"code": "internal_error", "message": "RuntimeError"}
    time.sleep(0.2)  # uvicorn logs from its own task; give a second traceback (the old bug) time to appear
    text = buf.getvalue()
    assert text.count("Traceback") == 1 and "RuntimeError: a bug" in text
    assert "unhandled error in GET /unexpected" in text
