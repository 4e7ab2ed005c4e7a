"""A node's history of a model: its series, the regressions found in them and its curves.

Keyword-only functions over the tables, like registry.crud: they flush, never commit. The
decisions (steps, knee) are pure functions in registry.questions; this module feeds them rows.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, cast

from sqlalchemy import ColumnElement, Integer, and_, bindparam, func, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from agent import wire
from registry.models import (
    RUN_NEWEST_FIRST,
    RUN_SUCCESSFUL,
    EngineBuild,
    HardwareFingerprint,
    Node,
    Regression,
    Run,
    RunPoint,
)
from registry.questions.regressions import (
    DetectionSettings,
    SeriesRun,
    Step,
    describe_cause,
    find_steps,
)

__all__ = [
    "HISTORY_RUNS",
    "METRICS",
    "Curve",
    "acknowledge_regression",
    "binding_label",
    "build_label",
    "curves",
    "get_regression",
    "list_regressions",
    "refresh_regressions",
    "series",
]

Metric = Literal["s_tg", "s_pp"]
METRICS: tuple[Metric, ...] = ("s_tg", "s_pp")

_MEDIAN_SE = math.sqrt(math.pi / 2)  # a median's standard error over a mean's

# Runs of a node x model read back when a new one arrives: enough for the detector's
# `lookback` behind the candidates it judges again and the noise of the series.
HISTORY_RUNS = 60


class _BuildFields(Protocol):
    @property
    def engine(self) -> str: ...
    @property
    def build_number(self) -> int | None: ...
    @property
    def commit(self) -> str | None: ...
    @property
    def backend(self) -> str | None: ...


class _BindingFields(Protocol):
    @property
    def binding(self) -> str | None: ...
    @property
    def binding_version(self) -> str | None: ...


def build_label(build: _BuildFields) -> str:
    """The llama.cpp build as people name it: `llama.cpp b11429 (d812350) Metal`."""
    parts = [build.engine]
    if build.build_number is not None:
        parts.append(f"b{build.build_number}")
    if build.commit:
        parts.append(
            f"({build.commit[:7]})" if build.build_number is not None else build.commit[:12]
        )
    if build.backend:
        parts.append(build.backend)
    return " ".join(parts)


def binding_label(build: _BindingFields) -> str | None:
    if not build.binding:
        return None
    return f"{build.binding} {build.binding_version}" if build.binding_version else build.binding


_SETTINGS = tuple(wire.RunSettings.model_fields)


def _settings_label(run: Any) -> str:
    return " ".join(f"{k}={getattr(run, k)}" for k in _SETTINGS if getattr(run, k) is not None)


def _hardware_label(description: str | None, digest: str | None) -> str | None:
    if digest is None:
        return None
    return f"{description or 'hardware'} [{digest[:8]}]"


Cell = tuple[int, int, int, Metric]  # PP, TG, B, metric: one series of a node's model

# Oldest first: the exact reverse of RUN_NEWEST_FIRST.
_RUN_OLDEST_FIRST = (Run.started_at, Run.received_at, Run.id.desc())


def _recent_runs() -> Any:
    return (
        select(Run.id)
        .where(
            Run.node_id == bindparam("node_id"),
            Run.model_id.in_(bindparam("model_ids", expanding=True)),
            RUN_SUCCESSFUL,
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
        select(
            Run.id,
            Run.started_at,
            *(getattr(Run, k) for k in _SETTINGS),
            EngineBuild.engine,
            EngineBuild.build_number,
            EngineBuild.commit,
            EngineBuild.backend,
            EngineBuild.binding,
            EngineBuild.binding_version,
            HardwareFingerprint.description,
            HardwareFingerprint.hash,
        )
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
    points = select(
        RunPoint.run_id,
        RunPoint.pp,
        RunPoint.tg,
        RunPoint.b,
        RunPoint.s_tg,
        RunPoint.s_pp,
        RunPoint.s_tg_stdev,
        RunPoint.s_pp_stdev,
        RunPoint.repeats,
    ).where(RunPoint.run_id.in_(_recent_runs()), at)
    return runs, points


def _series_runs(
    session: Session,
    *,
    node_id: int,
    model_ids: Sequence[int],
    cells: Sequence[tuple[int, int]] | None = None,
    point: tuple[int, int, int] | None = None,
    limit: int = HISTORY_RUNS,
) -> dict[Cell, list[SeriesRun]]:
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
    order: dict[uuid.UUID, int] = {}
    labels: list[tuple[uuid.UUID, datetime, str, str | None, str | None, str]] = []
    for run in connection.execute(runs_statement, params).all():
        order[run.id] = len(labels)
        labels.append(
            (
                run.id,
                run.started_at,
                build_label(run),
                binding_label(run),
                _hardware_label(run.description, run.hash),
                _settings_label(run),
            )
        )
    found: dict[Cell, list[tuple[int, SeriesRun]]] = defaultdict(list)
    points = connection.execute(points_statement, params).all()
    for run_id, pp, tg, b, s_tg, s_pp, s_tg_stdev, s_pp_stdev, repeats in points:
        position = order[run_id]
        _, started_at, build, binding, hardware, settings = labels[position]
        measured: tuple[tuple[Metric, float | None, float | None], ...] = (
            ("s_tg", s_tg, s_tg_stdev),
            ("s_pp", s_pp, s_pp_stdev),
        )
        for metric, value, stdev in measured:
            if value is None or value <= 0:
                continue
            found[(pp, tg, b, metric)].append(
                (
                    position,
                    SeriesRun(
                        run_id=run_id,
                        started_at=started_at,
                        value=value,
                        build=build,
                        binding=binding,
                        hardware=hardware,
                        settings=settings,
                        # the value is the median of the repeats: its standard error
                        repeat_noise=_MEDIAN_SE * stdev / value / math.sqrt(repeats)
                        if stdev is not None and repeats > 1
                        else None,
                    ),
                )
            )
    return {
        cell: [run for _, run in sorted(runs, key=lambda item: item[0])]
        for cell, runs in found.items()
    }


_STORED_STEPS = select(Regression).where(
    Regression.node_id == bindparam("node_id"),
    Regression.model_id == bindparam("model_id"),
    tuple_(Regression.pp, Regression.tg).in_(bindparam("cells", expanding=True)),
)


# --- regressions -----------------------------------------------------------------------


def refresh_regressions(
    session: Session,
    *,
    node_id: int,
    model_id: int,
    run_id: uuid.UUID,
    cells: Sequence[tuple[int, int]],
    settings: DetectionSettings | None = None,
) -> bool:
    """Judges again the candidates of each series of the run `run_id` (its (PP, TG) `cells`)
    whose runs after them include it (from `window` runs before it on), with the steps
    stored before them fixed, and stores what the detector finds now. A step it no longer
    sees there (an outlier that reverted) is dropped unless someone acknowledged it; steps
    judged earlier are never touched. True when a regression is stored."""
    settings = settings or DetectionSettings()
    cell_keys = sorted(set(cells))
    by_series = _series_runs(session, node_id=node_id, model_ids=[model_id], cells=cell_keys)
    stored: dict[Cell, dict[uuid.UUID, Regression]] = defaultdict(dict)
    for row in session.scalars(
        _STORED_STEPS, {"node_id": node_id, "model_id": model_id, "cells": cell_keys}
    ):
        stored[(row.pp, row.tg, row.b, cast(Metric, row.metric))][row.first_run_id] = row
    regressed = False
    for (pp, tg, b, metric), runs in by_series.items():
        index = {r.run_id: i for i, r in enumerate(runs)}
        position = index.get(run_id)
        if position is None:
            continue  # this run has no value in this series (the point failed)
        judge_from = max(1, position - settings.window + 1)
        rows = stored[(pp, tg, b, metric)]
        known_steps = [index[k] for k in rows if k in index and index[k] < judge_from]
        found = {
            step.first.run_id: step
            for step in find_steps(runs, settings, judge_from=judge_from, known_steps=known_steps)
        }
        for first_run_id, row in rows.items():
            judged = index.get(first_run_id, -1) >= judge_from
            if judged and first_run_id not in found and row.acknowledged_at is None:
                session.delete(row)
        for first_run_id, step in found.items():
            regressed = regressed or step.is_regression
            _store_step(
                session,
                rows.get(first_run_id),
                step,
                node_id=node_id,
                model_id=model_id,
                pp=pp,
                tg=tg,
                b=b,
                metric=metric,
            )
    session.flush()
    return regressed


def _store_step(session: Session, row: Regression | None, step: Step, **series: Any) -> None:
    """Updates the step's row, or inserts it with the `series` key (node_id, model_id, pp,
    tg, b, metric); an insert that a concurrent ingest of the same series made first
    (PostgreSQL) updates that row instead."""
    if row is not None:
        _record_step(row, step)
        return
    key = {**series, "first_run_id": step.first.run_id}
    row = Regression(**key, first_seen_at=step.first.started_at, detected_at=datetime.now(UTC))
    _record_step(row, step)
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        _record_step(session.scalars(select(Regression).filter_by(**key)).one(), step)


def _record_step(row: Regression, step: Step) -> None:
    row.before_value = step.before
    row.after_value = step.after
    row.change = step.change
    row.noise = step.noise
    row.confidence = step.confidence
    row.runs_before = step.runs_before
    row.runs_after = step.runs_after
    row.cause_kinds = list(step.cause_kinds)
    row.cause = describe_cause(step.cause_kinds, step.before_run, step.first)
    row.before_run_id = step.before_run.run_id
    row.before_build = step.before_run.build
    row.after_build = step.first.build


def list_regressions(
    session: Session,
    *,
    node: str | None = None,
    model_ids: Sequence[int] | None = None,
    since: datetime | None = None,
    min_change: float | None = None,
    include_improvements: bool = False,
    include_acknowledged: bool = False,
    series: tuple[int, int, int, str] | None = None,
    limit: int = 1000,
) -> tuple[Sequence[Regression], int]:
    """Stored steps newest first (regressions only unless asked), with the total count.
    `series` narrows to one (PP, TG, B, metric)."""
    conditions: list[ColumnElement[bool]] = []
    if node is not None:
        conditions.append(Regression.node.has(Node.name == node))
    if model_ids is not None:
        conditions.append(Regression.model_id.in_(model_ids))
    if since is not None:
        conditions.append(Regression.first_seen_at >= since)
    if min_change is not None:
        conditions.append(func.abs(Regression.change) >= min_change)
    if not include_improvements:
        conditions.append(Regression.change < 0)
    if not include_acknowledged:
        conditions.append(Regression.acknowledged_at.is_(None))
    if series is not None:
        pp, tg, b, metric = series
        conditions.extend(
            [
                Regression.pp == pp,
                Regression.tg == tg,
                Regression.b == b,
                Regression.metric == metric,
            ]
        )
    count = session.scalar(select(func.count(Regression.id)).where(*conditions)) or 0
    rows = session.scalars(
        select(Regression)
        .where(*conditions)
        .options(selectinload(Regression.node), selectinload(Regression.model))
        .order_by(Regression.first_seen_at.desc(), Regression.id.desc())
        .limit(limit)
    ).all()
    return rows, count


def get_regression(session: Session, regression_id: int) -> Regression | None:
    return session.get(Regression, regression_id)


def acknowledge_regression(regression: Regression, *, note: str) -> None:
    regression.acknowledged_at = datetime.now(UTC)
    regression.note = note


# --- series and curves -----------------------------------------------------------------


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
    """One series, oldest first, over the node's latest `limit` successful runs."""
    by_series = _series_runs(
        session, node_id=node_id, model_ids=model_ids, point=(pp, tg, b), limit=limit
    )
    return by_series.get((pp, tg, b, metric), [])


