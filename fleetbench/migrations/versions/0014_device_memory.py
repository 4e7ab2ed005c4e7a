"""device memory: each NVIDIA GPU's memory in use around a run (wire schema version 5)

Runs stored before carry none: agents before version 5 did not read it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 04:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("device_memory", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("device_memory")
