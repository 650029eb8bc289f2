"""The Alembic migrations build exactly the schema of diarist/models.py, and go down cleanly."""

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from diarist.db import alembic_config, upgrade


def tables(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        return set(inspect(eng).get_table_names())
    finally:
        eng.dispose()


def test_upgrade_matches_models_and_downgrade_empties(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    upgrade(url)
    command.check(alembic_config(url))  # raises when models and migrations differ
    names = tables(url)
    assert {"jobs", "job_metrics", "webhook_deliveries", "api_keys"} <= names
    command.downgrade(alembic_config(url), "base")
    assert tables(url) <= {"alembic_version"}
    upgrade(url)  # idempotent re-run


@pytest.mark.services
def test_migrations_on_postgres():
    from tests.servers import start_postgres

    url, stop = start_postgres()
    try:
        upgrade(url)
        command.check(alembic_config(url))
        assert "jobs" in tables(url)
        command.downgrade(alembic_config(url), "base")
        upgrade(url)
    finally:
        stop()
