"""Each progress mark (append) and ``upsert_routes`` row (upsert) records the OID of the
table its partition wrote into (``target_oid``), in the statement that already writes it:
a table dropped and created again between two runs has another OID, so the next run's
lost-target check tells it from the table the marks were written to (the marks outlive
it in fanout's schema, and said "held").

Nullable: marks and rows written before this revision have none, and are not compared.

Revision ID: 0006_target_oid
Revises: 0005_upsert_routes_partitions
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_target_oid"
down_revision = "0005_upsert_routes_partitions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``target_oid`` to ``<schema>.progress`` and ``<schema>.upsert_routes``."""
    schema = op.get_context().version_table_schema
    for table in ("progress", "upsert_routes"):
        op.add_column(table, sa.Column("target_oid", sa.BigInteger, nullable=True), schema=schema)


def downgrade() -> None:
    """Drop ``target_oid``."""
    schema = op.get_context().version_table_schema
    for table in ("upsert_routes", "progress"):
        op.drop_column(table, "target_oid", schema=schema)
