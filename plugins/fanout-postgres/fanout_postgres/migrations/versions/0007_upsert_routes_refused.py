"""Each ``upsert_routes`` row records how many rows its partition refused (``refused``)
and, when a PostgreSQL dead-letter table took them in the partition's own transaction,
that table (``kept_in``), as append's progress marks keep theirs (``rejects``, each
with its ``kept_in``). A Delta (or other) dead-letter target is written by the driver
after every partition committed, so a driver killed in between left a batch whose
partitions all committed and whose refused rows are in no target: without a count,
``holds_batch`` could not tell it from a batch that refused none, answered "held", and
``fanout recover`` recorded a lost mark, and the restart skipped the sink for the batch,
its refused rows with it. An upsert's replay
writes every partition again and refuses the same rows again, so the count is all it
needs: the rows themselves are not kept.

Nullable: rows written before this revision (or by an older fanout) have none, and are
read as "cannot tell" unless the dead-letter target shows the batch's letters
(:meth:`fanout_postgres.sink.PostgresSink.holds_batch`).

Revision ID: 0007_upsert_routes_refused
Revises: 0006_target_oid
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_upsert_routes_refused"
down_revision = "0006_target_oid"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``refused`` and ``kept_in`` to ``<schema>.upsert_routes``."""
    schema = op.get_context().version_table_schema
    op.add_column("upsert_routes", sa.Column("refused", sa.BigInteger, nullable=True),
                  schema=schema)  # fmt: skip
    op.add_column("upsert_routes", sa.Column("kept_in", sa.Text, nullable=True), schema=schema)


def downgrade() -> None:
    """Drop ``kept_in`` and ``refused``."""
    schema = op.get_context().version_table_schema
    for column in ("kept_in", "refused"):
        op.drop_column("upsert_routes", column, schema=schema)
