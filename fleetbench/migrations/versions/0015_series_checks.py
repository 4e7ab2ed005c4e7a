"""series checks: the regression check leaves ingest's transaction for a queue of series

Ingest queues each (node, model, kind) it stored runs of; a registry process's judge takes
the checks that are due, judges their series and deletes them. What the judge writes has a
table of its own: each series' minimum detectable change moves from latest_points (which
ingest rewrites) to detectable_changes. node_activity.changes, the key of the per-process
series cache that judging at ingest needed, goes with that cache. Every run stored before
this revision was judged at ingest: the queue starts empty. The downgrade drops the checks
still queued (their runs stay unjudged by the older code).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "series_checks",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_since", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_series_checks_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_series_checks_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "model_id", "kind", name=op.f("pk_series_checks")),
    )
    op.create_index("ix_series_checks_queued", "series_checks", ["queued_at"], unique=False)
    op.create_table(
        "detectable_changes",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("tg", sa.Integer(), nullable=False),
        sa.Column("b", sa.Integer(), nullable=False),
        sa.Column("change", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_detectable_changes_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_detectable_changes_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "node_id", "model_id", "pp", "tg", "b", name=op.f("pk_detectable_changes")
        ),
    )
    op.execute(
        "INSERT INTO detectable_changes (node_id, model_id, pp, tg, b, change) "
        "SELECT node_id, model_id, pp, tg, b, min_detectable_change FROM latest_points "
        "WHERE min_detectable_change IS NOT NULL"
    )
    with op.batch_alter_table("latest_points", schema=None) as batch_op:
        batch_op.drop_column("min_detectable_change")
    with op.batch_alter_table("node_activity", schema=None) as batch_op:
        batch_op.drop_column("changes")


def downgrade() -> None:
    with op.batch_alter_table("node_activity", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("changes", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
        )
    with op.batch_alter_table("latest_points", schema=None) as batch_op:
        batch_op.add_column(sa.Column("min_detectable_change", sa.Double(), nullable=True))
    op.execute(
        "UPDATE latest_points SET min_detectable_change = (SELECT d.change "
        "FROM detectable_changes AS d WHERE d.node_id = latest_points.node_id "
        "AND d.model_id = latest_points.model_id AND d.pp = latest_points.pp "
        "AND d.tg = latest_points.tg AND d.b = latest_points.b)"
    )
    op.drop_table("detectable_changes")
    op.drop_index("ix_series_checks_queued", table_name="series_checks")
    op.drop_table("series_checks")
