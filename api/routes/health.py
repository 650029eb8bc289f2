"""Liveness (``/healthz``: the process answers) and readiness (``/readyz``: every dependency answers).

``/readyz`` answers 503 when the API cannot take a job (database, object store or broker down, or the
in-process engine of embedded mode not ready). Engine servers (production) are reported under
``engine`` but do not make it 503: while they are down jobs are accepted and wait (status ``degraded``).
An engine on random weights (``load_format=dummy``) is ready, and listed under ``random_weights`` with a
line in ``warnings``.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.deps import ServicesDep

log = logging.getLogger("diarist.api")
router = APIRouter(tags=["health"])

LIVENESS_PATH = "/healthz"
"""The liveness route: it answers once the app serves (``diarist serve --workers`` waits for it)."""


@router.get(LIVENESS_PATH, summary="Liveness")
def healthz() -> dict:
    return {"status": "ok"}


def _checks(request: Request, services) -> dict[str, str]:
    checks: dict[str, str] = {}
    probes = {"database": services.db.ping, "object_store": services.store.ping}
    if services.dispatcher is not None:
        probes["broker"] = services.dispatcher.ping
    engine_ready = getattr(request.app.state, "engine_ready", None)
    for name, probe in probes.items():
        try:
            probe()
            checks[name] = "ok"
        except Exception as e:  # noqa: BLE001 - report every failing dependency, not only the first
            checks[name] = f"error: {type(e).__name__}: {e}"[:300]
    if engine_ready is not None:
        checks["engine"] = "ok" if engine_ready() else "error: engine not ready"
    return checks


def _down(stats: dict[str, dict | None]) -> list[str]:
    """The engines of an :func:`api.admin.engines.engine_stats` answer that did not answer, sorted."""
    return sorted(k for k, v in stats.items() if v is None)


def engine_unavailable(request: Request) -> str | None:
    """Why no engine can take a job right now, or None when one can or it cannot be told.

    The facts ``/readyz`` reports: the in-process engine's probe (embedded mode) says not ready, or every
    engine server (production; :func:`api.admin.engines.engine_stats`, cached 2 s) does not answer. One
    engine server down of several is not unavailable: the workers send its jobs to the others
    (``worker/engine_pool.py``). A failed look (a bug, not an outage) answers None, so a request is never
    refused on a guess. Blocking (HTTP to the engine servers): call it on a worker thread.
    """
    probe = getattr(request.app.state, "engine_ready", None)
    if probe is not None:
        return None if probe() else "the in-process engine is not ready"
    from api.admin import engines

    try:
        stats = engines.engine_stats(request.app)
    except Exception:  # unknown is not down (see the docstring); /readyz reports the error
        log.warning("engine availability could not be read", exc_info=True)
        return None
    down = _down(stats)
    if stats and len(down) == len(stats):
        return f"no engine server answers ({', '.join(down)})"
    return None


def _engine_servers(request: Request) -> tuple[str | None, list[str]]:
    """(``ok``, or which engine servers do not answer, None when there are none to ask (embedded);
    the engines, in-process or servers, that run random weights)."""
    from api.admin import engines

    try:
        stats = engines.engine_stats(request.app)
    except Exception as e:  # noqa: BLE001 - a failed look is reported as such, never a 500 nor dropped
        in_process = getattr(request.app.state, "engine_ready", None) is not None
        return (None if in_process else f"error: {type(e).__name__}: {e}"[:300]), []
    random = sorted(k for k, v in stats.items() if v and v.get("random_weights"))
    if getattr(request.app.state, "engine_ready", None) is not None or not stats:
        return None, random
    down = _down(stats)
    return ("ok" if not down else f"error: not answering: {', '.join(down)}"[:300]), random


@router.get("/readyz", summary="Readiness: database, object store, broker; engine (503 only when in-process)",
            responses={503: {"description": "a dependency is down"}})
async def readyz(request: Request, services: ServicesDep) -> JSONResponse:
    checks = await run_in_threadpool(_checks, request, services)
    ok = all(v == "ok" for v in checks.values())
    engine, random = await run_in_threadpool(_engine_servers, request)
    if engine is not None:
        checks["engine"] = engine
    status = "unavailable" if not ok else ("degraded" if engine not in (None, "ok") else "ok")
    body: dict = {"status": status, "checks": checks}
    if random:  # ready, but a user must not mistake the output for a transcript
        body["random_weights"] = random
        body["warnings"] = [f"engine {k} runs random weights (load_format=dummy): its transcripts are noise"
                            for k in random]
    return JSONResponse(body, status_code=200 if ok else 503)
