"""Alembic environment: runs the migrations on the URL set by ``diarist.db.alembic_config`` (or alembic.ini)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

import diarist.audit  # noqa: F401 - registers admin_audit on Base.metadata for `alembic check`
from diarist.models import Base

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                     poolclass=pool.NullPool)
    with connectable.connect() as connection:
        # Batch mode lets ALTERs work on SQLite (copy-and-move); a no-op on Postgres.
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
