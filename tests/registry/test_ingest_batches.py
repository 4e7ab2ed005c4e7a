"""Ingest in batches: each report of a batch answered on its own; a batch that fails stores
its reports one by one; the regression check judging a burst of a node's runs at once
finds what judging each as it came would, also when two processes take turns on one node."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.contract import wire
from fleetbench.registry import crud, tokens
from fleetbench.registry.db import session_factory, write_transaction
from fleetbench.registry.ingest import (
    Ingest,
    IngestLimits,
    ReportRefused,
    RunConflict,
    Stored,
    ingest_batch,
)
from fleetbench.registry.models import LatestPoint, LatestRun, NodeActivity, Regression
from fleetbench.registry.regressions.judge import judge_due
from tests.factories import make_report, scaled, store_report

DAY0 = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)


def _node(session: Session, name: str = "m4pro") -> int:
    tokens.create_node_token(session, node_name=name, labels={})
    found = crud.find_node(session, name)
    assert found is not None
    return found.id


def test_each_report_of_a_batch_is_answered_on_its_own(session: Session) -> None:
    node = _node(session)
    session.commit()
    first = make_report()
    other = make_report(node="m4pro", started_at=DAY0)
    conflicting = first.model_copy(update={"error": None, "points": first.points[:3]})
    huge = make_report(table=[(b, 100.0, 10.0 * b) for b in range(1, 12)])
    with write_transaction(session):
        answers = ingest_batch(
            session,
            [(first, node), (first, node), (conflicting, node), (huge, node), (other, node)],
            limits=IngestLimits(max_points_per_report=8),
        )
        session.commit()
    created, retry, conflict, refused, later = answers
    assert created == Stored(first.run_id, created=True)
    assert retry == Stored(first.run_id, created=False)
    assert isinstance(conflict, RunConflict)
    assert isinstance(refused, ReportRefused) and "11 points" in str(refused)
    assert isinstance(later, Stored) and later.created
    activity = session.get(NodeActivity, node)
    assert activity is not None
    assert (activity.run_count, activity.last_run_id) == (2, other.run_id)  # the later start


def test_a_copy_in_a_batch_is_answered_as_its_first_once_that_is_known(
    session: Session,
) -> None:
    """Two copies of one run in a batch (a daemon's flush and a manual one at once): when
    the first is refused, the copy is refused too, never answered "already stored"."""
    node = _node(session)
    session.commit()
    small = make_report(model="Small", table=[(1, 100.0, 10.0)])
    big = make_report(model="Big")  # the article's 6 points: with Small's, 7 > 6
    with write_transaction(session):
        answers = ingest_batch(
            session,
            [(small, node), (big, node), (big, node)],
            limits=IngestLimits(max_series_per_node=6),
        )
        session.commit()
    stored, refused, copy = answers
    assert stored == Stored(small.run_id, created=True)
    assert isinstance(refused, ReportRefused) and "7 points" in str(refused)
    assert isinstance(copy, ReportRefused) and str(copy) == str(refused)
    assert session.get(LatestRun, (node, _model_id(session, "Small"))) is not None
    assert session.scalar(select(func.count()).select_from(LatestPoint)) == 1


def test_runs_of_one_batch_count_against_each_other_for_the_series_bound(
    session: Session,
) -> None:
    node = _node(session)
    session.commit()
    first, second = (make_report(model=name) for name in ("Llama", "Qwen"))
    with write_transaction(session):
        answers = ingest_batch(
            session, [(first, node), (second, node)], limits=IngestLimits(max_series_per_node=8)
        )
        session.commit()
    assert answers[0] == Stored(first.run_id, created=True)
    assert isinstance(answers[1], ReportRefused)
    assert "would hold 12 points" in str(answers[1]) and "6 of its other models" in str(answers[1])
    assert session.scalar(select(func.count()).select_from(LatestPoint)) == 6


def test_an_older_run_in_a_batch_does_not_free_room_under_the_series_bound(
    session: Session,
) -> None:
    """A spool flushed after an outage: an older run of a model (fewer points) does not
    replace the stored curve, so it must not make room for another model's run."""
    node = _node(session)
    session.commit()
    stored = make_report(model="Llama", started_at=DAY0 + timedelta(days=1))
    with write_transaction(session):
        assert ingest_batch(session, [(stored, node)])[0] == Stored(stored.run_id, created=True)
        session.commit()
    older = make_report(model="Llama", started_at=DAY0, table=[(1, 100.0, 10.0)])
    other = make_report(model="Qwen", started_at=DAY0 + timedelta(days=2))
    with write_transaction(session):
        answers = ingest_batch(
            session, [(older, node), (other, node)], limits=IngestLimits(max_series_per_node=8)
        )
        session.commit()
    assert answers[0] == Stored(older.run_id, created=True)
    assert isinstance(answers[1], ReportRefused)
    assert session.scalar(select(func.count()).select_from(LatestPoint)) == 6


def _model_id(session: Session, name: str) -> int:
    model = crud.find_models(session, name)[0]
    return model.id


def test_the_newest_run_is_the_nodes_last_and_each_models_latest(session: Session) -> None:
    node = _node(session)
    session.commit()
    older = make_report(started_at=DAY0)
    newer = make_report(started_at=DAY0 + timedelta(hours=1), table=scaled(0.5))
    failed = make_report(
        started_at=DAY0 + timedelta(hours=2), status="failed", error="boom", points=[]
    )
    with write_transaction(session):
        answers = ingest_batch(session, [(newer, node), (failed, node), (older, node)])
        session.commit()
    assert all(isinstance(a, Stored) and a.created for a in answers)
    activity = session.get(NodeActivity, node)
    assert activity is not None
    assert (activity.run_count, activity.last_run_id) == (3, failed.run_id)
    latest = session.scalars(select(LatestRun)).one()
    assert latest.run_id == newer.run_id  # the failed run has no curve; the older lost
    s_tg = dict(
        session.execute(
            select(LatestPoint.b, LatestPoint.s_tg).where(LatestPoint.node_id == node)
        ).all()
    )
    assert s_tg[8] == pytest.approx(133.65 * 0.5)


def test_a_batch_that_fails_stores_its_other_reports_alone(engine: Engine) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        node = _node(session)
        session.commit()
    good = [make_report(started_at=DAY0 + timedelta(hours=h)) for h in range(4)]
    orphan = make_report(started_at=DAY0)  # its node does not exist: a foreign key fails

    async def submit_all() -> list[Any]:
        ingest = Ingest(sessions, IngestLimits(), writers=1, batch=8)
        try:
            tasks = [ingest.submit(report, node_id=node) for report in good[:2]]
            tasks.append(ingest.submit(orphan, node_id=node + 1000))
            tasks += [ingest.submit(report, node_id=node) for report in good[2:]]
            return await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            ingest.close()

    answers = asyncio.run(submit_all())
    assert isinstance(answers[2], IntegrityError)
    assert [a.created for a in answers if isinstance(a, Stored)] == [True] * 4
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM runs")).scalar() == 4


def test_reports_that_come_within_the_linger_share_a_transaction(engine: Engine) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        node = _node(session)
        session.commit()
    batches: list[int] = []

    async def submit_in_turn(linger: float, *, each_stored_first: bool) -> float:
        """Three reports 50 ms apart (or each once the one before is stored); the seconds
        the last waited for its answer."""
        ingest = Ingest(
            sessions,
            IngestLimits(),
            linger=linger,
            measured=lambda steps: batches.append(int(steps.costs["digest"].rows)),
        )
        try:
            tasks = []
            for hour in range(3):
                report = make_report(started_at=DAY0 + timedelta(days=linger, hours=hour))
                sent = time.monotonic()
                tasks.append(asyncio.ensure_future(ingest.submit(report, node_id=node)))
                if each_stored_first:
                    await tasks[-1]
                else:
                    await asyncio.sleep(0.05)
            assert all(stored.created for stored in await asyncio.gather(*tasks))
            return time.monotonic() - sent
        finally:
            ingest.close()

    # Without a linger a report is stored at once, alone: it does not wait for company.
    # (Each is sent once the one before is stored: a busy machine's commit may outlast any
    # fixed gap, and a report that comes during one rightly joins the next batch.)
    waited = asyncio.run(submit_in_turn(0.0, each_stored_first=True))
    assert batches == [1, 1, 1]
    assert waited < 0.5  # far from the 1 s linger below
    batches.clear()
    asyncio.run(submit_in_turn(1.0, each_stored_first=False))
    assert batches == [3]


def _history(seed: int) -> list[wire.RunReport]:
    """Forty days of one node: two models, a slower build from day 20, a build back to
    normal on day 30, wobble, a failed point now and then, and some runs arriving late."""
    rng = random.Random(seed)
    reports = []
    for day in range(40):
        build, factor = (11500, 0.82) if 20 <= day < 30 else (11429, 1.0)
        for model in ("Mistral-Nemo-Instruct-2407-Q4_K_M", "Qwen2.5-7B-Q4_K_M"):
            table = scaled(factor * (1 + rng.gauss(0, 0.01)))
            report = make_report(
                model=model,
                table=table,
                build_number=build,
                started_at=DAY0 + timedelta(days=day, minutes=rng.randrange(60)),
            )
            if rng.random() < 0.1:  # the B=32 point failed
                report = report.model_copy(
                    update={
                        "status": "partial",
                        "points": report.points[:-1],
                        "failures": [
                            wire.FailedPoint(pp=512, tg=128, b=32, reason="out of memory")
                        ],
                    }
                )
            reports.append(report)
    for _ in range(6):  # late arrivals
        i = rng.randrange(len(reports) - 3)
        reports[i], reports[i + 2] = reports[i + 2], reports[i]
    return reports


async def _store_in_turns(
    reports: list[wire.RunReport],
    sessions: sessionmaker[Session],
    node: int,
    processes: int,
    burst: int,
) -> None:
    """The reports one after the other, by `processes` Ingests in turn, judged every
    `burst` reports."""
    ingests = [Ingest(sessions, IngestLimits()) for _ in range(processes)]
    try:
        for n, report in enumerate(reports, start=1):
            stored = await ingests[n % processes].submit(report, node_id=node)
            assert stored.created
            if n % burst == 0 or n == len(reports):
                judge_due(sessions)
    finally:
        for ingest in ingests:
            ingest.close()


def _regressions(session: Session) -> list[tuple[Any, ...]]:
    return sorted(
        (r.model_id, r.pp, r.tg, r.b, r.metric, str(r.first_run_id), round(r.change, 9))
        for r in session.scalars(select(Regression))
    )


@pytest.mark.parametrize(("processes", "burst"), [(1, 1), (1, 7), (2, 3), (2, 40)])
def test_a_burst_is_judged_as_its_runs_one_by_one_would_be(
    engine: Engine, tmp_path: Any, processes: int, burst: int
) -> None:
    """The same history stored and judged report by report, then by `processes` Ingests
    taking turns with the judge passing every `burst` reports (the queue coalescing their
    checks, late arrivals among them): the same regressions every time."""
    from fleetbench.registry.db import create_db_engine, upgrade_schema

    reports = _history(seed=3)
    with session_factory(engine)() as session:
        node = _node(session)
        session.commit()
        for report in reports:
            store_report(session, report, node)
        expected = _regressions(session)
    assert expected  # the slower build and its end were found

    other = create_db_engine(f"sqlite:///{tmp_path}/bursts.db")
    upgrade_schema(other)
    other_sessions = session_factory(other)
    with other_sessions() as session:
        other_node = _node(session)
        session.commit()
    asyncio.run(_store_in_turns(reports, other_sessions, other_node, processes, burst))
    with other_sessions() as session:
        assert _regressions(session) == expected
    other.dispose()
