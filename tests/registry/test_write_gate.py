"""Anyone who can reach the port cannot stop the fleet's reports: a write is admitted only
once its token is valid and its whole body is in hand (registry.admission), so bodies sent
slowly, with or without a token, hold no slot the reports need."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from fleetbench.registry.config import RegistrySettings
from tests.factories import LiveRegistry, make_report, post_report, running_registry

# Few write slots, a short queue wait and a short body time limit: what the attack needs
# against the defaults (64 slots, 2 s), at a test's scale.
SLOTS = 4


def _settings(registry_settings: RegistrySettings, **more: object) -> RegistrySettings:
    return registry_settings.model_copy(
        update={"max_writes_in_flight": SLOTS, "max_queue_wait_s": 1.0, **more}
    )


def _head(url: str, method: str, path: str, token: str | None, length: int) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    host = urlsplit(url).netloc
    return (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: {length}\r\n\r\n"
    ).encode()


class SlowSender:
    """Connections that each send a request's head, then one byte of its body every
    `every_s` seconds, until stopped; what each was answered."""

    def __init__(self, url: str, heads: list[bytes], every_s: float = 0.5) -> None:
        address = urlsplit(url)
        self.sockets = [socket.create_connection((address.hostname, address.port)) for _ in heads]
        self.answers: list[bytes] = [b""] * len(heads)
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, args=(i, head, every_s), daemon=True)
            for i, head in enumerate(heads)
        ]
        for thread in self._threads:
            thread.start()

    def _send(self, index: int, head: bytes, every_s: float) -> None:
        sock = self.sockets[index]
        sock.settimeout(every_s)
        with contextlib.suppress(OSError):
            sock.sendall(head)
            while not self._stop.is_set():
                try:
                    part = sock.recv(65536)
                    if not part:
                        return
                    self.answers[index] += part
                except TimeoutError:
                    sock.sendall(b" ")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for sock in self.sockets:
            sock.close()

    def wait_answered(self, seconds: float = 20) -> None:
        """Until every connection is answered, or `seconds` have passed."""
        deadline = time.monotonic() + seconds
        while None in self.statuses() and time.monotonic() < deadline:
            time.sleep(0.1)

    def statuses(self) -> list[int | None]:
        return [int(a.split()[1]) if a.startswith(b"HTTP/1.1 ") else None for a in self.answers]


@contextlib.contextmanager
def slow_bodies(url: str, heads: list[bytes]) -> Iterator[SlowSender]:
    sender = SlowSender(url, heads)
    try:
        yield sender
    finally:
        sender.stop()


def _warm(registry: LiveRegistry, tokens: list[str]) -> None:
    """Each token used once, so that the attack's heads find it known (a first look-up on
    a loaded machine can outlast the test's short queue wait)."""
    for token in tokens:
        with registry.client(token) as client:
            assert client.get("/v1/agent/plans").status_code == 200


def _reports_meanwhile(registry: LiveRegistry, count: int) -> list[int]:
    token = registry.token("honest")
    with registry.client(token) as client:
        return [post_report(client, make_report(node="honest")).status_code for _ in range(count)]


def test_slow_bodies_without_a_token_leave_the_reports_alone(
    registry_settings: RegistrySettings,
) -> None:
    """Three times as many connections as write slots, no token, each trickling a plan's
    body: before, every report waited for a slot and was answered 503 after the queue's
    wait; now the trickles are answered 401 at once and hold nothing."""
    with running_registry(_settings(registry_settings)) as registry:
        heads = [_head(registry.url, "PUT", "/v1/plans/x", None, 100_000)] * (3 * SLOTS)
        with slow_bodies(registry.url, heads) as attack:
            time.sleep(0.5)  # every attacking connection has sent its head
            reported = _reports_meanwhile(registry, 5)
            time.sleep(0.5)
            answered = attack.statuses()
        stored = registry.count("runs")
    assert reported == [201] * 5
    assert stored == 5
    assert answered == [401] * len(heads)


