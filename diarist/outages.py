"""Which failures are a dependency being down (retry later, the job is not at fault) — one home for the rule.

A job meets four dependencies: the database, the object store, the broker and the engine server. An error
that means "that server did not answer" (refused or dropped connection, timeout, 5xx/throttling from S3, a
closed Postgres connection) is an *outage*: the job backs off without spending an attempt, and fails with
``<dependency>_unavailable`` only once the outage has lasted ``Settings.outage_bound_s``. A missing bucket
or refused S3 credentials count too (the deployment's, not the job's). Everything else (bad audio, a bug,
a missing object) is the job's own failure. The API answers an outage at submit with 503
and the same code.
"""

from __future__ import annotations

import enum


class Dependency(str, enum.Enum):
    """A server a job depends on; ``code`` is the machine code of its outage."""

    DATABASE = "database"
    STORAGE = "storage"
    QUEUE = "queue"
    ENGINE = "engine"

    @property
    def code(self) -> str:
        """``database_unavailable``, ``storage_unavailable``, ``queue_unavailable``, ``engine_unavailable``."""
        return f"{self.value}_unavailable"


class DependencyUnavailable(Exception):
    """Raised where a caller wants an outage as one exception type (``dependency`` says which)."""

    def __init__(self, dependency: Dependency, message: str) -> None:
        super().__init__(f"{dependency.code}: {message}")
        self.dependency, self.message = dependency, message

    @property
    def code(self) -> str:
        return self.dependency.code


# S3 error codes that mean "the service, not the request": retry later (AWS S3 error responses list).
_S3_TRANSIENT = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "503", "500", "502", "504"}
# S3 4xx codes that are the deployment's, never a job's: every key and request is ours, so a missing bucket
# or refused credentials stop every job alike until an operator fixes them (an outage, not a failure);
# a missing key (``NoSuchKey``) stays the job's own (``audio_missing``).
_S3_DEPLOYMENT = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                  "InvalidToken"}


def classify(exc: BaseException) -> Dependency | None:
    """The dependency whose outage ``exc`` is, or None when it is not an outage. Walks ``__cause__`` and
    ``__context__``, so an outage wrapped by a library (kombu around redis, SQLAlchemy around psycopg) is
    still found."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        dep = _classify_one(e)
        if dep is not None:
            return dep
        e = e.__cause__ or e.__context__
    return None


def reason(exc: BaseException) -> str:
    """What went wrong, on one line: the driver's own message for a SQLAlchemy error (its ``orig``, without
    SQLAlchemy's statement and "Background on this error" lines), a :class:`DependencyUnavailable`'s message,
    else ``str(exc)``; whitespace collapsed, the exception's type name when the message is empty."""
    if isinstance(exc, DependencyUnavailable):
        text = exc.message
    else:
        text = str(getattr(exc, "orig", None) or exc)
    return " ".join(text.split()) or type(exc).__name__


def _classify_one(e: BaseException) -> Dependency | None:
    if isinstance(e, DependencyUnavailable):
        return e.dependency
    mod = type(e).__module__.split(".")[0]
    if mod == "sqlalchemy":
        from sqlalchemy import exc as sa_exc

        # OperationalError: the server went away / refused / "database is locked"; the pool timing out is
        # the database not answering either. IntegrityError & co are the request's fault.
        if isinstance(e, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError,
                          sa_exc.TimeoutError)):
            return Dependency.DATABASE
        if isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated:
            return Dependency.DATABASE
        return None
    if mod == "botocore":
        from botocore import exceptions as bc

        if isinstance(e, (bc.EndpointConnectionError, bc.ConnectionClosedError, bc.ReadTimeoutError,
                          bc.ConnectTimeoutError, bc.HTTPClientError)):
            return Dependency.STORAGE
        if isinstance(e, bc.ClientError):
            err = e.response.get("Error", {})
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if err.get("Code") in _S3_TRANSIENT or err.get("Code") in _S3_DEPLOYMENT or status >= 500:
                return Dependency.STORAGE
        return None
    if mod in ("kombu", "redis", "amqp"):
        from kombu.exceptions import OperationalError as KombuOperationalError

        if isinstance(e, KombuOperationalError):
            return Dependency.QUEUE
        try:
            import redis
        except ImportError:  # pragma: no cover - redis is a dependency
            return None
        if isinstance(e, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                          redis.exceptions.BusyLoadingError)):
            return Dependency.QUEUE
    return None
