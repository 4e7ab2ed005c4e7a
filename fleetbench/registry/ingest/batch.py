"""One batch of reports stored in one transaction: the steps in order, answered per
report; the latest curves (registry.latest) and the regressions of the series it touched
(registry.regressions) brought up to date in the same transaction."""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from fleetbench.contract import wire
from fleetbench.contract.allocation import beside_kv_bytes
from fleetbench.registry.ingest.answers import (
    IngestLimits,
    ReportRefused,
    RunConflict,
    Stored,
    check_size,
)
from fleetbench.registry.ingest.rows import (
    Fingerprints,
    IncomingRun,
    KnownRows,
    assign_ids,
    build_id_of,
    count_activity,
    facts_id_of,
    fingerprint_of,
    insert_runs,
    model_id_of,
    newest_by,
    over_series_bound,
    sha256_of,
    store_fingerprints,
)
from fleetbench.registry.ingest.statements import Statements, statements_for
from fleetbench.registry.labels import run_labels
from fleetbench.registry.latest import (
    LatestCandidate,
    LatestServingCandidate,
    record_latest,
    record_latest_serving,
)
from fleetbench.registry.regressions import (
    NewRun,
    NewServingRun,
    check_new_runs,
    check_new_serving_runs,
)
from fleetbench.registry.series import (
    RecentRun,
    Values,
    point_values,
)
from fleetbench.registry.series_cache import SeriesCache


def _now() -> datetime:
    return datetime.now(UTC)


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
    sql = statements_for(connection.dialect.name)
    answers: list[Stored | Exception | None] = [None] * len(items)
    runs, copies = _distinct_runs(items, limits, answers)
    for run, retry in _stored_already(connection, sql, runs):
        answers[run.index] = retry
    runs = [run for run in runs if answers[run.index] is None]
    for run in runs:
        run.build_id = build_id_of(connection, sql, run.report.engine, known, learned)
        run.model_id = model_id_of(connection, sql, run.report.model, known, learned)
        run.facts_id = facts_id_of(connection, sql, run.model_id, run.report.model, known, learned)
    for run, refused in over_series_bound(connection, sql, runs, limits):
        answers[run.index] = refused
    runs = [run for run in runs if answers[run.index] is None]
    fingerprints = store_fingerprints(connection, sql, runs)
    assign_ids(connection, sql, runs)
    inserted = insert_runs(connection, sql, runs, fingerprints)
    # Not inserted: stored meanwhile by a concurrent request (a retry), or its id taken
    # meanwhile by another node's run (stored under an id of its own, in a second try).
    for run, retry in _stored_already(connection, sql, [r for r in runs if r.id not in inserted]):
        answers[run.index] = retry
    again = [run for run in runs if run.id not in inserted and answers[run.index] is None]
    assign_ids(connection, sql, again, taken=inserted)
    inserted |= insert_runs(connection, sql, again, fingerprints)
    for run in again:
        if run.id not in inserted:
            answers[run.index] = RuntimeError(f"run {run.report.run_id} could not be stored")
    runs = [run for run in runs if run.id in inserted]
    node_changes = count_activity(connection, sql, runs)
    regressed = _latest_and_regressions(
        session, connection, runs, fingerprints, node_changes, series_cache, learned
    )
    regressed |= _latest_serving_and_regressions(session, connection, runs)
    for run in runs:
        pair = (run.node_id, run.model_id)
        answers[run.index] = Stored(run.id, created=True, regressed=pair in regressed)
    for index, first in copies:  # a copy is answered as its first is, once that is known
        answer = answers[first.index]
        if isinstance(answer, Stored):
            answers[index] = Stored(first.id, created=False)
        elif answer is not None:  # its own exception: each request raises its own
            answers[index] = type(answer)(*answer.args)
    return [answer if answer is not None else RuntimeError("not answered") for answer in answers]


def _distinct_runs(
    items: Sequence[tuple[wire.RunReport, int]],
    limits: IngestLimits,
    answers: list[Stored | Exception | None],
) -> tuple[list[IncomingRun], list[tuple[int, IncomingRun]]]:
    """The batch's runs, each once, and the copies of a run given twice with the same body
    (index, the first), which are answered as the first is. A report over the size bound is
    answered refused; a node's run id given twice with different bodies, a conflict."""
    received = _now()
    runs: list[IncomingRun] = []
    copies: list[tuple[int, IncomingRun]] = []
    first_of: dict[tuple[int, uuid.UUID], IncomingRun] = {}
    for index, (report, node_id) in enumerate(items):
        try:
            check_size(report, limits)
        except ReportRefused as refused:
            answers[index] = refused
            continue
        run = IncomingRun(index, report, node_id, sha256_of(report.model_dump_json()), received)
        twin = first_of.get(run.key)
        if twin is None:
            first_of[run.key] = run
            runs.append(run)
        elif twin.digest == run.digest:
            copies.append((index, twin))
        else:
            answers[index] = _conflict(run)
    return runs, copies


