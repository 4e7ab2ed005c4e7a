"""A node's history of a model: its series, the regressions found in them and its curves.

Keyword-only functions over the tables, like registry.crud: they flush, never commit. The
decisions (steps, knee) are pure functions in registry.questions; this module feeds them rows.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import ColumnElement, and_, func, select, tuple_
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


def build_label(build: EngineBuild) -> str:
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


def binding_label(build: EngineBuild) -> str | None:
    if not build.binding:
        return None
    return f"{build.binding} {build.binding_version}" if build.binding_version else build.binding


def _settings_label(run: Run) -> str:
    settings = wire.RunSettings.model_fields
    return " ".join(f"{k}={getattr(run, k)}" for k in settings if getattr(run, k) is not None)


def _hardware_label(fingerprint: HardwareFingerprint | None) -> str | None:
    if fingerprint is None:
        return None
    return f"{fingerprint.description or 'hardware'} [{fingerprint.hash[:8]}]"


Cell = tuple[int, int, int, Metric]  # PP, TG, B, metric: one series of a node's model


def _series_runs(
    session: Session,
    *,
    node_id: int,
    model_ids: Sequence[int],
    points: ColumnElement[bool],
    limit: int = HISTORY_RUNS,
) -> dict[Cell, list[SeriesRun]]:
    """Each series of the node's model whose `points` match, over the node's latest `limit`
    successful runs, oldest first; one query, each run's labels made once."""
    recent = (
        select(Run.id)
        .where(Run.node_id == node_id, Run.model_id.in_(model_ids), RUN_SUCCESSFUL)
        .order_by(*RUN_NEWEST_FIRST)
        .limit(limit)
    )
    rows = session.execute(
        select(RunPoint, Run)
        .join(Run, Run.id == RunPoint.run_id)
        .where(RunPoint.run_id.in_(recent.scalar_subquery()), points)
        .options(selectinload(Run.build), selectinload(Run.fingerprint))
        .order_by(Run.started_at, Run.received_at, RunPoint.b)
    ).all()
    labels: dict[uuid.UUID, dict[str, str | None]] = {}
    found: dict[Cell, list[SeriesRun]] = defaultdict(list)
    for point, run in rows:
        if run.id not in labels:
            labels[run.id] = {
                "build": build_label(run.build),
                "binding": binding_label(run.build),
                "hardware": _hardware_label(run.fingerprint),
                "settings": _settings_label(run),
            }
        for metric in METRICS:
            value = getattr(point, metric)
            if value is None or value <= 0:
                continue
            stdev = getattr(point, f"{metric}_stdev")
            found[(point.pp, point.tg, point.b, metric)].append(
                SeriesRun(
                    run_id=run.id,
                    started_at=run.started_at,
                    value=value,
                    **labels[run.id],
                    repeat_noise=(
                        # the value is the median of the repeats: its standard error
                        _MEDIAN_SE * stdev / value / math.sqrt(point.repeats)
                        if stdev is not None and point.repeats > 1
                        else None
                    ),
                )
            )
    return found


# --- regressions -----------------------------------------------------------------------


def refresh_regressions(
    session: Session, *, run: Run, settings: DetectionSettings | None = None
) -> None:
    """Judges again the candidates of each series of `run` whose runs after them include it
    (from `window` runs before it on), with the steps stored before them fixed, and stores
    what the detector finds now. A step it no longer sees there (an outlier that reverted) is
    dropped unless someone acknowledged it; steps judged earlier are never touched."""
    settings = settings or DetectionSettings()
    cells = sorted({(p.pp, p.tg) for p in run.points})
    by_series = _series_runs(
        session,
        node_id=run.node_id,
        model_ids=[run.model_id],
        points=tuple_(RunPoint.pp, RunPoint.tg).in_(cells),
    )
    stored: dict[Cell, dict[uuid.UUID, Regression]] = defaultdict(dict)
    for row in session.scalars(
        select(Regression).where(
            Regression.node_id == run.node_id,
            Regression.model_id == run.model_id,
            tuple_(Regression.pp, Regression.tg).in_(cells),
        )
    ):
        stored[(row.pp, row.tg, row.b, cast(Metric, row.metric))][row.first_run_id] = row
    for (pp, tg, b, metric), runs in by_series.items():
        index = {r.run_id: i for i, r in enumerate(runs)}
        position = index.get(run.id)
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
            _store_step(
                session,
                rows.get(first_run_id),
                step,
                node_id=run.node_id,
                model_id=run.model_id,
                pp=pp,
                tg=tg,
                b=b,
                metric=metric,
            )
    session.flush()


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
        session,
        node_id=node_id,
        model_ids=model_ids,
        points=and_(RunPoint.pp == pp, RunPoint.tg == tg, RunPoint.b == b),
        limit=limit,
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
