"""job leases, the webhook outbox and worker heartbeats (issue 17: fault tolerance)

Revision ID: 0004_leases_outbox
Revises: 0003_request_fingerprint
Create Date: 2026-12-01

jobs.lease_owner / lease_expires_at / progress_at / outage_since: the sweeper re-drives an active job whose
lease passed (worker/sweeper.py). webhook_outbox: final webhooks written with the final transition.
worker_beats: worker liveness for the dashboard. Existing active rows have no lease (NULL): the sweeper
treats them as expired, so jobs stuck before this migration are re-driven once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004_leases_outbox'
down_revision = '0003_request_fingerprint'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('lease_owner', sa.String(length=200), nullable=True))
        batch.add_column(sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('progress_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('outage_since', sa.DateTime(timezone=True), nullable=True))
        batch.create_index(batch.f('ix_jobs_lease_expires_at'), ['lease_expires_at'], unique=False)
    op.create_table('webhook_outbox',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('locked_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_webhook_outbox_job_id'), 'webhook_outbox', ['job_id'], unique=False)
    op.create_index(op.f('ix_webhook_outbox_state'), 'webhook_outbox', ['state'], unique=False)
    op.create_table('worker_beats',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('queues', sa.String(length=200), nullable=False),
    sa.Column('engine_url', sa.String(length=500), nullable=True),
    sa.Column('engine_ok', sa.Boolean(), nullable=True),
    sa.Column('running', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_index(op.f('ix_worker_beats_seen_at'), 'worker_beats', ['seen_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_worker_beats_seen_at'), table_name='worker_beats')
    op.drop_table('worker_beats')
    op.drop_index(op.f('ix_webhook_outbox_state'), table_name='webhook_outbox')
    op.drop_index(op.f('ix_webhook_outbox_job_id'), table_name='webhook_outbox')
    op.drop_table('webhook_outbox')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_index(batch.f('ix_jobs_lease_expires_at'))
        batch.drop_column('outage_since')
        batch.drop_column('progress_at')
        batch.drop_column('lease_expires_at')
        batch.drop_column('lease_owner')
