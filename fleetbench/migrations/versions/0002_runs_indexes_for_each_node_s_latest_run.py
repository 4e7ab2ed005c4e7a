"""runs indexes for each node's latest run

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:36:11.849025
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_model_node_started"))
        batch_op.drop_index(batch_op.f("ix_runs_node_id"))
        batch_op.create_index("ix_runs_model_started", ["model_id", "started_at"], unique=False)
        batch_op.create_index(
            "ix_runs_node_model_started",
            ["node_id", "model_id", "started_at", "received_at"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_node_model_started")
        batch_op.drop_index("ix_runs_model_started")
        batch_op.create_index(batch_op.f("ix_runs_node_id"), ["node_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_runs_model_node_started"),
            ["model_id", "node_id", "started_at"],
            unique=False,
        )
