"""Liveness (``/healthz``: the process answers) and readiness (``/readyz``: every dependency answers).

``/readyz`` answers 503 when the API cannot take a job (database, object store or broker down, or the
in-process engine of embedded mode not ready). Engine servers (production) are reported under
``engine`` but do not make it 503: while they are down jobs are accepted and wait (status ``degraded``).
An engine on random weights (``load_format=dummy``) is ready, and reported as ``random_weights: true`` with
a line in ``warnings``.

``/readyz`` is unauthenticated (load balancers and orchestrators probe it), so it says only each
component's state (``ok`` or ``error``): the errors themselves (driver messages, hosts, ports, bucket
URLs, engine server addresses) go to the log, one WARNING line when a component's detail changes (not
one per probe), and to the admin dashboard (:func:`api.admin.readiness.readiness`).
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
    from api.admin import engines, readiness

    try:
        stats = engines.engine_stats(request.app)
    except Exception:  # unknown is not down (see the docstring); /readyz reports the error
        log.warning("engine availability could not be read", exc_info=True)
        return None
    down = readiness.down(stats)
    if stats and len(down) == len(stats):
        return f"no engine server answers ({', '.join(down)})"
    return None


@router.get("/readyz", summary="Readiness: database, object store, broker; engine (503 only when in-process)",
            responses={503: {"description": "a dependency is down"}})
async def readyz(request: Request, services: ServicesDep) -> JSONResponse:
    from api.admin.readiness import readiness

    found = await run_in_threadpool(readiness, request, services)
    return JSONResponse(found.public(), status_code=200 if found.ready else 503)
