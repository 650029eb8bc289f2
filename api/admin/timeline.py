"""A job's timeline as consecutive phases: queued → engine wait → encoding → prefill → decode → stored.

Sources: the job row's ``created_at`` / ``started_at`` / ``finished_at`` and the engine's per-request
seconds in ``job_metrics`` (``queue_wait_s``, ``encoder_s``, ``prefill_s``, ``decode_s``). The engine
phases are laid end to end in their natural order; in the engine they can interleave (chunked prefill
shares steps with other requests' decodes), so the bar shows how long each took, not exact wall-clock
boundaries. "stored" is the rest of the processing span: fetching the audio, VAD / diarization, writing
the transcript and metrics.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from api.admin.queries import seconds

COLORS = {"queued": "#9aa5b1", "engine wait": "#c3a6e0", "encoding": "#4c8bf5", "prefill": "#f5a623",
          "decode": "#2fb380", "stored": "#637381", "processing": "#7fb3f5"}


def phases(job: Any, metrics: Any | None, now: datetime | None = None) -> list[dict[str, Any]]:
    """``[{"name", "start_s", "seconds"}]`` from job creation, each ``seconds`` ≥ 0; empty before any data."""
    now = now or datetime.now(UTC)
    out: list[dict[str, Any]] = []
    t = 0.0

    def add(name: str, secs: float | None) -> None:
        nonlocal t
        if secs is None or secs <= 0:
            return
        out.append({"name": name, "start_s": t, "seconds": float(secs)})
        t += float(secs)

    started, finished = job.started_at, job.finished_at
    add("queued", seconds(job.created_at, started or finished or now))
    if started is None:
        return out
    span = seconds(started, finished or now) or 0.0
    if metrics is None or finished is None:
        add("processing", span)
        return out
    engine = 0.0
    for name, attr in (("engine wait", "queue_wait_s"), ("encoding", "encoder_s"), ("prefill", "prefill_s"),
                       ("decode", "decode_s")):
        v = getattr(metrics, attr, None)
        add(name, v)
        engine += max(0.0, v or 0.0)
    add("stored", span - engine)
    return out


def bar(parts: list[dict[str, Any]], width: float = 1000.0) -> dict[str, Any]:
    """SVG geometry for :func:`phases`: each part gets ``x``, ``w`` (in a ``width``-wide viewBox), ``color``."""
    total = sum(p["seconds"] for p in parts)
    if total <= 0:
        return {"total_s": 0.0, "parts": [], "width": width}
    laid = []
    for p in parts:
        laid.append({**p, "x": p["start_s"] / total * width, "w": max(p["seconds"] / total * width, 1.0),
                     "color": COLORS.get(p["name"], "#888"), "share": p["seconds"] / total})
    return {"total_s": total, "parts": laid, "width": width}
