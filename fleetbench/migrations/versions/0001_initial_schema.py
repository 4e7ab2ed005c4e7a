"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 10:03:32.793686
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "engine_builds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=64), nullable=False),
        sa.Column("engine", sa.String(length=200), nullable=False),
        sa.Column("build_number", sa.Integer(), nullable=True),
        sa.Column("commit", sa.String(length=64), nullable=True),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.Column("binding", sa.String(length=100), nullable=True),
        sa.Column("binding_version", sa.String(length=100), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_builds")),
        sa.UniqueConstraint("identity", name=op.f("uq_engine_builds_identity")),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=300), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("name_key", sa.String(length=200), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("quantization", sa.String(length=64), nullable=True),
        sa.Column("n_params", sa.BigInteger(), nullable=True),
        sa.Column("file_size", sa.BigInteger(), nullable=True),
        sa.Column("n_layer", sa.Integer(), nullable=True),
        sa.Column("n_head_kv", sa.Integer(), nullable=True),
        sa.Column("head_dim_k", sa.Integer(), nullable=True),
        sa.Column("head_dim_v", sa.Integer(), nullable=True),
        sa.Column("n_ctx_train", sa.Integer(), nullable=True),
        sa.Column("sliding_window", sa.Integer(), nullable=True),
        sa.Column("n_swa_layers", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("identity", name=op.f("uq_models_identity")),
    )
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_models_name_key"), ["name_key"], unique=False)
        batch_op.create_index(batch_op.f("ix_models_sha256"), ["sha256"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    op.create_table(
        "hardware_fingerprints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=128), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_hardware_fingerprints_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hardware_fingerprints")),
        sa.UniqueConstraint("node_id", "hash", name=op.f("uq_hardware_fingerprints_node_id")),
    )
    op.create_table(
        "node_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_tokens_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_node_tokens_token_sha256")),
    )
    with op.batch_alter_table("node_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_tokens_node_id"), ["node_id"], unique=False)

    op.create_table(
        "runs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_id", sa.Integer(), nullable=True),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("report_sha256", sa.String(length=64), nullable=False),
        sa.Column("n_ctx", sa.Integer(), nullable=True),
        sa.Column("n_batch", sa.Integer(), nullable=True),
        sa.Column("n_ubatch", sa.Integer(), nullable=True),
        sa.Column("flash_attn", sa.String(length=8), nullable=True),
        sa.Column("kv_unified", sa.Boolean(), nullable=True),
        sa.Column("pp_shared", sa.Boolean(), nullable=True),
        sa.Column("tg_separate", sa.Boolean(), nullable=True),
        sa.Column("n_gpu_layers", sa.Integer(), nullable=True),
        sa.Column("n_threads", sa.Integer(), nullable=True),
        sa.Column("n_threads_batch", sa.Integer(), nullable=True),
        sa.Column("cache_type_k", sa.String(length=16), nullable=True),
        sa.Column("cache_type_v", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(
            ["build_id"], ["engine_builds.id"], name=op.f("fk_runs_build_id_engine_builds")
        ),
        sa.ForeignKeyConstraint(
            ["fingerprint_id"],
            ["hardware_fingerprints.id"],
            name=op.f("fk_runs_fingerprint_id_hardware_fingerprints"),
        ),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name=op.f("fk_runs_model_id_models")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_runs_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_model_node_started", ["model_id", "node_id", "started_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_runs_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_started_at"), ["started_at"], unique=False)

    op.create_table(
        "failed_points",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("tg", sa.Integer(), nullable=False),
        sa.Column("b", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_failed_points_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_failed_points")),
    )
    with op.batch_alter_table("failed_points", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_failed_points_run_id"), ["run_id"], unique=False)

    op.create_table(
        "run_points",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("tg", sa.Integer(), nullable=False),
        sa.Column("b", sa.Integer(), nullable=False),
        sa.Column("n_kv", sa.Integer(), nullable=True),
        sa.Column("t_pp", sa.Double(), nullable=True),
        sa.Column("s_pp", sa.Double(), nullable=True),
        sa.Column("t_tg", sa.Double(), nullable=True),
        sa.Column("s_tg", sa.Double(), nullable=True),
        sa.Column("t", sa.Double(), nullable=True),
        sa.Column("s", sa.Double(), nullable=True),
        sa.Column("repeats", sa.Integer(), nullable=False),
        sa.Column("s_pp_stdev", sa.Double(), nullable=True),
        sa.Column("s_tg_stdev", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_points_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_points")),
    )
    with op.batch_alter_table("run_points", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_points_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("run_points", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_points_run_id"))

    op.drop_table("run_points")
    with op.batch_alter_table("failed_points", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_failed_points_run_id"))

    op.drop_table("failed_points")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_started_at"))
        batch_op.drop_index(batch_op.f("ix_runs_node_id"))
        batch_op.drop_index("ix_runs_model_node_started")

    op.drop_table("runs")
    with op.batch_alter_table("node_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_tokens_node_id"))

    op.drop_table("node_tokens")
    op.drop_table("hardware_fingerprints")
    op.drop_table("nodes")
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_models_sha256"))
        batch_op.drop_index(batch_op.f("ix_models_name_key"))

    op.drop_table("models")
    op.drop_table("engine_builds")
