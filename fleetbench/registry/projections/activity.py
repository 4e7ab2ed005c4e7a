"""Each node's newest offline run and how many runs it has (table node_activity): what the
fleet overview reads per node, so that listing nodes never searches or counts their runs.

Ingest takes each node's row here first in a batch (in node order): the prune and a
rebuild lock the same rows before they touch a node's other projections, so neither ever
interleaves with a batch of that node's runs."""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from fleetbench.registry.models import (
    Node,
    NodeActivity,
    Run,
    newer_run,
    table_of,
)
from fleetbench.registry.projections.base import (
    Projection,
    StoredRun,
    newest_by,
    newest_of_each,
)

__all__ = ["ACTIVITY", "hold_nodes", "lock_nodes"]

_ACTIVITY = table_of(NodeActivity)


@functools.cache
def _upsert(dialect: str) -> Any:
    """Every run counts; the newest (as RUN_NEWEST_FIRST orders runs) is the node's last."""
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    count_runs = insert_for(_ACTIVITY)
    run = count_runs.excluded
    newer = or_(
        _ACTIVITY.c.last_run_id.is_(None),
        newer_run(
            (run.last_run_started_at, run.last_run_received_at, run.last_run_id),
            (
                _ACTIVITY.c.last_run_started_at,
                _ACTIVITY.c.last_run_received_at,
                _ACTIVITY.c.last_run_id,
            ),
        ),
    )
    return count_runs.on_conflict_do_update(
        index_elements=[_ACTIVITY.c.node_id],
        set_={
            "run_count": _ACTIVITY.c.run_count + run.run_count,
            **{
                column: case((newer, run[column]), else_=_ACTIVITY.c[column])
                for column in ("last_run_id", "last_run_started_at", "last_run_received_at")
            },
        },
    )


def lock_nodes(connection: Connection, node_ids: Select[int]) -> None:
    """Locks the nodes' rows, in ingest's order (by node), until the transaction ends: a
    batch of their runs then waits before it touches their projections, and this waits for
    one already under way (PostgreSQL; SQLite has one writer at a time anyway)."""
    connection.execute(
        select(NodeActivity.node_id)
        .where(NodeActivity.node_id.in_(node_ids))
        .order_by(NodeActivity.node_id)
        .with_for_update()
    ).all()


@contextmanager
def hold_nodes(connection: Connection, node_ids: Sequence[int]) -> Iterator[None]:
    """Holds the nodes' rows until the transaction ends, those of nodes with no runs yet
    too: a row (no runs, no last run) is made for each that has none, in node order, so
    that a node's first batch of runs waits as its later ones do; those still without runs
    are let go of when the block ends."""
    if connection.dialect.name == "postgresql":
        placeholder = postgresql.insert(_ACTIVITY).from_select(
            ["node_id", "run_count"],
            select(Node.id, literal(0)).where(Node.id.in_(node_ids)).order_by(Node.id),
        )
        connection.execute(placeholder.on_conflict_do_nothing())
    lock_nodes(connection, select(Node.id).where(Node.id.in_(node_ids)))
    yield
    _forget_idle(connection, node_ids)


def _forget_idle(connection: Connection, node_ids: Sequence[int]) -> None:
    """No row for a node without runs, as a rebuild makes none."""
    connection.execute(
        delete(NodeActivity).where(
            NodeActivity.node_id.in_(node_ids),
            NodeActivity.run_count == 0,
            NodeActivity.last_run_id.is_(None),
        )
    )


def _add(connection: Connection, runs: Sequence[StoredRun]) -> int:
    """Each node's run count and newest run: one upsert, one row per node."""
    counts = Counter(run.node_id for run in runs)
    if not counts:
        return 0
    # A node's last run is its newest offline one: what its health and overview show (a
    # serving sweep of a server that is down says nothing of the node's engine).
    newest = newest_by([r for r in runs if r.kind == "offline"], lambda run: run.node_id)
    rows = []
    for node_id in sorted(counts):
        run = newest.get(node_id)
        rows.append(
            {
                "node_id": node_id,
                "last_run_id": run.id if run else None,
                "last_run_started_at": run.started_at if run else None,
                "last_run_received_at": run.received_at if run else None,
                "run_count": counts[node_id],
            }
        )
    connection.execute(_upsert(connection.dialect.name), rows)
    return len(rows)


def _keeps() -> ColumnElement[bool]:
    return select(NodeActivity.node_id).where(NodeActivity.last_run_id == Run.id).exists()


def _remove(connection: Connection, run_ids: Sequence[uuid.UUID]) -> None:
    """The counts of the nodes whose runs go (their last runs are kept: _keeps); a node
    left with none has no row."""
    per_node = connection.execute(
        select(Run.node_id, func.count()).where(Run.id.in_(run_ids)).group_by(Run.node_id)
    ).all()
    for node_id, deleted in per_node:
        connection.execute(
            update(NodeActivity)
            .where(NodeActivity.node_id == node_id)
            .values(run_count=NodeActivity.run_count - deleted)
        )
    _forget_idle(connection, [node_id for node_id, _ in per_node])


def _rebuild(connection: Connection, node_ids: Sequence[int]) -> None:
    connection.execute(delete(NodeActivity).where(NodeActivity.node_id.in_(node_ids)))
    counts = connection.execute(
        select(Run.node_id, func.count()).where(Run.node_id.in_(node_ids)).group_by(Run.node_id)
    ).all()
    newest = newest_of_each(connection, node_ids, Run.kind == "offline", per=(Run.node_id,))
    last = {
        row.node_id: row
        for row in connection.execute(
            select(Run.node_id, Run.id, Run.started_at, Run.received_at).where(Run.id.in_(newest))
        )
    }
    rows = [
        {
            "node_id": node_id,
            "last_run_id": last[node_id].id if node_id in last else None,
            "last_run_started_at": last[node_id].started_at if node_id in last else None,
            "last_run_received_at": last[node_id].received_at if node_id in last else None,
            "run_count": run_count,
        }
        for node_id, run_count in sorted(counts)
    ]
    if rows:
        connection.execute(insert(NodeActivity), rows)


ACTIVITY = Projection(
    name="activity",
    tables=(_ACTIVITY,),
    add=_add,
    keeps=_keeps,
    remove=_remove,
    rebuild=_rebuild,
)
