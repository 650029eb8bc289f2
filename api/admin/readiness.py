"""What ``/readyz`` probes, with the details it keeps from unauthenticated callers (api/routes/health.py):
the admin dashboard shows :func:`readiness`'s details, ``/readyz`` answers :meth:`Readiness.public`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from fastapi import Request

log = logging.getLogger("diarist.api")


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


def down(stats: dict[str, dict | None]) -> list[str]:
    """The engines of an :func:`api.admin.engines.engine_stats` answer that did not answer, sorted."""
    return sorted(k for k, v in stats.items() if v is None)


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
    missing = down(stats)
    return ("ok" if not missing else f"error: not answering: {', '.join(missing)}"[:300]), random


@dataclass
class Readiness:
    """What ``/readyz`` found. ``status``: ``ok``, ``degraded`` (engine servers down: jobs wait) or
    ``unavailable`` (the API cannot take a job). ``details``: per component, ``ok`` or the error (driver
    message, host, port: for the log and the admin view only). ``random_weights``: engines on random weights."""

    status: str
    details: dict[str, str]
    random_weights: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.status != "unavailable"

    def public(self) -> dict:
        """The unauthenticated answer: each component ``ok`` or ``error``, nothing of what or where."""
        body: dict = {"status": self.status,
                      "checks": {k: "ok" if v == "ok" else "error" for k, v in self.details.items()}}
        if self.random_weights:  # ready, but a user must not mistake the output for a transcript
            n = len(self.random_weights)
            body["random_weights"] = True
            engines = "1 engine runs" if n == 1 else f"{n} engines run"
            body["warnings"] = [f"{engines} random weights (load_format=dummy): transcripts are noise"]
        return body


def readiness(request: Request, services) -> Readiness:
    """Probe every component (blocking: call it on a worker thread); changes of a component's detail are
    logged once (WARNING when it fails, INFO when it is back)."""
    checks = _checks(request, services)
    ok = all(v == "ok" for v in checks.values())
    engine, random = _engine_servers(request)
    if engine is not None:
        checks["engine"] = engine
    status = "unavailable" if not ok else ("degraded" if engine not in (None, "ok") else "ok")
    _log_changes(request.app.state, checks)
    return Readiness(status, checks, random)


_seen_lock = threading.Lock()


def _log_changes(state, checks: dict[str, str]) -> None:
    with _seen_lock:
        seen = getattr(state, "readiness_seen", None)
        if seen is None:
            seen = state.readiness_seen = {}
        changed = {k: v for k, v in checks.items() if seen.get(k, "ok") != v}
        seen.update(checks)
    for name, detail in changed.items():
        if detail == "ok":
            log.info("readiness: %s is back", name)
        else:
            log.warning("readiness: %s %s", name, detail)
