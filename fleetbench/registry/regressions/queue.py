"""The queue of series checks (table series_checks): ingest queues each (node, model, kind)
it stored successful runs of, in the runs' own transaction; a judge claims the checks that
are due under a lease, judges them, and finishes them.

A check is due `delay` after the first of its runs arrived, however many arrive after: a
node flushing a spool of a hundred runs, or ten requests of one node in flight together, is
judged once. Claims are leases (`claimed_until`), so two registry processes never judge one
series at once, and a process that dies mid-judgement leaves its checks to the others once
the lease ends. A claim takes the check's runs (`since` moves to `claimed_since`): runs
queued while it is judged start `since` afresh, and the check stays for another judgement
`delay` after the one that missed them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection, and_, delete, func, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from fleetbench.registry.models import SeriesCheck, table_of

__all__ = ["Check", "CheckKind", "claim_due", "finish", "next_due", "queue_checks"]

CheckKind = Literal["offline", "serving"]


@dataclass(frozen=True)
class Check:
    """A node's model's series of a kind has runs to judge, those started at `since` or
    later: what ingest queues, and what a judge claims."""

    node_id: int
    model_id: int
    kind: CheckKind
    since: datetime

    @property
    def pair(self) -> tuple[int, int]:
        return (self.node_id, self.model_id)


@functools.cache
def _queue_statement(dialect: str) -> Any:
    """The upsert of checks, built once per dialect: a check already queued keeps its
    `queued_at` (it is due when its first run has waited `delay`) and starts at the earlier
    of the two `since` (the new one if a judge took the check's runs: PostgreSQL's least()
    passes over a NULL, SQLite's min() gives NULL)."""
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    earliest = func.least if dialect == "postgresql" else func.min
    checks = table_of(SeriesCheck)
    upsert = insert_for(checks)
    new = upsert.excluded.since
    return upsert.on_conflict_do_update(
        index_elements=[checks.c.node_id, checks.c.model_id, checks.c.kind],
        set_={"since": func.coalesce(earliest(checks.c.since, new), new)},
    )


def queue_checks(connection: Connection, checks: Sequence[Check], *, now: datetime) -> None:
    """Queues the checks (one per node, model and kind), in the caller's transaction; in
    key order, as ingest locks its other rows, so concurrent batches never deadlock."""
    if not checks:
        return
    rows = [
        {
            "node_id": c.node_id,
            "model_id": c.model_id,
            "kind": c.kind,
            "since": c.since,
            "queued_at": now,
        }
        for c in sorted(checks, key=lambda c: (c.node_id, c.model_id, c.kind))
    ]
    connection.execute(_queue_statement(connection.dialect.name), rows)


_KEYS = (SeriesCheck.node_id, SeriesCheck.model_id, SeriesCheck.kind)


def _free(now: datetime) -> Any:
    return or_(SeriesCheck.claimed_until.is_(None), SeriesCheck.claimed_until < now)


def claim_due(
    session: Session, *, now: datetime, delay: timedelta, until: datetime, limit: int
) -> list[Check]:
    """Up to `limit` due checks, oldest first, leased to the caller `until` then with their
    runs (in the session's write transaction; the caller commits). A check whose lease
    ended without a judgement brings that judgement's runs too. Checks another process
    holds are skipped, not waited for (PostgreSQL's SKIP LOCKED; SQLite has one writer)."""
    rows = session.execute(
        select(*_KEYS, SeriesCheck.since, SeriesCheck.claimed_since)
        .where(SeriesCheck.queued_at <= now - delay, _free(now))
        .order_by(SeriesCheck.queued_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    checks = [
        Check(
            row.node_id,
            row.model_id,
            row.kind,
            min(s for s in (row.since, row.claimed_since) if s is not None),
        )
        for row in rows
    ]
    if checks:  # by primary key, one executemany
        session.execute(
            update(SeriesCheck),
            [
                {
                    "node_id": c.node_id,
                    "model_id": c.model_id,
                    "kind": c.kind,
                    "claimed_until": until,
                    "claimed_since": c.since,
                    "since": None,
                }
                for c in checks
            ],
        )
    return checks


def finish(session: Session, checks: Sequence[Check], *, until: datetime, now: datetime) -> None:
    """Deletes the judged checks that nothing was queued for meanwhile; the others are
    freed, due again `delay` from `now` (in the session's write transaction). Only checks
    still under the caller's lease (`until`, as claimed) are touched: one whose lease ended
    and that another judge took is that judge's. The rows are locked in key order first,
    as ingest locks them, so a finish and a batch of reports never deadlock."""
    if not checks:
        return
    claimed = and_(
        tuple_(*_KEYS).in_([(c.node_id, c.model_id, c.kind) for c in checks]),
        SeriesCheck.claimed_until == until,
    )
    session.execute(select(*_KEYS).where(claimed).order_by(*_KEYS).with_for_update())
    session.execute(delete(SeriesCheck).where(claimed, SeriesCheck.since.is_(None)))
    session.execute(
        update(SeriesCheck)
        .where(claimed)
        .values(claimed_until=None, claimed_since=None, queued_at=now)
    )


def next_due(session: Session, *, now: datetime, delay: timedelta) -> datetime | None:
    """When the next check no process holds falls due (None: none is queued)."""
    queued = session.scalar(select(func.min(SeriesCheck.queued_at)).where(_free(now)))
    return queued + delay if queued is not None else None
