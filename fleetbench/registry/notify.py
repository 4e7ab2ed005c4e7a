"""Webhook notifications of new regressions, delivered at least once.

The regressions table is the outbox: a regression whose `notified_at` is NULL has not been
delivered. A thread beside the server claims due rows one at a time (a lease in
`notify_after`, longer than a delivery can take, so two registry processes do not send the
same one at once), POSTs each to the webhook and marks it delivered on a 2xx; any other
answer, or none, is retried later with exponential backoff and jitter. A registry restart
loses nothing: the rows wait in the table. Only regressions whose first run is recent
(`max_age`) are sent: turning the webhook on, or importing old sweeps, does not page anyone
about last year.
"""

from __future__ import annotations

import logging
import random
import threading
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import httpx
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import Regression
from fleetbench.registry.questions.knee_shifts import KNEE_METRIC
from fleetbench.registry.schemas import RegressionPublic, SeriesKey, regression_public

__all__ = ["WebhookNotifier", "series_link"]

log = logging.getLogger("fleetbench.registry.notify")


def series_link(public_url: str, series: RegressionPublic) -> str:
    """The dashboard page of a regression's series; of a knee's move, the node's curves of
    the model."""
    if series.metric == KNEE_METRIC:
        query = urlencode({"node": series.node, "model": series.model})
        return f"{public_url.rstrip('/')}/curves?{query}"
    query = urlencode(series.model_dump(include=set(SeriesKey.model_fields)))
    return f"{public_url.rstrip('/')}/series?{query}"


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
    ) -> None:
        self.sessions = sessions
        self.url = url
        self.public_url = public_url
        self.timeout = timeout
        self.first_retry = first_retry
        self.max_retry = max_retry
        self.poll_interval = poll_interval
        self.max_age = max_age
        # httpx's timeout bounds each phase (connect, write, each read): a delivery can take
        # a few of them, and the lease must outlast it.
        self.lease = timedelta(seconds=6 * timeout)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=timeout, headers={"User-Agent": "fleetbench-registry"})

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="webhook", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)
        self._client.close()

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
        """One pass over the regressions due when it starts (one that fails waits for its
        retry, not for this pass); returns how many were delivered."""
        started = datetime.now(UTC)
        delivered = 0
        while (regression_id := self._claim_next(due_by=started)) is not None:
            delivered += self._deliver(regression_id)
        return delivered

    def _claim_next(self, *, due_by: datetime) -> int | None:
        """A due regression now leased to this process, or None when none is due."""
        is_due = or_(Regression.notify_after.is_(None), Regression.notify_after <= due_by)
        while True:
            with self.sessions() as session, write_transaction(session):
                due = session.scalars(
                    select(Regression.id)
                    .where(
                        Regression.notified_at.is_(None),
                        Regression.acknowledged_at.is_(None),
                        Regression.change < 0,
                        Regression.first_seen_at >= due_by - self.max_age,
                        is_due,
                    )
                    .order_by(Regression.detected_at, Regression.id)
                    .limit(10)
                ).all()
                if not due:
                    return None
                lease = datetime.now(UTC) + self.lease
                for regression_id in due:
                    claimed = session.execute(
                        update(Regression)
                        .where(Regression.id == regression_id, is_due)
                        .values(notify_after=lease)
                    )
                    if claimed.rowcount == 1:  # type: ignore[attr-defined]
                        session.commit()
                        return regression_id
                session.commit()  # all taken by another process meanwhile: look again

    def _deliver(self, regression_id: int) -> int:
        with self.sessions() as session:
            regression = session.get(Regression, regression_id)
            if regression is None:  # withdrawn meanwhile
                return 0
            public = regression_public(regression)
            body = {
                "event": "regression",
                "regression": public.model_dump(mode="json"),
                "url": series_link(self.public_url, public),
            }
            attempts = regression.notify_attempts
        error: str | None = None
        try:
            response = self._client.post(self.url, json=body)
            if not response.is_success:
                error = f"HTTP {response.status_code}: {response.text[:500]}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        now = datetime.now(UTC)
        with self.sessions() as session, write_transaction(session):
            regression = session.get(Regression, regression_id)
            if regression is None:
                return 0
            regression.notify_attempts = attempts + 1
            if error is None:
                regression.notified_at = now
                regression.notify_error = None
            else:
                backoff = min(self.max_retry, self.first_retry * 2 ** min(attempts, 30))
                regression.notify_after = now + timedelta(
                    seconds=backoff * random.uniform(0.5, 1.0)
                )
                regression.notify_error = error
                log.warning("webhook for regression %s failed: %s", regression_id, error)
            session.commit()
        return 1 if error is None else 0
