"""What a projection of the runs is: a table (or two) derived from the runs alone, kept in
step with them in the transactions that store and prune runs, and rebuilt from them on
demand. Each says, in one place, how a stored run adds to it (`add`), which runs it points
at and so keeps from the prune (`keeps`), how a pruned run leaves it (`remove`), and how
its rows of some nodes are made again from their runs (`rebuild`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, SQLColumnExpression, Table, func, select

from fleetbench.contract import wire
from fleetbench.contract.allocation import beside_kv_bytes
from fleetbench.registry.models import (
    RUN_NEWEST_FIRST,
    HardwareFingerprint,
    Run,
    RunPoint,
    table_of,
)

__all__ = [
    "CurvePoint",
    "Projection",
    "StoredRun",
    "newest_by",
    "newest_of_each",
    "no_removal",
    "stored_runs",
]


@dataclass(frozen=True)
class CurvePoint:
    """What the projections keep of a batched-bench point."""

    pp: int
    tg: int
    b: int
    s_pp: float | None
    s_tg: float | None
    mbu: float | None = None  # its memory-bandwidth utilisation (contract.bandwidth)
    impossible: bool = False  # above its node's bandwidth: no curve takes it
    joules: float | None = None  # what it cost in energy (contract.energy), where counted


@dataclass(frozen=True)
class StoredRun:
    """A run as the projections read it: one ingest has just stored, or one a rebuild read
    back from table runs."""

    id: uuid.UUID
    node_id: int
    model_id: int
    build_id: int
    facts_id: int | None
    kind: str  # offline or serving
    failed: bool
    contended: bool  # measured while other processes used the node (wire.Contention)
    started_at: datetime
    received_at: datetime
    settings: wire.RunSettings
    points: Sequence[CurvePoint]
    server: wire.ServerIdentity | None
    engine_on_accelerator: bool | None
    beside_kv_bytes: int | None  # weights, compute and outputs, as allocated
    memory_bytes: int | None  # its fingerprint's

    @property
    def in_series(self) -> bool:
        """Whether it joins its node's offline curves (models.RUN_SUCCESSFUL)."""
        return self.kind == "offline" and not self.failed and not self.contended

    @property
    def concurrency_points(self) -> Sequence[CurvePoint]:
        """The points that measured B users at once: all of them, but for a table made with
        `-tgs` (tg_separate: each sequence decoded alone, one after another), which measured
        one user at a time: its B = 1 points alone. A point above its node's bandwidth
        (contract.bandwidth), which cannot be true, is left out too. The others stay in the
        run."""
        possible = [p for p in self.points if not p.impossible]
        if self.settings.tg_separate:
            return [p for p in possible if p.b == 1]
        return possible

    @property
    def served(self) -> bool:
        """Whether it measured a server that answered (models.RUN_SERVED)."""
        return self.kind == "serving" and not self.failed and not self.contended

    @property
    def order_key(self) -> tuple[datetime, datetime, int]:
        """Where it sorts oldest first (models.RUN_NEWEST_FIRST reversed): its start, its
        receipt, then the larger id first."""
        return (self.started_at, self.received_at, -self.id.int)


Key = TypeVar("Key", bound=Hashable)


def newest_by(runs: Sequence[StoredRun], key: Callable[[StoredRun], Key]) -> dict[Key, StoredRun]:
    """The newest run (RUN_NEWEST_FIRST's first) of each key."""
    newest: dict[Key, StoredRun] = {}
    for run in runs:
        k = key(run)
        if k not in newest or run.order_key > newest[k].order_key:
            newest[k] = run
    return newest


@dataclass(frozen=True)
class Projection:
    """One derived state, and the four things every writer of the runs asks of it. Each
    function runs in its caller's write transaction: ingest's, the prune's, a rebuild's."""

    name: str
    tables: tuple[Table, ...]
    # what a batch of runs just stored brings (returns the rows it counts, for its cost)
    add: Callable[[Connection, Sequence[StoredRun]], int]
    # the runs its rows point at, which the prune keeps (None: it points at none)
    keeps: Callable[[], ColumnElement[bool]] | None
    # runs about to be deleted taken out (before their rows go)
    remove: Callable[[Connection, Sequence[uuid.UUID]], None]
    # its rows of these nodes made again from their runs alone (None: it holds work to
    # do, not state, and a rebuild has nothing to make)
    rebuild: Callable[[Connection, Sequence[int]], None] | None


def no_removal(connection: Connection, run_ids: Sequence[uuid.UUID]) -> None:
    """For a projection whose rows no prunable run changes (it keeps the runs it names)."""


# StoredRun's fields that table runs keeps under their names
_AS_STORED = (
    "id",
    "node_id",
    "model_id",
    "build_id",
    "facts_id",
    "kind",
    "started_at",
    "received_at",
    "engine_on_accelerator",
)


def stored_runs(connection: Connection, run_ids: Collection[uuid.UUID]) -> list[StoredRun]:
    """The runs as ingest gave them to the projections, read back from the runs table."""
    if not run_ids:
        return []
    points: dict[uuid.UUID, list[CurvePoint]] = {}
    for row in connection.execute(
        select(
            RunPoint.run_id,
            RunPoint.pp,
            RunPoint.tg,
            RunPoint.b,
            RunPoint.s_pp,
            RunPoint.s_tg,
            RunPoint.mbu,
            RunPoint.impossible,
            RunPoint.energy,
        )
        .where(RunPoint.run_id.in_(list(run_ids)))
        .order_by(RunPoint.id)
    ):
        points.setdefault(row.run_id, []).append(
            CurvePoint(
                row.pp,
                row.tg,
                row.b,
                row.s_pp,
                row.s_tg,
                row.mbu,
                row.impossible is not None,
                row.energy.get("joules") if row.energy else None,
            )
        )
    rows = connection.execute(
        select(*table_of(Run).columns, HardwareFingerprint.memory_bytes)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .where(Run.id.in_(list(run_ids)))
    ).all()
    return [
        StoredRun(
            **{name: getattr(run, name) for name in _AS_STORED},
            failed=run.status == "failed",
            contended=run.contention_reason is not None,
            settings=wire.RunSettings.model_construct(
                **{name: getattr(run, name) for name in wire.RunSettings.model_fields}
            ),
            points=points.get(run.id, []),
            # as stored, not validated again: a later contract may be stricter than the one
            # the run was stored under
            server=wire.ServerIdentity.model_construct(**run.server) if run.server else None,
            beside_kv_bytes=beside_kv_bytes(
                wire.AllocatedBuffer.model_construct(**b) for b in run.buffers or []
            ),
            memory_bytes=run.memory_bytes,
        )
        for run in rows
    ]


def newest_of_each(
    connection: Connection,
    node_ids: Sequence[int],
    *where: ColumnElement[bool],
    per: Sequence[SQLColumnExpression[Any]] = (Run.node_id, Run.model_id),
) -> list[uuid.UUID]:
    """The ids of the newest run (RUN_NEWEST_FIRST's first) of each `per` (node and model)
    among those `where` selects, for these nodes."""
    rank = func.row_number().over(partition_by=per, order_by=RUN_NEWEST_FIRST).label("rank")
    ranked = select(Run.id, rank).where(Run.node_id.in_(node_ids), *where).subquery()
    return list(connection.scalars(select(ranked.c.id).where(ranked.c.rank == 1)))
