"""node_activity.changes: every run added to or pruned from a node, counted, never lowered

A process keeps the recent series of the nodes it stored runs for (registry.series_cache)
while this count is what it saw; run_count alone could come back to a value seen before
(prune deletes one run, another process stores one) with a different history.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("node_activity", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("changes", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("node_activity", schema=None) as batch_op:
        batch_op.drop_column("changes")
