"""Ingest's statements, built once per dialect."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite

from fleetbench.registry.models import (
    EngineBuild,
    HardwareFingerprint,
    LatestPoint,
    Model,
    ModelFacts,
    Run,
    table_of,
)

MODEL_FACTS = (
    "quantization",
    "n_params",
    "file_size",
    "n_layer",
    "n_head_kv",
    "head_dim_k",
    "head_dim_v",
    "n_ctx_train",
    "sliding_window",
    "n_swa_layers",
    "weight_bytes",
    "expert_bytes",
    "expert_count",
    "expert_used_count",
)


@dataclass(frozen=True)
class Statements:
    """Ingest's statements, built once per dialect: building SQLAlchemy statements costs
    more than executing them, and bound parameters keep their compiled form cached. Each
    runs once per batch, with one row per report (executemany: one multi-row statement)."""

    stored_runs: Any
    taken_ids: Any
    build_by_identity: Any
    insert_build: Any
    model_by_identity: Any
    insert_model: Any
    facts_by_identity: Any
    insert_facts: Any
    latest_counts: Any
    fingerprints: Any
    # by table: how many rows of it a node's reports made (models.CreatedByNode)
    made_by_node: dict[str, Any]


@functools.cache
def statements_for(dialect: str) -> Statements:
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    # PostgreSQL's greatest() and least(); SQLite's max() and min() of several arguments
    latest, earliest = (
        (func.greatest, func.least) if dialect == "postgresql" else (func.max, func.min)
    )
    runs, builds, models = table_of(Run), table_of(EngineBuild), table_of(Model)
    facts = table_of(ModelFacts)
    fingerprints, latest_points = table_of(HardwareFingerprint), table_of(LatestPoint)
    upsert = insert_for(fingerprints)
    new = upsert.excluded
    return Statements(
        stored_runs=select(
            runs.c.node_id, runs.c.reported_id, runs.c.id, runs.c.report_sha256
        ).where(tuple_(runs.c.node_id, runs.c.reported_id).in_(bindparam("keys", expanding=True))),
        taken_ids=select(runs.c.id).where(runs.c.id.in_(bindparam("run_ids", expanding=True))),
        build_by_identity=select(builds.c.id).where(builds.c.identity == bindparam("identity")),
        insert_build=insert_for(builds).on_conflict_do_nothing(),
        model_by_identity=select(models.c.id).where(models.c.identity == bindparam("identity")),
        insert_model=insert_for(models).on_conflict_do_nothing(),
        facts_by_identity=select(facts.c.id).where(
            facts.c.model_id == bindparam("model_id"), facts.c.identity == bindparam("identity")
        ),
        insert_facts=insert_for(facts).on_conflict_do_nothing(),
        latest_counts=select(latest_points.c.node_id, latest_points.c.model_id, func.count())
        .where(latest_points.c.node_id.in_(bindparam("node_ids", expanding=True)))
        .group_by(latest_points.c.node_id, latest_points.c.model_id),
        made_by_node={
            table.name: select(func.count())
            .select_from(table)
            .where(table.c.created_by_node_id == bindparam("node_id"))
            for table in (builds, models, facts)
        },
        fingerprints=upsert.on_conflict_do_update(
            index_elements=[fingerprints.c.node_id, fingerprints.c.hash],
            set_={
                "first_seen": earliest(fingerprints.c.first_seen, new.first_seen),
                "last_seen": latest(fingerprints.c.last_seen, new.last_seen),
                # where the stored fingerprint has none: filled now
                "description": func.coalesce(fingerprints.c.description, new.description),
                "hardware_class": func.coalesce(fingerprints.c.hardware_class, new.hardware_class),
                "memory_bytes": func.coalesce(fingerprints.c.memory_bytes, new.memory_bytes),
                "memory_kind": func.coalesce(fingerprints.c.memory_kind, new.memory_kind),
            },
        ).returning(
            fingerprints.c.node_id,
            fingerprints.c.hash,
            fingerprints.c.id,
            fingerprints.c.memory_bytes,
            fingerprints.c.description,
        ),
    )
