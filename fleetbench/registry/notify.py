"""Webhook notifications, delivered at least once: new regressions, and changes of a
watched rollout's verdict (registry.compare.rollouts).

Each event's table is its outbox: a due row whose `notified_at` is NULL has not been
delivered (models.WebhookOutbox). A thread beside the server claims due rows one at a time
(a lease in `notify_after`, longer than a delivery can take, so two registry processes do
not send the same one at once), POSTs each to the webhook and marks it delivered on a 2xx;
any other answer, or none, is retried later with exponential backoff and jitter. What an
endpoint can cost is bounded: a delivery has a deadline for all of it (connecting, sending,
the answer's head), its answer's body is never read beyond a short quote for the log, and a
redirect is a failed delivery, never followed (the webhook is the URL configured). A registry
restart loses nothing: the rows wait in their tables. Only regressions whose first run is
recent (`max_age`) are sent: turning the webhook on, or importing old sweeps, does not page
anyone about last year. Each pass first checks the watched rollouts whose models have new
runs, so that a change of verdict is sent in the same pass.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

import httpx
from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from fleetbench.printable import printable
from fleetbench.registry.compare.rollouts import check_rollouts, rollout_link, rollout_public
from fleetbench.registry.compare.rules import CompareSettings
from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import Regression, RolloutWatch
from fleetbench.registry.regressions.knee_shifts import KNEE_METRIC
from fleetbench.registry.regressions.output_shifts import OUTPUTS_METRIC
from fleetbench.registry.regressions.store import REGRESSED
from fleetbench.registry.schemas import RegressionPublic, SeriesKey, regression_public

__all__ = ["WebhookNotifier", "series_link"]

log = logging.getLogger("fleetbench.registry.notify")

# Of an answer that is not a 2xx, the bytes quoted in the log and the row's notify_error:
# the status is what counts, the body only helps a person see why.
QUOTED_BYTES = 500


def series_link(public_url: str, series: RegressionPublic) -> str:
    """The dashboard page of a regression's series; of a knee's move or an output shift
    (no series page), the node's curves of the model."""
    if series.metric in (KNEE_METRIC, OUTPUTS_METRIC):
        query = urlencode({"node": series.node, "model": series.model})
        return f"{public_url.rstrip('/')}/curves?{query}"
    query = urlencode(series.model_dump(include=set(SeriesKey.model_fields)))
    return f"{public_url.rstrip('/')}/series?{query}"


RowT = TypeVar("RowT", Regression, RolloutWatch)


@dataclass(frozen=True)
class _Outbox(Generic[RowT]):
    """One kind of event and the table that is its outbox."""

    table: type[RowT]
    first: InstrumentedAttribute[datetime | None]  # the order its events go out in
    pending: Callable[[datetime], list[ColumnElement[bool]]]  # besides being due, at a pass
    event: Callable[[RowT], dict[str, Any]]  # the body POSTed
    # which event a row holds: a regression is one; a watch, its latest change of verdict
    change: Callable[[RowT], datetime | None]


