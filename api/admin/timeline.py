"""A job's timeline as consecutive phases: queued → [vad] → engine wait → encoding → prefill → decode →
[diarization] → [voices] → stored.

Sources: the job row's ``created_at`` / ``started_at`` / ``finished_at``, the engine's per-request seconds
in ``job_metrics`` (``queue_wait_s``, ``encoder_s``, ``prefill_s``, ``decode_s``) and, for the cascade
pipeline, ``vad_s`` / ``diarization_s`` from ``job_metrics.extra`` (VAD runs before the engine requests,
speaker clustering after them; ``speaker_embedding_s``, the speakers' voice vectors for known speakers, last).
The engine
phases are laid end to end in their natural order; in the engine they can interleave (chunked prefill
shares steps with other requests' decodes), so the bar shows how long each took, not exact wall-clock
boundaries. "stored" is the rest of the processing span: fetching and decoding the audio, writing the
transcript and metrics.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from api.admin.queries import seconds

COLORS = {"queued": "#9aa5b1", "vad": "#8fd3e8", "diarization": "#e88fb4", "engine wait": "#c3a6e0", "encoding": "#4c8bf5", "prefill": "#f5a623",
          "decode": "#2fb380", "stored": "#637381", "processing": "#7fb3f5", "voices": "#d9b44a"}


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
    extra = getattr(metrics, "extra", None) or {}
    steps = [("vad", extra.get("vad_s")), ("engine wait", metrics.queue_wait_s), ("encoding", metrics.encoder_s),
             ("prefill", metrics.prefill_s), ("decode", metrics.decode_s),
             ("diarization", extra.get("diarization_s")), ("voices", extra.get("speaker_embedding_s"))]
    used = 0.0
    for name, v in steps:
        v = v if isinstance(v, (int, float)) else None
        add(name, v)
        used += max(0.0, v or 0.0)
    add("stored", span - used)
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
