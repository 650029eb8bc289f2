"""The Alembic migrations build exactly the schema of diarist/models.py, and go down cleanly."""

from alembic import command
from sqlalchemy import create_engine, inspect

from diarist.db import alembic_config, upgrade


def test_upgrade_matches_models_and_downgrade_empties(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    upgrade(url)
    command.check(alembic_config(url))  # raises when models and migrations differ
    names = set(inspect(create_engine(url)).get_table_names())
    assert {"jobs", "job_metrics", "webhook_deliveries", "api_keys"} <= names
    command.downgrade(alembic_config(url), "base")
    assert set(inspect(create_engine(url)).get_table_names()) <= {"alembic_version"}
    upgrade(url)  # idempotent re-run
