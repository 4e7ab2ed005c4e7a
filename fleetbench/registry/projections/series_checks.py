"""The regression judge's queue (table series_checks, registry.regressions.queue): each
(node, model, kind) series with runs not judged yet. What the judge writes from it (each
latest point's detectable change, the regressions) is made from the series alone, so a
rebuild queues every series from its first run and the judges make those again."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection, and_, delete, func, or_, select

from fleetbench.registry.models import RUN_SERVED, RUN_SUCCESSFUL, Run, SeriesCheck, table_of
from fleetbench.registry.projections.base import Projection, StoredRun, no_removal
from fleetbench.registry.regressions.queue import Check, CheckKind, queue_checks

__all__ = ["SERIES_CHECKS"]


def _add(connection: Connection, runs: Sequence[StoredRun]) -> int:
    """The series the runs that count join, each from its earliest run's start."""
    since: dict[tuple[int, int, CheckKind], datetime] = {}
    for run in runs:
        kind: CheckKind
        if run.in_series:
            kind = "offline"
        elif run.served and run.server is not None:
            kind = "serving"
        else:
            continue
        key = (run.node_id, run.model_id, kind)
        since[key] = min(since.get(key, run.started_at), run.started_at)
    checks = [Check(*key, started) for key, started in since.items()]
    queue_checks(connection, checks, now=datetime.now(UTC))
    return len(checks)


def _rebuild(connection: Connection, node_ids: Sequence[int]) -> None:
    connection.execute(delete(SeriesCheck).where(SeriesCheck.node_id.in_(node_ids)))
    series = connection.execute(
        select(Run.node_id, Run.model_id, Run.kind, func.min(Run.started_at))
        .where(
            Run.node_id.in_(node_ids),
            or_(RUN_SUCCESSFUL, and_(RUN_SERVED, Run.server.is_not(None))),
        )
        .group_by(Run.node_id, Run.model_id, Run.kind)
    ).all()
    queue_checks(
        connection,
        [
            Check(node_id, model_id, "serving" if kind == "serving" else "offline", since)
            for node_id, model_id, kind, since in series
        ],
        now=datetime.now(UTC),
    )


# A pruned run leaves the queue as it is: a check names a series, not its runs, and the
# judge reads the runs there are when it comes to it.
SERIES_CHECKS = Projection(
    name="queue",
    tables=(table_of(SeriesCheck),),
    add=_add,
    keeps=None,
    remove=no_removal,
    rebuild=_rebuild,
)
