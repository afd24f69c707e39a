"""What a replay must match: each progress mark records the partitioning it committed
under (fingerprint of the columns, types and hash scheme) and the digest of its input
rows (count and checksum), next to the existing ``partitions`` count.

Nullable: marks written before this revision have none, and are compared by count only.

Revision ID: 0002_progress_plan
Revises: 0001_progress
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_progress_plan"
down_revision = "0001_progress"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``fingerprint``, ``input_rows`` and ``input_checksum`` to ``<schema>.progress``."""
    schema = op.get_context().version_table_schema
    op.add_column("progress", sa.Column("fingerprint", sa.Text, nullable=True), schema=schema)
    op.add_column("progress", sa.Column("input_rows", sa.BigInteger, nullable=True), schema=schema)
    op.add_column(
        "progress", sa.Column("input_checksum", sa.BigInteger, nullable=True), schema=schema
    )


def downgrade() -> None:
    """Drop the three columns."""
    schema = op.get_context().version_table_schema
    for column in ("input_checksum", "input_rows", "fingerprint"):
        op.drop_column("progress", column, schema=schema)
