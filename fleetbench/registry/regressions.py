"""The regression check a batch's new runs get, in the batch's transaction: each series they
have a value in is read (from registry.series_cache where it is still valid, else from the
database), judged again by questions.regressions' detector, and what it finds stored
(registry.regression_store). Ingest calls it with the runs it stored; nothing here knows
how they were stored. Serving runs are checked the same way, over their own series (what a
server delivered at each concurrency; the server's build is the known change)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, update
from sqlalchemy.orm import Session

from fleetbench.registry.models import LatestPoint
from fleetbench.registry.questions.regressions import SeriesRun, min_detectable_change
from fleetbench.registry.regression_store import NewRuns, refresh_regressions
from fleetbench.registry.series import (
    Cell,
    RecentRun,
    RecentSeries,
    Values,
    series_of_pairs,
    serving_series,
)
from fleetbench.registry.series_cache import SeriesCache

__all__ = ["Checked", "NewRun", "NewServingRun", "check_new_runs", "check_new_serving_runs"]


@dataclass(frozen=True)
class NewRun:
    """A successful run just stored, as its series hold it."""

    run_id: uuid.UUID
    node_id: int
    model_id: int
    cells: frozenset[tuple[int, int]]  # the (PP, TG) it measured
    # It as its series hold it: made only to add it to a remembered series.
    as_series_run: Callable[[], tuple[RecentRun, Values]]


@dataclass(frozen=True)
class Checked:
    regressed: set[tuple[int, int]]  # the (node, model) pairs a regression is stored for
    series: dict[tuple[int, int], RecentSeries]  # each pair's series now, for the cache


def check_new_runs(
    session: Session,
    runs: Sequence[NewRun],
    *,
    node_changes_before: Mapping[int, int],
    series_cache: SeriesCache | None,
) -> Checked:
    """Checks the series of `runs` (`node_changes_before`: each node's NodeActivity.changes
    before the batch, which says whether a remembered series is still valid)."""
    new_runs: dict[tuple[int, int], NewRuns] = {}
    for run in runs:
        pair = new_runs.setdefault((run.node_id, run.model_id), NewRuns())
        pair.run_ids.append(run.run_id)
        pair.cells.update(run.cells)
    series = _recent_series(session, runs, new_runs, node_changes_before, series_cache)
    histories = {pair: recent.as_lists() for pair, recent in series.items()}
    regressed = refresh_regressions(session, new_runs, histories)
    _record_detectable_changes(session, histories)
    return Checked(regressed, series)


def _record_detectable_changes(
    session: Session, histories: Mapping[tuple[int, int], Mapping[Cell, Sequence[SeriesRun]]]
) -> None:
    """Each latest point's minimum detectable change, from its S_TG series as it stands
    with the batch's runs: what placement says of a candidate's series. One statement."""
    rows = [
        {"node": node_id, "model": model_id, "at_pp": pp, "at_tg": tg, "at_b": b, "change": change}
        for (node_id, model_id), cells in histories.items()
        for (pp, tg, b, metric), runs in cells.items()
        if metric == "s_tg" and (change := min_detectable_change(runs)) is not None
    ]
    if rows:
        session.connection().execute(_SET_DETECTABLE, rows)


_SET_DETECTABLE = (
    update(LatestPoint)
    .where(
        LatestPoint.node_id == bindparam("node"),
        LatestPoint.model_id == bindparam("model"),
        LatestPoint.pp == bindparam("at_pp"),
        LatestPoint.tg == bindparam("at_tg"),
        LatestPoint.b == bindparam("at_b"),
    )
    .values(min_detectable_change=bindparam("change"))
)


def _recent_series(
    session: Session,
    runs: Sequence[NewRun],
    new_runs: Mapping[tuple[int, int], NewRuns],
    node_changes_before: Mapping[int, int],
    series_cache: SeriesCache | None,
) -> dict[tuple[int, int], RecentSeries]:
    """Each pair's series with the batch's runs in: the remembered ones with the new runs
    added where they are still valid, else read from the database (where the new runs are,
    in this transaction)."""
    found: dict[tuple[int, int], RecentSeries] = {}
    for (node_id, model_id), pair in new_runs.items():
        if series_cache is None:
            break
        remembered = series_cache.get(
            node_id,
            model_id,
            changes=node_changes_before[node_id],
            cells=frozenset(pair.cells),
        )
        if remembered is None:
            continue
        mine = [r.as_series_run() for r in runs if (r.node_id, r.model_id) == (node_id, model_id)]
        found[(node_id, model_id)] = remembered.with_runs(mine)
    missing = {pair: runs_.cells for pair, runs_ in new_runs.items() if pair not in found}
    if missing:
        found.update(series_of_pairs(session, missing))
    return found


@dataclass(frozen=True)
class NewServingRun:
    """A successful serving run just stored."""

    run_id: uuid.UUID
    node_id: int
    model_id: int
    cell: tuple[int, int]  # its prompt and output lengths


def check_new_serving_runs(session: Session, runs: Sequence[NewServingRun]) -> set[tuple[int, int]]:
    """Checks the serving series of `runs`, read from the database (a node's serving runs
    are few beside its offline points: no cache); returns the (node, model) pairs a
    regression is stored for."""
    new_runs: dict[tuple[int, int], NewRuns] = {}
    for run in runs:
        pair = new_runs.setdefault((run.node_id, run.model_id), NewRuns())
        pair.run_ids.append(run.run_id)
        pair.cells.add(run.cell)
    histories = {
        (node_id, model_id): {
            cell: history
            for cell, history in serving_series(
                session, node_id=node_id, model_ids=[model_id]
            ).items()
            if cell[:2] in pair.cells
        }
        for (node_id, model_id), pair in new_runs.items()
    }
    return refresh_regressions(session, new_runs, histories)
