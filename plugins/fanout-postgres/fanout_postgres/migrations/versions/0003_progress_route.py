"""Each progress mark records the route its partition's rows went through
(``<fingerprint> <route>``, as a route letter's ``route`` column does), so a replay under
another route is refused before it writes route letters for rows a committed partition
already holds.

Nullable: marks written before this revision have none, and are not compared.

Revision ID: 0003_progress_route
Revises: 0002_progress_plan
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_progress_route"
down_revision = "0002_progress_plan"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``route`` to ``<schema>.progress``."""
    schema = op.get_context().version_table_schema
    op.add_column("progress", sa.Column("route", sa.Text, nullable=True), schema=schema)


def downgrade() -> None:
    """Drop ``route``."""
    op.drop_column("progress", "route", schema=op.get_context().version_table_schema)
