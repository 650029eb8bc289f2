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


def run(args: argparse.Namespace) -> int:
    from diarist.db import upgrade
    from diarist.outages import Dependency, DependencyUnavailable, classify, reason
    from diarist.settings import Settings

    url = Settings().db_url
    where = url.split("@")[-1]  # never the credentials
    try:
        upgrade(url, args.revision)
    except Exception as e:
        if classify(e) is not Dependency.DATABASE:
            raise
        raise DependencyUnavailable(Dependency.DATABASE,
                                    f"cannot reach the database at {where}: {reason(e)}") from None
    print(f"database at {where} is at revision {args.revision}")
    return 0
