"""A node's series: each (model, PP, TG, B, metric) of its runs over time, with what each
run ran on (its labels), read as plain rows for the regression judge and for
`GET /v1/series`. Offline runs give S_TG and S_PP at each B; serving runs (read on their
own: a node's serving sweeps must not crowd its offline runs out of the history) give the
output tokens/s a server delivered at each concurrency C, as metric `srv_tps` with B = C and
PP, TG the prompt and output lengths. The runs of either kind that carry an output
fingerprint give the model's outputs series, one per runner (regressions.output_shifts).
"""

from __future__ import annotations

import functools
import math
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    Row,
    and_,
    bindparam,
    case,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from fleetbench.contract.answers import Metric, StepMetric
from fleetbench.contract.outputs import OutputFingerprint
from fleetbench.registry.compare.output_rules import outputs_runner
from fleetbench.registry.models import (
    POINT_POSSIBLE,
    RUN_NEWEST_FIRST,
    RUN_SERVED,
    RUN_SUCCESSFUL,
    EngineBuild,
    HardwareFingerprint,
    Run,
    RunPoint,
    ServingPointRow,
    successful_offline,
)
from fleetbench.registry.regressions.labels import run_labels, runner_label, serving_labels
from fleetbench.registry.regressions.output_shifts import HISTORY as OUTPUTS_HISTORY
from fleetbench.registry.regressions.output_shifts import OutputRun
from fleetbench.registry.regressions.rules import SeriesRun
from fleetbench.registry.settings_label import SETTING_NAMES

__all__ = [
    "BUILD_COLUMNS",
    "HISTORY_RUNS",
    "METRICS",
    "MOST_JUDGED",
    "MOST_OUTPUTS_JUDGED",
    "SERVED",
    "Cell",
    "Metric",
    "OutputSeries",
    "Series",
    "StepCell",
    "StepMetric",
    "output_series_of_pairs",
    "series",
    "series_of_pairs",
    "serving_series",
]

METRICS: tuple[Metric, ...] = ("s_tg", "s_pp")  # an offline run's
SERVED: Metric = "srv_tps"  # a serving run's

_MEDIAN_SE = math.sqrt(math.pi / 2)  # a median's standard error over a mean's

# Runs of a node x model read back to judge its new ones: the detector's `lookback` (20)
# behind the candidates it judges again (the last `window`, 5), which covers the runs the
# series' noise is estimated over (`noise_runs`, 25), and a few more; whatever the history
# holds, one probe of the runs' index reads them.
HISTORY_RUNS = 32
# The most new runs of one series judged at once: a node whose clock was years off, or a
# spool of thousands of runs, is judged over its latest ones, never over its whole history.
MOST_JUDGED = 256
# ... of an outputs series: fingerprints are ~44 KB of JSON each, each compared with the one
# before it (a few ms); a spool of more is judged over its latest.
MOST_OUTPUTS_JUDGED = 24


Cell = tuple[int, int, int, Metric]  # PP, TG, B, metric: one series of a node's model
Series = dict[Cell, list[SeriesRun]]  # a node's model's series, each oldest first
OutputSeries = dict[str, list[OutputRun]]  # its outputs series by runner, each oldest first
# What a stored step is of: a series, or the knee of a PP x TG's curves (B 0,
# regressions.knee_shifts)
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


def _runs_to_read(
    node_id: Any, model_ids: Any, since: Any, kind: ColumnElement[bool], outer: Any = None
) -> Any:
    """How many of a node's models' newest runs of a kind to read: `history`, and every
    run started at `since` or later (the runs a check judges, however many a burst brought,
    up to MOST_JUDGED; none for a NULL `since`), so that the detector always sees `history`
    runs before them. The count is correlated to `outer` alone, never to the runs it
    limits."""
    since_then = (
        select(func.count())
        .select_from(Run)
        .where(Run.node_id == node_id, Run.model_id.in_(model_ids), kind, Run.started_at >= since)
        .correlate(outer)
        .scalar_subquery()
    )
    judged = case((since_then > MOST_JUDGED, MOST_JUDGED), else_=since_then)
    return bindparam("history", type_=Integer) + judged