def _stored_already(
    connection: Connection, sql: Statements, runs: Sequence[IncomingRun]
) -> list[tuple[IncomingRun, Stored | Exception]]:
    """The runs their node has stored already, answered: a retry (the same body) is stored,
    another body under the same run id is a conflict."""
    if not runs:
        return []
    stored = {
        (node_id, reported_id): (run_id, digest)
        for node_id, reported_id, run_id, digest in connection.execute(
            sql.stored_runs, {"keys": [run.key for run in runs]}
        )
    }
    answered: list[tuple[IncomingRun, Stored | Exception]] = []
    for run in runs:
        if run.key in stored:
            run_id, digest = stored[run.key]
            retry = Stored(run_id, created=False) if digest == run.digest else _conflict(run)
            answered.append((run, retry))
    return answered


def _conflict(run: IncomingRun) -> RunConflict:
    return RunConflict(f"run {run.report.run_id} exists with a different report")


def _latest_and_regressions(
    session: Session,
    connection: Connection,
    runs: Sequence[IncomingRun],
    fingerprints: Fingerprints,
    node_changes: Mapping[int, int],
    series_cache: SeriesCache | None,
    learned: KnownRows,
) -> set[tuple[int, int]]:
    """Brings each (node, model)'s latest curve and the regressions of its series up to
    date with the batch's runs (`runs`: all it stored; `node_changes`: each node's
    NodeActivity.changes now); returns the pairs a regression is stored for. The series
    the check reads are taken from `series_cache` where they are still valid, and what they
    are now is left in `learned` for the cache once the transaction commits."""
    successful = [run for run in runs if run.in_series]
    heads = []
    for (node_id, model_id), run in sorted(
        newest_by(successful, lambda run: (run.node_id, run.model_id)).items()
    ):
        fingerprint = fingerprint_of(run, fingerprints)
        heads.append(
            LatestCandidate(
                node_id=node_id,
                model_id=model_id,
                run_id=run.id,
                started_at=run.report.started_at,
                received_at=run.received_at,
                build_id=run.build_id,
                facts_id=run.facts_id,
                memory_bytes=fingerprint.memory_bytes if fingerprint else None,
                settings=run.report.settings,
                points=run.report.points,
                engine_on_accelerator=run.on_accelerator[0],
                beside_kv_bytes=beside_kv_bytes(run.report.buffers),
            )
        )
    record_latest(connection, heads)
    added = Counter(run.node_id for run in runs)
    before = {node_id: now - added[node_id] for node_id, now in node_changes.items()}
    checked = check_new_runs(
        session,
        [
            NewRun(
                run.id,
                run.node_id,
                run.model_id,
                frozenset((p.pp, p.tg) for p in run.report.points),
                functools.partial(_recent_run, run, fingerprints),
            )
            for run in successful
        ],
        node_changes_before=before,
        series_cache=series_cache,
    )
    for node_id, now in node_changes.items():
        models = {m: h for (n, m), h in checked.series.items() if n == node_id}
        learned.series[node_id] = (before[node_id], now, models)
    return checked.regressed


def _latest_serving_and_regressions(
    session: Session, connection: Connection, runs: Sequence[IncomingRun]
) -> set[tuple[int, int]]:
    """Brings each (node, model)'s latest serving run and the regressions of its serving
    series up to date with the batch's serving runs; returns the pairs a regression is
    stored for."""
    served = [r for r in runs if r.report.kind == "serving" and r.report.status != "failed"]
    if not served:
        return set()
    newest = newest_by(served, lambda run: (run.node_id, run.model_id))
    record_latest_serving(
        connection,
        [
            LatestServingCandidate(
                node_id=node_id,
                model_id=model_id,
                run_id=run.id,
                started_at=run.report.started_at,
                received_at=run.received_at,
                build_id=run.build_id,
                server=run.report.server,
            )
            for (node_id, model_id), run in sorted(newest.items())
            if run.report.server is not None
        ],
    )
    return check_new_serving_runs(
        session,
        [
            NewServingRun(
                run.id,
                run.node_id,
                run.model_id,
                (run.report.server.prompt_tokens, run.report.server.gen_tokens),
            )
            for run in served
            if run.report.server is not None
        ],
    )


def _recent_run(run: IncomingRun, fingerprints: Fingerprints) -> tuple[RecentRun, Values]:
    """A new run as its series hold it, labelled as a read of it would be."""
    report = run.report
    fingerprint = fingerprint_of(run, fingerprints)
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
