"""The regression judge's queue (table series_checks, registry.regressions.queue): each
(node, model, kind) series with runs not judged yet, queued in the runs' transaction.

It holds work to do, not state: once the judges catch up it is empty, whatever the runs.
So it has no rebuild (queueing every series again would judge each fleet-wide from its
first run, and let go of unacknowledged regressions a shorter history no longer shows).
A pruned run leaves it as it is: a check names a series, not its runs, and the judge reads
the runs there are when it comes to it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection

from fleetbench.registry.models import SeriesCheck, table_of
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
        elif run.served:
            kind = "serving"
        else:
            continue
        key = (run.node_id, run.model_id, kind)
        since[key] = min(since.get(key, run.started_at), run.started_at)
    checks = [Check(*key, started) for key, started in since.items()]
    queue_checks(connection, checks, now=datetime.now(UTC))
    return len(checks)


SERIES_CHECKS = Projection(
    name="queue",
    tables=(table_of(SeriesCheck),),
    add=_add,
    keeps=None,
    remove=no_removal,
    rebuild=None,
)
