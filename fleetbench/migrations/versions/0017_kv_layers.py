"""KV geometry layer by layer: a model's per-layer facts (wire schema version 6), whether a
run kept full-size sliding-window caches, and the settings of each node's latest run that
its fit depends on besides those it had (flash attention, swa_full)

Facts stored before carry no layers (the agents before version 6 did not read them); each
latest run's flash_attn is copied from its run.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("model_facts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("layers", sa.JSON(), nullable=True))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("swa_full", sa.Boolean(), nullable=True))
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("flash_attn", sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column("swa_full", sa.Boolean(), nullable=True))
    op.execute(
        "UPDATE latest_runs SET flash_attn = "
        "(SELECT runs.flash_attn FROM runs WHERE runs.id = latest_runs.run_id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.drop_column("swa_full")
        batch_op.drop_column("flash_attn")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("swa_full")
    with op.batch_alter_table("model_facts", schema=None) as batch_op:
        batch_op.drop_column("layers")
