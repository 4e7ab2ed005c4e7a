"""The fleet's latest curves: each node's latest successful run of each model and its points
that measured concurrency (tables latest_runs, latest_points), and its latest successful
serving run of each model (latest_serving_runs), kept by ingest in the run's own
transaction, and the questions read from them.

Placement, /metrics and the fit check ask about every node's latest run at once. Searching
the runs for it (a backward index probe per node, then its points) grows with the history;
these tables hold one row per node and model and one per point of that run, whatever the
history, so a 1,000-node answer reads a few thousand rows.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    and_,
    bindparam,
    delete,
    select,
    tuple_,
)

from fleetbench.registry.bulk import insert_rows
from fleetbench.registry.curves.knee import find_knee
from fleetbench.registry.models import (
    RUN_SERVED,
    RUN_SUCCESSFUL,
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
from fleetbench.registry.projections.base import (
    CurvePoint,
    Projection,
    StoredRun,
    newest_by,
    newest_of_each,
    no_removal,
    stored_runs,
)

__all__ = ["LATEST", "LATEST_SERVING", "OF_ITS_RUN", "latest_points_statement"]


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


def _head(run: StoredRun) -> dict[str, Any]:
    """What a latest row (offline or serving) says of its run: its node, model, id, build,
    and where it sorts (RUN_NEWEST_FIRST)."""
    return {
        "node_id": run.node_id,
        "model_id": run.model_id,
        "run_id": run.id,
        "started_at": run.started_at,
        "received_at": run.received_at,
        "build_id": run.build_id,
    }


def _add_latest(connection: Connection, runs: Sequence[StoredRun]) -> int:
    """Makes each (node, model)'s newest of the runs that join its curves (one per node and
    model) its latest if it is newer (as RUN_NEWEST_FIRST orders runs: started, then
    received, then the smaller id) than the one recorded, and its points theirs; returns
    the rows it wrote. One upsert for all; it locks their rows until commit on PostgreSQL,
    so concurrent ingests of one node's model take turns from here on."""
    newest = newest_by([r for r in runs if r.in_series], lambda run: (run.node_id, run.model_id))
    candidates = [newest[pair] for pair in sorted(newest)]
    if not candidates:
        return 0
    heads = [
        {
            **_head(c),
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
        for row in _points_with_knee(c.concurrency_points)
    ]
    insert_rows(connection, _POINTS, rows)
    return len(won) + len(rows)


def _add_latest_serving(connection: Connection, runs: Sequence[StoredRun]) -> int:
    """Makes each (node, model)'s newest successful serving run its latest if it is newer
    than the one recorded: one upsert for all; returns the rows it offered."""
    newest = newest_by([r for r in runs if r.served], lambda run: (run.node_id, run.model_id))
    rows = [
        {
            **_head(c),
            "prompt_tokens": c.server.prompt_tokens,
            "gen_tokens": c.server.gen_tokens,
            "slots": c.server.slots,
            "ctx_per_slot": c.server.ctx_per_slot,
        }
        for _, c in sorted(newest.items())
        if c.server is not None  # (a serving run always names its server: wire.RunReport)
    ]
    insert_rows(connection, table_of(LatestServingRun), rows, _only_if_newer)
    return len(rows)


def _rebuild_latest(connection: Connection, node_ids: Sequence[int]) -> None:
    connection.execute(delete(_POINTS).where(_POINTS.c.node_id.in_(node_ids)))
    connection.execute(delete(LatestRun).where(LatestRun.node_id.in_(node_ids)))
    newest = newest_of_each(connection, node_ids, RUN_SUCCESSFUL)
    _add_latest(connection, stored_runs(connection, newest))


def _rebuild_latest_serving(connection: Connection, node_ids: Sequence[int]) -> None:
    connection.execute(delete(LatestServingRun).where(LatestServingRun.node_id.in_(node_ids)))
    newest = newest_of_each(connection, node_ids, RUN_SERVED)
    _add_latest_serving(connection, stored_runs(connection, newest))


def _keeps_latest() -> ColumnElement[bool]:
    return select(LatestRun.run_id).where(LatestRun.run_id == Run.id).exists()


def _keeps_latest_serving() -> ColumnElement[bool]:
    return select(LatestServingRun.run_id).where(LatestServingRun.run_id == Run.id).exists()


# The latest runs are kept from the prune: no prunable run changes them.
LATEST = Projection(
    name="latest",
    tables=(table_of(LatestRun), _POINTS),
    add=_add_latest,
    keeps=_keeps_latest,
    remove=no_removal,
    rebuild=_rebuild_latest,
)
LATEST_SERVING = Projection(
    name="latest_serving",
    tables=(table_of(LatestServingRun),),
    add=_add_latest_serving,
    keeps=_keeps_latest_serving,
    remove=no_removal,
    rebuild=_rebuild_latest_serving,
)


def _points_with_knee(points: Sequence[CurvePoint]) -> list[dict[str, Any]]:
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
                "mbu": point.mbu,
                "joules": point.joules,
                "past_knee": point.b > knee
                if knee is not None and point.s_tg is not None
                else None,
            }
        )
    return rows


# A latest point joined to its latest run
OF_ITS_RUN = and_(
    LatestRun.node_id == LatestPoint.node_id, LatestRun.model_id == LatestPoint.model_id
)


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
            LatestPoint.mbu,
            LatestPoint.joules,
            Run.energy,
        )
        .select_from(LatestPoint)
        .join(LatestRun, OF_ITS_RUN)
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
