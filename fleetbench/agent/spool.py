"""The spool: every finished run is written here first (SQLite, synchronous=FULL, so a
commit is on disk), then delivered to the registry with retries and backoff; the run id
makes redelivery harmless. No report can hold up the others, and nothing is deleted but
delivered runs past their retention.

How `flush` treats each due run, oldest first (runs that already had 5xx answers last):
- delivered (201, or 200 for a run stored before): done;
- no answer (refused, timeout): the registry is down; this run backs off, the rest wait
  with it;
- an answer with Retry-After (503 when the registry sheds load or lost its database, 429):
  this run and the rest wait at least that long, plus jitter;
- any other 5xx answer: this run backs off on its own and the next is tried; a second
  failure in a row (5xx or no answer) means the registry is unwell, and the rest wait;
- 401, 408, 429 without Retry-After, and a 422 refusing the report's wire version (one side
  is yet to be upgraded): this run is retried later; any other 4xx sets it aside as
  `rejected` with the registry's reason.
A run is also set aside as `rejected` (kept, with why) after `set_aside_after_5xx` answers
of 5xx in flushes that delivered other runs, or once it has failed for longer than
`set_aside_after_s` since its first failure and at least `set_aside_after_attempts` times,
whatever the cause. Backoff is exponential with full jitter: 30 s doubling, up to an hour.

A full disk: the spool still opens and reads; `add` and `flush` raise SpoolUnwritable,
which names the free bytes; nothing already spooled is lost.
"""

from __future__ import annotations

import contextlib
import errno
import random
import shutil
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from fleetbench.agent.errors import (
    ClientError,
    RegistryUnavailable,
    RequestRejected,
    SpoolError,
    SpoolUnwritable,
)
from fleetbench.contract.answers import RunReceipt
from fleetbench.contract.wire import RunReport, defining_json

if TYPE_CHECKING:  # httpx is loaded by what delivers, not by every command that spools
    from fleetbench.agent.client import RegistryClient

__all__ = ["FlushResult", "Spool", "SpooledRun"]

State = Literal["queued", "delivered", "rejected"]

# Refusals that a later attempt can get past: a token being fixed, a timeout, rate limiting.
RETRYABLE_STATUS = {401, 408, 429}
_BACKOFF_BASE_S = 30.0
_BACKOFF_CAP_S = 3600.0
# This many failed runs in a row (5xx or no answer) and the registry is unwell: stop there.
_FAILURES_TO_STOP = 2
# An I/O error with less than this left on the file system is the disk being full.
_NEARLY_FULL_BYTES = 1 << 20
# How long a write waits for another process's lock on the file.
_BUSY_TIMEOUT_S = 30.0

_CREATE = (
    """CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    report TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'delivered', 'rejected')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT,
    spooled_at REAL NOT NULL,
    finished_at REAL,
    server_errors INTEGER NOT NULL DEFAULT 0,
    first_failed_at REAL
)""",
    "CREATE INDEX runs_due ON runs (state, next_attempt_at)",
)
# The file's format, as SQLite's user_version: 0.1.0 made the first. A later format upgrades
# the files of earlier ones; a file of a format this agent does not know (a development
# agent's before 0.1.0, or a newer agent's) is refused, never rewritten.
_FORMAT = 1
_RUN_COLUMNS = (
    "run_id",
    "state",
    "attempts",
    "next_attempt_at",
    "last_error",
    "spooled_at",
    "finished_at",
    "server_errors",
    "first_failed_at",
)


@dataclass(frozen=True)
class SpooledRun:
    run_id: str
    state: State
    attempts: int
    next_attempt_at: float
    last_error: str | None
    spooled_at: float
    finished_at: float | None
    server_errors: int  # 5xx answers while the registry delivered other runs
    first_failed_at: float | None


@dataclass
class FlushResult:
    delivered: int = 0
    rejected: int = 0  # refused by the registry, or set aside
    deferred: int = 0  # still queued: the registry is unavailable or asked to retry
    waiting_reason: str | None = None  # why the last run that still waits does
    registry_down: bool = False  # stopped early: no answer, or failures in a row
    receipts: dict[str, RunReceipt] = field(default_factory=dict)  # by run id, as answered


@dataclass(frozen=True)
class _Due:
    run_id: str
    report: str
    attempts: int
    server_errors: int
    first_failed_at: float | None


