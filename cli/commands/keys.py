"""``diarist keys create --name X [--admin] | list | revoke ID``: manage API keys in the configured database.

The token (``dia_…``) and the key's webhook signing secret (``whsec_…``) are printed once; only a hash of
the token is stored.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.commands import plain


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("keys", help="create, list or revoke API keys", description=plain(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="keys_command", metavar="ACTION")
    sub.required = True
    c = sub.add_parser("create", help="create a key and print its token once")
    c.add_argument("--name", required=True)
    c.add_argument("--admin", action="store_true", help="may see every key's jobs")
    c.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("list", help="list keys (never their tokens)")
    r = sub.add_parser("revoke", help="revoke a key by id")
    r.add_argument("key_id")
    p.set_defaults(func=run)
    return p


def _db():
    from diarist.db import Database, upgrade
    from diarist.settings import Settings

    st = Settings()
    if st.db_url.startswith("sqlite"):
        upgrade(st.db_url)  # the embedded database may not exist yet
    return Database(st.db_url)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from diarist.apikeys import create_key, revoke_key
    from diarist.models import ApiKey

    db = _db()
    try:
        if args.keys_command == "create":
            k = create_key(db, args.name, admin=args.admin)
            if args.json:
                print(json.dumps({"id": k.id, "name": k.name, "admin": k.admin, "token": k.token,
                                  "webhook_secret": k.webhook_secret}))
            else:
                print(f"id:             {k.id}\nname:           {k.name}\nadmin:          {k.admin}\n"
                      f"token:          {k.token}\nwebhook secret: {k.webhook_secret}\n"
                      "(the token and secret are shown only now)")
            return 0
        if args.keys_command == "list":
            with db.session() as s:
                for k in s.scalars(select(ApiKey).order_by(ApiKey.created_at)):
                    state = "revoked" if k.revoked_at else "active"
                    print(f"{k.id}  dia_{k.prefix}_…  {'admin' if k.admin else 'user '}  {state:7s}  {k.name}")
            return 0
        if revoke_key(db, args.key_id):
            print(f"revoked {args.key_id}")
            return 0
        print(f"diarist: error: not_found: no active key {args.key_id}")
        return 2
    finally:
        db.dispose()
