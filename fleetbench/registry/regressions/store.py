"""Regressions in the database: what the detector finds in a series stored (the decisions
are registry.regressions.rules', over rows registry.regressions.series reads), listed,
and acknowledged. Keyword-only functions like registry.crud: they flush, never commit.
"""

from __future__ import annotations

import functools
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from sqlalchemy import ColumnElement, bindparam, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from fleetbench.registry.models import Regression
from fleetbench.registry.regressions.knee_shifts import KNEE_METRIC, find_knee_shifts, knee_series
from fleetbench.registry.regressions.output_shifts import (
    OUTPUTS_METRIC,
    find_output_shifts,
)
from fleetbench.registry.regressions.rules import DetectionSettings, SeriesRun, Step, find_steps
from fleetbench.registry.regressions.series import (
    MOST_JUDGED,
    Cell,
    OutputSeries,
    StepCell,
    StepMetric,
)

__all__ = [
    "REGRESSED",
    "acknowledge_regression",
    "get_regression",
    "is_regression",
    "list_regressions",
    "refresh_output_shifts",
    "refresh_regressions",
]


# The steps stored whose first run is among those read: the ones a judgement can meet,
# however many steps the pair's whole history holds.
_STORED_STEPS = select(Regression).where(
    Regression.first_run_id.in_(bindparam("run_ids", expanding=True))
)
# A stored step that is a regression: slower (a knee: fewer streams), or any output shift
# (outputs have no better direction; one whose top tokens all agree has change 0).
REGRESSED = or_(Regression.change < 0, Regression.metric == OUTPUTS_METRIC)

_Stored = dict[tuple[int, int], dict[StepCell, dict[uuid.UUID, Regression]]]


class _Detect(Protocol):
    """A detector bound to its series: the steps from its `judge_from`th run on."""

    def __call__(self, *, judge_from: int, known_steps: list[int]) -> Sequence[Step]: ...


class _Timed(Protocol):
    @property
    def run_id(self) -> uuid.UUID: ...
    @property
    def started_at(self) -> datetime: ...


def is_regression(row: Regression) -> bool:
    """REGRESSED, of a row."""
    return row.change < 0 or row.metric == OUTPUTS_METRIC


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
    stored = _stored_steps(session, histories)
    regressed: set[tuple[int, int]] = set()
    for (node_id, model_id), first_new in since.items():
        for (pp, tg, b, metric), runs in _judged(histories.get((node_id, model_id), {})):
            detect = find_knee_shifts if metric == KNEE_METRIC else find_steps
            # Steps are judged with `window` runs after them: judged again while those come.
            if _refresh_series(
                session,
                stored[(node_id, model_id)][(pp, tg, b, metric)],
                runs,
                functools.partial(detect, runs, settings),
                first_new=first_new,
                back=settings.window - 1,
                key={"node_id": node_id, "model_id": model_id, "pp": pp, "tg": tg, "b": b},
                metric=metric,
            ):
                regressed.add((node_id, model_id))
    session.flush()
    return regressed


def refresh_output_shifts(
    session: Session,
    since: Mapping[tuple[int, int], datetime],
    outputs: Mapping[tuple[int, int], OutputSeries],
    *,
    min_kl: float,
) -> set[tuple[int, int]]:
    """What refresh_regressions does, for each (node, model)'s outputs series (one per
    runner, regressions.output_shifts, judged with `min_kl`), stored with metric
    OUTPUTS_METRIC at PP, TG and B 0. A shift is judged from its own run and those before
    it: new runs judge only themselves. Returns the pairs a shift is stored for."""
    stored = _stored_steps(session, outputs)
    regressed: set[tuple[int, int]] = set()
    for (node_id, model_id), first_new in since.items():
        rows = stored[(node_id, model_id)][(0, 0, 0, OUTPUTS_METRIC)]
        for runs in outputs.get((node_id, model_id), {}).values():
            if _refresh_series(
                session,
                rows,
                runs,
                functools.partial(find_output_shifts, runs, min_kl=min_kl),
                first_new=first_new,
                back=0,
                key={"node_id": node_id, "model_id": model_id, "pp": 0, "tg": 0, "b": 0},
                metric=OUTPUTS_METRIC,
            ):
                regressed.add((node_id, model_id))
    session.flush()
    return regressed


def _stored_steps(
    session: Session, series: Mapping[tuple[int, int], Mapping[Any, Sequence[_Timed]]]
) -> _Stored:
    """The steps stored whose first run is among the series' runs, by pair and cell: one
    query."""
    run_ids = sorted(
        {run.run_id for cells in series.values() for runs in cells.values() for run in runs}
    )
    stored: _Stored = defaultdict(lambda: defaultdict(dict))
    for row in session.scalars(_STORED_STEPS, {"run_ids": run_ids}) if run_ids else ():
        cell = (row.pp, row.tg, row.b, cast(StepMetric, row.metric))
        stored[(row.node_id, row.model_id)][cell][row.first_run_id] = row
    return stored


def _refresh_series(
    session: Session,
    rows: Mapping[uuid.UUID, Regression],
    runs: Sequence[_Timed],
    detect: _Detect,
    *,
    first_new: datetime,
    back: int,
    key: dict[str, int],
    metric: StepMetric,
) -> bool:
    """Judges one series again from `back` runs before its first new one (started at
    `first_new` or later) on, with the steps stored before that fixed, stores what `detect`
    finds and drops what it no longer does (unless acknowledged); `rows` are the steps
    stored in the series' cell (another runner's outputs series shares it: their runs are
    never this one's). Whether a regression is stored."""
    index = {r.run_id: i for i, r in enumerate(runs)}
    positions = [i for i, r in enumerate(runs) if r.started_at >= first_new]
    if not positions:
        return False  # no new run has a value in this series (the points failed)
    # Past MOST_JUDGED new runs the oldest read are history, never judged again.
    judge_from = max(1, min(positions) - back, len(runs) - MOST_JUDGED)
    known_steps = [index[k] for k in rows if k in index and index[k] < judge_from]
    found = {
        step.first.run_id: step for step in detect(judge_from=judge_from, known_steps=known_steps)
    }
    for first_run_id, row in rows.items():
        judged = index.get(first_run_id, -1) >= judge_from
        if judged and first_run_id not in found and row.acknowledged_at is None:
            session.delete(row)
    for first_run_id, step in found.items():
        _store_step(session, rows.get(first_run_id), step, **key, metric=metric)
    return any(step.is_regression for step in found.values())


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
    row.cause = step.describe()
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
    if min_change is not None:  # an output shift has no size on that scale: always listed
        conditions.append(
            or_(func.abs(Regression.change) >= min_change, Regression.metric == OUTPUTS_METRIC)
        )
    if not include_improvements:
        conditions.append(REGRESSED)
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
