"""The admin audit log: one row per dashboard action (cancel, retry, delete, redeliver, login, logout).

Rows are never updated. ``target_id`` is a plain string, not a foreign key, so the record of a deletion
outlives the job it deleted. The table is created by ``migrations/versions/0002_admin_audit.py``; this
module registers it on the shared :class:`diarist.models.Base` (``migrations/env.py`` imports it so that
``alembic check`` sees it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from diarist.db import Database
from diarist.models import Base, utcnow


class AuditEntry(Base):
    """Who did what to which object, when, and how it ended (``outcome``: ok | noop | error | denied)."""

    __tablename__ = "admin_audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor_key_id: Mapped[str | None] = mapped_column(String(40), default=None)  # None: auth is off / unknown
    actor_name: Mapped[str | None] = mapped_column(String(200), default=None)
    action: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str | None] = mapped_column(String(64), default=None, index=True)
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text, default=None)
    remote_addr: Mapped[str | None] = mapped_column(String(64), default=None)


def record(db: Database, *, action: str, outcome: str, actor_key_id: str | None = None,
           actor_name: str | None = None, target_id: str | None = None, detail: str | None = None,
           remote_addr: str | None = None) -> int:
    """Append one entry and return its id. ``detail`` is cut to 2000 characters."""
    row = AuditEntry(action=action, outcome=outcome, actor_key_id=actor_key_id, actor_name=actor_name,
                     target_id=target_id, detail=(detail or None) and detail[:2000], remote_addr=remote_addr)
    with db.session() as s:
        s.add(row)
        s.flush()
        return row.id


def recent(db: Database, limit: int = 100, target_id: str | None = None) -> list[dict[str, Any]]:
    """The newest entries first (optionally only those about ``target_id``), as plain dicts."""
    with db.session() as s:
        q = select(AuditEntry)
        if target_id is not None:
            q = q.where(AuditEntry.target_id == target_id)
        rows = s.scalars(q.order_by(AuditEntry.id.desc()).limit(limit))
        return [{c: getattr(r, c) for c in ("id", "at", "actor_key_id", "actor_name", "action", "target_id",
                                             "outcome", "detail", "remote_addr")} for r in rows]
