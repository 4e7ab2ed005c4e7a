"""One batch of reports stored in one transaction: the steps in order, answered per
report; every projection of the runs (registry.projections) brought up to date with them
in the same transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from fleetbench.contract import wire
from fleetbench.registry.costs import Steps
from fleetbench.registry.ingest.answers import (
    IngestLimits,
    ReportRefused,
    RunConflict,
    Stored,
    check_size,
)
from fleetbench.registry.ingest.rows import (
    IncomingRun,
    KnownRows,
    MadeBy,
    assign_ids,
    build_id_of,
    facts_id_of,
    insert_runs,
    model_id_of,
    over_series_bound,
    sha256_of,
    store_fingerprints,
)
from fleetbench.registry.ingest.statements import Statements, statements_for
from fleetbench.registry.projections import PROJECTIONS


def _now() -> datetime:
    return datetime.now(UTC)


def ingest_batch(
    session: Session,
    items: Sequence[tuple[wire.RunReport, int]],
    *,
    limits: IngestLimits | None = None,
    known: KnownRows | None = None,
    learned: KnownRows | None = None,
    steps: Steps | None = None,
) -> list[Stored | Exception]:
    """Stores (report, node id) items as runs, in the session's transaction (the caller
    commits), and answers each: Stored (created, or already stored with the same body), or
    the RunConflict or ReportRefused that refused it before anything of it was written. Rows
    found or made are added to `learned`, for the caller to remember once committed; what
    each step cost is added to `steps` (registry.costs).

    Set-based: each step is one statement for the whole batch (a select of all its keys, a
    multi-row insert or upsert), whatever its size."""
    limits = limits or IngestLimits()
    known = known or KnownRows()
    learned = learned if learned is not None else KnownRows()
    steps = steps if steps is not None else Steps()
    answers: list[Stored | Exception | None] = [None] * len(items)
    with steps.step("digest") as cost:
        runs, copies = _distinct_runs(items, limits, answers)
        cost.rows += len(items)
    connection = session.connection()
    sql = statements_for(connection.dialect.name)
    with steps.step("lookup"):
        for run, retry in _stored_already(connection, sql, runs):
            answers[run.index] = retry
        runs = [run for run in runs if answers[run.index] is None]
        for run in runs:
            try:
                _find_rows_named(connection, sql, run, limits, known, learned)
            except ReportRefused as too_many:
                answers[run.index] = too_many
        runs = [run for run in runs if answers[run.index] is None]
        for run, refused in over_series_bound(connection, sql, runs, limits):
            answers[run.index] = refused
        runs = [run for run in runs if answers[run.index] is None]
    with steps.step("fingerprints") as cost:
        fingerprints = store_fingerprints(connection, sql, runs)
        cost.rows += len(fingerprints)
    with steps.step("runs") as cost:
        assign_ids(connection, sql, runs)
        inserted = insert_runs(connection, sql, runs, fingerprints)
        # Not inserted: stored meanwhile by a concurrent request (a retry), or its id taken
        # meanwhile by another node's run (stored under an id of its own, in a second try).
        not_in = [r for r in runs if r.id not in inserted]
        for run, retry in _stored_already(connection, sql, not_in):
            answers[run.index] = retry
        again = [run for run in runs if run.id not in inserted and answers[run.index] is None]
        assign_ids(connection, sql, again, taken=inserted)
        inserted |= insert_runs(connection, sql, again, fingerprints)
        for run in again:
            if run.id not in inserted:
                answers[run.index] = RuntimeError(f"run {run.report.run_id} could not be stored")
        runs = [run for run in runs if run.id in inserted]
        cost.rows += sum(1 + len(r.report.points) + len(r.report.serving_points) for r in runs)
    stored = [run.stored(fingerprints) for run in runs]
    for projection in PROJECTIONS:
        with steps.step(projection.name) as cost:
            cost.rows += projection.add(connection, stored)
    for run in runs:
        answers[run.index] = Stored(run.id, created=True)
    for index, first in copies:  # a copy is answered as its first is, once that is known
        answer = answers[first.index]
        if isinstance(answer, Stored):
            answers[index] = Stored(first.id, created=False)
        elif answer is not None:  # its own exception: each request raises its own
            answers[index] = type(answer)(*answer.args)
    return [answer if answer is not None else RuntimeError("not answered") for answer in answers]


def _find_rows_named(
    connection: Connection,
    sql: Statements,
    run: IncomingRun,
    limits: IngestLimits,
    known: KnownRows,
    learned: KnownRows,
) -> None:
    """The run's build, model and facts rows, found or made."""
    made_by = MadeBy(run.node_id, limits.max_rows_per_node)
    model = run.report.model
    run.build_id = build_id_of(connection, sql, run.report.engine, known, learned, made_by)
    run.model_id = model_id_of(connection, sql, model, known, learned, made_by)
    run.facts_id = facts_id_of(connection, sql, run.model_id, model, known, learned, made_by)


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
        run = IncomingRun(index, report, node_id, sha256_of(wire.defining_json(report)), received)
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
