"""admin audit log

Revision ID: 0002_admin_audit
Revises: 0001
Create Date: 2026-11-29

One row per admin dashboard action (see diarist/audit.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002_admin_audit'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('admin_audit',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor_key_id', sa.String(length=40), nullable=True),
    sa.Column('actor_name', sa.String(length=200), nullable=True),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('target_id', sa.String(length=64), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('remote_addr', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_admin_audit_at'), 'admin_audit', ['at'], unique=False)
    op.create_index(op.f('ix_admin_audit_target_id'), 'admin_audit', ['target_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_admin_audit_target_id'), table_name='admin_audit')
    op.drop_index(op.f('ix_admin_audit_at'), table_name='admin_audit')
    op.drop_table('admin_audit')
