"""``diarist migrate``: ``alembic upgrade head`` on DIARIST_DATABASE_URL (the compose ``migrate`` step).

A database that does not answer is one line, ``diarist: error: database_unavailable: cannot reach the database
at HOST/NAME: <reason>``, and exit status 1 (a dependency down, as for every command), so the step fails and
its supervisor can run it again.
"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import plain


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("migrate", help="upgrade the database schema to the latest migration",
                              description=plain(__doc__))
    p.add_argument("--revision", default="head")
    p.set_defaults(func=run)
    return p


def database_named(url: str) -> str:
    """The database ``url`` names, for messages: ``host:port/name``, or the file of an SQLite database.

    Never the user, the password or the query string: libpq also takes ``?password=`` there. ``url`` has
    passed the settings' check (SQLAlchemy's ``make_url``), so it parses.
    """
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.host is None:  # SQLite (a path, or :memory:), or libpq's socket given in the query
        return u.database or "(default)"
    host = f"[{u.host}]" if ":" in u.host else u.host  # an IPv6 literal keeps its brackets
    return f"{host}:{u.port}/{u.database or ''}" if u.port else f"{host}/{u.database or ''}"


def run(args: argparse.Namespace) -> int:
    from diarist.db import upgrade
    from diarist.outages import Dependency, DependencyUnavailable, classify, reason
    from diarist.settings import Settings

    url = Settings().db_url
    where = database_named(url)
    try:
        upgrade(url, args.revision)
    except Exception as e:
        if classify(e) is not Dependency.DATABASE:
            raise
        raise DependencyUnavailable(Dependency.DATABASE,
                                    f"cannot reach the database at {where}: {reason(e)}") from None
    print(f"database at {where} is at revision {args.revision}")
    return 0