def _recent_runs(kind: ColumnElement[bool] = RUN_SUCCESSFUL) -> Any:
    node_id: Any = bindparam("node_id")
    model_ids: Any = bindparam("model_ids", expanding=True)
    return (
        select(Run.id)
        .where(Run.node_id == node_id, Run.model_id.in_(model_ids), kind)
        .order_by(*RUN_NEWEST_FIRST)
        .limit(_runs_to_read(node_id, model_ids, bindparam("since"), kind))
        .scalar_subquery()
    )


# The node's model's latest successful runs (`_runs_to_read`) with their labels, oldest
# first. Built once; all values are bound parameters.
_SERIES_RUNS = (
    select(*_LABEL_COLUMNS)
    .join(EngineBuild, EngineBuild.id == Run.build_id)
    .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
    .where(Run.id.in_(_recent_runs()))
    .order_by(*_RUN_OLDEST_FIRST)
)
# The points of the runs read, or of them at one `pp`, `tg`, `b`: by the ids read (runs
# stored since by another process would be in a second probe of the newest runs).
_POINTS = select(*_POINT_COLUMNS).where(
    RunPoint.run_id.in_(bindparam("run_ids", expanding=True)), POINT_POSSIBLE
)
_POINTS_AT = _POINTS.where(
    RunPoint.pp == bindparam("pp"), RunPoint.tg == bindparam("tg"), RunPoint.b == bindparam("b")
)


def _points_of(
    connection: Connection, runs: Sequence[Row[Any]], point: tuple[int, int, int] | None = None
) -> Sequence[Any]:
    if not runs:
        return []
    params: dict[str, Any] = {"run_ids": [run.id for run in runs]}
    if point is not None:
        params.update(zip(("pp", "tg", "b"), point, strict=True))
    return connection.execute(_POINTS if point is None else _POINTS_AT, params).all()


def _series_runs(
    session: Session,
    *,
    node_id: int,
    model_ids: Sequence[int],
    point: tuple[int, int, int] | None = None,
    limit: int = HISTORY_RUNS,
    since: datetime | None = None,
) -> Series:
    """Each series of the node's model, or the one at a (PP, TG, B) `point`, over the
    node's runs started at `since` or later and the `limit` successful runs before them,
    oldest first: two queries of plain rows (the runs with their labels, then their
    points)."""
    params = {"node_id": node_id, "model_ids": list(model_ids), "history": limit, "since": since}
    connection = session.connection()
    runs = connection.execute(_SERIES_RUNS, params).all()
    return _assemble(runs, _points_of(connection, runs, point))


_MetricValue = tuple[Metric, float | None, float | None]  # metric, value, its repeats' stdev


def _assemble(runs: Sequence[Row[Any]], points: Sequence[Any]) -> Series:
    """The series from rows of `runs` (with their labels, oldest first) and of their
    `points`. A point without a positive value has none; a value's repeat noise is the
    relative standard error of the median its repeats gave."""
    points_of: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for point in points:
        points_of[point.run_id].append(point)
    found: Series = defaultdict(list)
    for run in runs:
        build, binding, hardware, settings = run_labels(run, run.description, run.hash, run)
        for p in points_of[run.id]:
            measured: tuple[_MetricValue, ...] = (
                ("s_tg", p.s_tg, p.s_tg_stdev),
                ("s_pp", p.s_pp, p.s_pp_stdev),
            )
            for metric, value, stdev in measured:
                if value is None or value <= 0:
                    continue
                noise = (
                    _MEDIAN_SE * stdev / value / math.sqrt(p.repeats)
                    if stdev is not None and p.repeats > 1
                    else None
                )
                found[(p.pp, p.tg, p.b, metric)].append(
                    SeriesRun(
                        run.id, run.started_at, value, build, binding, hardware, settings, noise
                    )
                )
    return found


