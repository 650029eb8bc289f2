"""``diarist migrate``: ``alembic upgrade head`` on DIARIST_DATABASE_URL (the compose ``migrate`` step)."""

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
    from diarist.settings import Settings

    url = Settings().db_url
    upgrade(url, args.revision)
    print(f"database at {url.split('@')[-1]} is at revision {args.revision}")
    return 0
