"""The fleet's latest curves: each node's latest successful run of each model and its points
(tables latest_runs, latest_points), and its latest successful serving run of each model
(latest_serving_runs), kept by ingest in the run's own transaction, and the questions read
from them.

Placement, /metrics and the fit check ask about every node's latest run at once. Searching
the runs for it (a backward index probe per node, then its points) grows with the history;
these tables hold one row per node and model and one per point of that run, whatever the
history, so a 1,000-node answer reads a few thousand rows.
"""

from __future__ import annotations

import functools
import typing
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Select,
    and_,
    bindparam,
    delete,
    select,
    tuple_,
    update,
)
from sqlalchemy.orm import Session

from fleetbench.contract import wire
from fleetbench.registry.bulk import insert_rows
from fleetbench.registry.models import (
    EngineBuild,
    LatestPoint,
    LatestRun,
    LatestServingRun,
    Model,
    Node,
    Run,
    newer_run,
    table_of,
)
from fleetbench.registry.questions.knee import find_knee

__all__ = [
    "LatestCandidate",
    "LatestServingCandidate",
    "fill_unknown_knees",
    "latest_points_statement",
    "record_latest",
    "record_latest_serving",
]


def _only_if_newer(upsert: Any) -> Any:
    """The insert of (node, model)s' latest rows made an upsert that replaces a row only
    with a newer run (RUN_NEWEST_FIRST's order), returning the pairs it wrote."""
    heads = upsert.table
    new = upsert.excluded
    newer = newer_run(
        (new.started_at, new.received_at, new.run_id),
        (heads.c.started_at, heads.c.received_at, heads.c.run_id),
    )
    keys = ("node_id", "model_id")
    return upsert.on_conflict_do_update(
        index_elements=[heads.c.node_id, heads.c.model_id],
        set_={c.name: new[c.name] for c in heads.columns if c.name not in keys},
        where=newer,
    ).returning(heads.c.node_id, heads.c.model_id)


_POINTS = table_of(LatestPoint)
# The points of (node, model)s whose latest run changed.
_DELETE_POINTS = delete(_POINTS).where(
    tuple_(_POINTS.c.node_id, _POINTS.c.model_id).in_(bindparam("pairs", expanding=True))
)


@dataclass(frozen=True)
class LatestCandidate:
    """A node's newest successful run of a model in a batch, to become its latest."""

    node_id: int
    model_id: int
    run_id: uuid.UUID
    started_at: datetime
    received_at: datetime
    build_id: int
    facts_id: int | None
    memory_bytes: int | None
    settings: wire.RunSettings
    points: Sequence[wire.Point]
    engine_on_accelerator: bool | None = None
    beside_kv_bytes: int | None = None  # weights, compute and outputs, as allocated


def record_latest(connection: Connection, candidates: Sequence[LatestCandidate]) -> int:
    """Makes each candidate (one per node and model) the latest of its node's model if it
    is newer (as RUN_NEWEST_FIRST orders runs: started, then received, then the smaller id)
    than the one recorded, and its points theirs; returns the rows it wrote. One upsert
    for all; it locks their rows until commit on PostgreSQL, so concurrent ingests of one
    node's model take turns from here on."""
    if not candidates:
        return 0
    heads = [
        {
            "node_id": c.node_id,
            "model_id": c.model_id,
            "run_id": c.run_id,
            "started_at": c.started_at,
            "received_at": c.received_at,
            "build_id": c.build_id,
            "facts_id": c.facts_id,
            "memory_bytes": c.memory_bytes,
            "cache_type_k": c.settings.cache_type_k,
            "cache_type_v": c.settings.cache_type_v,
            "n_ubatch": c.settings.n_ubatch,
            "flash_attn": c.settings.flash_attn,
            "swa_full": c.settings.swa_full,
            "engine_on_accelerator": c.engine_on_accelerator,
            "beside_kv_bytes": c.beside_kv_bytes,
        }
        for c in candidates
    ]
    # Older runs arriving late leave the latest as it is.
    written = insert_rows(connection, table_of(LatestRun), heads, _only_if_newer)
    won = {(row.node_id, row.model_id) for row in written} if written else set()
    if not won:
        return 0
    connection.execute(_DELETE_POINTS, {"pairs": sorted(won)})
    rows = [
        {"node_id": c.node_id, "model_id": c.model_id, **row}
        for c in candidates
        if (c.node_id, c.model_id) in won
        for row in _points_with_knee(c.points)
    ]
    insert_rows(connection, _POINTS, rows)
    return len(won) + len(rows)


