"""Old runs: every run is kept for a retention period, then only the newest successful run
of each node, model, kind (offline or serving) and engine build (the history a regression
or an upgrade is judged against), the runs regressions name and the runs the projections
point at (registry.projections: each node's latest curves, latest serving runs and its
newest run); each projection takes the runs deleted out of it in the same transaction. Applied by
`fleetbench-registry prune` in small batches, each its own short write transaction, so that
it can run while the registry serves: ingest waits at most one batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, delete, exists, func, or_, select
from sqlalchemy.orm import Session, aliased, sessionmaker

from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import (
    FailedPoint,
    Regression,
    Run,
    RunPoint,
    ServingPointRow,
    newer_run,
)
from fleetbench.registry.projections import PROJECTIONS
from fleetbench.registry.projections.activity import lock_nodes

__all__ = ["Pruned", "prunable_runs", "prune_runs"]


@dataclass
class Pruned:
    runs: int = 0
    points: int = 0


def prunable_runs(cutoff: datetime, limit: int | None = None) -> Select[uuid.UUID]:
    """Ids of runs started before `cutoff` that retention lets go (at most `limit`)."""
    newer = aliased(Run)
    newer_success_same_build = exists().where(
        newer.node_id == Run.node_id,
        newer.model_id == Run.model_id,
        newer.build_id == Run.build_id,
        newer.kind == Run.kind,
        newer.status != "failed",
        newer.contention_reason.is_(None),  # a contended run stands for no build
        newer_run(
            (newer.started_at, newer.received_at, newer.id),
            (Run.started_at, Run.received_at, Run.id),
        ),
    )
    statement = select(Run.id).where(
        Run.started_at < cutoff,
        *(~projection.keeps() for projection in PROJECTIONS if projection.keeps is not None),
        ~exists().where(or_(Regression.before_run_id == Run.id, Regression.first_run_id == Run.id)),
        or_(Run.status == "failed", newer_success_same_build),
    )
    return statement if limit is None else statement.limit(limit)


def prune_runs(
    sessions: sessionmaker[Session],
    *,
    cutoff: datetime,
    batch: int = 500,
    dry_run: bool = False,
    progress: Callable[[Pruned], None] | None = None,
) -> Pruned:
    """Deletes what retention lets go of the runs started before `cutoff` (their points
    and failed points with them), `batch` runs per transaction, telling `progress` after
    each; with `dry_run`, counts them instead."""
    if dry_run:
        with sessions() as session:
            candidates = prunable_runs(cutoff).subquery()
            runs = session.scalar(select(func.count()).select_from(candidates))
            points = session.scalar(
                select(func.count())
                .select_from(RunPoint)
                .where(RunPoint.run_id.in_(select(candidates.c.id)))
            )
        return Pruned(runs=runs or 0, points=points or 0)
    pruned = Pruned()
    while True:
        with sessions() as session, write_transaction(session):
            ids = list(session.scalars(prunable_runs(cutoff, batch)))
            if not ids:
                return pruned
            # The nodes' activity rows first, in ingest's order (by node): an ingest of
            # them waits for this batch before it reads its history, and this batch for
            # one already under way. Then asked again, under those locks: an ingest that
            # committed meanwhile may have named a candidate in a regression.
            connection = session.connection()
            lock_nodes(connection, select(Run.node_id).where(Run.id.in_(ids)).distinct())
            ids = list(session.scalars(prunable_runs(cutoff).where(Run.id.in_(ids))))
            if not ids:
                continue
            points = session.scalar(
                select(func.count()).select_from(RunPoint).where(RunPoint.run_id.in_(ids))
            )
            for projection in PROJECTIONS:  # while the runs' rows remain
                projection.remove(connection, ids)
            # Points first: the foreign keys would cascade, but deleting them directly is
            # one statement instead of a trigger per run.
            session.execute(delete(RunPoint).where(RunPoint.run_id.in_(ids)))
            session.execute(delete(FailedPoint).where(FailedPoint.run_id.in_(ids)))
            session.execute(delete(ServingPointRow).where(ServingPointRow.run_id.in_(ids)))
            session.execute(delete(Run).where(Run.id.in_(ids)))
            session.commit()
        pruned.runs += len(ids)
        pruned.points += points or 0
        if progress is not None:
            progress(pruned)
