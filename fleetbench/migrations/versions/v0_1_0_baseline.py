"""fleetbench 0.1.0: the whole schema, in one baseline

The development builds before 0.1.0 made 21 migrations; this replaces them (a database they
made is refused, registry.db). From here on each release adds at most one migration, and
until it is released that one is amended rather than followed by another (docs/development.md).

Revision ID: v0_1_0
Revises:
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "v0_1_0"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
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
        "hardware_prices",
        sa.Column("hardware_class", sa.String(length=300), nullable=False),
        sa.Column("usd_per_hour", sa.Double(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("set_by", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("hardware_class", name=op.f("pk_hardware_prices")),
    )
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
    op.create_table(
        "sweep_plans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep_plans")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_sweep_plans_name")),
    )
    epoch = op.create_table(
        "token_epoch",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_token_epoch")),
    )
    # the one row every registry process watches (registry.authentication)
    op.bulk_insert(epoch, [{"id": 1, "epoch": 0}])
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
        sa.Column("created_by_node_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["created_by_node_id"],
            ["nodes.id"],
            name=op.f("fk_engine_builds_created_by_node_id_nodes"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_builds")),
        sa.UniqueConstraint("identity", name=op.f("uq_engine_builds_identity")),
    )
    op.create_index(
        op.f("ix_engine_builds_created_by_node_id"),
        "engine_builds",
        ["created_by_node_id"],
        unique=False,
    )

    op.create_table(
        "hardware_fingerprints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=128), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("description", sa.String(length=300), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_kind", sa.String(length=16), nullable=True),
        sa.Column("hardware_class", sa.String(length=300), nullable=True),
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
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=300), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("name_key", sa.String(length=200), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("created_by_node_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["created_by_node_id"],
            ["nodes.id"],
            name=op.f("fk_models_created_by_node_id_nodes"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("identity", name=op.f("uq_models_identity")),
    )
    op.create_index(
        op.f("ix_models_created_by_node_id"), "models", ["created_by_node_id"], unique=False
    )
    op.create_index(op.f("ix_models_name_key"), "models", ["name_key"], unique=False)
    op.create_index(op.f("ix_models_sha256"), "models", ["sha256"], unique=False)

    op.create_table(
        "node_plan_status",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.JSON(), nullable=True),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sweep_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_plan_status_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_plan_status")),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("replaced_by_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_tokens_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["replaced_by_id"], ["tokens.id"], name=op.f("fk_tokens_replaced_by_id_tokens")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_tokens_token_sha256")),
    )
    op.create_index(op.f("ix_tokens_node_id"), "tokens", ["node_id"], unique=False)

    op.create_table(
        "build_point_sums",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_id", sa.Integer(), nullable=False),
        sa.Column("settings", sa.String(length=400), nullable=False),
        sa.Column("metric", sa.String(length=24), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("tg", sa.Integer(), nullable=False),
        sa.Column("b", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("total", sa.Double(), nullable=False),
        sa.Column("squares", sa.Double(), nullable=False),
        sa.Column("relative_sd", sa.Double(), nullable=False),
        sa.Column("repeats", sa.Double(), nullable=False),
        sa.Column("repeated", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["build_id"],
            ["engine_builds.id"],
            name=op.f("fk_build_point_sums_build_id_engine_builds"),
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_build_point_sums_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_build_point_sums_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "model_id",
            "build_id",
            "node_id",
            "fingerprint_id",
            "settings",
            "metric",
            "pp",
            "tg",
            "b",
            name=op.f("pk_build_point_sums"),
        ),
    )
    op.create_table(
        "build_sums_stamps",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["build_id"],
            ["engine_builds.id"],
            name=op.f("fk_build_sums_stamps_build_id_engine_builds"),
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_build_sums_stamps_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_build_sums_stamps_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "model_id", "build_id", "node_id", name=op.f("pk_build_sums_stamps")
        ),
    )
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
    op.create_table(
        "model_facts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=64), nullable=False),
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
        sa.Column("weight_bytes", sa.BigInteger(), nullable=True),
        sa.Column("expert_bytes", sa.BigInteger(), nullable=True),
        sa.Column("expert_count", sa.Integer(), nullable=True),
        sa.Column("expert_used_count", sa.Integer(), nullable=True),
        sa.Column("layers", sa.JSON(), nullable=True),
        sa.Column("created_by_node_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["created_by_node_id"],
            ["nodes.id"],
            name=op.f("fk_model_facts_created_by_node_id_nodes"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_model_facts_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_facts")),
        sa.UniqueConstraint("model_id", "identity", name=op.f("uq_model_facts_model_id")),
    )
    op.create_index(
        op.f("ix_model_facts_created_by_node_id"),
        "model_facts",
        ["created_by_node_id"],
        unique=False,
    )

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
        "runs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("reported_id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_id", sa.Integer(), nullable=True),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("facts_id", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("agent", sa.String(length=512), nullable=True),
        sa.Column("kind", sa.String(length=16), server_default="offline", nullable=False),
        sa.Column("server", sa.JSON(), nullable=True),
        sa.Column("slo_search", sa.JSON(), nullable=True),
        sa.Column("engine_on_accelerator", sa.Boolean(), nullable=True),
        sa.Column("accelerator_note", sa.Text(), nullable=True),
        sa.Column("buffers", sa.JSON(), nullable=True),
        sa.Column("kv_predicted_bytes", sa.BigInteger(), nullable=True),
        sa.Column("kv_allocated_bytes", sa.BigInteger(), nullable=True),
        sa.Column("device_memory", sa.JSON(), nullable=True),
        sa.Column("bandwidth", sa.JSON(), nullable=True),
        sa.Column("contention", sa.JSON(), nullable=True),
        sa.Column("contention_reason", sa.Text(), nullable=True),
        sa.Column("energy", sa.JSON(), nullable=True),
        sa.Column("outputs", sa.JSON(), nullable=True),
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
        sa.Column("swa_full", sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(
            ["build_id"], ["engine_builds.id"], name=op.f("fk_runs_build_id_engine_builds")
        ),
        sa.ForeignKeyConstraint(
            ["facts_id"], ["model_facts.id"], name=op.f("fk_runs_facts_id_model_facts")
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
        sa.UniqueConstraint("node_id", "reported_id", name=op.f("uq_runs_node_id")),
    )
    op.create_index("ix_runs_model_started", "runs", ["model_id", "started_at"], unique=False)
    op.create_index(
        "ix_runs_node_model_newest",
        "runs",
        [
            "node_id",
            "model_id",
            sa.literal_column("started_at DESC"),
            sa.literal_column("received_at DESC"),
            "id",
        ],
        unique=False,
    )
    op.create_index("ix_runs_node_started", "runs", ["node_id", "started_at"], unique=False)
    op.create_index(op.f("ix_runs_started_at"), "runs", ["started_at"], unique=False)

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
    op.create_index(op.f("ix_failed_points_run_id"), "failed_points", ["run_id"], unique=False)

    op.create_table(
        "latest_runs",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("facts_id", sa.Integer(), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("cache_type_k", sa.String(length=16), nullable=True),
        sa.Column("cache_type_v", sa.String(length=16), nullable=True),
        sa.Column("n_ubatch", sa.Integer(), nullable=True),
        sa.Column("flash_attn", sa.String(length=8), nullable=True),
        sa.Column("swa_full", sa.Boolean(), nullable=True),
        sa.Column("engine_on_accelerator", sa.Boolean(), nullable=True),
        sa.Column("beside_kv_bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["build_id"], ["engine_builds.id"], name=op.f("fk_latest_runs_build_id_engine_builds")
        ),
        sa.ForeignKeyConstraint(
            ["facts_id"], ["model_facts.id"], name=op.f("fk_latest_runs_facts_id_model_facts")
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
    op.create_index(op.f("ix_latest_runs_model_id"), "latest_runs", ["model_id"], unique=False)

    op.create_table(
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
    op.create_index(
        op.f("ix_latest_serving_runs_model_id"), "latest_serving_runs", ["model_id"], unique=False
    )

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
    op.create_index(
        op.f("ix_node_activity_last_run_id"), "node_activity", ["last_run_id"], unique=False
    )

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
        sa.Column("acknowledged_by", sa.String(length=200), nullable=True),
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
    op.create_index(
        op.f("ix_regressions_before_run_id"), "regressions", ["before_run_id"], unique=False
    )
    op.create_index(
        op.f("ix_regressions_first_run_id"), "regressions", ["first_run_id"], unique=False
    )
    op.create_index("ix_regressions_first_seen", "regressions", ["first_seen_at"], unique=False)

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
        sa.Column("mbu", sa.Double(), nullable=True),
        sa.Column("impossible", sa.Text(), nullable=True),
        sa.Column("energy", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_points_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_points")),
    )
    op.create_index(op.f("ix_run_points_run_id"), "run_points", ["run_id"], unique=False)

    op.create_table(
        "serving_points",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("seconds", sa.Double(), nullable=False),
        sa.Column("total_tps", sa.Double(), nullable=True),
        sa.Column("per_user_tps_p10", sa.Double(), nullable=True),
        sa.Column("per_user_tps_p50", sa.Double(), nullable=True),
        sa.Column("per_user_tps_p90", sa.Double(), nullable=True),
        sa.Column("ttft_ms_p50", sa.Double(), nullable=True),
        sa.Column("ttft_ms_p90", sa.Double(), nullable=True),
        sa.Column("ttft_ms_p99", sa.Double(), nullable=True),
        sa.Column("itl_ms_p50", sa.Double(), nullable=True),
        sa.Column("itl_ms_p90", sa.Double(), nullable=True),
        sa.Column("itl_ms_p99", sa.Double(), nullable=True),
        sa.Column("e2e_ms_p50", sa.Double(), nullable=True),
        sa.Column("e2e_ms_p90", sa.Double(), nullable=True),
        sa.Column("e2e_ms_p99", sa.Double(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_serving_points_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_serving_points")),
    )
    op.create_index(op.f("ix_serving_points_run_id"), "serving_points", ["run_id"], unique=False)

    op.create_table(
        "latest_points",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("tg", sa.Integer(), nullable=False),
        sa.Column("b", sa.Integer(), nullable=False),
        sa.Column("s_pp", sa.Double(), nullable=True),
        sa.Column("s_tg", sa.Double(), nullable=True),
        sa.Column("mbu", sa.Double(), nullable=True),
        sa.Column("joules", sa.Double(), nullable=True),
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
    op.create_index(
        "ix_latest_points_model_node", "latest_points", ["model_id", "node_id", "pp"], unique=False
    )


def downgrade() -> None:
    op.drop_table("latest_points")
    op.drop_table("serving_points")
    op.drop_table("run_points")
    op.drop_table("regressions")
    op.drop_table("node_activity")
    op.drop_table("latest_serving_runs")
    op.drop_table("latest_runs")
    op.drop_table("failed_points")
    op.drop_table("runs")
    op.drop_table("series_checks")
    op.drop_table("model_facts")
    op.drop_table("detectable_changes")
    op.drop_table("build_sums_stamps")
    op.drop_table("build_point_sums")
    op.drop_table("tokens")
    op.drop_table("node_plan_status")
    op.drop_table("models")
    op.drop_table("hardware_fingerprints")
    op.drop_table("engine_builds")
    op.drop_table("token_epoch")
    op.drop_table("sweep_plans")
    op.drop_table("rollout_watches")
    op.drop_table("hardware_prices")
    op.drop_table("nodes")
    # (a table's indexes go with it)
