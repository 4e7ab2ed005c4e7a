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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, and_, bindparam, case, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from agent import wire
from agent.wire import model_name_key
from registry.latest import LatestCandidate, record_latest
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
from registry.regression_store import NewRuns, refresh_regressions
from registry.series import (
    OrderKey,
    RecentRun,
    RecentSeries,
    Values,
    order_key,
    point_values,
    run_labels,
    series_of_pairs,
)
from registry.series_cache import SeriesCache
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
    "ingest_batch",
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
    process filled is updated once more, harmlessly (the update keeps what is there).

    A transaction also leaves here, by node, its run counts before and after and the recent
    series of the models it stored runs of, for the series cache (registry.series_cache)."""

    builds: dict[str, int] = field(default_factory=dict)
    models: dict[str, tuple[int, frozenset[str]]] = field(default_factory=dict)
    series: dict[int, tuple[int, int, dict[int, RecentSeries]]] = field(default_factory=dict)

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
        self._series = SeriesCache()
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
        answers = ingest_batch(
            session,
            items,
            limits=self.limits,
            known=known,
            learned=learned,
            series_cache=self._series,
        )

        def remember() -> None:
            with self._learning:
                self._known.learn(learned)
            for node_id, (before, after, models) in learned.series.items():
                self._series.committed(node_id, runs_before=before, runs_after=after, models=models)

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
    more than executing them, and bound parameters keep their compiled form cached. Each
    runs once per batch, with one row per report (executemany: one multi-row statement)."""

    run_digests: Any
    insert_runs: Any
    insert_points: Any
    insert_failures: Any
    build_by_identity: Any
    insert_build: Any
    model_by_identity: Any
    insert_model: Any
    latest_counts: Any
    fingerprints: Any
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
    count_runs = insert_for(activity)
    run = count_runs.excluded
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
        run_digests=select(runs.c.id, runs.c.report_sha256).where(
            runs.c.id.in_(bindparam("run_ids", expanding=True))
        ),
        # ON CONFLICT DO NOTHING: RETURNING yields no row for a conflict; PostgreSQL waits
        # for a concurrent insert of the same key to commit or roll back first.
        insert_runs=insert_for(runs).on_conflict_do_nothing().returning(runs.c.id),
        insert_points=insert(table_of(RunPoint)),
        insert_failures=insert(table_of(FailedPoint)),
        build_by_identity=select(builds.c.id).where(builds.c.identity == bindparam("identity")),
        insert_build=insert_for(builds).on_conflict_do_nothing(),
        model_by_identity=select(models.c.id, *(models.c[f] for f in MODEL_FACTS)).where(
            models.c.identity == bindparam("identity")
        ),
        insert_model=insert_for(models).on_conflict_do_nothing(),
        latest_counts=select(latest_points.c.node_id, latest_points.c.model_id, func.count())
        .where(latest_points.c.node_id.in_(bindparam("node_ids", expanding=True)))
        .group_by(latest_points.c.node_id, latest_points.c.model_id),
        fingerprints=upsert.on_conflict_do_update(
            index_elements=[fingerprints.c.node_id, fingerprints.c.hash],
            set_={
                "first_seen": earliest(fingerprints.c.first_seen, new.first_seen),
                "last_seen": latest(fingerprints.c.last_seen, new.last_seen),
                # stored before summaries existed (migration 0003): filled now
                "description": func.coalesce(fingerprints.c.description, new.description),
                "memory_bytes": func.coalesce(fingerprints.c.memory_bytes, new.memory_bytes),
                "memory_kind": func.coalesce(fingerprints.c.memory_kind, new.memory_kind),
            },
        ).returning(
            fingerprints.c.node_id,
            fingerprints.c.hash,
            fingerprints.c.id,
            fingerprints.c.memory_bytes,
            fingerprints.c.description,
        ),
        # Every run counts; the newest (as RUN_NEWEST_FIRST orders runs) is the node's last.
        activity=count_runs.on_conflict_do_update(
            index_elements=[activity.c.node_id],
            set_={
                "run_count": activity.c.run_count + run.run_count,
                **{
                    column: case((newer, run[column]), else_=activity.c[column])
                    for column in ("last_run_id", "last_run_started_at", "last_run_received_at")
                },
            },
        ).returning(activity.c.node_id, activity.c.run_count),
    )


