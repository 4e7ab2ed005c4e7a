"""HTTP from the agent with every wait and every answer bounded. A request ends by its
deadline however slowly its answer trickles in (each socket wait is cut to what is left of
it, the headers' too: per-read timeouts alone let a byte every few seconds go on for ever),
and no more of an answer is read than a limit, so that a registry, a proxy before it or a
server under test can neither hold the agent nor fill its memory."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

__all__ = [
    "AnswerTooLarge",
    "DeadlineClock",
    "DeadlinePassed",
    "deadline_transport",
    "read_bounded",
]

MIB = 2**20


class AnswerTooLarge(Exception):
    """An answer longer than the limit it was read with; what was past it was not read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an answer of more than {limit / MIB:g} MiB")
        self.limit = limit


class DeadlinePassed(Exception):
    """The request's deadline passed before its answer was read to the end."""


class DeadlineClock:
    """The deadline of the request under way (time.monotonic(); None: no deadline), set by
    whoever sends it; one request at a time."""

    def __init__(self) -> None:
        self.deadline: float | None = None

    def left(self, timeout: float | None, late: type[Exception]) -> float | None:
        """The wait for one socket operation: its own timeout, or less, what is left of the
        deadline; `late` (an httpcore timeout, which httpx maps) once nothing is."""
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise late("the request's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, clock: DeadlineClock) -> None:
        self._inner = inner
        self._clock = clock

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._clock.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._clock.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        wait = self._clock.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, wait), self._clock
        )

    def get_extra_info(self, info: str) -> object:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own sockets, each wait cut to what is left of the request's deadline."""

    def __init__(self, clock: DeadlineClock) -> None:
        self._inner = httpcore.SyncBackend()
        self._clock = clock

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,  # setsockopt's arguments
    ) -> httpcore.NetworkStream:
        wait = self._clock.left(timeout, httpcore.ConnectTimeout)
        stream = self._inner.connect_tcp(host, port, wait, local_address, socket_options)
        return _DeadlineStream(stream, self._clock)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    def __init__(self, clock: DeadlineClock, retries: int) -> None:
        super().__init__(retries=retries)
        # httpx takes no network backend: its pool is made again with ours (httpcore's limits:
        # the client sends one request at a time)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            keepalive_expiry=5.0,
            retries=retries,
            network_backend=_DeadlineBackend(clock),
        )


def deadline_transport(retries: int = 0) -> tuple[httpx.HTTPTransport, DeadlineClock]:
    """An httpx transport (connections retried `retries` times) whose requests end by the
    deadline the clock returned with holds."""
    clock = DeadlineClock()
    return _DeadlineTransport(clock, retries), clock


def read_bounded(
    response: httpx.Response, limit: int, deadline: float | None = None, *, cut: bool = False
) -> bytes:
    """The body of a streamed response, decoded, if it is `limit` bytes or less; past that
    its first `limit` bytes with `cut`, else AnswerTooLarge (a Content-Length saying so
    first). The rest is never read: the connection is dropped when the response closes.
    DeadlinePassed when `deadline` (time.monotonic()) passes between two reads."""
    length = response.headers.get("Content-Length", "")
    if not cut and length.isdigit() and int(length) > limit:
        raise AnswerTooLarge(limit)
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            if cut:
                return bytes(body[:limit])
            raise AnswerTooLarge(limit)
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlinePassed
    return bytes(body)
