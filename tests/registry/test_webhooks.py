"""Webhook notifications of new regressions, received by a real HTTP server on loopback."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import session_factory
from fleetbench.registry.models import Regression
from fleetbench.registry.notify import WebhookNotifier
from tests.factories import WOBBLE, LiveRegistry, Receiver, post_history, running_registry

SLOWER_BUILD = [(1, w) for w in WOBBLE[:5]] + [(2, 0.8), (2, 0.8)]


def recently() -> datetime:
    """A start such that the regression's first run (day 5) was two days ago."""
    return datetime.now(UTC) - timedelta(days=7)


def test_a_new_regression_reaches_the_webhook_with_a_link(
    database_url: str, receiver: Receiver
) -> None:
    settings = RegistrySettings(
        database_url=database_url,
        webhook_url=receiver.url,
        public_url="http://registry.example:8787",
    )
    with running_registry(settings) as registry:
        post_history(registry, SLOWER_BUILD, start=recently())
        receiver.wait_for(12)
        time.sleep(0.3)  # nothing more comes: each regression is sent once
        assert len(receiver.bodies) == 12
    eight = next(
        b
        for b in receiver.bodies
        if (b["regression"]["metric"], b["regression"]["b"]) == ("s_tg", 8)
    )
    assert eight["event"] == "regression"
    assert eight["regression"]["node"] == "m4pro"
    assert eight["regression"]["cause_kinds"] == ["llama.cpp build"]
    assert eight["regression"]["change_pct"] == pytest.approx(-20, abs=1.5)
    assert eight["url"] == (
        "http://registry.example:8787/series?node=m4pro&model=Mistral-Nemo-Instruct-2407-Q4_K_M"
        "&pp=512&tg=128&b=8&metric=s_tg"
    )


def test_a_failed_delivery_is_retried_and_nothing_is_lost(
    live_registry: LiveRegistry, receiver: Receiver
) -> None:
    post_history(live_registry, SLOWER_BUILD, start=recently())
    receiver.statuses = [500, 503]  # the receiver is down for the first two attempts
    sessions = session_factory(live_registry.engine)
    notifier = WebhookNotifier(
        sessions, url=receiver.url, public_url="http://x", first_retry=0.05, max_retry=0.2
    )
    try:
        assert notifier.deliver_due() == 10  # two of twelve failed and wait their turn
        with sessions() as session:
            waiting = session.scalars(
                select(Regression).where(Regression.notified_at.is_(None))
            ).all()
            assert len(waiting) == 2
            assert all(
                r.notify_attempts == 1 and "HTTP 50" in (r.notify_error or "") for r in waiting
            )
        time.sleep(0.25)
        assert notifier.deliver_due() == 2
        assert notifier.deliver_due() == 0  # all delivered, once each
    finally:
        notifier.stop()
    assert receiver.attempts == 14
    assert len({b["regression"]["id"] for b in receiver.bodies}) == 12


def test_old_regressions_are_not_sent_when_the_webhook_is_turned_on(
    live_registry: LiveRegistry, receiver: Receiver
) -> None:
    post_history(live_registry, SLOWER_BUILD)  # first slow run in early November
    sessions = session_factory(live_registry.engine)
    notifier = WebhookNotifier(sessions, url=receiver.url, public_url="http://x")
    try:
        assert notifier.deliver_due() == 0
    finally:
        notifier.stop()
    assert receiver.attempts == 0


def test_two_registries_on_one_database_send_each_regression_once(
    live_registry: LiveRegistry, receiver: Receiver
) -> None:
    """Two registry processes share a PostgreSQL (or SQLite) database, each with its webhook
    thread: they claim regressions under leases, so each one is sent once."""
    post_history(live_registry, SLOWER_BUILD, start=recently())
    notifiers = [
        WebhookNotifier(session_factory(live_registry.engine), url=receiver.url, public_url="x")
        for _ in range(2)
    ]
    delivered: list[int] = []
    try:
        passes = [
            threading.Thread(target=lambda n=n: delivered.append(n.deliver_due()))
            for n in notifiers
        ]
        for thread in passes:
            thread.start()
        for thread in passes:
            thread.join()
    finally:
        for notifier in notifiers:
            notifier.stop()
    assert sum(delivered) == 12
    assert receiver.attempts == 12
    assert len({b["regression"]["id"] for b in receiver.bodies}) == 12
