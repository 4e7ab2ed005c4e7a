"""Rollouts an admin watches: two builds of a model, their verdict as last checked, and a
change of verdict waiting for the webhook (registry.compare.rollouts)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 01:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout_watches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("from_build", sa.String(length=200), nullable=False),
        sa.Column("to_build", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("previous_verdict", sa.String(length=16), nullable=True),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notified_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notify_attempts", sa.Integer(), nullable=False),
        sa.Column("notify_after", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notify_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_watches")),
        sa.UniqueConstraint(
            "model", "from_build", "to_build", "kind", name=op.f("uq_rollout_watches_model")
        ),
    )


def downgrade() -> None:
    op.drop_table("rollout_watches")
