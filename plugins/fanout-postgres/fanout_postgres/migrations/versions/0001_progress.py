"""The append-mode progress table: one row per committed (pipeline, sink, batch, partition).

Revision ID: 0001_progress
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001_progress"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``<schema>.progress``, written in the same transaction as the rows it marks."""
    schema = op.get_context().version_table_schema
    op.create_table(
        "progress",
        sa.Column("pipeline", sa.Text, nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("partitions", sa.Integer, nullable=False),
        sa.Column("query_id", sa.Text, nullable=True),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("rejects", postgresql.JSONB, nullable=True),
        sa.Column(
            "committed_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.PrimaryKeyConstraint("pipeline", "sink", "batch_id", "partition", name="progress_pkey"),
        schema=schema,
        comment="fanout: partitions of append batches already committed (see fanout-postgres)",
    )


def downgrade() -> None:
    """Drop the progress table."""
    op.drop_table("progress", schema=op.get_context().version_table_schema)
