"""latest curves of each node and model, each node's activity; an index for deleting runs

The tables are filled from the runs already stored, in SQL (each node's latest successful
run of each model, as the registry orders runs, and its points; each node's newest run and
its number of runs). Whether a point lies past its curve's knee is left unknown (NULL)
here: computing it is application code, which a migration must not run;
`fleetbench-registry migrate` computes it right after upgrading.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:15:01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "latest_runs",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("cache_type_k", sa.String(length=16), nullable=True),
        sa.Column("cache_type_v", sa.String(length=16), nullable=True),
        sa.Column("n_ubatch", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["build_id"], ["engine_builds.id"], name=op.f("fk_latest_runs_build_id_engine_builds")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_latest_runs_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_latest_runs_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_latest_runs_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "model_id", name=op.f("pk_latest_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_latest_runs_run_id")),
    )
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_latest_runs_model_id"), ["model_id"], unique=False)

    op.create_table(
        "node_activity",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("last_run_id", sa.Uuid(), nullable=True),
        sa.Column("last_run_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_received_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["last_run_id"],
            ["runs.id"],
            name=op.f("fk_node_activity_last_run_id_runs"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_activity_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_activity")),
    )
    with op.batch_alter_table("node_activity", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_node_activity_last_run_id"), ["last_run_id"], unique=False
        )

    op.create_table(
        "latest_points",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("tg", sa.Integer(), nullable=False),
        sa.Column("b", sa.Integer(), nullable=False),
        sa.Column("s_pp", sa.Double(), nullable=True),
        sa.Column("s_tg", sa.Double(), nullable=True),
        sa.Column("past_knee", sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id", "model_id"],
            ["latest_runs.node_id", "latest_runs.model_id"],
            name=op.f("fk_latest_points_node_id_latest_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "node_id", "model_id", "pp", "tg", "b", name=op.f("pk_latest_points")
        ),
    )
    with op.batch_alter_table("latest_points", schema=None) as batch_op:
        batch_op.create_index(
            "ix_latest_points_model_node", ["model_id", "node_id", "pp"], unique=False
        )

    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_regressions_before_run_id"), ["before_run_id"], unique=False
        )

    op.execute(_LATEST_RUNS)
    op.execute(_LATEST_POINTS)
    op.execute(_NODE_ACTIVITY)


def downgrade() -> None:
    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_regressions_before_run_id"))

    with op.batch_alter_table("latest_points", schema=None) as batch_op:
        batch_op.drop_index("ix_latest_points_model_node")

    op.drop_table("latest_points")
    with op.batch_alter_table("node_activity", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_activity_last_run_id"))

    op.drop_table("node_activity")
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_latest_runs_model_id"))

    op.drop_table("latest_runs")


# Newest first as the registry orders runs: started, then received, then the smaller id.
_LATEST_RUNS = """
INSERT INTO latest_runs (node_id, model_id, run_id, started_at, received_at, build_id,
                         memory_bytes, cache_type_k, cache_type_v, n_ubatch)
SELECT node_id, model_id, id, started_at, received_at, build_id,
       memory_bytes, cache_type_k, cache_type_v, n_ubatch
FROM (
    SELECT r.node_id, r.model_id, r.id, r.started_at, r.received_at, r.build_id,
           f.memory_bytes, r.cache_type_k, r.cache_type_v, r.n_ubatch,
           row_number() OVER (PARTITION BY r.node_id, r.model_id
                              ORDER BY r.started_at DESC, r.received_at DESC, r.id) AS newest
    FROM runs r LEFT JOIN hardware_fingerprints f ON f.id = r.fingerprint_id
    WHERE r.status <> 'failed'
) ranked
WHERE newest = 1
"""
# A run stored before cells had to be unique may hold one twice: the first stored is kept.
_LATEST_POINTS = """
INSERT INTO latest_points (node_id, model_id, pp, tg, b, s_pp, s_tg, past_knee)
SELECT node_id, model_id, pp, tg, b, s_pp, s_tg, NULL
FROM (
    SELECT l.node_id, l.model_id, p.pp, p.tg, p.b, p.s_pp, p.s_tg,
           row_number() OVER (PARTITION BY l.node_id, l.model_id, p.pp, p.tg, p.b
                              ORDER BY p.id) AS first
    FROM latest_runs l JOIN run_points p ON p.run_id = l.run_id
) points
WHERE first = 1
"""


_NODE_ACTIVITY = """
INSERT INTO node_activity (node_id, last_run_id, last_run_started_at, last_run_received_at,
                           run_count)
SELECT node_id, id, started_at, received_at, runs
FROM (
    SELECT r.node_id, r.id, r.started_at, r.received_at,
           count(*) OVER (PARTITION BY r.node_id) AS runs,
           row_number() OVER (PARTITION BY r.node_id
                              ORDER BY r.started_at DESC, r.received_at DESC, r.id) AS newest
    FROM runs r
) ranked
WHERE newest = 1
"""
