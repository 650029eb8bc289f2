"""API errors: always JSON ``{"error": {"code", "message"}}`` with a 4xx/5xx status (docs/api_conventions.md §3)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from diarist.contract.errors import CodedError
from diarist.outages import classify

log = logging.getLogger("diarist.api")


class ApiError(CodedError):
    """An error the API raises itself, with its HTTP ``status`` given per instance (e.g. 422
    ``decode_failed``) and optional response ``headers`` (``Retry-After``)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(code, message)
        self.status, self.headers = status, headers  # per instance, over the class default


def unknown_model(name: str, served: Sequence[str]) -> ApiError:
    """422 ``unknown_model``: ``name`` is not among the ``served`` model names (the main API's routes and
    the engine server's OpenAI route answer alike)."""
    return ApiError(422, "unknown_model", f"unknown model {name!r}; this server serves: {', '.join(served)}")


def error_body(code: str, message: str) -> dict:
    """The JSON error shape: ``{"error": {"code", "message"}}``."""
    return {"error": {"code": code, "message": message}}


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
               429: "rate_limited", 503: "unavailable"}


def describe_errors(errors: Sequence[Any]) -> str:
    """One message for pydantic validation errors (the first five): ``field: message`` joined by ``; ``,
    without the request part names FastAPI puts in ``loc`` nor pydantic's ``Value error, `` prefix on our
    own validators' messages."""
    parts = []
    for e in list(errors)[:5]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body", "query", "header", "path"))
        msg = str(e.get("msg"))
        if e.get("type") == "value_error":
            msg = msg.removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "invalid request"


def install(app: FastAPI, *, retry_after_s: int | None = None) -> None:
    """Register the handlers that turn every error into the JSON error shape. ``retry_after_s``: the
    ``Retry-After`` (seconds) on a 503 for a dependency outage (``Settings.retry_after_s``); None sends none."""

    @app.exception_handler(CodedError)
    async def _coded_error(_req: Request, exc: CodedError) -> JSONResponse:  # ApiError and every other one
        return JSONResponse(error_body(exc.code, exc.message), status_code=exc.status,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body("invalid_request", describe_errors(exc.errors())), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    app.add_middleware(InternalErrors, retry_after_s=retry_after_s)


class InternalErrors:
    """ASGI middleware: an unexpected exception becomes a 500 ``internal_error`` and one logged traceback.

    Starlette's own ``exception_handler(Exception)`` re-raises after answering, so uvicorn printed the
    traceback a second time ("Exception in ASGI application"); here the exception stops. When the response
    had already started (a stream), nothing more can be sent: the traceback is logged and the response ends.
    Expected failures (:class:`~diarist.contract.errors.CodedError`, validation, HTTP errors) never get here and log no traceback.
    A dependency outage that escapes a route (:func:`diarist.outages.classify`: e.g. Postgres down while
    the API key is looked up) is not a bug: 503 with the dependency's code (``database_unavailable``, ...)
    and ``Retry-After``, logged as one warning line. A client that goes away before its request body is read
    (an abandoned upload: Starlette's ``ClientDisconnect``) is one INFO line: nobody is left to answer.
    """

    def __init__(self, app: Any, retry_after_s: int | None = None) -> None:
        self.app, self.retry_after_s = app, retry_after_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            log.info("%s %s: the client closed the connection before its request was read (upload abandoned)",
                     scope.get("method"), scope.get("path"))
        except Exception as exc:  # the one place unexpected errors are logged and answered
            dep = classify(exc)
            if dep is not None:
                log.warning("%s %s: %s unavailable (%s)", scope.get("method"), scope.get("path"), dep.value,
                            type(exc).__name__)
                response = JSONResponse(error_body(dep.code, f"the {dep.value} is unavailable; retry later"),
                                        status_code=503, headers=None if self.retry_after_s is None
                                        else {"Retry-After": str(self.retry_after_s)})
            else:
                log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
                response = JSONResponse(error_body("internal_error", type(exc).__name__), status_code=500)
            if not started:
                await response(scope, receive, send)