def ingest_report(
    session: Session,
    *,
    report: wire.RunReport,
    node_id: int,
    limits: IngestLimits | None = None,
) -> Stored:
    """Stores one report (`ingest_batch` of one); raises RunConflict or ReportRefused."""
    answer = ingest_batch(session, [(report, node_id)], limits=limits)[0]
    if isinstance(answer, Exception):
        raise answer
    return answer


@dataclass
class _Run:
    """One report of a batch on its way in."""

    index: int  # in the batch
    report: wire.RunReport
    node_id: int
    digest: str
    received_at: datetime
    build_id: int = 0
    model_id: int = 0

    @property
    def id(self) -> uuid.UUID:
        return self.report.run_id

    @property
    def order_key(self) -> OrderKey:
        return order_key(self.report.started_at, self.received_at, self.id)

    def newer_than(self, other: _Run) -> bool:
        """As RUN_NEWEST_FIRST orders runs: started, then received, then the smaller id."""
        mine = (self.report.started_at, self.received_at)
        theirs = (other.report.started_at, other.received_at)
        return mine > theirs or (mine == theirs and self.id < other.id)


def ingest_batch(
    session: Session,
    items: Sequence[tuple[wire.RunReport, int]],
    *,
    limits: IngestLimits | None = None,
    known: KnownRows | None = None,
    learned: KnownRows | None = None,
    series_cache: SeriesCache | None = None,
) -> list[Stored | Exception]:
    """Stores (report, node id) items as runs, in the session's transaction (the caller
    commits), and answers each: Stored (created, or already stored with the same body), or
    the RunConflict or ReportRefused that refused it before anything of it was written. Rows
    found or made are added to `learned`, for the caller to remember once committed.

    Set-based: each step is one statement for the whole batch (a select of all its keys, a
    multi-row insert or upsert), whatever its size."""
    limits = limits or IngestLimits()
    known = known or KnownRows()
    learned = learned if learned is not None else KnownRows()
    connection = session.connection()
    sql = _statements(connection.dialect.name)
    answers: list[Stored | Exception | None] = [None] * len(items)
    runs = _distinct_runs(items, limits, answers)
    stored = dict(connection.execute(sql.run_digests, {"run_ids": [r.id for r in runs]}).all())
    for run in runs:
        if run.id in stored:
            answers[run.index] = _as_retry(run.id, stored[run.id], run.digest)
    runs = [run for run in runs if answers[run.index] is None]
    known_now = KnownRows(dict(known.builds), dict(known.models))
    for run in runs:
        run.build_id = _build_id(connection, sql, run.report.engine, known_now, learned)
        run.model_id = _model_id(connection, sql, run.report.model, known_now, learned)
        known_now.learn(learned)
    for run, refused in _over_series_bound(connection, sql, runs, limits):
        answers[run.index] = refused
    runs = [run for run in runs if answers[run.index] is None]
    fingerprints = _fingerprints(connection, sql, runs)
    inserted = _insert_runs(connection, sql, runs, fingerprints)
    for run in runs:
        if run.id not in inserted:  # stored meanwhile by a concurrent request: a retry
            winner = connection.execute(sql.run_digests, {"run_ids": [run.id]}).first()
            answers[run.index] = _as_retry(run.id, winner[1] if winner else "", run.digest)
    runs = [run for run in runs if run.id in inserted]
    node_runs = _count_activity(connection, sql, runs)
    regressed = _latest_and_regressions(
        session, connection, runs, fingerprints, node_runs, series_cache, learned
    )
    for run in runs:
        pair = (run.node_id, run.model_id)
        answers[run.index] = Stored(run.id, created=True, regressed=pair in regressed)
    return [answer if answer is not None else RuntimeError("not answered") for answer in answers]


def _distinct_runs(
    items: Sequence[tuple[wire.RunReport, int]],
    limits: IngestLimits,
    answers: list[Stored | Exception | None],
) -> list[_Run]:
    """The batch's runs, each once: a report over the size bound is answered refused, a run
    id given twice is answered as a retry of its first."""
    received = _now()
    runs: list[_Run] = []
    first_of: dict[uuid.UUID, _Run] = {}
    for index, (report, node_id) in enumerate(items):
        try:
            check_size(report, limits)
        except ReportRefused as refused:
            answers[index] = refused
            continue
        run = _Run(index, report, node_id, _sha256(report.model_dump_json()), received)
        twin = first_of.get(run.id)
        if twin is not None:
            answers[index] = _as_retry(run.id, twin.digest, run.digest)
            continue
        first_of[run.id] = run
        runs.append(run)
    return runs


