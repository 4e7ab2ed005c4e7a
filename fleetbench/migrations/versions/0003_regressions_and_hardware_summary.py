"""regressions, and each fingerprint's hardware summary and memory

Fingerprints stored before this revision get their summary from the next run that reports
them (registry.crud), not here: a migration must not run application code that may change.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware_fingerprints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("description", sa.String(length=300), nullable=True))
        batch_op.add_column(sa.Column("memory_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("memory_kind", sa.String(length=16), nullable=True))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_node_started", ["node_id", "started_at"], unique=False)

    op.create_table(
        "regressions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("tg", sa.Integer(), nullable=False),
        sa.Column("b", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=8), nullable=False),
        sa.Column("before_value", sa.Double(), nullable=False),
        sa.Column("after_value", sa.Double(), nullable=False),
        sa.Column("change", sa.Double(), nullable=False),
        sa.Column("noise", sa.Double(), nullable=False),
        sa.Column("confidence", sa.Double(), nullable=False),
        sa.Column("runs_before", sa.Integer(), nullable=False),
        sa.Column("runs_after", sa.Integer(), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("cause_kinds", sa.JSON(), nullable=False),
        sa.Column("before_build", sa.String(length=300), nullable=True),
        sa.Column("after_build", sa.String(length=300), nullable=True),
        sa.Column("before_run_id", sa.Uuid(), nullable=False),
        sa.Column("first_run_id", sa.Uuid(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("notified_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notify_attempts", sa.Integer(), nullable=False),
        sa.Column("notify_after", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notify_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["before_run_id"],
            ["runs.id"],
            name=op.f("fk_regressions_before_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["first_run_id"],
            ["runs.id"],
            name=op.f("fk_regressions_first_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_regressions_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_regressions_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regressions")),
        sa.UniqueConstraint(
            "node_id",
            "model_id",
            "pp",
            "tg",
            "b",
            "metric",
            "first_run_id",
            name=op.f("uq_regressions_node_id"),
        ),
    )
    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.create_index("ix_regressions_first_seen", ["first_seen_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_regressions_first_run_id"), ["first_run_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_node_started")
    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_regressions_first_run_id"))
        batch_op.drop_index("ix_regressions_first_seen")
    op.drop_table("regressions")
    with op.batch_alter_table("hardware_fingerprints", schema=None) as batch_op:
        batch_op.drop_column("memory_kind")
        batch_op.drop_column("memory_bytes")
        batch_op.drop_column("description")
