"""Upsert mode: one row per committed (pipeline, sink, batch, partition), written in the
partition's transaction, recording the route its rows went through (``<fingerprint>
<route>``). An upsert rewrites a replayed batch but deletes nothing, so a replay under
another route than a committed partition's is refused before it writes route letters for
rows that partition holds (:mod:`fanout_postgres.membership`).

Revision ID: 0004_upsert_routes
Revises: 0003_progress_route
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_upsert_routes"
down_revision = "0003_progress_route"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``<schema>.upsert_routes``."""
    schema = op.get_context().version_table_schema
    op.create_table(
        "upsert_routes",
        sa.Column("pipeline", sa.Text, nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("route", sa.Text, nullable=True),
        sa.Column(
            "committed_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.PrimaryKeyConstraint(
            "pipeline", "sink", "batch_id", "partition", name="upsert_routes_pkey"
        ),
        schema=schema,
        comment="fanout: the route of each committed upsert partition (see fanout-postgres)",
    )


def downgrade() -> None:
    """Drop the table."""
    op.drop_table("upsert_routes", schema=op.get_context().version_table_schema)
