"""jobs.request_sha256: the request an Idempotency-Key was first used with

Revision ID: 0003_request_fingerprint
Revises: 0002_admin_audit
Create Date: 2026-11-29

A key reused with a different request gets 422 idempotency_key_reused instead of the first job
(api/submit.py). Rows made before this column replay as before (NULL: nothing to compare).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003_request_fingerprint'
down_revision = '0002_admin_audit'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('request_sha256', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('request_sha256')
