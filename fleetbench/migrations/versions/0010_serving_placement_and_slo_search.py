"""serving placement and SLO search: each node's latest serving run of each model, and a
serving run's search

Filled from the serving runs stored so far.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 23:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slo_search", sa.JSON(), nullable=True))
    latest = op.create_table(
        "latest_serving_runs",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("gen_tokens", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=True),
        sa.Column("ctx_per_slot", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["build_id"],
            ["engine_builds.id"],
            name=op.f("fk_latest_serving_runs_build_id_engine_builds"),
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_latest_serving_runs_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_latest_serving_runs_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_latest_serving_runs_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "model_id", name=op.f("pk_latest_serving_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_latest_serving_runs_run_id")),
    )
    with op.batch_alter_table("latest_serving_runs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_latest_serving_runs_model_id"), ["model_id"], unique=False
        )
    runs = sa.table(
        "runs",
        sa.column("id", sa.Uuid()),
        sa.column("node_id", sa.Integer()),
        sa.column("model_id", sa.Integer()),
        sa.column("build_id", sa.Integer()),
        sa.column("kind", sa.String()),
        sa.column("status", sa.String()),
        sa.column("server", sa.JSON()),
        sa.column("started_at", sa.DateTime(timezone=True)),
        sa.column("received_at", sa.DateTime(timezone=True)),
    )
    rows = op.get_bind().execute(
        sa.select(runs)
        .where(runs.c.kind == "serving", runs.c.status != "failed")
        # RUN_NEWEST_FIRST: the first of each node and model is its latest
        .order_by(runs.c.started_at.desc(), runs.c.received_at.desc(), runs.c.id)
    )
    newest: dict[tuple[int, int], dict[str, object]] = {}
    for run in rows:
        server = run.server or {}
        newest.setdefault(
            (run.node_id, run.model_id),
            {
                "node_id": run.node_id,
                "model_id": run.model_id,
                "run_id": run.id,
                "started_at": run.started_at,
                "received_at": run.received_at,
                "build_id": run.build_id,
                "prompt_tokens": server.get("prompt_tokens", 0),
                "gen_tokens": server.get("gen_tokens", 0),
                "slots": server.get("slots"),
                "ctx_per_slot": server.get("ctx_per_slot"),
            },
        )
    if newest:
        op.bulk_insert(latest, list(newest.values()))


def downgrade() -> None:
    # Version 0009 knows the offline metrics alone: serving regressions go with the table.
    op.execute("DELETE FROM regressions WHERE metric = 'srv_tps'")
    with op.batch_alter_table("latest_serving_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_latest_serving_runs_model_id"))
    op.drop_table("latest_serving_runs")
    # Version 2 runs have no search: a searched run stays, without what it found.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("slo_search")
