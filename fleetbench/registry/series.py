"""A node's series: each (model, PP, TG, B, metric) of its runs over time, with what each
run ran on (its labels), read as plain rows for the regression detector at ingest and for
`GET /v1/series`. Offline runs give S_TG and S_PP at each B; serving runs (read on their
own: a node's serving sweeps must not crowd its offline runs out of the history) give the
output tokens/s a server delivered at each concurrency C, as metric `srv_tps` with B = C and
PP, TG the prompt and output lengths.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

from sqlalchemy import ColumnElement, Integer, Row, and_, bindparam, func, select, true, tuple_
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from fleetbench.registry.labels import SETTING_NAMES, RunLabels, run_labels, serving_labels
from fleetbench.registry.models import (
    RUN_NEWEST_FIRST,
    RUN_SERVED,
    RUN_SUCCESSFUL,
    EngineBuild,
    HardwareFingerprint,
    Run,
    RunPoint,
    ServingPointRow,
)
from fleetbench.registry.questions.regressions import SeriesRun

__all__ = [
    "BUILD_COLUMNS",
    "HISTORY_RUNS",
    "METRICS",
    "SERVED",
    "Cell",
    "Metric",
    "OrderKey",
    "RecentRun",
    "RecentSeries",
    "StepCell",
    "StepMetric",
    "Values",
    "order_key",
    "point_values",
    "series",
    "series_of_pairs",
    "serving_series",
]

Metric = Literal["s_tg", "s_pp", "srv_tps"]
METRICS: tuple[Metric, ...] = ("s_tg", "s_pp")  # an offline run's
SERVED: Metric = "srv_tps"  # a serving run's

_MEDIAN_SE = math.sqrt(math.pi / 2)  # a median's standard error over a mean's

# Runs of a node x model read back when a new one arrives: the detector's `lookback` (20)
# behind the candidates it judges again (the last `window`, 5), and a few more for the
# series' noise. Reading and assembling them is most of an ingest's work.
HISTORY_RUNS = 32


Cell = tuple[int, int, int, Metric]  # PP, TG, B, metric: one series of a node's model
# What a stored step is of: a series, or the knee of a PP x TG's curves (B 0, questions.knee_shifts)
StepMetric = Literal[Metric, "knee"]
StepCell = tuple[int, int, int, StepMetric]

# Oldest first: the exact reverse of RUN_NEWEST_FIRST.
_RUN_OLDEST_FIRST = (Run.started_at, Run.received_at, Run.id.desc())


# What build_label and binding_label read of a run's engine build, in that order.
BUILD_COLUMNS = (
    EngineBuild.engine,
    EngineBuild.build_number,
    EngineBuild.commit,
    EngineBuild.backend,
    EngineBuild.binding,
    EngineBuild.binding_version,
)
# What a series needs of each run (its labels say what it ran on) and of each point.
_LABEL_COLUMNS = (
    Run.id,
    Run.started_at,
    Run.received_at,
    *(getattr(Run, k) for k in SETTING_NAMES),
    *BUILD_COLUMNS,
    HardwareFingerprint.description,
    HardwareFingerprint.hash,
)
_POINT_COLUMNS = (
    RunPoint.run_id,
    RunPoint.pp,
    RunPoint.tg,
    RunPoint.b,
    RunPoint.s_tg,
    RunPoint.s_pp,
    RunPoint.s_tg_stdev,
    RunPoint.s_pp_stdev,
    RunPoint.repeats,
)


def _recent_runs(kind: ColumnElement[bool] = RUN_SUCCESSFUL) -> Any:
    return (
        select(Run.id)
        .where(
            Run.node_id == bindparam("node_id"),
            Run.model_id.in_(bindparam("model_ids", expanding=True)),
            kind,
        )
        .order_by(*RUN_NEWEST_FIRST)
        .limit(bindparam("history", type_=Integer))
        .scalar_subquery()
    )


@functools.cache
def _series_statements(by_cells: bool) -> tuple[Any, Any]:
    """(the node's model's latest `history` successful runs with their labels, oldest
    first; their points at the run's (PP, TG) `cells`, or at one `pp`, `tg`, `b`). Built
    once (they run at every ingest); all values are bound parameters."""
    runs = (
        select(*_LABEL_COLUMNS)
        .join(EngineBuild, EngineBuild.id == Run.build_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .where(Run.id.in_(_recent_runs()))
        .order_by(*_RUN_OLDEST_FIRST)
    )
    at = (
        tuple_(RunPoint.pp, RunPoint.tg).in_(bindparam("cells", expanding=True))
        if by_cells
        else and_(
            RunPoint.pp == bindparam("pp"),
            RunPoint.tg == bindparam("tg"),
            RunPoint.b == bindparam("b"),
        )
    )
    points = select(*_POINT_COLUMNS).where(RunPoint.run_id.in_(_recent_runs()), at)
    return runs, points


def _series_runs(
    session: Session,
    *,
    node_id: int,
    model_ids: Sequence[int],
    cells: Sequence[tuple[int, int]] | None = None,
    point: tuple[int, int, int] | None = None,
    limit: int = HISTORY_RUNS,
) -> RecentSeries:
    """Each series of the node's model at the (PP, TG) `cells`, or at one (PP, TG, B)
    `point`, over the node's latest `limit` successful runs, oldest first: two queries of
    plain rows (the runs with their labels, then their points)."""
    params: dict[str, Any] = {"node_id": node_id, "model_ids": list(model_ids), "history": limit}
    if cells is not None:
        params["cells"] = list(cells)
    else:
        assert point is not None
        params.update(zip(("pp", "tg", "b"), point, strict=True))
    runs_statement, points_statement = _series_statements(cells is not None)
    connection = session.connection()
    runs = connection.execute(runs_statement, params).all()
    points = connection.execute(points_statement, params).all()
    at = cells if cells is not None else [point[:2]] if point is not None else []
    return _assemble(runs, points, at)


OrderKey = tuple[datetime, datetime, int]
"""Where a run sorts oldest first (RUN_NEWEST_FIRST reversed): its start, its receipt,
then the larger id first."""


def order_key(started_at: datetime, received_at: datetime, run_id: uuid.UUID) -> OrderKey:
    return (started_at, received_at, -run_id.int)


class RecentRun(NamedTuple):
    key: OrderKey
    run_id: uuid.UUID
    started_at: datetime
    labels: RunLabels


# A run's values at its points: (PP, TG, B, metric) -> (value, relative standard error of
# the value from its repeats, or None). Tuples of numbers: the garbage collector, which a
# cache of many objects would keep busy, does not track them.
Values = dict[Cell, tuple[float, float | None]]


@dataclass(frozen=True)
class RecentSeries:
    """A (node, model)'s newest HISTORY_RUNS successful runs, oldest first, with their values
    at the (PP, TG) `cells`. Kept this compact (registry.series_cache remembers many);
    `as_lists` makes the SeriesRun objects the detector takes."""

    runs: tuple[tuple[RecentRun, Values], ...]
    cells: frozenset[tuple[int, int]]

    def as_lists(self) -> dict[Cell, list[SeriesRun]]:
        series: dict[Cell, list[SeriesRun]] = defaultdict(list)
        for run, values in self.runs:
            build, binding, hardware, settings = run.labels
            for cell, (value, repeat_noise) in values.items():
                series[cell].append(
                    SeriesRun(
                        run.run_id,
                        run.started_at,
                        value,
                        build,
                        binding,
                        hardware,
                        settings,
                        repeat_noise,
                    )
                )
        return series

    def with_runs(self, new: Sequence[tuple[RecentRun, Values]]) -> RecentSeries:
        """These series with more runs in: what a read of the database would give once
        they are stored, without the read."""
        merged = sorted([*self.runs, *new], key=lambda item: item[0].key)[-HISTORY_RUNS:]
        return RecentSeries(
            tuple(
                (run, {cell: v for cell, v in values.items() if cell[:2] in self.cells})
                for run, values in merged
            ),
            self.cells,
        )


def point_values(
    points: Iterable[
        tuple[int, int, int, float | None, float | None, float | None, float | None, int]
    ],
) -> Values:
    """A run's values, from its points (PP, TG, B, S_TG, S_PP, their stdevs, repeats); a
    point without a positive value has none."""
    found: Values = {}
    for pp, tg, b, s_tg, s_pp, s_tg_stdev, s_pp_stdev, repeats in points:
        measured: tuple[tuple[Metric, float | None, float | None], ...] = (
            ("s_tg", s_tg, s_tg_stdev),
            ("s_pp", s_pp, s_pp_stdev),
        )
        for metric, value, stdev in measured:
            if value is None or value <= 0:
                continue
            # the value is the median of the repeats: its standard error
            noise = (
                _MEDIAN_SE * stdev / value / math.sqrt(repeats)
                if stdev is not None and repeats > 1
                else None
            )
            found[(pp, tg, b, metric)] = (value, noise)
    return found


def _assemble(
    runs: Sequence[Row[Any]], points: Sequence[Any], cells: Collection[tuple[int, int]]
) -> RecentSeries:
    """The series from rows of `runs` (with their labels) and of their `points`."""
    points_of: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for run_id, *point in points:
        points_of[run_id].append(point)
    recent = [
        (
            RecentRun(
                order_key(run.started_at, run.received_at, run.id),
                run.id,
                run.started_at,
                run_labels(run, run.description, run.hash, run),
            ),
            point_values(points_of[run.id]),
        )
        for run in runs
    ]
    recent.sort(key=lambda item: item[0].key)
    return RecentSeries(tuple(recent), frozenset(cells))


@functools.cache
def _pairs_statements() -> tuple[Any, Any]:
    """PostgreSQL: (the latest `history` successful runs of each (node, model) of the
    `node_ids` and `model_ids` arrays, with their labels; their points at `cells`): two
    queries for a whole batch, each a LATERAL probe of the runs' index per pair."""
    pairs = (
        func.unnest(
            bindparam("node_ids", type_=ARRAY(Integer)),
            bindparam("model_ids", type_=ARRAY(Integer)),
        )
        .table_valued("node_id", "model_id")
        .render_derived(name="pairs")
    )
    candidate = aliased(Run)  # the runs the probe looks at, apart from those selected
    recent = (
        select(candidate.id)
        .where(
            candidate.node_id == pairs.c.node_id,
            candidate.model_id == pairs.c.model_id,
            candidate.status != "failed",
        )
        .order_by(candidate.started_at.desc(), candidate.received_at.desc(), candidate.id)
        .limit(bindparam("history", type_=Integer))
        .correlate(pairs)
        .lateral("recent")
    )
    runs = (
        select(Run.node_id, Run.model_id, *_LABEL_COLUMNS)
        .select_from(pairs)
        .join(recent, true())
        .join(Run, Run.id == recent.c.id)
        .join(EngineBuild, EngineBuild.id == Run.build_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .order_by(Run.node_id, Run.model_id, *_RUN_OLDEST_FIRST)
    )
    points = (
        select(*_POINT_COLUMNS)
        .select_from(pairs)
        .join(recent, true())
        .join(RunPoint, RunPoint.run_id == recent.c.id)
        .where(tuple_(RunPoint.pp, RunPoint.tg).in_(bindparam("cells", expanding=True)))
    )
    return runs, points


def series_of_pairs(
    session: Session, cells: Mapping[tuple[int, int], Collection[tuple[int, int]]]
) -> dict[tuple[int, int], RecentSeries]:
    """For each (node, model), its series at its (PP, TG) `cells` over its latest
    HISTORY_RUNS successful runs, oldest first. On PostgreSQL two queries for all the
    pairs; on SQLite, in-process, two per pair."""
    if session.get_bind().dialect.name != "postgresql":
        return {
            (node_id, model_id): _series_runs(
                session, node_id=node_id, model_ids=[model_id], cells=sorted(pair_cells)
            )
            for (node_id, model_id), pair_cells in cells.items()
        }
    pairs = sorted(cells)
    runs_statement, points_statement = _pairs_statements()
    connection = session.connection()
    params = {
        "node_ids": [node for node, _ in pairs],
        "model_ids": [model for _, model in pairs],
        "history": HISTORY_RUNS,
        "cells": sorted({cell for pair_cells in cells.values() for cell in pair_cells}),
    }
    runs = connection.execute(runs_statement, params).all()
    points = connection.execute(points_statement, params).all()
    runs_of: dict[tuple[int, int], list[Row[Any]]] = defaultdict(list)
    pair_of: dict[uuid.UUID, tuple[int, int]] = {}
    for run in runs:
        runs_of[(run.node_id, run.model_id)].append(run)
        pair_of[run.id] = (run.node_id, run.model_id)
    points_of: dict[tuple[int, int], list[Row[Any]]] = defaultdict(list)
    for point in points:
        pair = pair_of[point.run_id]
        if (point.pp, point.tg) in cells[pair]:
            points_of[pair].append(point)
    return {pair: _assemble(runs_of[pair], points_of[pair], cells[pair]) for pair in pairs}


@functools.cache
def _serving_statements() -> tuple[Any, Any]:
    """(the node's model's latest `history` successful serving runs with their labels and
    servers, oldest first; their points' output tokens/s)."""
    recent = _recent_runs(RUN_SERVED)
    runs = (
        select(*_LABEL_COLUMNS, Run.server)
        .join(EngineBuild, EngineBuild.id == Run.build_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .where(Run.id.in_(recent))
        .order_by(*_RUN_OLDEST_FIRST)
    )
    points = select(
        ServingPointRow.run_id, ServingPointRow.concurrency, ServingPointRow.total_tps
    ).where(ServingPointRow.run_id.in_(recent), ServingPointRow.total_tps > 0)
    return runs, points


def serving_series(
    session: Session, *, node_id: int, model_ids: Sequence[int], limit: int = HISTORY_RUNS
) -> dict[Cell, list[SeriesRun]]:
    """The node's serving series of the models over its latest `limit` successful serving
    runs, oldest first: (prompt tokens, output tokens, concurrency, SERVED) -> the output
    tokens/s of each run, labelled by its server (labels.serving_labels)."""
    runs_statement, points_statement = _serving_statements()
    params = {"node_id": node_id, "model_ids": list(model_ids), "history": limit}
    connection = session.connection()
    runs = connection.execute(runs_statement, params).all()
    served: dict[uuid.UUID, list[tuple[int, float]]] = defaultdict(list)
    for run_id, concurrency, total_tps in connection.execute(points_statement, params):
        served[run_id].append((concurrency, total_tps))
    found: dict[Cell, list[SeriesRun]] = defaultdict(list)
    for run in runs:
        server = run.server or {}
        labels = serving_labels(run, run.description, run.hash, server)
        cell = (server.get("prompt_tokens", 0), server.get("gen_tokens", 0))
        for concurrency, total_tps in sorted(served[run.id]):
            found[(*cell, concurrency, SERVED)].append(
                SeriesRun(run.id, run.started_at, total_tps, *labels)
            )
    return found


def series(
    session: Session,
    *,
    node_id: int,
    model_ids: Sequence[int],
    pp: int,
    tg: int,
    b: int,
    metric: Metric,
    limit: int,
) -> list[SeriesRun]:
    """One series, oldest first, over the node's latest `limit` successful runs (of its
    kind: serving runs for SERVED)."""
    if metric == SERVED:
        found = serving_series(session, node_id=node_id, model_ids=model_ids, limit=limit)
        return found.get((pp, tg, b, metric), [])
    recent = _series_runs(
        session, node_id=node_id, model_ids=model_ids, point=(pp, tg, b), limit=limit
    )
    return recent.as_lists().get((pp, tg, b, metric), [])
