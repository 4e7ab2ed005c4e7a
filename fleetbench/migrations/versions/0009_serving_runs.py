"""serving runs: a run's kind and server, and its points per concurrency

Every run so far is an offline one.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FIGURES = [
    "seconds",
    "total_tps",
    *(f"per_user_tps_p{q}" for q in (10, 50, 90)),
    *(f"{name}_ms_p{q}" for name in ("ttft", "itl", "e2e") for q in (50, 90, 99)),
]


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), server_default="offline", nullable=False)
        )
        batch_op.add_column(sa.Column("server", sa.JSON(), nullable=True))
    op.create_table(
        "serving_points",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Double(), nullable=name != "seconds") for name in FIGURES),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_serving_points_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_serving_points")),
    )
    with op.batch_alter_table("serving_points", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_serving_points_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("serving_points", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_serving_points_run_id"))
    op.drop_table("serving_points")
    # Version 1 has no room for serving runs: they go, and what names them lets go first
    # (SQLite migrates with its foreign keys off, so nothing cascades).
    serving = "(SELECT id FROM runs WHERE kind = 'serving')"
    op.execute(f"DELETE FROM failed_points WHERE run_id IN {serving}")
    op.execute(f"UPDATE node_activity SET last_run_id = NULL WHERE last_run_id IN {serving}")
    op.execute("DELETE FROM runs WHERE kind = 'serving'")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("server")
        batch_op.drop_column("kind")
