"""Each ``upsert_routes`` row records the table its partition wrote, as the sink's option
``table`` named it (``target``), as append's progress marks do (migration
``0001_progress``). With the OID alone (``0006_target_oid``) a row of another table could
not tell a table moved (option ``table`` changed) from one replaced under its name (a
dump restored), so ``holds_batch`` counted a moved upsert sink's rows as holding the batch
for the table it names now: a checkpoint reset with the table moved and a dead-letter
target was refused, and its lost mark recorded for a batch the new table lacks
(docs/architecture.md §8.2, "A table moved mid-batch").

Nullable: rows written before this revision (or by an older fanout) have none, and count
as before (not moved).

Revision ID: 0008_upsert_routes_target
Revises: 0007_upsert_routes_refused
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_upsert_routes_target"
down_revision = "0007_upsert_routes_refused"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``target`` to ``<schema>.upsert_routes``."""
    schema = op.get_context().version_table_schema
    op.add_column("upsert_routes", sa.Column("target", sa.Text, nullable=True), schema=schema)


def downgrade() -> None:
    """Drop ``target``."""
    schema = op.get_context().version_table_schema
    op.drop_column("upsert_routes", "target", schema=schema)
