"""Each ``upsert_routes`` row records the partition count its batch was written in, as a
progress mark does (``partitions``), so whether a batch is held whole is told from the
count of the write, not from the sink's ``partitions`` option at the time of asking (an
option lowered between a killed run and a reset made part of a batch read as the whole).

Nullable: rows written before this revision have none; a batch whose rows record no count
is never answered as held whole.

Revision ID: 0005_upsert_routes_partitions
Revises: 0004_upsert_routes
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_upsert_routes_partitions"
down_revision = "0004_upsert_routes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``partitions`` to ``<schema>.upsert_routes``."""
    schema = op.get_context().version_table_schema
    op.add_column(
        "upsert_routes", sa.Column("partitions", sa.Integer, nullable=True), schema=schema
    )


def downgrade() -> None:
    """Drop ``partitions``."""
    op.drop_column("upsert_routes", "partitions", schema=op.get_context().version_table_schema)