class Spool:
    """
    spool = Spool(Path("/var/lib/fleetbench/spool.db"))
    spool.add(report)                       # durable once it returns
    spool.flush(client)                     # delivers what is due
    """

    def __init__(
        self,
        path: Path,
        *,
        set_aside_after_5xx: int = 5,
        set_aside_after_attempts: int = 20,
        set_aside_after_s: float = 24 * 3600.0,
        keep_delivered_s: float = 7 * 86400.0,
    ) -> None:
        self.path = path
        self.set_aside_after_5xx = set_aside_after_5xx
        self.set_aside_after_attempts = set_aside_after_attempts
        self.set_aside_after_s = set_aside_after_s
        self.keep_delivered_s = keep_delivered_s
        self._schema_ready = False
        with contextlib.suppress(SpoolUnwritable):  # still readable; writes will say so
            self._ensure_schema()

    # --- writing --------------------------------------------------------------------------

    def add(self, report: RunReport, *, now: float | None = None, again: bool = False) -> None:
        """Keeps the report until the registry has it. Adding the same run again is a no-op;
        the same run id with another report is an error (it would be refused as 409).
        With `again` (a run imported again), a run delivered or set aside before is queued
        once more, so the registry says what it holds, and one never delivered takes the
        new report. Raises SpoolUnwritable when the file cannot be written (a full disk,
        another process's lock held too long), SpoolError when it is of another format."""
        body = report.model_dump_json()
        moment = time.time() if now is None else now
        run_id = str(report.run_id)
        self._ensure_schema()
        with self._writing() as db:
            db.execute(
                "INSERT OR IGNORE INTO runs (run_id, report, state, next_attempt_at, spooled_at)"
                " VALUES (?, ?, 'queued', ?, ?)",
                (run_id, body, moment, moment),
            )
            stored, state = db.execute(
                "SELECT report, state FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            # The same run whatever agent sent it (an import again after an upgrade)
            same = stored == body or _defining(stored) == defining_json(report)
            if again and (same or state != "delivered"):
                db.execute(
                    "UPDATE runs SET report = ?, state = 'queued', next_attempt_at = ?,"
                    " attempts = 0, server_errors = 0, first_failed_at = NULL,"
                    " last_error = NULL, finished_at = NULL WHERE run_id = ?",
                    (body, moment, run_id),
                )
                return
        if not same:
            raise ValueError(f"run {report.run_id} is already spooled with another report")

    def flush(
        self,
        client: RegistryClient,
        *,
        now: float | None = None,
        every_queued: bool = False,
        only: Collection[str] | None = None,
        progress: Callable[[], None] = lambda: None,
    ) -> FlushResult:
        """Delivers every queued run that is due (with `every_queued`, every queued run,
        whatever its backoff; with `only`, of those runs ids only) by the rules in the
        module's docstring, and prunes delivered runs older than `keep_delivered_s`.
        `progress` is called after each run is tried. Raises SpoolUnwritable when the file
        cannot be written."""
        moment = time.time() if now is None else now
        self._ensure_schema()
        with self._writing() as db:
            db.execute(
                "DELETE FROM runs WHERE state = 'delivered' AND finished_at < ?",
                (moment - self.keep_delivered_s,),
            )
            chosen = "" if only is None else f" AND run_id IN ({', '.join('?' * len(only))})"
            due = [
                _Due(*row)
                for row in db.execute(
                    "SELECT run_id, report, attempts, server_errors, first_failed_at FROM runs"
                    f" WHERE state = 'queued' AND (? OR next_attempt_at <= ?){chosen}"
                    " ORDER BY server_errors, spooled_at, run_id",
                    (every_queued, moment, *(only or ())),
                )
            ]
        result = FlushResult()
        answered_5xx: list[tuple[_Due, str, float]] = []  # counted once the flush is over
        failures_in_a_row = 0
        for position, run in enumerate(due):
            try:
                report = RunReport.model_validate_json(run.report)
            except ValidationError as exc:
                # Not a report this agent's contract reads (a damaged row): set aside, so
                # that it holds up no other.
                progress()
                reason = f"not a valid report for this agent's wire format: {exc}"
                self._finish(run.run_id, "rejected", reason, moment)
                result.rejected += 1
                continue
            try:
                result.receipts[run.run_id] = client.submit_run(report)
            except ClientError as exc:
                failure: ClientError | None = exc
            else:
                failure = None
            progress()
            if failure is None:
                self._finish(run.run_id, "delivered", None, moment)
                result.delivered += 1
                failures_in_a_row = 0
                continue
            if (
                isinstance(failure, RequestRejected)
                and failure.status_code not in RETRYABLE_STATUS
                and not _wire_version_refused(failure)
            ):
                self._finish(run.run_id, "rejected", str(failure), moment)
                result.rejected += 1
                failures_in_a_row = 0
                continue
            retry_at = _retry_at(run.attempts, moment, failure.retry_after)
            failures_in_a_row += isinstance(failure, RegistryUnavailable)
            if _own_5xx(failure):
                answered_5xx.append((run, str(failure), retry_at))
            else:
                set_aside = self._retry_later(run, str(failure), retry_at, moment)
                self._count(result, set_aside, str(failure))
            down = failure.retry_after is None and (
                _no_answer(failure) or failures_in_a_row >= _FAILURES_TO_STOP
            )
            if down or failure.retry_after is not None:
                # The runs behind it would fail the same way, or the registry asked for
                # quiet: they wait as long.
                rest = [later.run_id for later in due[position + 1 :]]
                self._postpone(rest, retry_at)
                result.deferred += len(rest)
                result.registry_down = down
                break
        for run, error, retry_at in answered_5xx:
            counted = result.delivered > 0  # the registry took others: this run is the problem
            self._count(result, self._retry_later(run, error, retry_at, moment, counted), error)
        return result

    def unwritable_reason(self) -> str | None:
        """Why the spool cannot be written now, naming the free bytes; None when it can. Opens
        a write transaction and rolls it back: a disk that fills later shows in `add`."""
        try:
            self._ensure_schema()
            with self._writing() as db:
                db.execute("BEGIN IMMEDIATE")
                db.execute("ROLLBACK")
        except SpoolUnwritable as exc:
            return str(exc)
        return None

    def free_bytes(self) -> int:
        """What the spool's file system has left for it."""
        existing = next(p for p in (self.path.parent, *self.path.parent.parents) if p.exists())
        return shutil.disk_usage(existing).free

    # --- reading ----------------------------------------------------------------------------

    def runs(self, state: State | None = None) -> list[SpooledRun]:
        with self._reading() as db:
            if not self._has_runs(db):
                return []
            query = f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs"
            if state is None:
                rows = db.execute(query + " ORDER BY spooled_at").fetchall()
            else:
                rows = db.execute(
                    query + " WHERE state = ? ORDER BY spooled_at", (state,)
                ).fetchall()
        return [SpooledRun(*row) for row in rows]

    def counts(self) -> dict[State, int]:
        counts: dict[State, int] = {"queued": 0, "delivered": 0, "rejected": 0}
        with self._reading() as db:
            if self._has_runs(db):
                for state, count in db.execute("SELECT state, count(*) FROM runs GROUP BY state"):
                    counts[state] = count
        return counts

    # --- the file ---------------------------------------------------------------------------

    def _ensure_schema(self) -> None:
        """Creates the table in a new file. Writes only then, so a full disk opens a spool
        that has one."""
        if self._schema_ready:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unwritable(exc) from exc
        needed = True
        if self.path.exists():
            with self._reading() as db:
                needed = not self._has_runs(db)
        if needed:
            with self._writing() as db:
                db.execute("BEGIN IMMEDIATE")
                if not self._has_runs(db):  # again: another process may have made it
                    for statement in _CREATE:
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {_FORMAT}")
                db.execute("COMMIT")
        self._schema_ready = True

    def _has_runs(self, db: sqlite3.Connection) -> bool:
        """Whether the file holds the runs table; raises SpoolError where it holds one of a
        format this agent does not know."""
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone() is None:
            return False
        (found,) = db.execute("PRAGMA user_version").fetchone()
        if found != _FORMAT:
            made_by = (
                "an agent newer than this one"
                if found > _FORMAT
                else ("a development agent before fleetbench 0.1.0")
            )
            raise SpoolError(
                f"the spool at {self.path} is in format {found}, made by {made_by}; this agent "
                f"reads format {_FORMAT}. Nothing in it was changed: deliver its runs with the "
                "agent that made it, or move the file aside (CHANGELOG.md)"
            )
        return True

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """A read-write connection (WAL, synchronous=FULL: a committed run survives a power
        cut). Anything that stops a write (a full disk, an unwritable file, another
        process's lock held past _BUSY_TIMEOUT_S) raises SpoolUnwritable."""
        try:
            db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.DatabaseError as exc:
            raise self._unwritable(exc) from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            yield db
        except sqlite3.DatabaseError as exc:
            # Whatever stops the write (a full disk, a lock held past the wait, a damaged
            # file): the caller keeps the run elsewhere (memory, stdout, the registry).
            raise self._unwritable(exc) from exc
        finally:
            db.close()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A connection that reads even on a full disk, where WAL mode cannot make its -shm
        file: read-write first (it sees the log), then read-only, then immutable (no -shm;
        it misses only what a crash left in the log). Raises SpoolError if none opens."""
        uri = self.path.absolute().as_uri()
        failure: sqlite3.DatabaseError | None = None
        for target in (uri, f"{uri}?mode=ro", f"{uri}?mode=ro&immutable=1"):
            try:
                db = sqlite3.connect(
                    target, uri=True, timeout=_BUSY_TIMEOUT_S, isolation_level=None
                )
            except sqlite3.DatabaseError as exc:
                failure = exc
                continue
            try:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.DatabaseError as exc:
                db.close()
                failure = exc
                continue
            try:
                yield db
            finally:
                db.close()
            return
        raise SpoolError(f"the spool at {self.path} cannot be read: {failure}")

    def _unwritable(self, exc: sqlite3.DatabaseError | OSError) -> SpoolUnwritable:
        free = self.free_bytes()
        if isinstance(exc, OSError):
            full = exc.errno == errno.ENOSPC
        else:
            full = exc.sqlite_errorname == "SQLITE_FULL" or (
                exc.sqlite_errorname.startswith("SQLITE_IOERR") and free < _NEARLY_FULL_BYTES
            )
        return SpoolUnwritable(str(self.path), "disk full" if full else str(exc), free)

    # --- a run's state ------------------------------------------------------------------------

    def _retry_later(
        self, run: _Due, error: str, retry_at: float, now: float, counted_5xx: bool = False
    ) -> bool:
        """Records a failed attempt: the run is tried again at `retry_at`, or set aside as
        rejected by the rules above (True)."""
        attempts = run.attempts + 1
        server_errors = run.server_errors + counted_5xx
        first_failed_at = now if run.first_failed_at is None else run.first_failed_at
        failing_for = now - first_failed_at
        reason = None
        if server_errors >= self.set_aside_after_5xx:
            reason = (
                f"set aside after {server_errors} answers of 5xx while the registry accepted"
                f" other runs: {error}"
            )
        elif failing_for > self.set_aside_after_s and attempts >= self.set_aside_after_attempts:
            reason = (
                f"set aside after {attempts} failed attempts over {failing_for / 3600:.1f} h:"
                f" {error}"
            )
        with self._writing() as db:
            db.execute(
                "UPDATE runs SET state = ?, attempts = ?, server_errors = ?,"
                " first_failed_at = ?, next_attempt_at = ?, last_error = ?, finished_at = ?"
                " WHERE run_id = ?",
                (
                    "queued" if reason is None else "rejected",
                    attempts,
                    server_errors,
                    first_failed_at,
                    retry_at,
                    reason or error,
                    None if reason is None else now,
                    run.run_id,
                ),
            )
        return reason is not None

    @staticmethod
    def _count(result: FlushResult, set_aside: bool, error: str) -> None:
        if set_aside:
            result.rejected += 1
        else:
            result.deferred += 1
            result.waiting_reason = error

    def _postpone(self, run_ids: list[str], until: float) -> None:
        with self._writing() as db:
            db.executemany(
                "UPDATE runs SET next_attempt_at = max(next_attempt_at, ?) WHERE run_id = ?",
                [(until, run_id) for run_id in run_ids],
            )

    def _finish(self, run_id: str, state: State, error: str | None, now: float) -> None:
        with self._writing() as db:
            db.execute(
                "UPDATE runs SET state = ?, attempts = attempts + 1, last_error = ?,"
                " finished_at = ? WHERE run_id = ?",
                (state, error, now, run_id),
            )


def _retry_at(attempts: int, now: float, retry_after: float | None) -> float:
    """When to try a run again: when the registry said (Retry-After), plus up to half as long
    again; else exponential backoff with full jitter. Either way agents that lost the same
    registry do not all come back in the same second."""
    if retry_after is not None:
        delay = retry_after + random.uniform(0, max(retry_after / 2, 1.0))
    else:
        delay = random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** min(attempts, 20)))
    return now + max(delay, 1.0)


def _defining(stored: str) -> str | None:
    """The defining fields of a spooled report (wire.defining_json); None for a row the
    contract does not read."""
    try:
        return defining_json(RunReport.model_validate_json(stored))
    except ValidationError:
        return None


def _wire_version_refused(failure: RequestRejected) -> bool:
    """The registry reads another version of the wire format: the run is not wrong, one side
    is yet to be upgraded (CHANGELOG.md says which): it waits, backing off."""
    return failure.status_code == 422 and "body.schema_version:" in failure.detail


def _own_5xx(failure: ClientError) -> bool:
    """An answer without Retry-After that is no registry's to take (a 5xx, or what
    UnexpectedAnswer says: a redirect, a page, too large): about this run, not a busy
    registry."""
    return (
        isinstance(failure, RegistryUnavailable)
        and failure.status_code is not None
        and failure.retry_after is None
    )


def _no_answer(failure: ClientError) -> bool:
    """No answer at all: the registry is down or unreachable."""
    return isinstance(failure, RegistryUnavailable) and failure.status_code is None