def _as_retry(run_id: uuid.UUID, stored_digest: str, digest: str) -> Stored | Exception:
    if stored_digest != digest:
        return RunConflict(f"run {run_id} exists with a different report")
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


def _over_series_bound(
    connection: Connection, sql: _Statements, runs: Sequence[_Run], limits: IngestLimits
) -> list[tuple[_Run, ReportRefused]]:
    """The runs that would take their node's latest curves (this run's in place of its
    model's) past the bound: what placement, /metrics and the dashboard read per node."""
    candidates = [run for run in runs if run.report.status != "failed"]
    if not candidates:
        return []
    held: dict[int, dict[int, int]] = {}
    node_ids = sorted({run.node_id for run in candidates})
    for node_id, model_id, count in connection.execute(
        sql.latest_counts, {"node_ids": node_ids}
    ).all():
        held.setdefault(node_id, {})[model_id] = count
    refused = []
    for run in candidates:
        others = sum(c for m, c in held.get(run.node_id, {}).items() if m != run.model_id)
        total = others + len(run.report.points)
        if total > limits.max_series_per_node:
            message = (
                f"node {run.report.node!r} would hold {total} points in its latest curves "
                f"(this run's {len(run.report.points)} and {others} of its other models), "
                f"over this registry's limit of {limits.max_series_per_node} "
                "(FLEETBENCH_MAX_SERIES_PER_NODE)"
            )
            refused.append((run, ReportRefused(message)))
    return refused


@dataclass(frozen=True)
class _Fingerprint:
    id: int
    memory_bytes: int | None
    description: str | None


Fingerprints = dict[tuple[int, str], _Fingerprint]


def _fingerprints(connection: Connection, sql: _Statements, runs: Sequence[_Run]) -> Fingerprints:
    """(id, memory in bytes) by (node, hash) of the fingerprints the runs report, stored or
    widened to the runs' times: one upsert, one row per fingerprint."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for run in runs:
        hardware = run.report.hardware
        if hardware is None:
            continue
        seen = run.report.started_at
        row = rows.get((run.node_id, hardware.hash))
        if row is not None:
            row["first_seen"] = min(row["first_seen"], seen)
            row["last_seen"] = max(row["last_seen"], seen)
            continue
        summary = summarize_hardware(hardware.data)
        rows[(run.node_id, hardware.hash)] = {
            "node_id": run.node_id,
            "hash": hardware.hash,
            "data": hardware.data,
            "first_seen": seen,
            "last_seen": seen,
            "description": summary.description,
            "memory_bytes": summary.memory_bytes,
            "memory_kind": summary.memory_kind,
        }
    if not rows:
        return {}
    returned = connection.execute(sql.fingerprints, [rows[key] for key in sorted(rows)]).all()
    return {
        (node_id, digest): _Fingerprint(int(id_), memory, description)
        for node_id, digest, id_, memory, description in returned
    }


def _fingerprint_of(run: _Run, fingerprints: Fingerprints) -> _Fingerprint | None:
    hardware = run.report.hardware
    return fingerprints.get((run.node_id, hardware.hash)) if hardware is not None else None


def _insert_runs(
    connection: Connection, sql: _Statements, runs: Sequence[_Run], fingerprints: Fingerprints
) -> set[uuid.UUID]:
    """Inserts the runs, their points and failed points; returns the ids it inserted (the
    others were stored meanwhile by another request)."""
    if not runs:
        return set()
    rows = []
    for run in runs:
        report = run.report
        fingerprint = _fingerprint_of(run, fingerprints)
        rows.append(
            {
                "id": run.id,
                "node_id": run.node_id,
                "fingerprint_id": fingerprint.id if fingerprint else None,
                "build_id": run.build_id,
                "model_id": run.model_id,
                "source": report.source,
                "status": report.status,
                "error": report.error,
                "started_at": report.started_at,
                "finished_at": report.finished_at,
                "received_at": run.received_at,
                "report_sha256": run.digest,
                **report.settings.model_dump(),
            }
        )
    inserted = {row[0] for row in connection.execute(sql.insert_runs, rows).all()}
    new = [run for run in runs if run.id in inserted]
    points = [{"run_id": r.id, **p.model_dump()} for r in new for p in r.report.points]
    if points:
        connection.execute(sql.insert_points, points)
    failures = [{"run_id": r.id, **f.model_dump()} for r in new for f in r.report.failures]
    if failures:
        connection.execute(sql.insert_failures, failures)
    return inserted


def _newest_by(runs: Sequence[_Run], key: Any) -> dict[Any, _Run]:
    newest: dict[Any, _Run] = {}
    for run in runs:
        k = key(run)
        if k not in newest or run.newer_than(newest[k]):
            newest[k] = run
    return newest


def _count_activity(
    connection: Connection, sql: _Statements, runs: Sequence[_Run]
) -> dict[int, int]:
    """Each node's run count and newest run: one upsert, one row per node. Returns each
    node's run count now."""
    counts = Counter(run.node_id for run in runs)
    newest = _newest_by(runs, lambda run: run.node_id)
    if not newest:
        return {}
    returned = connection.execute(
        sql.activity,
        [
            {
                "node_id": node_id,
                "last_run_id": run.id,
                "last_run_started_at": run.report.started_at,
                "last_run_received_at": run.received_at,
                "run_count": counts[node_id],
            }
            for node_id, run in sorted(newest.items())
        ],
    ).all()
    return {int(node_id): int(count) for node_id, count in returned}


