"""Storing one report: validated before any transaction starts, then one short write
transaction of plain inserts (no ORM unit of work), with the node's latest curve and the
regressions of its series brought up to date in it.

What an ingest costs was measured under load (bench/load.py; README, "Holding a fleet"): the
ORM objects of the regression refresh's history read and of the run's own flush took two
thirds of a core's time per report. Here the history is read as plain rows, the run and its
points are inserted with executemany, and the rows that never change once written (engine
builds) or only gain facts (models) are remembered per process, so most ingests look them up
not at all.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, and_, bindparam, case, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from agent import wire
from agent.wire import model_name_key
from registry.history import refresh_regressions
from registry.latest import record_latest
from registry.models import (
    EngineBuild,
    FailedPoint,
    HardwareFingerprint,
    LatestPoint,
    Model,
    NodeActivity,
    Run,
    RunPoint,
    table_of,
)
from registry.questions.hardware import summarize_hardware
from registry.writer import Batch, Writer

__all__ = [
    "MODEL_FACTS",
    "Ingest",
    "IngestLimits",
    "KnownRows",
    "ReportRefused",
    "RunConflict",
    "Stored",
    "build_identity",
    "ingest_report",
]

MODEL_FACTS = (
    "quantization",
    "n_params",
    "file_size",
    "n_layer",
    "n_head_kv",
    "head_dim_k",
    "head_dim_v",
    "n_ctx_train",
    "sliding_window",
    "n_swa_layers",
)


class RunConflict(Exception):
    """A run with this id exists and its report differs from the one sent now."""


class ReportRefused(Exception):
    """The report is valid but over a bound of the registry's (say which and how to raise
    it); answered 422."""


@dataclass(frozen=True)
class IngestLimits:
    max_points_per_report: int = 1024
    max_series_per_node: int = 1024


@dataclass(frozen=True)
class Stored:
    run_id: uuid.UUID
    created: bool
    regressed: bool = False  # a regression is stored for one of its series


@dataclass
class KnownRows:
    """Ids of rows by identity, per database, filled only from committed transactions:
    engine builds never change once written; models only gain facts (`facts`: those the
    row is known to hold). Several processes share a database: a model whose facts another
    process filled is updated once more, harmlessly (the update keeps what is there)."""

    builds: dict[str, int] = field(default_factory=dict)
    models: dict[str, tuple[int, frozenset[str]]] = field(default_factory=dict)

    def learn(self, other: KnownRows) -> None:
        self.builds.update(other.builds)
        self.models.update(other.models)


def _now() -> datetime:
    return datetime.now(UTC)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build_identity(fields: dict[str, Any]) -> str:
    """An engine build's identity: a digest of all its fields (NULLs included)."""
    return _sha256(json.dumps(fields, sort_keys=True))


