"""Liveness (``/healthz``: the process answers) and readiness (``/readyz``: every dependency answers)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
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


@router.get("/readyz", summary="Readiness: database, object store, broker (and engine when in-process)",
            responses={503: {"description": "a dependency is down"}})
async def readyz(request: Request, services: ServicesDep) -> JSONResponse:
    checks = await run_in_threadpool(_checks, request, services)
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503)
