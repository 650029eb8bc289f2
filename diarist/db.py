"""Database connection, sessions and migrations (SQLAlchemy 2 + Alembic) for Postgres and SQLite."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

# A source checkout (or an editable install) keeps migrations/ beside the packages; an image that installs
# the wheel elsewhere points DIARIST_MIGRATIONS_DIR at its copy.
MIGRATIONS_DIR = Path(os.environ.get("DIARIST_MIGRATIONS_DIR") or Path(__file__).resolve().parents[1] / "migrations")


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def make_engine(url: str) -> Engine:
    """A pooled SQLAlchemy engine.

    SQLite (embedded mode) is opened for use from many threads, in WAL mode with a busy timeout, so the API
    and the in-process workers can write concurrently without "database is locked" errors.
    """
    if url.startswith("sqlite"):
        _ensure_sqlite_dir(url)
        eng = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return eng
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class Database:
    """An engine plus a session factory; ``with db.session() as s:`` commits on success, rolls back on error."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.factory = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.factory() as s:
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def ping(self) -> None:
        """Raises when the database cannot answer ``SELECT 1``."""
        with self.engine.connect() as c:
            c.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config(url: str):
    """Alembic config pointing at ``migrations/`` with ``url``; no alembic.ini needed."""
    from alembic.config import Config

    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise RuntimeError(f"migrations not found at {MIGRATIONS_DIR}; run from a source checkout")
    # alembic's default ``stdout`` is bound when alembic.config is first imported; a stream that was
    # current then (a test's capture, a closed pipe) may be gone now
    cfg = Config(stdout=sys.stdout)
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Run ``alembic upgrade <revision>`` on ``url`` (embedded mode does this at start)."""
    from alembic import command

    _ensure_sqlite_dir(url)
    command.upgrade(alembic_config(url), revision)
