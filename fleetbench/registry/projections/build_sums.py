"""Each node's runs of a model with one build, summed per point and metric (table
build_point_sums): what a build comparison reads (registry.compare.rows).

A comparison of two builds across a 1,000-node fleet weighs every node's points of both;
aggregating their runs' points at each question costs a join and a sort of every run's
points (about 100 ms on PostgreSQL at two runs of each build per node). The sums are kept
instead, in the transaction that stores or deletes the runs, by the same statement that
answers a question limited to recent runs (`max_age_days`) from the runs themselves: the
count, sum and sum of squares of each metric at each point, and its repeats' spread.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Double,
    Select,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    or_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite

from fleetbench.registry.models import (
    POINT_POSSIBLE,
    RUN_SERVED,
    RUN_SUCCESSFUL,
    BuildPointSum,
    BuildSumsStamp,
    Run,
    RunPoint,
    ServingPointRow,
    table_of,
)
from fleetbench.registry.projections.base import Projection, StoredRun
from fleetbench.registry.settings_label import server_shape_label_sql, settings_label_sql

__all__ = [
    "BUILD_SUMS",
    "METRICS",
    "MOST_RELATIVE",
    "OFFLINE_METRICS",
    "SERVING_METRICS",
    "SUMS_KEY",
    "SUM_COLUMNS",
    "add_runs",
    "metrics_of",
    "remove_runs",
    "sums_of_runs",
]

# joules_per_token: a point's joules (contract.energy) over its B x TG generated tokens
OFFLINE_METRICS = ("s_tg", "s_pp", "joules_per_token")
SERVING_METRICS = ("per_user_tps_p10", "ttft_ms_p90")
METRICS = OFFLINE_METRICS + SERVING_METRICS
# A spread relative to a value this small is no measurement: capped, not divided (float
# division would overflow, which PostgreSQL refuses).
MOST_RELATIVE = 1e6
# PostgreSQL refuses a product or quotient that underflows (a speed of 1e-300 squared):
# figures this small are taken as this, which no mean or spread that matters can tell.
_LEAST = 1e-100
SUM_COLUMNS = ("runs", "total", "squares", "relative_sd", "repeats", "repeated")


def _at_least(value: Any) -> ColumnElement[float]:
    return case((value < _LEAST, _LEAST), else_=value)


def _offline(metric: str) -> Select[Any]:
    if metric == "joules_per_token":
        return _offline_energy()
    value = getattr(RunPoint, metric)
    sd = getattr(RunPoint, f"{metric}_stdev")
    relative = case(
        (
            and_(sd.is_not(None), RunPoint.repeats >= 2),
            case(
                (sd < _LEAST, 0.0),
                (sd < value * MOST_RELATIVE, sd / _at_least(value)),
                else_=MOST_RELATIVE,
            ),
        )
    )
    return (
        _summed(
            metric,
            value,
            settings_label_sql(),
            (RunPoint.pp, RunPoint.tg, RunPoint.b),
            relative,
            case((relative.is_not(None), RunPoint.repeats)),
        )
        .join(RunPoint, RunPoint.run_id == Run.id)
        .where(RUN_SUCCESSFUL, POINT_POSSIBLE)
    )


def _offline_energy() -> Select[Any]:
    """Joules per generated token, where the point's energy was counted validly (a point
    without joules, or with no tokens, has no value and is in no sum)."""
    # B x TG as a float: two 32-bit columns' product overflows PostgreSQL's integer
    tokens = func.nullif(cast(RunPoint.b, Double) * RunPoint.tg, 0)
    value = _at_least(RunPoint.energy["joules"].as_float()) / tokens
    return (
        _summed(
            "joules_per_token",
            value,
            settings_label_sql(),
            (RunPoint.pp, RunPoint.tg, RunPoint.b),
            None,
            None,
        )
        .join(RunPoint, RunPoint.run_id == Run.id)
        .where(RUN_SUCCESSFUL, POINT_POSSIBLE)
    )


def _serving(metric: str) -> Select[Any]:
    value = getattr(ServingPointRow, metric)
    server = Run.server
    point = (
        func.coalesce(server["prompt_tokens"].as_integer(), 0),
        func.coalesce(server["gen_tokens"].as_integer(), 0),
        ServingPointRow.concurrency,
    )
    return (
        _summed(metric, value, server_shape_label_sql(), point, None, None)
        .join(ServingPointRow, ServingPointRow.run_id == Run.id)
        .where(RUN_SERVED)
    )


def _summed(
    metric: str,
    value: Any,
    settings: ColumnElement[str],
    point: tuple[Any, Any, Any],
    relative: ColumnElement[float] | None,
    repeats: ColumnElement[int] | None,
) -> Select[Any]:
    keys: tuple[Any, ...] = (
        Run.model_id,
        Run.build_id,
        Run.node_id,
        func.coalesce(Run.fingerprint_id, 0),
        settings,
        literal(metric),
        *point,
    )
    return (
        select(
            *(key.label(name) for key, name in zip(keys, SUMS_KEY, strict=True)),
            func.count().label("runs"),
            func.sum(value).label("total"),
            func.sum(_at_least(value) * _at_least(value)).label("squares"),
            func.coalesce(func.sum(relative), 0.0).label("relative_sd")
            if relative is not None
            else literal(0.0).label("relative_sd"),
            func.coalesce(func.sum(repeats), 0).label("repeats")
            if repeats is not None
            else literal(0).label("repeats"),
            (func.count(relative) if relative is not None else literal(0)).label("repeated"),
        )
        .select_from(Run)
        .where(value > 0)  # a speed of 0 (or a wait of 0 ms) is no measurement
        .group_by(*keys)
    )


SUMS_KEY = (  # the columns that key build_point_sums
    "model_id",
    "build_id",
    "node_id",
    "fingerprint_id",
    "settings",
    "metric",
    "pp",
    "tg",
    "b",
)


def sums_of_runs(kind: str, *where: ColumnElement[bool]) -> Select[Any]:
    """The sums of the runs `where` selects (of table runs), as build_point_sums holds
    them: offline runs' S_TG, S_PP and joules per token, or serving runs' per-user p10 and
    TTFT p90."""
    parts = [_offline(m) if kind == "offline" else _serving(m) for m in metrics_of(kind)]
    return union_all(*(part.where(*where) for part in parts)).subquery().select()


def metrics_of(kind: str) -> tuple[str, ...]:
    """The metrics of a kind of run (`offline` or `serving`), or all of them."""
    return {"offline": OFFLINE_METRICS, "serving": SERVING_METRICS}.get(kind, METRICS)


_RUN_IDS: Any = bindparam("run_ids", expanding=True)
# a failed run is in no sum: its (model, build, node) is touched by the runs that count
_COUNTED = or_(RUN_SUCCESSFUL, RUN_SERVED)
_TOUCHED = select(Run.model_id, Run.build_id, Run.node_id).where(Run.id.in_(_RUN_IDS), _COUNTED)
_NODE_IDS: Any = bindparam("node_ids", expanding=True)


@dataclass(frozen=True)
class _Statements:
    """Built once per dialect: building these costs more than running them (SQLAlchemy
    caches a statement's compiled form only when it is the same object's shape)."""

    stamp: Any
    add: tuple[Any, ...]  # per kind
    forget: Any
    recount: tuple[Any, ...]  # per kind
    stamp_nodes: Any
    forget_stamps: Any
    count_nodes: tuple[Any, ...]  # per kind


@functools.cache
def _statements(dialect: str) -> _Statements:
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    table = table_of(BuildPointSum)
    stamps = table_of(BuildSumsStamp)
    now = bindparam("now", type_=stamps.c.changed_at.type)

    def stamped(runs: Select[int, int, int]) -> Any:
        """Each (model, build, node) of the runs stamped with a new version."""
        touched = (
            runs.add_columns(literal(1), now)
            .distinct()
            .order_by(Run.model_id, Run.build_id, Run.node_id)  # one lock order
        )
        stamp = insert_for(stamps).from_select(
            ["model_id", "build_id", "node_id", "version", "changed_at"], touched
        )
        return stamp.on_conflict_do_update(
            index_elements=[stamps.c.model_id, stamps.c.build_id, stamps.c.node_id],
            set_={"version": stamps.c.version + 1, "changed_at": stamp.excluded.changed_at},
        )

    columns = [*SUMS_KEY, *SUM_COLUMNS]

    def upsert(found: Select[Any]) -> Any:
        rows = found.subquery()
        ordered = (
            select(*(rows.c[c] for c in columns))
            .where(true())  # (SQLite reads an upsert's SELECT without WHERE ambiguously)
            .order_by(*(rows.c[c] for c in SUMS_KEY))  # one lock order for every writer
        )
        statement = insert_for(table).from_select(columns, ordered)
        return statement.on_conflict_do_update(
            index_elements=[table.c[c] for c in SUMS_KEY],
            set_={c: table.c[c] + statement.excluded[c] for c in SUM_COLUMNS},
        )

    counted_of_nodes = select(Run.model_id, Run.build_id, Run.node_id).where(
        Run.node_id.in_(_NODE_IDS), _COUNTED
    )
    staying = (
        tuple_(Run.model_id, Run.build_id, Run.node_id).in_(_TOUCHED),
        Run.id.not_in(_RUN_IDS),
    )
    return _Statements(
        stamp=stamped(_TOUCHED),
        add=tuple(upsert(sums_of_runs(k, Run.id.in_(_RUN_IDS))) for k in _KINDS),
        forget=delete(table).where(
            tuple_(table.c.model_id, table.c.build_id, table.c.node_id).in_(_TOUCHED)
        ),
        recount=tuple(upsert(sums_of_runs(k, *staying)) for k in _KINDS),
        stamp_nodes=stamped(counted_of_nodes),
        # stamps of (model, build, node)s with no run that counts (written before the
        # prune stamped only those): their sums are gone, and so their signature moves
        forget_stamps=delete(stamps).where(
            stamps.c.node_id.in_(_NODE_IDS),
            tuple_(stamps.c.model_id, stamps.c.build_id, stamps.c.node_id).not_in(counted_of_nodes),
        ),
        count_nodes=tuple(upsert(sums_of_runs(k, Run.node_id.in_(_NODE_IDS))) for k in _KINDS),
    )


_KINDS = ("offline", "serving")


def add_runs(
    connection: Connection, *, offline: Sequence[uuid.UUID], serving: Sequence[uuid.UUID]
) -> None:
    """Adds the runs just stored that count (RUN_SUCCESSFUL, RUN_SERVED: a failed run has
    no figures) to the sums, in their transaction, and stamps their nodes' sums of each
    model and build with a new version."""
    if not offline and not serving:
        return
    sql = _statements(connection.dialect.name)
    connection.execute(sql.stamp, {"run_ids": [*offline, *serving], "now": datetime.now(UTC)})
    for statement, run_ids in zip(sql.add, (offline, serving), strict=True):
        if run_ids:
            connection.execute(statement, {"run_ids": list(run_ids)})


def remove_runs(connection: Connection, run_ids: Collection[uuid.UUID]) -> None:
    """Takes runs about to be deleted out of the sums (in their transaction): the sums of
    each node, model and build they belong to are counted again from its other runs. Not
    subtracted: a sum of squares less a large one loses the small ones' (1e24 + 1e4 - 1e24
    is 0 in floating point), and with them a node's spread for good."""
    if not run_ids:
        return
    sql = _statements(connection.dialect.name)
    ids = {"run_ids": list(run_ids)}
    connection.execute(sql.stamp, {**ids, "now": datetime.now(UTC)})
    connection.execute(sql.forget, ids)
    for statement in sql.recount:
        connection.execute(statement, ids)


def _add(connection: Connection, runs: Sequence[StoredRun]) -> int:
    offline = [run.id for run in runs if run.in_series]
    serving = [run.id for run in runs if run.served]
    add_runs(connection, offline=offline, serving=serving)
    return len(offline) + len(serving)


def _rebuild(connection: Connection, node_ids: Sequence[int]) -> None:
    """The nodes' sums counted again from all their runs, and their stamps raised (a
    process holding them reads them again)."""
    sql = _statements(connection.dialect.name)
    nodes = {"node_ids": list(node_ids)}
    connection.execute(sql.stamp_nodes, {**nodes, "now": datetime.now(UTC)})
    connection.execute(sql.forget_stamps, nodes)
    table = table_of(BuildPointSum)
    connection.execute(delete(table).where(table.c.node_id.in_(node_ids)))
    for statement in sql.count_nodes:
        connection.execute(statement, nodes)


BUILD_SUMS = Projection(
    name="sums",
    tables=(table_of(BuildPointSum), table_of(BuildSumsStamp)),
    add=_add,
    keeps=None,
    remove=remove_runs,
    rebuild=_rebuild,
)
