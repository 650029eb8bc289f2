"""The jobs table: filters (status, class, key, time range, id search) and page-numbered pagination."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from diarist.db import Database
from diarist.models import Job, JobStatus

STATUSES = tuple(s.value for s in JobStatus)
RANGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30)}


def parse_time(v: str | None) -> datetime | None:
    """``YYYY-MM-DDTHH:MM[:SS]`` (an ``<input type=datetime-local>``), read as UTC; None if blank or invalid."""
    if not v:
        return None
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        return None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


@dataclass
class Filters:
    """What the operator asked for; unknown values are dropped rather than refused (it is a form)."""

    status: str = ""
    cls: str = ""
    key: str = ""
    range: str = ""
    since: str = ""
    until: str = ""
    q: str = ""

    def clean(self) -> Filters:
        self.status = self.status if self.status in STATUSES else ""
        self.cls = self.cls if self.cls in ("short", "long") else ""
        self.range = self.range if self.range in RANGES else ""
        self.key, self.q = self.key.strip()[:64], self.q.strip()[:64]
        return self

    def query(self) -> dict[str, str]:
        """Non-empty fields, for links that keep the filters (pagination)."""
        return {k: v for k, v in asdict(self).items() if v}


def job_page(db: Database, f: Filters, page: int, size: int, now: datetime | None = None) -> dict[str, Any]:
    """``{"rows": [Job], "total", "page", "pages"}``, newest first; ``q`` matches an id or its prefix."""
    now = now or datetime.now(UTC)
    cond = []
    if f.status:
        cond.append(Job.status == f.status)
    if f.cls:
        cond.append(Job.queue == f"transcribe.{f.cls}")
    if f.key:
        cond.append(Job.owner_key == f.key)
    if f.range:
        cond.append(Job.created_at >= now - RANGES[f.range])
    if (since := parse_time(f.since)) is not None:
        cond.append(Job.created_at >= since)
    if (until := parse_time(f.until)) is not None:
        cond.append(Job.created_at <= until)
    if f.q:
        q = f.q if f.q.startswith("job_") else f"job_{f.q}"
        escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        cond.append(Job.id.like(f"{escaped}%", escape="\\"))
    with db.session() as s:
        total = s.scalar(select(func.count()).select_from(Job).where(*cond)) or 0
        pages = max(1, -(-total // size))
        page = min(max(1, page), pages)
        rows = list(s.scalars(select(Job).where(*cond).order_by(Job.created_at.desc(), Job.id.desc())
                              .offset((page - 1) * size).limit(size)))
        for r in rows:
            s.expunge(r)
    return {"rows": rows, "total": int(total), "page": page, "pages": pages}