class Ingest:
    """Stores reports through the writer (registry.writer): in batches, each batch one
    transaction, on one thread for SQLite and `writers` threads for PostgreSQL.

    ingest = Ingest(sessions, IngestLimits(), writers=4)
    stored = await ingest.submit(report, node_id=7)   # committed when it returns
    ingest.close()
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        limits: IngestLimits,
        *,
        writers: int = 1,
        batch: int = 32,
    ) -> None:
        self.limits = limits
        self._known = KnownRows()
        self._learning = threading.Lock()
        threads = 1 if sessions.kw["bind"].dialect.name == "sqlite" else writers
        self._writer: Writer[tuple[wire.RunReport, int], Stored] = Writer(
            sessions, self._write, threads=threads, batch=batch
        )

    async def submit(self, report: wire.RunReport, *, node_id: int) -> Stored:
        """Stores the report as a run of the node; raises RunConflict or ReportRefused."""
        check_size(report, self.limits)
        return await self._writer.submit((report, node_id))

    def close(self) -> None:
        self._writer.close()

    def _write(
        self, session: Session, items: Sequence[tuple[wire.RunReport, int]]
    ) -> Batch[Stored]:
        with self._learning:
            known = KnownRows(dict(self._known.builds), dict(self._known.models))
        learned = KnownRows()
        answers: list[Stored | Exception] = [RuntimeError("not stored")] * len(items)
        # By node: concurrent batches lock the nodes' rows in one order, never in a cycle.
        for index in sorted(range(len(items)), key=lambda i: items[i][1]):
            report, node_id = items[index]
            try:
                answers[index] = ingest_report(
                    session,
                    report=report,
                    node_id=node_id,
                    limits=self.limits,
                    known=known,
                    learned=learned,
                )
            except (RunConflict, ReportRefused) as refused:
                answers[index] = refused
            known.learn(learned)  # rows made earlier in this transaction are visible in it

        def remember() -> None:
            with self._learning:
                self._known.learn(learned)

        return Batch(answers, committed=remember)


def check_size(report: wire.RunReport, limits: IngestLimits) -> None:
    points = len(report.points) + len(report.failures)
    if points > limits.max_points_per_report:
        raise ReportRefused(
            f"the report holds {points} points (measured and failed), over this registry's "
            f"limit of {limits.max_points_per_report} (FLEETBENCH_MAX_POINTS_PER_REPORT)"
        )


@dataclass(frozen=True)
class _Statements:
    """Ingest's statements, built once per dialect: building SQLAlchemy statements costs
    more than executing them, and bound parameters keep their compiled form cached."""

    run_digest: Any
    insert_run: Any
    insert_points: Any
    insert_failures: Any
    build_by_identity: Any
    insert_build: Any
    model_by_identity: Any
    insert_model: Any
    model_facts: Any
    other_latest_points: Any
    fingerprint: Any
    activity: Any


@functools.cache
def _statements(dialect: str) -> _Statements:
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    # PostgreSQL's greatest() and least(); SQLite's max() and min() of several arguments
    latest, earliest = (
        (func.greatest, func.least) if dialect == "postgresql" else (func.max, func.min)
    )
    runs, builds, models = table_of(Run), table_of(EngineBuild), table_of(Model)
    fingerprints, latest_points = table_of(HardwareFingerprint), table_of(LatestPoint)
    upsert = insert_for(fingerprints)
    new = upsert.excluded
    activity = table_of(NodeActivity)
    count_run = insert_for(activity)
    run = count_run.excluded
    newer = or_(
        activity.c.last_run_id.is_(None),
        run.last_run_started_at > activity.c.last_run_started_at,
        and_(
            run.last_run_started_at == activity.c.last_run_started_at,
            or_(
                run.last_run_received_at > activity.c.last_run_received_at,
                and_(
                    run.last_run_received_at == activity.c.last_run_received_at,
                    run.last_run_id < activity.c.last_run_id,
                ),
            ),
        ),
    )
    return _Statements(
        run_digest=select(runs.c.report_sha256).where(runs.c.id == bindparam("run_id")),
        # ON CONFLICT DO NOTHING: RETURNING yields no row on a conflict; PostgreSQL waits
        # for a concurrent insert of the same key to commit or roll back first.
        insert_run=insert_for(runs).on_conflict_do_nothing().returning(runs.c.id),
        insert_points=insert(table_of(RunPoint)),
        insert_failures=insert(table_of(FailedPoint)),
        build_by_identity=select(builds.c.id).where(builds.c.identity == bindparam("identity")),
        insert_build=insert_for(builds).on_conflict_do_nothing().returning(builds.c.id),
        model_by_identity=select(models.c.id, *(models.c[f] for f in MODEL_FACTS)).where(
            models.c.identity == bindparam("identity")
        ),
        insert_model=insert_for(models).on_conflict_do_nothing().returning(models.c.id),
        model_facts=select(*(models.c[f] for f in MODEL_FACTS)).where(
            models.c.id == bindparam("model_id")
        ),
        other_latest_points=select(func.count())
        .select_from(latest_points)
        .where(
            latest_points.c.node_id == bindparam("node_id"),
            latest_points.c.model_id != bindparam("model_id"),
        ),
        fingerprint=upsert.on_conflict_do_update(
            index_elements=[fingerprints.c.node_id, fingerprints.c.hash],
            set_={
                "first_seen": earliest(fingerprints.c.first_seen, new.first_seen),
                "last_seen": latest(fingerprints.c.last_seen, new.last_seen),
                # stored before summaries existed (migration 0003): filled now
                "description": func.coalesce(fingerprints.c.description, new.description),
                "memory_bytes": func.coalesce(fingerprints.c.memory_bytes, new.memory_bytes),
                "memory_kind": func.coalesce(fingerprints.c.memory_kind, new.memory_kind),
            },
        ).returning(fingerprints.c.id, fingerprints.c.memory_bytes),
        # Every run counts; the newest (as RUN_NEWEST_FIRST orders runs) is the node's last.
        activity=count_run.on_conflict_do_update(
            index_elements=[activity.c.node_id],
            set_={
                "run_count": activity.c.run_count + 1,
                **{
                    column: case((newer, run[column]), else_=activity.c[column])
                    for column in ("last_run_id", "last_run_started_at", "last_run_received_at")
                },
            },
        ),
    )


def ingest_report(
    session: Session,
    *,
    report: wire.RunReport,
    node_id: int,
    limits: IngestLimits | None = None,
    known: KnownRows | None = None,
    learned: KnownRows | None = None,
) -> Stored:
    """Stores the report as a run of the node, in the session's transaction (the caller
    commits). A report already stored with the same body is answered as such; the same run
    id with another body raises RunConflict; a bound exceeded raises ReportRefused. Rows
    found or made are added to `learned`, for the caller to remember once committed."""
    limits = limits or IngestLimits()
    known = known or KnownRows()
    learned = learned if learned is not None else KnownRows()
    check_size(report, limits)
    connection = session.connection()
    sql = _statements(connection.dialect.name)
    digest = _sha256(report.model_dump_json())
    stored_digest = connection.execute(sql.run_digest, {"run_id": report.run_id}).scalar()
    if stored_digest is not None:
        return _as_retry(report.run_id, stored_digest, digest)

    build_id = _build_id(connection, sql, report.engine, known, learned)
    model_id = _model_id(connection, sql, report.model, known, learned)
    if report.status != "failed":
        _check_series(
            connection, sql, node_id=node_id, model_id=model_id, report=report, limits=limits
        )
    fingerprint_id, memory_bytes = _fingerprint(connection, sql, node_id=node_id, report=report)
    received = _now()
    row = {
        "id": report.run_id,
        "node_id": node_id,
        "fingerprint_id": fingerprint_id,
        "build_id": build_id,
        "model_id": model_id,
        "source": report.source,
        "status": report.status,
        "error": report.error,
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "received_at": received,
        "report_sha256": digest,
        **report.settings.model_dump(),
    }
    if connection.execute(sql.insert_run, row).scalar() is None:
        # The same run id was stored meanwhile by a concurrent request: answer as a retry.
        winner = connection.execute(sql.run_digest, {"run_id": report.run_id}).scalar()
        return _as_retry(report.run_id, winner or "", digest)
    connection.execute(
        sql.activity,
        {
            "node_id": node_id,
            "last_run_id": report.run_id,
            "last_run_started_at": report.started_at,
            "last_run_received_at": received,
            "run_count": 1,
        },
    )
    if report.points:
        connection.execute(
            sql.insert_points, [{"run_id": report.run_id, **p.model_dump()} for p in report.points]
        )
    if report.failures:
        connection.execute(
            sql.insert_failures,
            [{"run_id": report.run_id, **f.model_dump()} for f in report.failures],
        )
    regressed = False
    if report.status != "failed":
        record_latest(
            connection,
            node_id=node_id,
            model_id=model_id,
            run_id=report.run_id,
            started_at=report.started_at,
            received_at=received,
            build_id=build_id,
            memory_bytes=memory_bytes,
            settings=report.settings,
            points=report.points,
        )
        regressed = refresh_regressions(
            session,
            node_id=node_id,
            model_id=model_id,
            run_id=report.run_id,
            cells=[(p.pp, p.tg) for p in report.points],
        )
    return Stored(report.run_id, created=True, regressed=regressed)


def _as_retry(run_id: uuid.UUID, stored_digest: str, digest: str) -> Stored:
    if stored_digest != digest:
        raise RunConflict(f"run {run_id} exists with a different report")
    return Stored(run_id, created=False)


def _get_or_insert(
    connection: Connection, find: Any, insert_row: Any, identity: str, values: dict[str, Any]
) -> Row[Any]:
    """The row `find` selects for this identity, inserted with `values` if there is none
    (a concurrent insert of the same row is found once committed)."""
    found = connection.execute(find, {"identity": identity}).first()
    if found is None:
        connection.execute(insert_row, {"identity": identity, **values})
        found = connection.execute(find, {"identity": identity}).one()
    return found


def _build_id(
    connection: Connection,
    sql: _Statements,
    engine: wire.EngineBuild,
    known: KnownRows,
    learned: KnownRows,
) -> int:
    fields = engine.model_dump()
    identity = build_identity(fields)
    build_id = known.builds.get(identity)
    if build_id is None:
        row = _get_or_insert(connection, sql.build_by_identity, sql.insert_build, identity, fields)
        build_id = learned.builds[identity] = int(row.id)
    return build_id


def _model_id(
    connection: Connection,
    sql: _Statements,
    info: wire.ModelInfo,
    known: KnownRows,
    learned: KnownRows,
) -> int:
    key = model_name_key(info.name)
    identity = f"sha256:{info.sha256}" if info.sha256 else f"name:{key}"
    remembered = known.models.get(identity)
    if remembered is None:
        row = _get_or_insert(
            connection,
            sql.model_by_identity,
            sql.insert_model,
            identity,
            {"name": info.name, "name_key": key, "sha256": info.sha256},
        )
        model_id = int(row.id)
        held = frozenset(f for f in MODEL_FACTS if getattr(row, f) is not None)
    else:
        model_id, held = remembered
    # Facts a later report knows and an earlier one did not are filled in, never
    # overwritten; the row is written (and locked) only when there is something to fill.
    new = {
        f: value for f in MODEL_FACTS if f not in held and (value := getattr(info, f)) is not None
    }
    if new:
        connection.execute(
            update(Model)
            .where(Model.id == model_id)
            .values({f: func.coalesce(getattr(Model, f), value) for f, value in new.items()})
        )
        held = held | new.keys()
    if remembered is None or new:
        learned.models[identity] = (model_id, held)
    return model_id


def _check_series(
    connection: Connection,
    sql: _Statements,
    *,
    node_id: int,
    model_id: int,
    report: wire.RunReport,
    limits: IngestLimits,
) -> None:
    """The node's latest curves, with this run's in place of its model's, must stay within
    the bound: they are what placement, /metrics and the dashboard read per node."""
    others = connection.execute(
        sql.other_latest_points, {"node_id": node_id, "model_id": model_id}
    ).scalar()
    total = (others or 0) + len(report.points)
    if total > limits.max_series_per_node:
        raise ReportRefused(
            f"node {report.node!r} would hold {total} points in its latest curves (this run's "
            f"{len(report.points)} and {others} of its other models), over this registry's "
            f"limit of {limits.max_series_per_node} (FLEETBENCH_MAX_SERIES_PER_NODE)"
        )


def _fingerprint(
    connection: Connection, sql: _Statements, *, node_id: int, report: wire.RunReport
) -> tuple[int | None, int | None]:
    """(id, memory in bytes) of the run's hardware fingerprint, stored or widened to the
    run's time in one upsert."""
    if report.hardware is None:
        return None, None
    hardware = report.hardware
    summary = summarize_hardware(hardware.data)
    row = connection.execute(
        sql.fingerprint,
        {
            "node_id": node_id,
            "hash": hardware.hash,
            "data": hardware.data,
            "first_seen": report.started_at,
            "last_seen": report.started_at,
            "description": summary.description,
            "memory_bytes": summary.memory_bytes,
            "memory_kind": summary.memory_kind,
        },
    ).one()
    return int(row[0]), row[1]