@dataclass(frozen=True)
class Curve:
    """One batching curve: the latest run of one build at one (PP, TG)."""

    run: Run
    pp: int
    tg: int
    points: list[RunPoint]  # by B, each with an S_TG


def curves(session: Session, *, node_id: int, model_ids: Sequence[int]) -> list[Curve]:
    """For each engine build the node ran the model on, its latest successful run's curves
    (one per PP x TG); oldest build first."""
    newest_first = (
        func.row_number()
        .over(
            partition_by=Run.build_id,
            order_by=RUN_NEWEST_FIRST,
        )
        .label("rank")
    )
    ranked = (
        select(Run.id, newest_first)
        .where(Run.node_id == node_id, Run.model_id.in_(model_ids), RUN_SUCCESSFUL)
        .subquery()
    )
    runs = session.scalars(
        select(Run)
        .where(Run.id.in_(select(ranked.c.id).where(ranked.c.rank == 1)))
        .options(selectinload(Run.build), selectinload(Run.points))
        .order_by(Run.started_at, Run.received_at)
    ).all()
    found: list[Curve] = []
    for run in runs:
        groups: dict[tuple[int, int], list[RunPoint]] = defaultdict(list)
        for point in run.points:
            if point.s_tg is not None:
                groups[(point.pp, point.tg)].append(point)
        for (pp, tg), points in sorted(groups.items()):
            found.append(Curve(run, pp, tg, sorted(points, key=lambda p: p.b)))
    return found
