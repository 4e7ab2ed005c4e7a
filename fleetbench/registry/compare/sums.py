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
import operator
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    Select,
    String,
    and_,
    case,
    cast,
    delete,
    func,
    literal,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite

from fleetbench.registry.labels import SETTING_NAMES
from fleetbench.registry.models import (
    RUN_SERVED,
    RUN_SUCCESSFUL,
    BuildPointSum,
    BuildSumsStamp,
    Run,
    RunPoint,
    ServingPointRow,
    table_of,
)

__all__ = [
    "METRICS",
    "OFFLINE_METRICS",
    "SERVING_METRICS",
    "add_runs",
    "metrics_of",
    "remove_runs",
    "sums_of_runs",
]

OFFLINE_METRICS = ("s_tg", "s_pp")
SERVING_METRICS = ("per_user_tps_p10", "ttft_ms_p90")
METRICS = OFFLINE_METRICS + SERVING_METRICS
# What of a server, besides its build, shapes its figures: runs compared must share it.
_SERVER_SHAPE = ("kind", "slots", "ctx_per_slot", "n_ctx", "prompt_tokens", "gen_tokens")
# A spread relative to a value this small is no measurement: capped, not divided (float
# division would overflow, which PostgreSQL refuses).
_MOST_RELATIVE = 1e6
# PostgreSQL refuses a product or quotient that underflows (a speed of 1e-300 squared):
# figures this small are taken as this, which no mean or spread that matters can tell.
_LEAST = 1e-100
_SUMMED = ("runs", "total", "squares", "relative_sd", "repeats", "repeated")


def _labelled(parts: list[tuple[str, ColumnElement[Any]]]) -> ColumnElement[str]:
    """`name=value` for each value not NULL, space-separated: a key made the same way by
    every statement that makes it."""
    pieces = [func.coalesce(literal(f" {name}=") + value, "") for name, value in parts]
    return func.ltrim(functools.reduce(operator.add, pieces))


def _as_text(column: ColumnElement[Any]) -> ColumnElement[str]:
    if isinstance(column.type, Boolean):  # the same words on PostgreSQL and SQLite
        return case((column.is_(True), "true"), (column.is_(False), "false"))
    return cast(column, String)


def _at_least(value: Any) -> ColumnElement[float]:
    return case((value < _LEAST, _LEAST), else_=value)


def _offline(metric: str) -> Select[Any]:
    value = getattr(RunPoint, metric)
    sd = getattr(RunPoint, f"{metric}_stdev")
    relative = case(
        (
            and_(sd.is_not(None), RunPoint.repeats >= 2),
            case(
                (sd < _LEAST, 0.0),
                (sd < value * _MOST_RELATIVE, sd / _at_least(value)),
                else_=_MOST_RELATIVE,
            ),
        )
    )
    settings = _labelled([(name, _as_text(getattr(Run, name))) for name in SETTING_NAMES])
    return (
        _summed(
            metric,
            value,
            settings,
            (RunPoint.pp, RunPoint.tg, RunPoint.b),
            relative,
            case((relative.is_not(None), RunPoint.repeats)),
        )
        .join(RunPoint, RunPoint.run_id == Run.id)
        .where(RUN_SUCCESSFUL)
    )


def _serving(metric: str) -> Select[Any]:
    value = getattr(ServingPointRow, metric)
    server = Run.server
    settings = _labelled([(k, server[k].as_string()) for k in _SERVER_SHAPE])
    point = (
        func.coalesce(server["prompt_tokens"].as_integer(), 0),
        func.coalesce(server["gen_tokens"].as_integer(), 0),
        ServingPointRow.concurrency,
    )
    return (
        _summed(metric, value, settings, point, None, None)
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
            *(key.label(name) for key, name in zip(keys, _KEY_NAMES, strict=True)),
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


_KEY_NAMES = (
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
    them: offline runs' S_TG and S_PP, or serving runs' per-user p10 and TTFT p90."""
    parts = [_offline(m) if kind == "offline" else _serving(m) for m in metrics_of(kind)]
    return union_all(*(part.where(*where) for part in parts)).subquery().select()


def metrics_of(kind: str) -> tuple[str, ...]:
    """The metrics of a kind of run (`offline` or `serving`), or all of them."""
    return {"offline": OFFLINE_METRICS, "serving": SERVING_METRICS}.get(kind, METRICS)


def _upsert(connection: Connection, sums: dict[str, Select[Any]]) -> None:
    """Adds each kind's `sums` (sums_of_runs) to the kept ones, and stamps their nodes."""
    table = table_of(BuildPointSum)
    insert_for: Any = (
        postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    )
    columns = [*_KEY_NAMES, *_SUMMED]
    for found in sums.values():
        rows = found.subquery()
        ordered = (
            select(*(rows.c[c] for c in columns))
            .where(true())  # (SQLite reads an upsert's SELECT without WHERE ambiguously)
            .order_by(*(rows.c[c] for c in _KEY_NAMES))  # one lock order for every writer
        )
        statement = insert_for(table).from_select(columns, ordered)
        connection.execute(
            statement.on_conflict_do_update(
                index_elements=[table.c[c] for c in _KEY_NAMES],
                set_={c: table.c[c] + statement.excluded[c] for c in _SUMMED},
            )
        )


def _stamp(connection: Connection, run_ids: Collection[uuid.UUID], insert_for: Any) -> None:
    """A new version of each (model, build, node) the runs touch."""
    stamps = table_of(BuildSumsStamp)
    touched = (
        select(
            Run.model_id,
            Run.build_id,
            Run.node_id,
            literal(1),
            literal(datetime.now(UTC), stamps.c.changed_at.type),
        )
        .where(Run.id.in_(list(run_ids)))
        .distinct()
        .order_by(Run.model_id, Run.build_id, Run.node_id)  # one lock order
    )
    statement = insert_for(stamps).from_select(
        ["model_id", "build_id", "node_id", "version", "changed_at"], touched
    )
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=[stamps.c.model_id, stamps.c.build_id, stamps.c.node_id],
            set_={
                "version": stamps.c.version + 1,
                "changed_at": statement.excluded.changed_at,
            },
        )
    )


def _insert_for(connection: Connection) -> Any:
    return postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert


def add_runs(connection: Connection, run_ids: Collection[uuid.UUID]) -> None:
    """Adds the runs just stored to the sums (in their transaction)."""
    if not run_ids:
        return
    _stamp(connection, run_ids, _insert_for(connection))
    stored = Run.id.in_(list(run_ids))
    _upsert(connection, {kind: sums_of_runs(kind, stored) for kind in ("offline", "serving")})


def remove_runs(connection: Connection, run_ids: Collection[uuid.UUID]) -> None:
    """Takes runs about to be deleted out of the sums (in their transaction): the sums of
    each node, model and build they belong to are counted again from its other runs. Not
    subtracted: a sum of squares less a large one loses the small ones' (1e24 + 1e4 - 1e24
    is 0 in floating point), and with them a node's spread for good."""
    if not run_ids:
        return
    _stamp(connection, run_ids, _insert_for(connection))
    leaving = list(run_ids)
    touched = select(Run.model_id, Run.build_id, Run.node_id).where(Run.id.in_(leaving))
    table = table_of(BuildPointSum)
    connection.execute(
        delete(table).where(
            tuple_(table.c.model_id, table.c.build_id, table.c.node_id).in_(touched)
        )
    )
    staying = (
        tuple_(Run.model_id, Run.build_id, Run.node_id).in_(touched),
        Run.id.not_in(leaving),
    )
    _upsert(connection, {kind: sums_of_runs(kind, *staying) for kind in ("offline", "serving")})
