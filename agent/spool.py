"""The spool: every finished run is written here first (SQLite, synchronous=FULL, so a
commit is on disk), then delivered to the registry with retries and backoff. A registry that
is down, slow or answering 5xx only delays delivery; the run id makes redelivery harmless.
A report the registry refuses as invalid is kept aside with the reason, not retried forever.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.client import RegistryClient
from agent.errors import RegistryUnavailable, RequestRejected
from agent.wire import RunReport

__all__ = ["FlushResult", "Spool", "SpooledRun"]

State = Literal["queued", "delivered", "rejected"]

# Refusals that a later attempt can get past: a token being fixed, a timeout, rate limiting.
_RETRYABLE_STATUS = {401, 408, 429}
_BACKOFF_BASE_S = 30.0
_BACKOFF_CAP_S = 3600.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    report TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'delivered', 'rejected')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT,
    spooled_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS runs_due ON runs (state, next_attempt_at);
"""


@dataclass(frozen=True)
class SpooledRun:
    run_id: str
    state: State
    attempts: int
    next_attempt_at: float
    last_error: str | None
    spooled_at: float
    finished_at: float | None


@dataclass
class FlushResult:
    delivered: int = 0
    rejected: int = 0
    deferred: int = 0  # still queued: the registry is unavailable or asked to retry


class Spool:
    """
    spool = Spool(Path("/var/lib/fleetbench/spool.db"))
    spool.add(report)                       # durable once it returns
    spool.flush(client)                     # delivers what is due
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a committed run survives a power cut
            yield db
        finally:
            db.close()

    def add(self, report: RunReport, *, now: float | None = None) -> None:
        """Keeps the report until the registry has it. Adding the same run again is a no-op;
        the same run id with another report is an error (it would be refused as 409)."""
        body = report.model_dump_json()
        moment = time.time() if now is None else now
        with self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO runs (run_id, report, state, next_attempt_at, spooled_at)"
                " VALUES (?, ?, 'queued', ?, ?)",
                (str(report.run_id), body, moment, moment),
            )
            (stored,) = db.execute(
                "SELECT report FROM runs WHERE run_id = ?", (str(report.run_id),)
            ).fetchone()
        if stored != body:
            raise ValueError(f"run {report.run_id} is already spooled with another report")

    def flush(self, client: RegistryClient, *, now: float | None = None) -> FlushResult:
        """Delivers every queued run that is due, oldest first. Stops at the first sign that
        the registry is unavailable: the rest would fail the same way."""
        moment = time.time() if now is None else now
        result = FlushResult()
        with self._connect() as db:
            due = db.execute(
                "SELECT run_id, report, attempts FROM runs"
                " WHERE state = 'queued' AND next_attempt_at <= ? ORDER BY spooled_at, run_id",
                (moment,),
            ).fetchall()
        for position, (run_id, body, attempts) in enumerate(due):
            try:
                client.submit_run(RunReport.model_validate_json(body))
            except RegistryUnavailable as exc:
                retry_at = self._retry_later(run_id, attempts, str(exc), moment)
                # The runs behind it would fail the same way: they wait as long.
                self._postpone([later for later, _, _ in due[position + 1 :]], retry_at)
                result.deferred += len(due) - position
                break
            except RequestRejected as exc:
                if exc.status_code in _RETRYABLE_STATUS:
                    self._retry_later(run_id, attempts, str(exc), moment)
                    result.deferred += 1
                else:
                    self._finish(run_id, "rejected", str(exc), moment)
                    result.rejected += 1
            else:
                self._finish(run_id, "delivered", None, moment)
                result.delivered += 1
        return result

    def runs(self, state: State | None = None) -> list[SpooledRun]:
        query = (
            "SELECT run_id, state, attempts, next_attempt_at, last_error, spooled_at,"
            " finished_at FROM runs"
        )
        with self._connect() as db:
            if state is None:
                rows = db.execute(query + " ORDER BY spooled_at").fetchall()
            else:
                rows = db.execute(
                    query + " WHERE state = ? ORDER BY spooled_at", (state,)
                ).fetchall()
        return [SpooledRun(*row) for row in rows]

    def counts(self) -> dict[State, int]:
        counts: dict[State, int] = {"queued": 0, "delivered": 0, "rejected": 0}
        with self._connect() as db:
            for state, count in db.execute("SELECT state, count(*) FROM runs GROUP BY state"):
                counts[state] = count
        return counts

    def _retry_later(self, run_id: str, attempts: int, error: str, now: float) -> float:
        # Exponential backoff with full jitter: agents that lost the same registry do not
        # all come back at the same second.
        delay = random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**attempts))
        retry_at = now + max(delay, 1.0)
        with self._connect() as db:
            db.execute(
                "UPDATE runs SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?"
                " WHERE run_id = ?",
                (retry_at, error, run_id),
            )
        return retry_at

    def _postpone(self, run_ids: list[str], until: float) -> None:
        with self._connect() as db:
            db.executemany(
                "UPDATE runs SET next_attempt_at = ? WHERE run_id = ?",
                [(until, run_id) for run_id in run_ids],
            )

    def _finish(self, run_id: str, state: State, error: str | None, now: float) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE runs SET state = ?, attempts = attempts + 1, last_error = ?,"
                " finished_at = ? WHERE run_id = ?",
                (state, error, now, run_id),
            )
