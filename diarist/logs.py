"""Process logging: one handler on the root logger, text or JSON lines, every line about a job with its id.

- **Job id.** :func:`job_context` puts a job id in a context variable for the duration of a block (a
  Celery task, an engine request); :class:`ContextFilter` copies it onto every record made inside as
  ``record.job_id``, so ``log.info("retrying")`` in any module carries it without string concatenation.
  A record may also carry one explicitly (``extra={"job_id": ...}``). Lines made outside any context that
  name a job (Celery's "Task diarist.transcribe[…] received" / "succeeded", whose arguments are the job
  id, or a message that mentions one) get the id they name.
- **Redaction.** :class:`RedactFilter` rewrites every URL in a line to scheme, host, port and path
  (:func:`diarist.redact.redact_text`): query strings (pre-signed links, tokens, the engine request's
  options) and credentials never reach a log. Uvicorn's access lines get their query string dropped.
- **Formats.** ``text``: ``time level logger [job_id] message``; ``json``: one object per line with
  ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``message``, ``job_id`` (when known), the record's
  ``fields`` (``extra={"fields": {...}}``: a line's facts as keys a log pipeline can query, e.g. the engine
  server's request lines; they never replace the keys above) and ``exc`` (the formatted traceback, when the
  record has one). Set with ``DIARIST_LOG_FORMAT`` and ``DIARIST_LOG_LEVEL``.
- **Tracebacks.** A record has one only when the code asked for it (``log.exception``), which the code
  does for unexpected errors only; expected failures (a bad file, an engine retry) are one line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import IO, Literal

from diarist.redact import redact_text

LogFormat = Literal["text", "json"]

_job_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("diarist_job_id", default=None)

_JOB_ID = re.compile(r"\bjob_[0-9a-f]{32}\b")  # the ids diarist.models.new_id("job") makes
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(job_tag)s %(message)s"
HANDLER_NAME = "diarist"


def current_job_id() -> str | None:
    """The job id of the enclosing :func:`job_context`, or None."""
    return _job_id.get()


@contextmanager
def job_context(job_id: str | None) -> Iterator[None]:
    """Tag every log record made in this block (this thread or task) with ``job_id``."""
    token = _job_id.set(job_id)
    try:
        yield
    finally:
        _job_id.reset(token)


class ContextFilter(logging.Filter):
    """Set ``record.job_id`` (from ``extra`` or the :func:`job_context`) and ``record.job_tag``."""

    def filter(self, record: logging.LogRecord) -> bool:
        job_id = getattr(record, "job_id", None) or _job_id.get() or _named_job(record)
        record.job_id = job_id
        record.job_tag = f" [{job_id}]" if job_id else ""
        return True


def _named_job(record: logging.LogRecord) -> str | None:
    """The job id a record names: in Celery's task-line arguments (``{"args": "['job_…']"}``) or its message."""
    if isinstance(record.args, Mapping) and "args" in record.args:
        text = str(record.args["args"])
    else:
        text = str(record.msg) if not record.args else record.getMessage()
    m = _JOB_ID.search(text)
    return m.group(0) if m else None


class RedactFilter(logging.Filter):
    """Rewrite the record's message with every URL redacted; drop the query of uvicorn access lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, version, status = record.args
            record.args = (client, method, str(path).split("?", 1)[0], version, status)
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message``, ``job_id``?, the record's
    ``fields``?, ``exc``?."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if getattr(record, "job_id", None):
            out["job_id"] = record.job_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            out.update({k: v for k, v in fields.items() if k not in out and k != "exc"})
        if record.exc_info:
            out["exc"] = redact_text(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc"] = redact_text(record.exc_text)
        return json.dumps(out, default=str)


class _TextFormatter(logging.Formatter):
    def formatException(self, ei) -> str:  # logging's name
        return redact_text(super().formatException(ei))


def make_handler(fmt: LogFormat = "text", stream: IO[str] | None = None) -> logging.Handler:
    """A stream handler (stderr by default) with the context and redaction filters and the formatter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else _TextFormatter(TEXT_FORMAT))
    return handler


# Loggers that install their own handlers (uvicorn) or talk too much at INFO (httpx: a line per request).
_ROUTED = ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "celery.app.trace")
_QUIET = {"httpx": logging.WARNING, "httpcore": logging.WARNING}


def configure_logging(fmt: LogFormat = "text", level: str = "INFO", stream: IO[str] | None = None) -> None:
    """Route every logger through one root handler of format ``fmt`` at ``level``.

    Idempotent: a handler installed by an earlier call is replaced. Uvicorn's and Celery's loggers lose
    their own handlers and propagate to the root, so their lines get the same format, job ids and
    redaction. Call it before starting uvicorn with ``log_config=None``.
    """
    root = logging.getLogger()
    for h in list(root.handlers):
        if h.get_name() == HANDLER_NAME:
            root.removeHandler(h)
    root.addHandler(make_handler(fmt, stream))
    root.setLevel(level.upper())
    for name in _ROUTED:  # as uvicorn's or Celery's own logging config may have left them
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate, lg.disabled = True, False
        lg.setLevel(logging.NOTSET)  # uvicorn sets its levels from its log_level when it starts
    for name, lvl in _QUIET.items():
        logging.getLogger(name).setLevel(max(lvl, root.level))
    # warnings.warn (e.g. Celery's "running the worker with superuser privileges") are log lines too, in the
    # same format, not raw text on stderr
    logging.captureWarnings(True)