@pytest.mark.parametrize("method, path", [("POST", "/v1/runs"), ("PUT", "/v1/plans/x")])
def test_slow_bodies_with_valid_tokens_are_cut_off_and_hold_no_slot(
    registry_settings: RegistrySettings, method: str, path: str
) -> None:
    """Valid node tokens, each trickling a body: the reports of another node go through
    meanwhile, and each trickle is answered 408 once the body time limit has passed."""
    settings = _settings(registry_settings, body_timeout_s=3.0)
    with running_registry(settings) as registry:
        slow_tokens = [registry.token(f"slow-{i}") for i in range(3 * SLOTS)]
        _warm(registry, slow_tokens)
        heads = [_head(registry.url, method, path, token, 100_000) for token in slow_tokens]
        with slow_bodies(registry.url, heads) as attack:
            time.sleep(0.5)
            reported = _reports_meanwhile(registry, 5)
            attack.wait_answered()
            answered = attack.statuses()
    assert reported == [201] * 5
    assert answered == [408] * len(heads), [a[:120] for a in attack.answers]
    assert b"did not arrive within 3 s" in attack.answers[0]


def test_one_token_sends_a_few_bodies_at_once(registry_settings: RegistrySettings) -> None:
    """A node token may have FLEETBENCH_MAX_UPLOADS_PER_TOKEN bodies arriving at once: one
    more is answered 429 at once, and the token still reports once they are done."""
    settings = _settings(registry_settings, max_uploads_per_token=2, body_timeout_s=2.0)
    with running_registry(settings) as registry:
        token = registry.token("greedy")
        _warm(registry, [token])
        heads = [_head(registry.url, "POST", "/v1/runs", token, 100_000)] * 3
        with slow_bodies(registry.url, heads) as attack:
            attack.wait_answered()
            answered = sorted(s or 0 for s in attack.statuses())
        with registry.client(token) as client:
            later = post_report(client, make_report(node="greedy"))
    assert answered == [408, 408, 429]
    assert later.status_code == 201, later.text


@pytest.mark.parametrize(
    "method, path",
    [("PUT", "/v1/plans/x"), ("POST", "/v1/tokens"), ("POST", "/v1/rollouts")],
)
def test_an_admin_write_with_a_wrong_token_is_refused_before_its_body(
    live_registry: LiveRegistry, method: str, path: str
) -> None:
    """A 1 MB body declared, 100 bytes sent: the 401 comes without the rest being waited
    for (before, the admin routes read and parsed the whole body first)."""
    address = urlsplit(live_registry.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(_head(live_registry.url, method, path, "fba_wrong", 1_000_000) + b"{" * 100)
        answer = _answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def _answer_of(sock: socket.socket) -> bytes:
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
        if not (part := sock.recv(65536)):
            break
        answer += part
    return answer


def test_a_token_revoked_while_its_body_arrives_writes_nothing(
    live_registry: LiveRegistry,
) -> None:
    """An admin token's plan, its body half sent when the token is revoked: the rest
    arrives, and the plan is refused (401), not stored."""
    leaked = live_registry.scoped_token("admin", name="leaked")
    ops = live_registry.scoped_token("admin", name="ops")
    body = b'{"model": {"path": "/models/m.gguf"}, "cron": "0 3 * * *"}'
    address = urlsplit(live_registry.url)
    with live_registry.client(ops) as client:
        [leaked_id] = [
            t["id"] for t in client.get("/v1/tokens").json()["data"] if t["name"] == "leaked"
        ]
        with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
            sock.sendall(_head(live_registry.url, "PUT", "/v1/plans/x", leaked, len(body)))
            sock.sendall(body[:10])
            assert client.post(f"/v1/tokens/{leaked_id}/revoke").status_code == 200
            sock.sendall(body[10:])
            answer = _answer_of(sock)
        plans = client.get("/v1/plans").json()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert plans["count"] == 0


def test_an_options_body_is_never_read(live_registry: LiveRegistry) -> None:
    """No route takes OPTIONS: its body, however large it says it is, is not waited for
    (before, the write lane read it whole into memory)."""
    address = urlsplit(live_registry.url)
    token = live_registry.token("gpu-1")
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(_head(live_registry.url, "OPTIONS", "/v1/runs", token, 10_000_000) + b"{")
        answer = _answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 405"), answer[:200]