def _latest_and_regressions(
    session: Session,
    connection: Connection,
    runs: Sequence[_Run],
    fingerprints: Fingerprints,
    node_runs: Mapping[int, int],
    series_cache: SeriesCache | None,
    learned: KnownRows,
) -> set[tuple[int, int]]:
    """Brings each (node, model)'s latest curve and the regressions of its series up to
    date with the batch's runs (`runs`: all it stored; `node_runs`: each node's run count
    now); returns the pairs a regression is stored for. The series the check reads are
    taken from `series_cache` where they are still valid, and what they are now is left in
    `learned` for the cache once the transaction commits."""
    successful = [run for run in runs if run.report.status != "failed"]
    heads = []
    for (node_id, model_id), run in sorted(
        _newest_by(successful, lambda run: (run.node_id, run.model_id)).items()
    ):
        fingerprint = _fingerprint_of(run, fingerprints)
        heads.append(
            LatestCandidate(
                node_id=node_id,
                model_id=model_id,
                run_id=run.id,
                started_at=run.report.started_at,
                received_at=run.received_at,
                build_id=run.build_id,
                memory_bytes=fingerprint.memory_bytes if fingerprint else None,
                settings=run.report.settings,
                points=run.report.points,
            )
        )
    record_latest(connection, heads)
    new_runs: dict[tuple[int, int], NewRuns] = {}
    for run in successful:
        pair = new_runs.setdefault((run.node_id, run.model_id), NewRuns())
        pair.run_ids.append(run.id)
        pair.cells.update((p.pp, p.tg) for p in run.report.points)
    added = Counter(run.node_id for run in runs)
    before = {node_id: count - added[node_id] for node_id, count in node_runs.items()}
    histories = _recent_series(session, successful, new_runs, fingerprints, before, series_cache)
    for node_id, count in node_runs.items():
        models = {m: h for (n, m), h in histories.items() if n == node_id}
        learned.series[node_id] = (before[node_id], count, models)
    return refresh_regressions(
        session, new_runs, {pair: recent.as_lists() for pair, recent in histories.items()}
    )


def _recent_series(
    session: Session,
    runs: Sequence[_Run],
    new_runs: Mapping[tuple[int, int], NewRuns],
    fingerprints: Fingerprints,
    node_runs_before: Mapping[int, int],
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
            node_runs=node_runs_before[node_id],
            cells=frozenset(pair.cells),
        )
        if remembered is None:
            continue
        mine = [r for r in runs if (r.node_id, r.model_id) == (node_id, model_id)]
        found[(node_id, model_id)] = remembered.with_runs(
            [_recent_run(run, fingerprints) for run in mine]
        )
    missing = {pair: runs_.cells for pair, runs_ in new_runs.items() if pair not in found}
    if missing:
        found.update(series_of_pairs(session, missing))
    return found


def _recent_run(run: _Run, fingerprints: Fingerprints) -> tuple[RecentRun, Values]:
    """A new run as its series hold it, labelled as a read of it would be."""
    report = run.report
    fingerprint = _fingerprint_of(run, fingerprints)
    labels = run_labels(
        report.engine,
        fingerprint.description if fingerprint else None,
        report.hardware.hash if report.hardware else None,
        report.settings,
    )
    values = point_values(
        (p.pp, p.tg, p.b, p.s_tg, p.s_pp, p.s_tg_stdev, p.s_pp_stdev, p.repeats)
        for p in report.points
    )
    return RecentRun(run.order_key, run.id, report.started_at, labels), values
