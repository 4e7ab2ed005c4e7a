"""The judge: each registry process has one, a thread that takes the series checks that are
due (registry.regressions.queue), reads their series (registry.regressions.series), judges
them with regressions.rules' detector (and their outputs with regressions.output_shifts'),
stores what it finds (registry.regressions.store) and each latest point's minimum detectable
change, and wakes the webhook notifier when a regression was stored.

Judging in ingest's transaction cost half of a report's CPU and held the node's rows locked
while it ran; here it runs apart, once per series however many runs a burst brings, and a
report's transaction only queues its series.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.registry.compare.output_rules import MIN_KL
from fleetbench.registry.costs import Steps
from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import DetectableChange, table_of
from fleetbench.registry.regressions.queue import Check, claim_due, finish, next_due
from fleetbench.registry.regressions.rules import min_detectable_change
from fleetbench.registry.regressions.series import (
    HISTORY_RUNS,
    Series,
    output_series_of_pairs,
    series_of_pairs,
    serving_series,
)
from fleetbench.registry.regressions.store import refresh_output_shifts, refresh_regressions

__all__ = ["Judged", "RegressionJudge", "judge_checks", "judge_due", "judge_next_batch"]

log = logging.getLogger("fleetbench.registry.regressions")

# Checks judged in one transaction: enough to read their series in two queries, few enough
# that SQLite's one writer (ingest's) waits for it only briefly.
BATCH = 32
# Longer than a pass over one batch can take: a process that dies mid-judgement leaves its
# checks to the others when it ends.
LEASE = timedelta(minutes=5)
# How soon to look again when the due checks were taken by another process between the read
# and the claim: they are that process's now, and the next are due soon.
RETRY = timedelta(seconds=1)


def judge_checks(
    session: Session,
    checks: Sequence[Check],
    steps: Steps | None = None,
    outputs_min_kl: float = MIN_KL,
) -> set[tuple[int, int]]:
    """Judges the checks' series (their outputs against `outputs_min_kl`) and stores what is
    found, in the session's transaction; returns the (node, model) pairs a regression is
    stored for. What each step cost is added to `steps` (registry.costs)."""
    steps = steps if steps is not None else Steps()
    offline = {c.pair: c.since for c in checks if c.kind == "offline"}
    serving = {c.pair: c.since for c in checks if c.kind == "serving"}
    # A pair's outputs series holds runs of both kinds: judged once, from its first new run.
    fingerprinted = {**serving, **{p: min(t, serving.get(p, t)) for p, t in offline.items()}}
    with steps.step("series") as cost:
        histories = series_of_pairs(session, offline)
        served = {
            (node_id, model_id): serving_series(
                session, node_id=node_id, model_ids=[model_id], since=since
            )
            for (node_id, model_id), since in serving.items()
        }
        outputs = output_series_of_pairs(session, fingerprinted)
        cost.rows += sum(
            len(runs)
            for series in (*histories.values(), *served.values())
            for runs in series.values()
        )
        cost.rows += sum(len(runs) for series in outputs.values() for runs in series.values())
    with steps.step("judge") as cost:
        regressed = refresh_regressions(session, offline, histories)
        regressed |= refresh_regressions(session, serving, served)
        regressed |= refresh_output_shifts(session, fingerprinted, outputs, min_kl=outputs_min_kl)
        cost.rows += len(checks)
    with steps.step("detectable") as cost:
        cost.rows += _record_detectable_changes(session, histories)
    return regressed


def _record_detectable_changes(
    session: Session, histories: Mapping[tuple[int, int], Series]
) -> int:
    """Each S_TG series' minimum detectable change as it stands now, over its latest
    HISTORY_RUNS (as GET /v1/series tells it): what placement says of a candidate's
    series. One upsert, in key order (another judge's rows never meet these: a series is
    judged by one judge at a time); returns its rows."""
    rows = [
        {"node_id": node_id, "model_id": model_id, "pp": pp, "tg": tg, "b": b, "change": change}
        for (node_id, model_id), cells in sorted(histories.items())
        for (pp, tg, b, metric), runs in sorted(cells.items())
        if metric == "s_tg" and (change := min_detectable_change(runs[-HISTORY_RUNS:])) is not None
    ]
    if rows:
        connection = session.connection()
        connection.execute(_detectable_upsert(connection.dialect.name), rows)
    return len(rows)


@functools.cache
def _detectable_upsert(dialect: str) -> Any:
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    upsert = insert_for(table_of(DetectableChange))
    return upsert.on_conflict_do_update(
        index_elements=["node_id", "model_id", "pp", "tg", "b"],
        set_={"change": upsert.excluded.change},
    )


@dataclass
class Judged:
    """What a judge did: checks judged, the pairs regressions were stored for, and when the
    next check no process holds falls due (None: none is queued)."""

    checks: int = 0
    regressed: set[tuple[int, int]] = field(default_factory=set)
    next_due: datetime | None = None


def judge_next_batch(
    sessions: sessionmaker[Session],
    *,
    delay: timedelta = timedelta(0),
    batch: int = BATCH,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    steps: Steps | None = None,
    outputs_min_kl: float = MIN_KL,
) -> Judged:
    """Claims up to `batch` due checks, judges them (outputs against `outputs_min_kl`) and
    finishes them, each in a transaction of its own. Whether a check is due is read first:
    when none is, SQLite's write lock is never taken and `next_due` says when one will be.
    A batch whose judgement fails is judged again check by check, so one series that
    cannot be judged holds up no other; a check that fails alone keeps its lease (a later
    pass takes it when the lease ends) and, alone, its error is raised. What each step cost
    is added to `steps` (registry.costs)."""
    steps = steps if steps is not None else Steps()
    with steps.step("claim"):
        moment = now()
        with sessions() as session:
            due = next_due(session, now=moment, delay=delay)
        if due is None or due > moment:
            return Judged(next_due=due)
        until = moment + LEASE
        with sessions() as session, write_transaction(session):
            checks = claim_due(session, now=moment, delay=delay, until=until, limit=batch)
            session.commit()
    if not checks:  # another process took them between the two reads
        return Judged(next_due=moment + RETRY)
    judged = Judged(checks=len(checks), next_due=moment)
    try:
        judged.regressed = _judge_and_finish(sessions, checks, until, now, steps, outputs_min_kl)
    except Exception:
        if len(checks) == 1:
            raise
        log.exception("judging %d series checks together failed: judging each alone", len(checks))
        for check in checks:
            try:
                judged.regressed |= _judge_and_finish(
                    sessions, [check], until, now, steps, outputs_min_kl
                )
            except Exception:
                log.exception("judging %s failed: tried again when its lease ends", check)
    return judged


def _judge_and_finish(
    sessions: sessionmaker[Session],
    checks: Sequence[Check],
    until: datetime,
    now: Callable[[], datetime],
    steps: Steps,
    outputs_min_kl: float,
) -> set[tuple[int, int]]:
    with sessions() as session, write_transaction(session):
        regressed = judge_checks(session, checks, steps, outputs_min_kl)
        with steps.step("finish"):
            finish(session, checks, until=until, now=now())
            session.commit()
    return regressed


def judge_due(
    sessions: sessionmaker[Session],
    *,
    delay: timedelta = timedelta(0),
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    measured: Callable[[Steps], None] | None = None,
    regressed: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
    outputs_min_kl: float = MIN_KL,
) -> Judged:
    """Judges every check due now, batch after batch (judge_next_batch, outputs against
    `outputs_min_kl`), until none is or `stop` is set; after each batch, `measured` is told
    what it cost (even when it failed) and `regressed` is called if it stored a
    regression."""
    judged = Judged()
    while stop is None or not stop.is_set():
        steps = Steps()
        try:
            batch = judge_next_batch(
                sessions, delay=delay, now=now, steps=steps, outputs_min_kl=outputs_min_kl
            )
        finally:
            if measured is not None:
                measured(steps)
        if batch.regressed and regressed is not None:
            regressed()
        judged.checks += batch.checks
        judged.regressed |= batch.regressed
        judged.next_due = batch.next_due
        if not batch.checks:
            break
    return judged


class RegressionJudge:
    """The thread that judges this process's queued checks when they fall due, and every
    `poll_s` seconds the checks other processes left (a process that stopped, a lease that
    ended).

    judge = RegressionJudge(
        sessions, delay_s=10, regressed=notifier.wake, measured=metrics.judge_steps
    )
    judge.start()
    judge.queued()   # ingest queued checks: they fall due in delay_s
    judge.stop()
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        delay_s: float,
        regressed: Callable[[], None] | None = None,
        measured: Callable[[Steps], None] | None = None,
        poll_s: float = 30.0,
        outputs_min_kl: float = MIN_KL,
    ) -> None:
        self.sessions = sessions
        self.delay = timedelta(seconds=delay_s)
        self.poll_s = poll_s
        self.outputs_min_kl = outputs_min_kl
        self._regressed = regressed
        self._measured = measured
        self._due_at: float | None = None  # monotonic; None: nothing known to be queued
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="regression-judge", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def queued(self) -> None:
        """Checks were queued just now: they fall due `delay_s` from now."""
        due = time.monotonic() + self.delay.total_seconds()
        with self._lock:
            if self._due_at is not None and self._due_at <= due:
                return
            self._due_at = due
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            wait = self.poll_s
            with self._lock:
                due_at = self._due_at
            if due_at is None or due_at <= time.monotonic():
                wait = self._pass()
            else:
                wait = min(wait, due_at - time.monotonic())
            self._wake.wait(max(0.0, wait))

    def _pass(self) -> float:
        """Judges what is due, batch after batch, saying what each cost and waking the
        notifier after each; returns how long to sleep before the next pass."""
        with self._lock:
            self._due_at = None
        try:
            judged = judge_due(
                self.sessions,
                delay=self.delay,
                measured=self._measured,
                regressed=self._regressed,
                stop=self._stop,
                outputs_min_kl=self.outputs_min_kl,
            )
        except Exception:  # the database may be down: keep the thread, try again later
            log.exception("judging the queued series checks failed")
            return self.poll_s
        if judged.next_due is None:
            return self.poll_s
        until = (judged.next_due - datetime.now(UTC)).total_seconds()
        return min(self.poll_s, max(0.0, until))
