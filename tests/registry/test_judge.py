"""The regression check apart from ingest: a report's transaction queues its series, the
judge takes a check once it is due, judges a burst of runs once, never judges a series
twice at once, takes back what a judge that stopped left, and wakes on its own."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.registry import crud, tokens
from fleetbench.registry.db import session_factory, write_transaction
from fleetbench.registry.ingest import ingest_batch
from fleetbench.registry.models import DetectableChange, Regression, SeriesCheck
from fleetbench.registry.regressions import judge as judge_module
from fleetbench.registry.regressions.judge import (
    LEASE,
    RegressionJudge,
    judge_due,
    judge_next_batch,
)
from fleetbench.registry.regressions.queue import claim_due, finish
from tests.factories import DAY0, make_report, scaled

DELAY = timedelta(seconds=10)


def _node(session: Session, name: str = "m4pro") -> int:
    tokens.create_node_token(session, node_name=name, labels={})
    session.commit()
    node = crud.find_node(session, name)
    assert node is not None
    return node.id


def _store(sessions: sessionmaker[Session], node: int, days: range, factor: float = 1.0) -> None:
    """One report a day, each in a transaction of its own, none judged."""
    for day in days:
        report = make_report(table=scaled(factor), started_at=DAY0 + timedelta(days=day))
        with sessions() as session, write_transaction(session):
            [stored] = ingest_batch(session, [(report, node)])
            assert not isinstance(stored, Exception)
            session.commit()


def _checks(sessions: sessionmaker[Session]) -> list[SeriesCheck]:
    with sessions() as session:
        return list(session.scalars(select(SeriesCheck)))


def _regressions(sessions: sessionmaker[Session]) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Regression)) or 0


def test_a_burst_of_a_nodes_runs_is_one_check_judged_once_it_is_due(engine: Engine) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        node = _node(session)
    _store(sessions, node, range(5))
    _store(sessions, node, range(5, 8), factor=0.8)  # a 20% slower stretch, no cause known
    [check] = _checks(sessions)
    assert (check.kind, check.since, check.claimed_until) == ("offline", DAY0, None)

    queued = check.queued_at
    early = judge_due(sessions, delay=DELAY, now=lambda: queued + DELAY / 2)
    assert (early.checks, early.next_due) == (0, queued + DELAY)
    assert len(_checks(sessions)) == 1

    due = judge_due(sessions, delay=DELAY, now=lambda: queued + DELAY)
    assert due.checks == 1 and due.next_due is None
    assert _checks(sessions) == []
    assert due.regressed == {(node, 1)} and _regressions(sessions) == 12
    with sessions() as session:  # what placement reads of the series
        assert session.scalar(select(func.count()).select_from(DetectableChange)) == 6


def test_runs_stored_while_a_check_is_judged_are_judged_after(engine: Engine) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        node = _node(session)
    _store(sessions, node, range(3))
    now = datetime.now(UTC)
    with sessions() as session, write_transaction(session):
        [claimed] = claim_due(session, now=now, delay=timedelta(0), until=now + LEASE, limit=10)
        session.commit()
    assert claimed.since == DAY0
    # A judge that comes now finds nothing: the check is leased.
    assert judge_due(sessions, now=lambda: now).checks == 0

    _store(sessions, node, range(3, 4))  # arrives while the claimed check is judged
    with sessions() as session, write_transaction(session):
        finish(session, [claimed], until=now + LEASE, now=now)
        session.commit()
    [again] = _checks(sessions)
    assert (again.since, again.claimed_until, again.queued_at) == (
        DAY0 + timedelta(days=3),
        None,
        now,
    )
    assert judge_due(sessions, now=lambda: now).checks == 1
    assert _checks(sessions) == []


def test_a_check_whose_judge_stopped_is_taken_back_with_its_runs(engine: Engine) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        node = _node(session)
    _store(sessions, node, range(4))
    now = datetime.now(UTC)
    with sessions() as session, write_transaction(session):
        claim_due(session, now=now, delay=timedelta(0), until=now + LEASE, limit=10)
        session.commit()  # ... and its judge stopped before it judged
    _store(sessions, node, range(4, 6))

    assert judge_due(sessions, now=lambda: now + LEASE / 2).checks == 0  # still leased
    later = now + LEASE + timedelta(seconds=1)
    with sessions() as session, write_transaction(session):
        [taken] = claim_due(session, now=later, delay=timedelta(0), until=later + LEASE, limit=10)
        session.commit()
    assert taken.since == DAY0  # the stopped judge's runs and those queued since

    # The stopped judge comes back: the check is no longer its to finish.
    with sessions() as session, write_transaction(session):
        finish(session, [taken], until=now + LEASE, now=later)
        session.commit()
    [held] = _checks(sessions)
    assert held.claimed_until == later + LEASE
    with sessions() as session, write_transaction(session):
        finish(session, [taken], until=later + LEASE, now=later)
        session.commit()
    assert _checks(sessions) == []


def test_a_series_that_cannot_be_judged_holds_up_no_other(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        good, bad = _node(session, "good"), _node(session, "bad")
    _store(sessions, good, range(5))
    _store(sessions, good, range(5, 8), factor=0.8)
    _store(sessions, bad, range(3))
    refresh = judge_module.refresh_regressions

    def failing_for_bad(session: Session, since: Any, histories: Any) -> set[tuple[int, int]]:
        if any(node == bad for node, _ in since):
            raise RuntimeError("a series the detector cannot judge")
        return refresh(session, since, histories)

    monkeypatch.setattr(judge_module, "refresh_regressions", failing_for_bad)
    now = datetime.now(UTC)
    judged = judge_next_batch(sessions, now=lambda: now)
    assert (judged.checks, judged.regressed) == (2, {(good, 1)})
    [left] = _checks(sessions)  # the bad one, under its lease until it ends
    assert (left.node_id, left.claimed_until) == (bad, now + LEASE)
    assert judge_due(sessions, now=lambda: now).checks == 0


def test_a_judge_wakes_when_checks_fall_due_and_says_when_it_found_a_regression(
    engine: Engine,
) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        node = _node(session)
    regressed = threading.Event()
    judge = RegressionJudge(sessions, delay_s=0.3, regressed=regressed.set, poll_s=60)
    judge.start()
    try:
        _store(sessions, node, range(5))
        _store(sessions, node, range(5, 8), factor=0.8)
        began = time.monotonic()
        judge.queued()
        assert regressed.wait(10), "the judge did not judge the queued series"
        assert time.monotonic() - began >= 0.3  # not before the delay
        deadline = time.monotonic() + 10
        while _checks(sessions):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        judge.stop()
    assert _regressions(sessions) == 12


def test_two_judges_never_take_the_same_check(postgres_database_url: str) -> None:
    """PostgreSQL: a check one judge is claiming is skipped by another, not waited for."""
    from fleetbench.registry.db import create_db_engine

    engine = create_db_engine(postgres_database_url)
    sessions = session_factory(engine)
    try:
        with sessions() as session:
            first, second = _node(session, "a"), _node(session, "b")
        _store(sessions, first, range(2))
        _store(sessions, second, range(2))
        now = datetime.now(UTC)
        with sessions() as one, write_transaction(one):
            mine = claim_due(one, now=now, delay=timedelta(0), until=now + LEASE, limit=1)
            with sessions() as other, write_transaction(other):
                theirs = claim_due(other, now=now, delay=timedelta(0), until=now + LEASE, limit=10)
                other.commit()
            one.commit()
        assert len(mine) == len(theirs) == 1
        assert {mine[0].node_id, theirs[0].node_id} == {first, second}
    finally:
        engine.dispose()
