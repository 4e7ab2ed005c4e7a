"""An HTTP server on loopback that answers as no registry (or served model's server) should:
a sign-in page instead of JSON, a redirect elsewhere, an answer trickled a byte at a time,
one larger than any answer, or JSON holding hostile strings. It records the requests it got
and how many bytes of its answers it could send before the agent hung up."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.loopback import serving

__all__ = [
    "HostileServer",
    "Reply",
    "by_path",
    "endless",
    "hostile_server",
    "json_reply",
    "page",
    "redirect_to",
    "reply_with",
    "trickle",
]

MIB = 2**20


@dataclass
class HostileServer:
    url: str = ""
    requests: list[str] = field(default_factory=list)  # "POST /v1/runs", in the order they came
    sent: int = 0  # bytes of answer bodies written before the other side hung up


Reply = Callable[[BaseHTTPRequestHandler, HostileServer], None]


def _head(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()


def _body(handler: BaseHTTPRequestHandler, state: HostileServer, data: bytes) -> None:
    handler.wfile.write(data)
    handler.wfile.flush()
    state.sent += len(data)


def reply_with(status: int, content_type: str, data: bytes) -> Reply:
    def reply(handler: BaseHTTPRequestHandler, state: HostileServer) -> None:
        _head(handler, status, {"Content-Type": content_type, "Content-Length": str(len(data))})
        _body(handler, state, data)

    return reply


def json_reply(status: int, body: object) -> Reply:
    return reply_with(status, "application/json", json.dumps(body).encode())


# a proxy's sign-in page, with 200
page = reply_with(
    200, "text/html", b"<!doctype html><html><body><form>Sign in</form></body></html>"
)


def redirect_to(location: str, status: int = 307) -> Reply:
    def reply(handler: BaseHTTPRequestHandler, state: HostileServer) -> None:
        _head(handler, status, {"Location": location, "Content-Length": "0"})

    return reply


def trickle(every_s: float, *, in_headers: bool = False, for_s: float = 60.0) -> Reply:
    """200 and a body promised 10 kB long, sent a byte every `every_s` seconds, or, `in_headers`,
    a header that never ends, a byte at a time (for `for_s` at most: the server's thread
    ends)."""

    def reply(handler: BaseHTTPRequestHandler, state: HostileServer) -> None:
        if in_headers:
            handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        else:
            _head(handler, 200, {"Content-Type": "application/json", "Content-Length": "10000"})
        ends = time.monotonic() + for_s
        while time.monotonic() < ends:
            _body(handler, state, b"a")
            time.sleep(every_s)

    return reply


def endless(status: int = 200, mib: int = 512) -> Reply:
    """An answer of `mib` MiB of JSON-looking bytes with no Content-Length (read until the
    connection closes), a MiB at a time."""

    def reply(handler: BaseHTTPRequestHandler, state: HostileServer) -> None:
        _head(handler, status, {"Content-Type": "application/json", "Connection": "close"})
        for _ in range(mib):
            _body(handler, state, b" " * MIB)

    return reply


def by_path(replies: dict[str, Reply]) -> Reply:
    """Each path's reply (the query left out); 404 for any other path."""

    def reply(handler: BaseHTTPRequestHandler, state: HostileServer) -> None:
        found = replies.get(handler.path.split("?")[0], json_reply(404, {"detail": "not found"}))
        found(handler, state)

    return reply


@contextmanager
def hostile_server(reply: Reply) -> Iterator[HostileServer]:
    """A server on 127.0.0.1 answering every request with `reply`, for the duration."""
    state = HostileServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state.requests.append(f"{self.command} {self.path.split('?')[0]}")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                reply(self, state)
            except (BrokenPipeError, ConnectionResetError):  # the agent hung up
                self.close_connection = True

        do_POST = do_PUT = do_GET

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    with serving(Handler) as state.url:
        yield state
