"""What a webhook endpoint can cost the registry: its answer is read no further than a
quote, a delivery ends at its deadline whatever the endpoint trickles, and a redirect is a
failed delivery, never followed. Real HTTP servers on loopback answer the registry's
notifier."""

from __future__ import annotations

import json
import logging
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from fleetbench.registry.db import session_factory
from fleetbench.registry.models import Regression
from fleetbench.registry.notify import WebhookNotifier
from tests.factories import WOBBLE, LiveRegistry, post_history

SLOWER_BUILD = [(1, w) for w in WOBBLE[:5]] + [(2, 0.8), (2, 0.8)]  # 12 regressions
REGRESSIONS = 12
HUGE = 256 * 1024 * 1024
CHUNK = 64 * 1024

# How one attempt is answered, given the request's handler (its body already read).
Answer = Callable[[BaseHTTPRequestHandler], None]


class Endpoint:
    """A webhook endpoint on loopback: the first attempts are answered as `answers` say,
    the others 200 at once; it keeps the bodies it answered 200 and counts the bytes of
    answers it managed to send."""

    def __init__(self, answers: list[Answer] | None = None) -> None:
        self.answers = list(answers or [])
        self.delivered: list[dict[str, object]] = []
        self.attempts = 0
        self.bytes_sent = 0
        self.done = threading.Event()  # ends what a trickle still sends at the test's end
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.attempts += 1
                answer = endpoint.answers.pop(0) if endpoint.answers else None
                if answer is not None:
                    answer(self)
                    return
                endpoint.delivered.append(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.done.set()
        self.server.shutdown()
        self.server.server_close()

    def huge(self, status: int) -> Answer:
        """`status` with a body of HUGE bytes (a newline in each chunk), written until the
        client hangs up."""

        def answer(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(status)
            handler.send_header("Content-Length", str(HUGE))
            handler.end_headers()
            chunk = (b"x" * 99 + b"\n") * (CHUNK // 100) + b"x" * (CHUNK % 100)
            try:
                for _ in range(HUGE // CHUNK):
                    handler.wfile.write(chunk)
                    self.bytes_sent += CHUNK
            except OSError:  # the client closed the connection: what it read is counted
                pass

        return answer

    def trickle(self, every_s: float) -> Answer:
        """A status line and headers that never end, a byte every `every_s` seconds: each
        read gets a byte well within any read timeout."""

        def answer(handler: BaseHTTPRequestHandler) -> None:
            head = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"y" * 10_000
            try:
                for byte in head:
                    if self.done.wait(every_s):
                        return
                    handler.wfile.write(bytes([byte]))
                    self.bytes_sent += 1
            except OSError:
                pass

        return answer

    @staticmethod
    def redirect(location: str, status: int = 307) -> Answer:
        def answer(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(status)
            handler.send_header("Location", location)
            handler.send_header("Content-Length", "0")
            handler.end_headers()

        return answer


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    found = Endpoint()
    yield found
    found.close()


def recent_regressions(registry: LiveRegistry) -> None:
    """12 regressions whose first slow run was two days ago (recent enough to be sent)."""
    post_history(registry, SLOWER_BUILD, start=datetime.now(UTC) - timedelta(days=7))


def notifier_of(registry: LiveRegistry, url: str, *, timeout: float = 10.0) -> WebhookNotifier:
    return WebhookNotifier(
        session_factory(registry.engine), url=url, public_url="http://x", timeout=timeout
    )


def undelivered(registry: LiveRegistry) -> list[Regression]:
    with session_factory(registry.engine)() as session:
        return list(session.scalars(select(Regression).where(Regression.notified_at.is_(None))))


def test_a_huge_2xx_answer_is_not_read(live_registry: LiveRegistry, endpoint: Endpoint) -> None:
    """A 200 is the delivery: its body, 256 MiB here, is not read (a few MiB of it fill
    the sockets' buffers before the registry hangs up) and takes no memory."""
    recent_regressions(live_registry)
    endpoint.answers = [endpoint.huge(200)]
    notifier = notifier_of(live_registry, endpoint.url)
    tracemalloc.start()
    try:
        delivered = notifier.deliver_due()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        notifier.stop()
    assert delivered == REGRESSIONS
    assert endpoint.attempts == REGRESSIONS
    assert undelivered(live_registry) == []
    assert endpoint.bytes_sent < 32 * 1024 * 1024, endpoint.bytes_sent
    assert peak < 32 * 1024 * 1024, peak


def test_a_huge_error_answer_is_quoted_short_and_on_one_line(
    live_registry: LiveRegistry, endpoint: Endpoint
) -> None:
    recent_regressions(live_registry)
    endpoint.answers = [endpoint.huge(500)]
    notifier = notifier_of(live_registry, endpoint.url)
    try:
        delivered = notifier.deliver_due()
    finally:
        notifier.stop()
    assert delivered == REGRESSIONS - 1
    assert endpoint.bytes_sent < 32 * 1024 * 1024, endpoint.bytes_sent
    [failed] = undelivered(live_registry)
    error = failed.notify_error or ""
    assert error.startswith("HTTP 500: xxx")
    assert "\n" not in error and "\\n" in error  # the answer's newlines shown, not acted on
    assert len(error) < 1200


def test_a_trickling_endpoint_holds_a_delivery_no_longer_than_its_deadline(
    live_registry: LiveRegistry, endpoint: Endpoint
) -> None:
    """The first attempt is answered a byte every 0.2 s, forever: each read is quick, so
    only a deadline for the whole delivery ends it; the other 11 are sent after it."""
    recent_regressions(live_registry)
    endpoint.answers = [endpoint.trickle(0.2)]
    notifier = notifier_of(live_registry, endpoint.url, timeout=1.0)
    delivered: list[int] = []
    passing = threading.Thread(target=lambda: delivered.append(notifier.deliver_due()))
    try:
        passing.start()
        passing.join(timeout=60)  # 1 s for the trickle, the rest at loopback speed
        assert not passing.is_alive(), "a trickling endpoint held the webhook thread"
    finally:
        endpoint.done.set()
        passing.join()
        notifier.stop()
    assert delivered == [REGRESSIONS - 1]
    assert len(endpoint.delivered) == REGRESSIONS - 1
    assert 1 <= endpoint.bytes_sent <= 50  # cut off about 5 bytes in, not at 10,000
    [failed] = undelivered(live_registry)
    assert failed.notify_error == "no complete answer within 1 s"
    assert failed.notify_after is not None  # retried later, with backoff


def test_a_redirect_is_a_failed_delivery_and_not_followed(
    live_registry: LiveRegistry, endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = Endpoint()
    try:
        recent_regressions(live_registry)
        endpoint.answers = [endpoint.redirect(elsewhere.url)] * REGRESSIONS
        notifier = notifier_of(live_registry, endpoint.url)
        try:
            with caplog.at_level(logging.WARNING, logger="fleetbench.registry.notify"):
                assert notifier.deliver_due() == 0
        finally:
            notifier.stop()
    finally:
        elsewhere.close()
    assert elsewhere.attempts == 0
    assert endpoint.attempts == REGRESSIONS
    waiting = undelivered(live_registry)
    assert len(waiting) == REGRESSIONS
    expected = f"HTTP 307: a redirect to {elsewhere.url}, not followed"
    assert {r.notify_error for r in waiting} == {expected}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == REGRESSIONS
    assert all(expected in message for message in warnings)