@dataclass(frozen=True)
class LatestServingCandidate:
    """A node's newest successful serving run of a model in a batch, to become its latest."""

    node_id: int
    model_id: int
    run_id: uuid.UUID
    started_at: datetime
    received_at: datetime
    build_id: int
    server: wire.ServerIdentity


def record_latest_serving(
    connection: Connection, candidates: Sequence[LatestServingCandidate]
) -> None:
    """Makes each candidate (one per node and model) the latest serving run of its node's
    model if it is newer than the one recorded: one upsert for all."""
    if not candidates:
        return
    rows = [
        {
            "node_id": c.node_id,
            "model_id": c.model_id,
            "run_id": c.run_id,
            "started_at": c.started_at,
            "received_at": c.received_at,
            "build_id": c.build_id,
            "prompt_tokens": c.server.prompt_tokens,
            "gen_tokens": c.server.gen_tokens,
            "slots": c.server.slots,
            "ctx_per_slot": c.server.ctx_per_slot,
        }
        for c in candidates
    ]
    insert_rows(connection, table_of(LatestServingRun), rows, _only_if_newer)


def _points_with_knee(points: Sequence[wire.Point]) -> list[dict[str, Any]]:
    curves: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for point in points:
        if point.s_tg is not None:
            curves[(point.pp, point.tg)].append((point.b, point.s_tg))
    knees = {cell: find_knee(curve) for cell, curve in curves.items()}
    rows = []
    for point in points:
        knee = knees.get((point.pp, point.tg))
        rows.append(
            {
                "pp": point.pp,
                "tg": point.tg,
                "b": point.b,
                "s_pp": point.s_pp,
                "s_tg": point.s_tg,
                "past_knee": point.b > knee
                if knee is not None and point.s_tg is not None
                else None,
            }
        )
    return rows


def fill_unknown_knees(session: Session) -> int:
    """Computes `past_knee` where it is unknown (points copied by migration 0004); returns
    how many curves it did. Cheap when there are none: one pass over latest_points."""
    rows = session.execute(
        select(
            LatestPoint.node_id,
            LatestPoint.model_id,
            LatestPoint.pp,
            LatestPoint.tg,
            LatestPoint.b,
            LatestPoint.s_tg,
        ).where(LatestPoint.past_knee.is_(None), LatestPoint.s_tg.is_not(None))
    ).all()
    curves: dict[tuple[int, int, int, int], list[tuple[int, float]]] = defaultdict(list)
    for node_id, model_id, pp, tg, b, s_tg in rows:
        curves[(node_id, model_id, pp, tg)].append((b, typing.cast(float, s_tg)))
    updates: list[dict[str, object]] = []
    for (node_id, model_id, pp, tg), curve in curves.items():
        knee = find_knee(curve)
        updates.extend(
            {
                "node_id": node_id,
                "model_id": model_id,
                "pp": pp,
                "tg": tg,
                "b": b,
                "past_knee": knee is not None and b > knee,
            }
            for b, _ in curve
        )
    if updates:
        session.execute(update(LatestPoint), updates)  # by primary key, in one executemany
    return len(curves)


# --- /metrics ---------------------------------------------------------------------------


@functools.cache
def latest_points_statement() -> Select[*tuple[Any, ...]]:
    """Every point of each node's latest successful run of each model, with its node,
    model, run, build and the KV cache predicted and allocated for it; by node, model, PP,
    TG, B, so that the `limit` parameter cuts the same rows each time."""
    return (
        select(
            Node.name.label("node"),
            Model.name.label("model"),
            LatestRun.run_id,
            LatestRun.started_at,
            LatestRun.received_at,
            EngineBuild.build_number,
            Run.kv_predicted_bytes,
            Run.kv_allocated_bytes,
            LatestPoint.pp,
            LatestPoint.tg,
            LatestPoint.b,
            LatestPoint.s_pp,
            LatestPoint.s_tg,
        )
        .select_from(LatestPoint)
        .join(
            LatestRun,
            and_(
                LatestRun.node_id == LatestPoint.node_id,
                LatestRun.model_id == LatestPoint.model_id,
            ),
        )
        .join(Node, Node.id == LatestPoint.node_id)
        .join(Model, Model.id == LatestPoint.model_id)
        .join(EngineBuild, EngineBuild.id == LatestRun.build_id)
        .join(Run, Run.id == LatestRun.run_id)
        .order_by(
            Node.name,
            Model.name,
            LatestRun.started_at.desc(),
            LatestRun.received_at.desc(),
            LatestRun.run_id,
            LatestPoint.pp,
            LatestPoint.tg,
            LatestPoint.b,
        )
        .limit(bindparam("limit", type_=Integer))
    )
