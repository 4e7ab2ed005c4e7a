"""Regressions in the database: what the detector finds in a series stored (the decisions
are registry.regressions.rules', over rows registry.regressions.series reads), listed,
and acknowledged. Keyword-only functions like registry.crud: they flush, never commit.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from fleetbench.registry.models import Regression
from fleetbench.registry.regressions.knee_shifts import KNEE_METRIC, find_knee_shifts, knee_series
from fleetbench.registry.regressions.rules import (
    DetectionSettings,
    SeriesRun,
    Step,
    describe_cause,
    find_steps,
)
from fleetbench.registry.regressions.series import MOST_JUDGED, Cell, StepCell, StepMetric

__all__ = [
    "acknowledge_regression",
    "get_regression",
    "list_regressions",
    "refresh_regressions",
]


# The steps stored whose first run is among those read: the ones a judgement can meet,
# however many steps the pair's whole history holds.
_STORED_STEPS = select(Regression).where(
    Regression.first_run_id.in_(bindparam("run_ids", expanding=True))
)


def refresh_regressions(
    session: Session,
    since: Mapping[tuple[int, int], datetime],
    histories: Mapping[tuple[int, int], Mapping[Cell, Sequence[SeriesRun]]],
    settings: DetectionSettings | None = None,
) -> set[tuple[int, int]]:
    """For each (node, model) of `since`: judges again the candidates of each series that
    has runs started at `since` or later (its new runs), from `window` runs before the
    earliest of them on, with the steps stored before that fixed, and stores what the
    detector finds now. A step it no longer sees there (an outlier that reverted) is
    dropped unless someone acknowledged it; steps judged earlier are never touched. Returns
    the pairs a regression is stored for.

    `histories`: each pair's series, new runs in. The stored steps: one query."""
    settings = settings or DetectionSettings()
    run_ids = sorted(
        {run.run_id for cells in histories.values() for runs in cells.values() for run in runs}
    )
    stored: dict[tuple[int, int], dict[StepCell, dict[uuid.UUID, Regression]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for row in session.scalars(_STORED_STEPS, {"run_ids": run_ids}) if run_ids else ():
        cell = (row.pp, row.tg, row.b, cast(StepMetric, row.metric))
        stored[(row.node_id, row.model_id)][cell][row.first_run_id] = row
    regressed: set[tuple[int, int]] = set()
    for (node_id, model_id), first_new in since.items():
        for (pp, tg, b, metric), runs in _judged(histories.get((node_id, model_id), {})):
            detect = find_knee_shifts if metric == KNEE_METRIC else find_steps
            index = {r.run_id: i for i, r in enumerate(runs)}
            positions = [i for i, r in enumerate(runs) if r.started_at >= first_new]
            if not positions:
                continue  # no new run has a value in this series (the points failed)
            # Past MOST_JUDGED new runs the oldest read are history, never judged again.
            judge_from = max(1, min(positions) - settings.window + 1, len(runs) - MOST_JUDGED)
            rows = stored[(node_id, model_id)][(pp, tg, b, metric)]
            known_steps = [index[k] for k in rows if k in index and index[k] < judge_from]
            found = {
                step.first.run_id: step
                for step in detect(runs, settings, judge_from=judge_from, known_steps=known_steps)
            }
            for first_run_id, row in rows.items():
                judged = index.get(first_run_id, -1) >= judge_from
                if judged and first_run_id not in found and row.acknowledged_at is None:
                    session.delete(row)
            for first_run_id, step in found.items():
                if step.is_regression:
                    regressed.add((node_id, model_id))
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


def _judged(
    cells: Mapping[Cell, Sequence[SeriesRun]],
) -> Iterator[tuple[StepCell, Sequence[SeriesRun]]]:
    """Every series to judge: each point's S_TG and S_PP (or a server's throughput), judged
    for lasting steps, and each PP x TG's knee (at B 0: it is the curve's), judged for moves
    at known changes."""
    curves: dict[tuple[int, int], dict[int, Sequence[SeriesRun]]] = defaultdict(dict)
    for (pp, tg, b, metric), runs in cells.items():
        yield (pp, tg, b, metric), runs
        if metric == "s_tg":
            curves[(pp, tg)][b] = runs
    for (pp, tg), by_b in curves.items():
        if len(by_b) > 1:
            yield (pp, tg, 0, KNEE_METRIC), knee_series(by_b)


def _store_step(session: Session, row: Regression | None, step: Step, **series: Any) -> None:
    """Updates the step's row, or inserts it with the `series` key (node_id, model_id, pp,
    tg, b, metric); an insert that another judge of the same series made first (one whose
    lease ran out meanwhile; PostgreSQL) updates that row instead."""
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
        existing = session.scalars(select(Regression).filter_by(**key)).one_or_none()
        if existing is None:
            raise  # not the same step inserted first by another judge
        _record_step(existing, step)


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
    node_id: int | None = None,
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
    if node_id is not None:
        conditions.append(Regression.node_id == node_id)
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


def acknowledge_regression(regression: Regression, *, note: str, by: str) -> None:
    regression.acknowledged_at = datetime.now(UTC)
    regression.acknowledged_by = by
    regression.note = note
