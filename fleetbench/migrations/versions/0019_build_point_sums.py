"""Each node's runs of a model with one build, summed per point (build_point_sums: what a
build comparison reads, registry.projections.build_sums), filled from the runs stored; and each
fingerprint's hardware class (its description without the driver)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04 06:30:00
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As the registry made them when this migration was written (registry.projections.build_sums): a
# migration is a frozen copy.
_SETTINGS = (
    ("n_ctx", False),
    ("n_batch", False),
    ("n_ubatch", False),
    ("flash_attn", False),
    ("kv_unified", True),
    ("pp_shared", True),
    ("tg_separate", True),
    ("n_gpu_layers", False),
    ("n_threads", False),
    ("n_threads_batch", False),
    ("cache_type_k", False),
    ("cache_type_v", False),
    ("swa_full", True),
)
_SERVER_SHAPE = ("kind", "slots", "ctx_per_slot", "n_ctx", "prompt_tokens", "gen_tokens")
_KEYS = ("model_id", "build_id", "node_id", "fingerprint_id", "settings", "metric", "pp", "tg", "b")
_SUMMED = ("runs", "total", "squares", "relative_sd", "repeats", "repeated")

_runs = sa.table(
    "runs",
    *(
        sa.column(c)
        for c in ("id", "model_id", "build_id", "node_id", "fingerprint_id", "status", "kind")
    ),
    *(sa.column(name, sa.Boolean() if flag else sa.Integer()) for name, flag in _SETTINGS),
    sa.column("server", sa.JSON()),
)
_points = sa.table(
    "run_points",
    *(sa.column(c, sa.Integer()) for c in ("pp", "tg", "b", "repeats")),
    *(sa.column(c, sa.Double()) for c in ("s_tg", "s_pp", "s_tg_stdev", "s_pp_stdev")),
    sa.column("run_id"),
)
_serving = sa.table(
    "serving_points",
    sa.column("run_id"),
    sa.column("concurrency", sa.Integer()),
    sa.column("per_user_tps_p10", sa.Double()),
    sa.column("ttft_ms_p90", sa.Double()),
)


def _at_least(value: Any) -> Any:
    return sa.case((value < 1e-100, 1e-100), else_=value)


def _labelled(parts: list[tuple[str, Any]]) -> Any:
    pieces = [sa.func.coalesce(sa.literal(f" {name}=") + value, "") for name, value in parts]
    return sa.func.ltrim(functools.reduce(operator.add, pieces))


def _text(name: str, flag: bool) -> Any:
    column = _runs.c[name]
    if flag:
        return sa.case((column.is_(True), "true"), (column.is_(False), "false"))
    return sa.cast(column, sa.String)


def _summed(metric: str, value: Any, settings: Any, point: Any, relative: Any, repeats: Any) -> Any:
    keys = (
        _runs.c.model_id,
        _runs.c.build_id,
        _runs.c.node_id,
        sa.func.coalesce(_runs.c.fingerprint_id, 0),
        settings,
        sa.literal(metric),
        *point,
    )
    return (
        sa.select(
            *(k.label(n) for k, n in zip(keys, _KEYS, strict=True)),
            sa.func.count().label("runs"),
            sa.func.sum(value).label("total"),
            sa.func.sum(_at_least(value) * _at_least(value)).label("squares"),
            (
                sa.func.coalesce(sa.func.sum(relative), 0.0)
                if relative is not None
                else sa.literal(0.0)
            ).label("relative_sd"),
            (
                sa.func.coalesce(sa.func.sum(repeats), 0) if repeats is not None else sa.literal(0)
            ).label("repeats"),
            (sa.func.count(relative) if relative is not None else sa.literal(0)).label("repeated"),
        )
        .select_from(_runs)
        .where(value > 0)
        .group_by(*keys)
    )


def _offline(metric: str) -> Any:
    value, sd = _points.c[metric], _points.c[f"{metric}_stdev"]
    relative = sa.case(
        (
            sa.and_(sd.is_not(None), _points.c.repeats >= 2),
            sa.case((sd < 1e-100, 0.0), (sd < value * 1e6, sd / _at_least(value)), else_=1e6),
        )
    )
    settings = _labelled([(name, _text(name, flag)) for name, flag in _SETTINGS])
    point = (_points.c.pp, _points.c.tg, _points.c.b)
    repeats = sa.case((relative.is_not(None), _points.c.repeats))
    return (
        _summed(metric, value, settings, point, relative, repeats)
        .join(_points, _points.c.run_id == _runs.c.id)
        .where(_runs.c.status != "failed", _runs.c.kind == "offline")
    )


def _served(metric: str) -> Any:
    value, server = _serving.c[metric], _runs.c.server
    settings = _labelled([(k, server[k].as_string()) for k in _SERVER_SHAPE])
    point = (
        sa.func.coalesce(server["prompt_tokens"].as_integer(), 0),
        sa.func.coalesce(server["gen_tokens"].as_integer(), 0),
        _serving.c.concurrency,
    )
    return (
        _summed(metric, value, settings, point, None, None)
        .join(_serving, _serving.c.run_id == _runs.c.id)
        .where(_runs.c.status != "failed", _runs.c.kind == "serving")
    )


def upgrade() -> None:
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
        sa.PrimaryKeyConstraint(*_KEYS, name=op.f("pk_build_point_sums")),
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
    with op.batch_alter_table("hardware_fingerprints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hardware_class", sa.String(length=300), nullable=True))

    connection = op.get_bind()
    fingerprints = sa.table(
        "hardware_fingerprints",
        sa.column("id"),
        sa.column("description"),
        sa.column("hardware_class"),
    )
    described = connection.execute(
        sa.select(fingerprints.c.id, fingerprints.c.description).where(
            fingerprints.c.description.is_not(None)
        )
    ).all()
    if described:
        connection.execute(
            fingerprints.update()
            .where(fingerprints.c.id == sa.bindparam("fingerprint"))
            .values(hardware_class=sa.bindparam("named")),
            [
                {"fingerprint": i, "named": re.sub(r"\s*\(driver [^)]*\)", "", d).strip() or None}
                for i, d in described
            ],
        )
    sums = sa.table("build_point_sums", *(sa.column(c) for c in (*_KEYS, *_SUMMED)))
    for part in (
        _offline("s_tg"),
        _offline("s_pp"),
        _served("per_user_tps_p10"),
        _served("ttft_ms_p90"),
    ):
        connection.execute(sums.insert().from_select([*_KEYS, *_SUMMED], part))
    stamps = sa.table(
        "build_sums_stamps",
        *(sa.column(c) for c in ("model_id", "build_id", "node_id", "version")),
        sa.column("changed_at", sa.DateTime(timezone=True)),
    )
    summed = sa.select(
        sums.c.model_id,
        sums.c.build_id,
        sums.c.node_id,
        sa.literal(1),
        sa.literal(datetime.now(UTC), sa.DateTime(timezone=True)),
    ).distinct()
    connection.execute(
        stamps.insert().from_select(
            ["model_id", "build_id", "node_id", "version", "changed_at"], summed
        )
    )


def downgrade() -> None:
    op.drop_table("build_sums_stamps")
    with op.batch_alter_table("hardware_fingerprints", schema=None) as batch_op:
        batch_op.drop_column("hardware_class")
    op.drop_table("build_point_sums")