class WebhookNotifier:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        url: str,
        public_url: str,
        timeout: float = 10.0,
        first_retry: float = 5.0,
        max_retry: float = 3600.0,
        poll_interval: float = 30.0,
        max_age: timedelta = timedelta(days=7),
        compare_settings: CompareSettings | None = None,
    ) -> None:
        """`timeout`: seconds one delivery may take in all, its answer's head included.
        `compare_settings`: check the watched rollouts with these at each pass (None:
        deliver only what is already waiting)."""
        self.sessions = sessions
        self.url = url
        self.public_url = public_url
        self.timeout = timeout
        self.first_retry = first_retry
        self.max_retry = max_retry
        self.poll_interval = poll_interval
        self.max_age = max_age
        self.compare_settings = compare_settings
        self._regressions = _Outbox(
            Regression,
            Regression.detected_at,
            lambda started: [
                Regression.acknowledged_at.is_(None),
                REGRESSED,
                Regression.first_seen_at >= started - self.max_age,
            ],
            self._regression_event,
            lambda _: None,
        )
        self._rollouts = _Outbox(
            RolloutWatch,
            RolloutWatch.changed_at,
            lambda _: [RolloutWatch.changed_at.is_not(None)],
            self._rollout_event,
            lambda watch: watch.changed_at,
        )
        # `timeout` is a delivery's deadline, all of it; the lease outlasts it and the
        # database round trips around it.
        self.lease = timedelta(seconds=3 * timeout + 30)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tls = httpx.create_ssl_context()  # made once: each delivery has its own client

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="webhook", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)

    def wake(self) -> None:
        """New regressions may be waiting: deliver now rather than at the next poll."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a wake() during it brings another pass
            try:
                self.deliver_due()
            except Exception:  # the database may be down: keep the thread, try again later
                log.exception("webhook delivery pass failed")
            self._wake.wait(self.poll_interval)

    def deliver_due(self) -> int:
        """One pass over the events due when it starts (one that fails waits for its retry,
        not for this pass): the regressions, then the watched rollouts, checked first;
        returns how many were delivered."""
        started = datetime.now(UTC)
        delivered = self._deliver_all(self._regressions, started)
        if self.compare_settings is not None:
            try:
                with self.sessions() as session:
                    check_rollouts(session, self.compare_settings, stop=self._stop)
            except Exception:  # the database may be down: what is due is still tried
                log.exception("checking the watched rollouts failed")
        return delivered + self._deliver_all(self._rollouts, datetime.now(UTC))

    def _deliver_all(self, outbox: _Outbox[RowT], due_by: datetime) -> int:
        delivered = 0
        while (row_id := self._claim_next(outbox, due_by=due_by)) is not None:
            delivered += self._deliver(outbox, row_id)
        return delivered

    def _claim_next(self, outbox: _Outbox[RowT], *, due_by: datetime) -> int | None:
        """A due event of `outbox` now leased to this process, or None when none is due."""
        table = outbox.table
        is_due = or_(table.notify_after.is_(None), table.notify_after <= due_by)
        while True:
            with self.sessions() as session, write_transaction(session):
                due = session.scalars(
                    select(table.id)
                    .where(table.notified_at.is_(None), is_due, *outbox.pending(due_by))
                    .order_by(outbox.first, table.id)
                    .limit(10)
                ).all()
                if not due:
                    return None
                lease = datetime.now(UTC) + self.lease
                for row_id in due:
                    claimed = session.execute(
                        update(table).where(table.id == row_id, is_due).values(notify_after=lease)
                    )
                    if claimed.rowcount == 1:  # type: ignore[attr-defined]
                        session.commit()
                        return row_id
                session.commit()  # all taken by another process meanwhile: look again

    def _regression_event(self, row: Regression) -> dict[str, Any]:
        regression = regression_public(row)
        return {
            "event": "regression",
            "regression": regression.model_dump(mode="json"),
            "url": series_link(self.public_url, regression),
        }

    def _rollout_event(self, row: RolloutWatch) -> dict[str, Any]:
        rollout = rollout_public(row)
        return {
            "event": "rollout_verdict",
            "rollout": rollout.model_dump(mode="json"),
            "url": rollout_link(self.public_url, rollout),
        }

    def _deliver(self, outbox: _Outbox[RowT], row_id: int) -> int:
        with self.sessions() as session:
            row = session.get(outbox.table, row_id)
            if row is None or row.notified_at is not None:  # withdrawn, or sent meanwhile
                return 0
            body = outbox.event(row)
            attempts = row.notify_attempts
            sent = outbox.change(row)
        error = self.post(body)
        now = datetime.now(UTC)
        with self.sessions() as session, write_transaction(session):
            row = session.get(outbox.table, row_id)
            if row is None or outbox.change(row) != sent:
                # withdrawn, or a rollout whose verdict changed again meanwhile: that newer
                # change is the one still to send, and this answer says nothing of it
                return 0
            row.notify_attempts = attempts + 1
            if error is None:
                row.notified_at = now
                row.notify_error = None
            else:
                backoff = min(self.max_retry, self.first_retry * 2 ** min(attempts, 30))
                row.notify_after = now + timedelta(seconds=backoff * random.uniform(0.5, 1.0))
                row.notify_error = error
                log.warning("webhook for %s %s failed: %s", body["event"], row_id, error)
            session.commit()
        return 1 if error is None else 0

    def post(self, body: dict[str, Any]) -> str | None:
        """POSTs `body` to the webhook within the deadline: None when answered 2xx, else
        why not (on one line)."""
        return asyncio.run(self._post(body))

    async def _post(self, body: dict[str, Any]) -> str | None:
        # httpx's own timeout bounds each read, not the delivery: an endpoint sending a
        # byte a second would hold the only webhook thread, and every event after it,
        # for ever. Cancelling at the deadline closes the connection.
        try:
            async with (
                asyncio.timeout(self.timeout),
                httpx.AsyncClient(
                    timeout=self.timeout,
                    verify=self._tls,
                    follow_redirects=False,
                    # the quote is read as sent: a compressed answer can inflate a
                    # thousandfold
                    headers={"User-Agent": "fleetbench-registry", "Accept-Encoding": "identity"},
                ) as client,
                client.stream("POST", self.url, json=body) as response,
            ):
                if response.is_success:
                    return None  # its body unread: leaving hangs up rather than drain it
                if response.is_redirect:
                    location = response.headers.get("location", "")[:QUOTED_BYTES]
                    return printable(
                        f"HTTP {response.status_code}: a redirect to {location}, not followed"
                    )
                quoted = await _first_bytes(response, QUOTED_BYTES)
                text = quoted.decode("utf-8", errors="replace")
                return printable(f"HTTP {response.status_code}: {text}")
        except TimeoutError:
            return f"no complete answer within {self.timeout:g} s"
        except httpx.HTTPError as exc:
            return printable(f"{type(exc).__name__}: {exc}")


async def _first_bytes(response: httpx.Response, limit: int) -> bytes:
    """Up to `limit` bytes of the answer's body as sent (never decompressed), the rest
    unread."""
    read = bytearray()
    async for chunk in response.aiter_raw():
        read += chunk
        if len(read) >= limit:
            break
    return bytes(read[:limit])
