"""A registry stand-in on loopback for the faults a real registry does not produce on
demand: a 500 for chosen runs, 503 or 429 with Retry-After for every run, an unhealthy
/healthz, a registry older than a report that leaves some of its fields out and names them.
Runs it is not told to fail get 201 and a receipt, as from the
registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from uuid import UUID

from tests.loopback import serving


@dataclass(frozen=True)
class Answer:
    status: int
    body: str = "boom"
    retry_after: str | None = None


@dataclass
class FlakyRegistry:
    url: str = ""
    failing: dict[str, Answer] = field(default_factory=dict)  # by run id
    every_run: Answer | None = None  # for every run, when set
    healthy: bool = True
    ignored_fields: list[str] = field(default_factory=list)  # named in every receipt
    posted: list[str] = field(default_factory=list)  # run ids, in the order they came
    bodies: list[dict[str, object]] = field(default_factory=list)
    health_checks: int = 0

    def fail(self, run_id: UUID, status: int, body: str = "boom") -> None:
        self.failing[str(run_id)] = Answer(status, body)

    def answer(self, run_id: str) -> tuple[int, dict[str, str], str]:
        answer = self.every_run or self.failing.get(run_id)
        if answer is None:
            receipt = {"run_id": run_id, "outcome": "created", "points": 6, "failures": 0,
                       "ignored_fields": self.ignored_fields}  # fmt: skip
            return 201, {"Content-Type": "application/json"}, json.dumps(receipt)
        headers = {"Content-Type": "text/plain"}
        if answer.retry_after is not None:
            headers["Retry-After"] = answer.retry_after
        return answer.status, headers, answer.body


@contextmanager
def flaky_registry() -> Iterator[FlakyRegistry]:
    """A FlakyRegistry served by http.server in a thread on 127.0.0.1 for the duration."""
    state = FlakyRegistry()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            run_id = str(body["run_id"])
            state.posted.append(run_id)
            state.bodies.append(body)
            self._send(*state.answer(run_id))

        def do_GET(self) -> None:
            if self.path != "/healthz":
                self._send(404, {}, "not found")
                return
            state.health_checks += 1
            if state.healthy:
                self._send(200, {"Content-Type": "application/json"}, '{"status": "ok"}')
            else:
                self._send(503, {"Retry-After": "2"}, '{"detail": "database unavailable"}')

        def _send(self, status: int, headers: dict[str, str], body: str) -> None:
            data = body.encode()
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    with serving(Handler) as state.url:
        yield state