@functools.cache
def _pairs_statement() -> Any:
    """PostgreSQL: the latest successful runs (`_runs_to_read`) of each (node, model,
    since) of the `node_ids`, `model_ids` and `sinces` arrays, with their labels: one query
    for many pairs, a LATERAL probe of the runs' index per pair."""
    pairs = (
        func.unnest(
            bindparam("node_ids", type_=ARRAY(Integer)),
            bindparam("model_ids", type_=ARRAY(Integer)),
            bindparam("sinces", type_=ARRAY(DateTime(timezone=True))),
        )
        .table_valued("node_id", "model_id", "since")
        .render_derived(name="pairs")
    )
    candidate = aliased(Run)  # the runs the probe looks at, apart from those selected
    to_read = _runs_to_read(
        pairs.c.node_id, [pairs.c.model_id], pairs.c.since, RUN_SUCCESSFUL, outer=pairs
    )
    recent = (
        select(candidate.id)
        .where(
            candidate.node_id == pairs.c.node_id,
            candidate.model_id == pairs.c.model_id,
            successful_offline(candidate),  # RUN_SUCCESSFUL, of the probe's runs
        )
        .order_by(candidate.started_at.desc(), candidate.received_at.desc(), candidate.id)
        .limit(to_read)
        .correlate(pairs)
        .lateral("recent")
    )
    return (
        select(Run.node_id, Run.model_id, *_LABEL_COLUMNS)
        .select_from(pairs)
        .join(recent, true())
        .join(Run, Run.id == recent.c.id)
        .join(EngineBuild, EngineBuild.id == Run.build_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .order_by(Run.node_id, Run.model_id, *_RUN_OLDEST_FIRST)
    )


def series_of_pairs(
    session: Session, since: Mapping[tuple[int, int], datetime]
) -> dict[tuple[int, int], Series]:
    """For each (node, model), its series over its successful runs started at `since` or
    later and the HISTORY_RUNS before them, oldest first. On PostgreSQL two queries for all
    the pairs; on SQLite, in-process, two per pair."""
    if session.get_bind().dialect.name != "postgresql":
        return {
            (node_id, model_id): _series_runs(
                session, node_id=node_id, model_ids=[model_id], since=first
            )
            for (node_id, model_id), first in since.items()
        }
    ordered = sorted(since)
    connection = session.connection()
    params = {
        "node_ids": [node for node, _ in ordered],
        "model_ids": [model for _, model in ordered],
        "sinces": [since[pair] for pair in ordered],
        "history": HISTORY_RUNS,
    }
    runs = connection.execute(_pairs_statement(), params).all()
    points = _points_of(connection, runs)
    runs_of: dict[tuple[int, int], list[Row[Any]]] = defaultdict(list)
    pair_of: dict[uuid.UUID, tuple[int, int]] = {}
    for run in runs:
        runs_of[(run.node_id, run.model_id)].append(run)
        pair_of[run.id] = (run.node_id, run.model_id)
    points_of: dict[tuple[int, int], list[Row[Any]]] = defaultdict(list)
    for point in points:
        points_of[pair_of[point.run_id]].append(point)
    return {pair: _assemble(runs_of[pair], points_of[pair]) for pair in ordered}


# The node's model's latest successful serving runs (`_runs_to_read`) with their labels
# and servers, oldest first; the output tokens/s of the points of the runs read.
_SERVING_RUNS = (
    select(*_LABEL_COLUMNS, Run.server)
    .join(EngineBuild, EngineBuild.id == Run.build_id)
    .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
    .where(Run.id.in_(_recent_runs(RUN_SERVED)))
    .order_by(*_RUN_OLDEST_FIRST)
)
_SERVED = select(
    ServingPointRow.run_id, ServingPointRow.concurrency, ServingPointRow.total_tps
).where(
    ServingPointRow.run_id.in_(bindparam("run_ids", expanding=True)),
    ServingPointRow.total_tps > 0,
)


def serving_series(
    session: Session,
    *,
    node_id: int,
    model_ids: Sequence[int],
    limit: int = HISTORY_RUNS,
    since: datetime | None = None,
) -> Series:
    """The node's serving series of the models over its successful serving runs started at
    `since` or later and the `limit` before them, oldest first: (prompt tokens, output
    tokens, concurrency, SERVED) -> the output tokens/s of each run, labelled by its server
    (labels.serving_labels)."""
    params = {"node_id": node_id, "model_ids": list(model_ids), "history": limit, "since": since}
    connection = session.connection()
    runs = connection.execute(_SERVING_RUNS, params).all()
    served: dict[uuid.UUID, list[tuple[int, float]]] = defaultdict(list)
    if runs:
        read = {"run_ids": [run.id for run in runs]}
        for run_id, concurrency, total_tps in connection.execute(_SERVED, read):
            served[run_id].append((concurrency, cast(float, total_tps)))  # > 0: not NULL
    found: Series = defaultdict(list)
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
    found = _series_runs(
        session, node_id=node_id, model_ids=model_ids, point=(pp, tg, b), limit=limit
    )
    return found.get((pp, tg, b, metric), [])


# A node's model's runs with an output fingerprint, either kind: a run without one holds
# JSON's null where bulk ingest wrote None (PostgreSQL), not NULL.
_FINGERPRINTED = and_(
    or_(RUN_SUCCESSFUL, RUN_SERVED),
    Run.node_id == bindparam("node_id"),
    Run.model_id == bindparam("model_id"),
    Run.outputs["text_version"].as_string().is_not(None),
)


@functools.cache
def _outputs_statement() -> Any:
    """The node's model's fingerprinted runs started at `since` or later (up to
    MOST_OUTPUTS_JUDGED) and the OUTPUTS_HISTORY before them, with their labels, runners and
    fingerprints, oldest first; none when no new run has a fingerprint (nothing to judge,
    and 350 KB not read)."""
    new = (
        select(func.count())
        .select_from(Run)
        .where(_FINGERPRINTED, Run.started_at >= bindparam("since"))
        .correlate(None)
        .scalar_subquery()
    )
    judged = case((new > MOST_OUTPUTS_JUDGED, MOST_OUTPUTS_JUDGED), else_=new)
    newest = (
        select(Run.id)
        .where(_FINGERPRINTED)
        .order_by(*RUN_NEWEST_FIRST)
        .limit(case((new == 0, 0), else_=OUTPUTS_HISTORY + judged))
        .scalar_subquery()
    )
    return (
        select(*_LABEL_COLUMNS, Run.kind, Run.server, Run.outputs)
        .join(EngineBuild, EngineBuild.id == Run.build_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .where(Run.id.in_(newest))
        .order_by(*_RUN_OLDEST_FIRST)
    )


def output_series_of_pairs(
    session: Session, since: Mapping[tuple[int, int], datetime]
) -> dict[tuple[int, int], OutputSeries]:
    """For each (node, model) with fingerprinted runs started at `since` or later, its
    outputs series over them and the OUTPUTS_HISTORY fingerprinted runs before them, keyed
    by runner: the run's kind, engine, backend, binding and the settings that change
    outputs (compare.output_rules.outputs_runner: fingerprints taken another way never
    compare). One query per pair."""
    connection = session.connection()
    found: dict[tuple[int, int], OutputSeries] = {}
    for (node_id, model_id), first in sorted(since.items()):
        params = {"node_id": node_id, "model_id": model_id, "since": first}
        runs = connection.execute(_outputs_statement(), params).all()
        if runs:
            found[(node_id, model_id)] = _output_series(runs)
    return found


def _output_series(runs: Sequence[Row[Any]]) -> OutputSeries:
    found: OutputSeries = defaultdict(list)
    for run in runs:
        try:
            outputs = OutputFingerprint.model_validate(run.outputs)
        except ValidationError:  # stored under other bounds: compared with nothing
            continue
        if run.kind == "serving":
            labels = serving_labels(run, run.description, run.hash, run.server or {})
        else:
            labels = run_labels(run, run.description, run.hash, run)
        runner = outputs_runner(run.kind, runner_label(run), run)
        found[runner].append(OutputRun(SeriesRun(run.id, run.started_at, 0.0, *labels), outputs))
    return found
