"""API keys: creation and Bearer-token verification. Only SHA-256 of the token is stored.

Token format: ``dia_<prefix>_<secret>`` (prefix 8 hex chars to find the row, secret 32 url-safe chars).
The tokens are random with 190+ bits of entropy, so a fast hash is enough (no password stretching needed);
comparison is constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select

from diarist.db import Database
from diarist.models import ApiKey, utcnow


def new_webhook_secret() -> str:
    """A fresh Standard-Webhooks signing secret: ``whsec_<base64 of 24 random bytes>``."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class CreatedKey:
    id: str
    name: str
    admin: bool
    token: str
    webhook_secret: str


def create_key(db: Database, name: str, admin: bool = False) -> CreatedKey:
    """Create a key; the token and webhook secret are returned once and cannot be recovered later."""
    prefix = secrets.token_hex(4)
    token = f"dia_{prefix}_{secrets.token_urlsafe(24)}"
    row = ApiKey(name=name, prefix=prefix, secret_hash=_hash(token), admin=admin,
                 webhook_secret=new_webhook_secret())
    with db.session() as s:
        s.add(row)
    return CreatedKey(id=row.id, name=name, admin=admin, token=token, webhook_secret=row.webhook_secret)


def authenticate(db: Database, token: str) -> ApiKey | None:
    """The live key for a Bearer token, or None."""
    parts = token.split("_")
    if len(parts) < 3 or parts[0] != "dia":
        return None
    with db.session() as s:
        row = s.scalar(select(ApiKey).where(ApiKey.prefix == parts[1]))
        if row is None or row.revoked_at is not None:
            return None
        if not hmac.compare_digest(row.secret_hash, _hash(token)):
            return None
        s.expunge(row)
        return row


def revoke_key(db: Database, key_id: str) -> bool:
    with db.session() as s:
        row = s.get(ApiKey, key_id)
        if row is None or row.revoked_at is not None:
            return False
        row.revoked_at = utcnow()
        return True
