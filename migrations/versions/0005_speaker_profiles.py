"""voice profiles and their samples (issue 30: known speakers)

Revision ID: 0005_speaker_profiles
Revises: 0004_leases_outbox
Create Date: 2026-12-06

speaker_profiles: a named voice per API key (unique name per key) with the speech-weighted mean vector of
its samples; speaker_samples: each sample's vector (JSON array of floats), seconds and source, deleted with
its profile (ON DELETE CASCADE). No audio is stored.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005_speaker_profiles'
down_revision = '0004_leases_outbox'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('speaker_profiles',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('owner_key', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('model', sa.String(length=100), nullable=False),
    sa.Column('vector', sa.JSON(), nullable=False),
    sa.Column('sample_count', sa.Integer(), nullable=False),
    sa.Column('sample_seconds', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('owner_key', 'name', name='uq_speaker_profiles_owner_name')
    )
    with op.batch_alter_table('speaker_profiles') as batch:
        batch.create_index(batch.f('ix_speaker_profiles_owner_key'), ['owner_key'], unique=False)
    op.create_table('speaker_samples',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('profile_id', sa.String(length=40), nullable=False),
    sa.Column('vector', sa.JSON(), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('source', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['profile_id'], ['speaker_profiles.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('speaker_samples') as batch:
        batch.create_index(batch.f('ix_speaker_samples_profile_id'), ['profile_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('speaker_samples') as batch:
        batch.drop_index(batch.f('ix_speaker_samples_profile_id'))
    op.drop_table('speaker_samples')
    with op.batch_alter_table('speaker_profiles') as batch:
        batch.drop_index(batch.f('ix_speaker_profiles_owner_key'))
    op.drop_table('speaker_profiles')
