"""`fleetbench-registry rebuild`: projections made again from the runs alone, a few nodes
per short write transaction, so that it can run while the registry serves (as the prune
does). Each batch first holds its nodes' activity rows as ingest takes them, in node
order (registry.projections.activity.hold_nodes): a batch of those nodes' runs waits for
the rebuild before it touches their projections, and the rebuild for one under way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import Node
from fleetbench.registry.projections.activity import hold_nodes
from fleetbench.registry.projections.base import Projection

__all__ = ["Rebuilt", "rebuild"]


@dataclass
class Rebuilt:
    nodes: int = 0
    total: int = 0  # nodes in all


def rebuild(
    sessions: sessionmaker[Session],
    projections: Sequence[Projection],
    *,
    batch: int = 50,
    progress: Callable[[Rebuilt], None] | None = None,
) -> Rebuilt:
    """Rebuilds the projections' rows of every node, `batch` nodes per transaction,
    telling `progress` after each."""
    with sessions() as session:
        node_ids = list(session.scalars(select(Node.id).order_by(Node.id)))
    rebuilt = Rebuilt(total=len(node_ids))
    for start in range(0, len(node_ids), batch):
        chunk = node_ids[start : start + batch]
        with sessions() as session, write_transaction(session):
            connection = session.connection()
            with hold_nodes(connection, chunk):
                for projection in projections:
                    if projection.rebuild is not None:
                        projection.rebuild(connection, chunk)
            session.commit()
        rebuilt.nodes += len(chunk)
        if progress is not None:
            progress(rebuilt)
    return rebuilt
